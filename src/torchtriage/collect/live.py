"""Live diagnosis of a running job: capture every rank's stack, ask armed ranks for their flight
recorder, and fuse what came back (with any dumps and logs the user adds)."""

from __future__ import annotations

import time
from pathlib import Path

from torchtriage.analysis.postmortem import diagnose_paths
from torchtriage.collect.capture import capture_stacks
from torchtriage.collect.discovery import parse_environ
from torchtriage.model import Verdict
from torchtriage.protocol import FR_SUBDIR, REQUEST_FILE, RUN_DIR_ENV, hang_dir

# How long to wait for ranks started by `torchtriage run` to answer a dump request: their watchdogs
# poll every few seconds.
ARMED_WAIT_S = 15.0


def armed_run_dir(pids: list[int]) -> Path | None:
    """The hang folder of a job started with `torchtriage run`, read from a rank's environment."""
    for pid in pids:
        try:
            env = parse_environ(Path(f"/proc/{pid}/environ").read_bytes(), keys=(RUN_DIR_ENV,))
        except OSError:
            continue
        if env.get(RUN_DIR_ENV):
            return hang_dir(env[RUN_DIR_ENV])
    return None


def request_fresh_dumps(folder: Path, ranks: int, wait_s: float = ARMED_WAIT_S) -> Path | None:
    """Ask armed ranks' watchdogs for their flight-recorder buffers; the folder they land in, if any."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / REQUEST_FILE).write_text(f"requested by torchtriage diagnose at {time.time():.0f}\n")
    fr = folder / FR_SUBDIR
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
    armed = armed_run_dir(captured)
    if armed is not None:
        fresh = request_fresh_dumps(armed, len(captured))
        if fresh is not None:
            sources.append(str(fresh))
    verdict = diagnose_paths(sources, extra_logs=logs)
    verdict.facts["capture_folder"] = str(capture.folder)
    verdict.problems.extend(f"rank {p.target.rank} (pid {p.target.pid}): {p.error}" for p in capture.failures)
    return verdict
