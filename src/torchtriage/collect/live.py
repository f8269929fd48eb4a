"""Live diagnosis of a running job: capture every rank's stack, ask armed ranks for their flight
recorder, and fuse what came back (with any dumps and logs the user adds)."""

from __future__ import annotations

import time
from pathlib import Path

from torchtriage.analysis.postmortem import diagnose_paths
from torchtriage.collect.capture import capture_stacks
from torchtriage.collect.discovery import parse_environ
from torchtriage.model import Verdict

# How long to wait for ranks started by `torchtriage run` to answer a dump request: their watchdogs
# poll every few seconds.
ARMED_WAIT_S = 15.0


def armed_run_dir(pids: list[int]) -> Path | None:
    """The hang folder of a job started with `torchtriage run`, read from a rank's environment."""
    for pid in pids:
        try:
            env = parse_environ(Path(f"/proc/{pid}/environ").read_bytes(), keys=("TORCHTRIAGE_RUN_DIR",))
        except OSError:
            continue
        if env.get("TORCHTRIAGE_RUN_DIR"):
            return Path(env["TORCHTRIAGE_RUN_DIR"]) / "hang"
    return None


def request_fresh_dumps(hang_dir: Path, ranks: int, wait_s: float = ARMED_WAIT_S) -> Path | None:
    """Ask armed ranks' watchdogs for their flight-recorder buffers; the folder they land in, if any."""
    from torchtriage.runtime.watchdog import REQUEST_FILE

    hang_dir.mkdir(parents=True, exist_ok=True)
    (hang_dir / REQUEST_FILE).write_text(f"requested by torchtriage diagnose at {time.time():.0f}\n")
    fr = hang_dir / "fr"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if fr.is_dir() and len(list(fr.iterdir())) >= ranks:
            break
        time.sleep(0.5)
    return fr if fr.is_dir() and any(fr.iterdir()) else None


def diagnose_live(
    pids: list[int] | None = None,
    out: Path | None = None,
    *,
    native: bool = False,
    timeout_s: float = 10.0,
    extra_paths: list[str] | None = None,
    logs: list[str] | None = None,
) -> Verdict:
    capture = capture_stacks(pids, out, native=native, timeout_s=timeout_s)
    sources = [str(capture.folder), *(extra_paths or [])]
    captured = [p.target.pid for p in capture.processes]
    hang_dir = armed_run_dir(captured)
    if hang_dir is not None:
        fresh = request_fresh_dumps(hang_dir, len(captured))
        if fresh is not None:
            sources.append(str(fresh))
    verdict = diagnose_paths(sources, extra_logs=logs)
    verdict.facts["capture_folder"] = str(capture.folder)
    verdict.problems.extend(f"rank {p.target.rank} (pid {p.target.pid}): {p.error}" for p in capture.failures)
    return verdict
