"""`torchtriage demo`: a real failure on CPU, diagnosed.

Starts a small torchrun + gloo job (`torchtriage/demo/skip_collective.py`) whose culprit rank runs out
of data and skips one step's all_reduce; its peers wait in that all_reduce until gloo's timeout fires
and the job dies. Then triages the job's own console log, exactly as a user would triage theirs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchtriage import exit_codes
from torchtriage.analysis.pipeline import triage_paths
from torchtriage.errors import EnvironmentProblem, UsageError
from torchtriage.report.json_report import render_json
from torchtriage.report.text import render_text

JOB = Path(__file__).resolve().parent.parent / "demo" / "skip_collective.py"
# The job itself takes a few seconds; torch's import and the timeout dominate. This bounds a run
# that went wrong (a port clash, a stuck launcher) so the demo never hangs a newcomer's terminal.
_LAUNCH_GRACE_S = 90


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument("--culprit", type=int, default=1, help="the rank that skips the collective (default 1)")
    parser.add_argument("--step", type=int, default=3, help="the step whose all_reduce it skips (default 3)")
    parser.add_argument("--timeout", type=int, default=10, help="gloo timeout in seconds (default 10)")
    parser.add_argument("--out", metavar="DIR", help="keep the job's log in DIR (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")


def _say(text: str, quiet: bool) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    if not 2 <= args.ranks <= 16 or not 0 <= args.culprit < args.ranks or args.step < 1 or args.timeout < 1:
        raise UsageError("need 2 <= --ranks <= 16, 0 <= --culprit < --ranks, --step >= 1 and --timeout >= 1.")
    if importlib.util.find_spec("torch") is None:
        raise EnvironmentProblem("the demo runs a real torchrun job and needs torch: pip install torch")
    out_dir = Path(args.out or tempfile.mkdtemp(prefix="torchtriage-demo-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "job.log"
    env = dict(
        os.environ,
        TORCHTRIAGE_DEMO_CULPRIT=str(args.culprit),
        TORCHTRIAGE_DEMO_STEP=str(args.step),
        TORCHTRIAGE_DEMO_TIMEOUT_S=str(args.timeout),
        OMP_NUM_THREADS="1",
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={args.ranks}",
        str(JOB),
    ]
    quiet = args.json
    _say(
        f"torchtriage demo: {args.ranks} ranks on CPU (gloo); rank {args.culprit} runs out of data and skips "
        f"the all_reduce of step {args.step}; the others wait until the {args.timeout} s timeout.",
        quiet,
    )
    _say(f"  $ {' '.join(command[2:])}", quiet)
    start = time.monotonic()
    with open(log_path, "wb") as log:
        try:
            job = subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=args.timeout + _LAUNCH_GRACE_S
            )
            code = job.returncode
        except subprocess.TimeoutExpired:
            code = None
    elapsed = time.monotonic() - start
    ended = f"exit code {code}" if code is not None else "stopped: it outlived its time limit"
    _say(f"  the job ended after {elapsed:.1f} s ({ended}); its log: {log_path}", quiet)
    _say(f"  $ torchtriage triage {log_path}\n", quiet)

    verdict = triage_paths([str(log_path)])
    print(render_json(verdict) if args.json else render_text(verdict))
    if verdict.culprit_ranks == [args.culprit]:
        _say(f"\nThe injected culprit was rank {args.culprit}: the diagnosis is right.", quiet)
        return exit_codes.OK
    _say(
        f"\nThe injected culprit was rank {args.culprit}, but the verdict names {verdict.culprit_ranks}: "
        "this is a bug in torchtriage; please report it with the log above.",
        quiet,
    )
    return exit_codes.PROBLEM_FOUND
