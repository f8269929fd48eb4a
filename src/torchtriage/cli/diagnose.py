"""`torchtriage diagnose`: "my job is stuck" — stacks, flight recorder and logs fused into one verdict.

Live (no PATH): captures every rank's stack on this node with py-spy (the same discovery, preflight
and care as `torchtriage dump`); when the job was started with `torchtriage run`, also asks its
ranks for a fresh flight-recorder dump; reads `--fr` dumps and `--logs` when given; fuses.
Post-mortem (PATH...): the same fused verdict from the folders and files a dead job left behind.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from torchtriage import exit_codes
from torchtriage.analysis.postmortem import diagnose_paths
from torchtriage.errors import UsageError
from torchtriage.report.json_report import render_json
from torchtriage.report.text import render_text

# How long to wait for ranks started by `torchtriage run` to answer a dump request.
_ARMED_WAIT_S = 15.0


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="post-mortem: folders/files of stack dumps, flight-recorder dumps and logs",
    )
    parser.add_argument(
        "--pid",
        type=int,
        action="append",
        metavar="PID",
        help="live: a rank's pid or its launcher's (repeatable); default: every torchrun job here",
    )
    parser.add_argument("--fr", action="append", metavar="DIR", default=[], help="flight-recorder dumps to read")
    parser.add_argument("--logs", action="append", metavar="PATH", default=[], help="logs to read")
    parser.add_argument("--out", metavar="DIR", help="live: where the captured stacks go")
    parser.add_argument("--native", action="store_true", help="live: include native frames (slower)")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="S", help="live: per-rank py-spy timeout")
    parser.add_argument("--json", action="store_true", help="print the verdict as one JSON object")


def _armed_run_dir(pids: list[int]) -> Path | None:
    """The folder of a job started with `torchtriage run`, read from a rank's environment."""
    from torchtriage.collect.discovery import parse_environ

    for pid in pids:
        try:
            env = parse_environ(Path(f"/proc/{pid}/environ").read_bytes(), keys=("TORCHTRIAGE_RUN_DIR",))
        except OSError:
            continue
        if env.get("TORCHTRIAGE_RUN_DIR"):
            return Path(env["TORCHTRIAGE_RUN_DIR"]) / "hang"
    return None


def _request_fresh_dumps(hang_dir: Path, ranks: int) -> Path | None:
    """Ask the armed ranks' watchdogs for their flight-recorder buffers; wait for them, briefly."""
    from torchtriage.runtime.watchdog import REQUEST_FILE

    hang_dir.mkdir(parents=True, exist_ok=True)
    (hang_dir / REQUEST_FILE).write_text(f"requested by torchtriage diagnose at {time.time():.0f}\n")
    deadline = time.monotonic() + _ARMED_WAIT_S
    while time.monotonic() < deadline:
        if len(list(hang_dir.glob("rank*.txt"))) >= ranks:
            break
        time.sleep(0.5)
    fr = hang_dir / "fr"
    return fr if fr.is_dir() and any(fr.iterdir()) else None


def run(args: argparse.Namespace) -> int:
    if args.paths and args.pid:
        raise UsageError("give PATHs (post-mortem) or --pid (live), not both.")
    sources = list(args.paths) + list(args.fr)
    if not args.paths:
        from torchtriage.collect.capture import capture_stacks

        capture = capture_stacks(
            args.pid, Path(args.out) if args.out else None, native=args.native, timeout_s=args.timeout
        )
        pids = [p.target.pid for p in capture.processes]
        hang_dir = _armed_run_dir(pids)
        if hang_dir is not None:
            fresh = _request_fresh_dumps(hang_dir, len(pids))
            if fresh is not None:
                sources.append(str(fresh))
        sources.append(str(capture.folder))
    missing = [p for p in sources + args.logs if not os.path.exists(p)]
    if missing:
        raise UsageError(f"no such file or folder: {', '.join(missing)}")
    verdict = diagnose_paths(sources, extra_logs=args.logs)
    print(render_json(verdict) if args.json else render_text(verdict))
    return exit_codes.PROBLEM_FOUND if verdict.findings else exit_codes.OK
