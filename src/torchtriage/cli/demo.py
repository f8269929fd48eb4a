"""`torchtriage demo`: a real failure on CPU, diagnosed twice — from its log after it died, and live.

The job (`torchtriage/demo/skip_collective.py`, torchrun + gloo) has a culprit rank that runs out of
data and skips one step's all_reduce for the end-of-epoch barrier, while its peers wait in that
all_reduce.

1. After the fact: with a short timeout the job dies; its console log is triaged, as a user would.
2. Live: the same job, started with `torchtriage run` and a long timeout, hangs; while it is alive,
   `torchtriage diagnose` captures every rank's stack, asks the armed ranks for their flight-recorder
   buffers, and fuses both into the verdict. Then the job is stopped.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchtriage import exit_codes
from torchtriage.analysis.pipeline import triage_paths
from torchtriage.errors import EnvironmentProblem, UsageError
from torchtriage.model import Verdict
from torchtriage.report.json_report import json_text
from torchtriage.report.text import render_text

JOB = Path(__file__).resolve().parent.parent / "demo" / "skip_collective.py"
# The job itself takes a few seconds; torch's import and the timeout dominate. This bounds a run
# that went wrong (a port clash, a stuck launcher) so the demo never hangs a newcomer's terminal.
_LAUNCH_GRACE_S = 90
# The culprit does a second of end-of-epoch work before its barrier (see the job): give it that.
_SETTLE_S = 2.5
_LIVE_TIMEOUT_S = 600  # long enough that the live job hangs rather than times out


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument("--culprit", type=int, default=1, help="the rank that skips the collective (default 1)")
    parser.add_argument("--step", type=int, default=3, help="the step whose all_reduce it skips (default 3)")
    parser.add_argument("--timeout", type=int, default=10, help="gloo timeout of the first job in seconds (default 10)")
    parser.add_argument(
        "--part", choices=("log", "live", "both"), default="both", help="triage a dead job's log, diagnose a live one"
    )
    parser.add_argument("--out", metavar="DIR", help="keep logs and captures in DIR (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help='print {"log": verdict, "live": verdict} as JSON')


def _say(text: str, quiet: bool) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


def _job_env(args: argparse.Namespace, timeout_s: int) -> dict[str, str]:
    return dict(
        os.environ,
        TORCHTRIAGE_DEMO_CULPRIT=str(args.culprit),
        TORCHTRIAGE_DEMO_STEP=str(args.step),
        TORCHTRIAGE_DEMO_TIMEOUT_S=str(timeout_s),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )


def _torchrun(args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ranks}", str(JOB)]


def _after_the_fact(args: argparse.Namespace, out_dir: Path, quiet: bool) -> Verdict:
    log_path = out_dir / "job.log"
    _say(
        f"1. After the fact: {args.ranks} ranks on CPU (gloo); rank {args.culprit} runs out of data and skips the "
        f"all_reduce of step {args.step}; the others wait until the {args.timeout} s timeout kills the job.",
        quiet,
    )
    _say(f"   $ torchrun --standalone --nproc_per_node={args.ranks} {JOB.name} > {log_path} 2>&1", quiet)
    start = time.monotonic()
    with open(log_path, "wb") as log:
        try:
            job = subprocess.run(
                _torchrun(args),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_job_env(args, args.timeout),
                timeout=args.timeout + _LAUNCH_GRACE_S,
            )
            ended = f"exit code {job.returncode}"
        except subprocess.TimeoutExpired:
            ended = "stopped: it outlived its time limit"
    _say(f"   the job ended after {time.monotonic() - start:.1f} s ({ended})", quiet)
    _say(f"   $ torchtriage triage {log_path}\n", quiet)
    verdict = triage_paths([str(log_path)])
    _say(render_text(verdict), quiet)
    return verdict


def _stuck(log_path: Path, args: argparse.Namespace) -> bool:
    """Every rank has reached the step where the culprit leaves: the job now hangs."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    peers_there = (
        all(f"rank {r} | step {args.step - 1} |" in text for r in range(args.ranks) if r != args.culprit)
        or args.step == 1
    )
    return peers_there and f"rank {args.culprit} | epoch done" in text


def _job_processes(launcher_pid: int) -> list[int]:
    """Every process under the launcher (torchrun's agent and its workers, in their own sessions)."""
    from torchtriage.collect.discovery import read_process_table

    table = read_process_table()
    found, frontier = [], [launcher_pid]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, facts in table.items() if facts.ppid == parent]
        found += children
        frontier += children
    return found


def _stop(launcher: subprocess.Popen) -> None:
    for pid in [*_job_processes(launcher.pid), launcher.pid]:
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    launcher.wait()


def _live(args: argparse.Namespace, out_dir: Path, quiet: bool) -> Verdict:
    from torchtriage.collect.discovery import is_agent, read_process_table
    from torchtriage.collect.live import diagnose_live

    run_dir, log_path = out_dir / "run", out_dir / "live-job.log"
    _say(
        "\n2. Live: the same job started with `torchtriage run` and a long timeout, so it hangs; diagnosed "
        "while it is alive.",
        quiet,
    )
    command = [sys.executable, "-m", "torchtriage", "run", "--out", str(run_dir), "--", *_torchrun(args)]
    _say(f"   $ torchtriage run -- torchrun --standalone --nproc_per_node={args.ranks} {JOB.name}", quiet)
    with open(log_path, "wb") as log:
        launcher = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=_job_env(args, _LIVE_TIMEOUT_S), start_new_session=True
        )
    try:
        deadline = time.monotonic() + _LAUNCH_GRACE_S
        while not _stuck(log_path, args):
            if launcher.poll() is not None or time.monotonic() > deadline:
                raise EnvironmentProblem(f"the live demo job did not reach its hang; its log: {log_path}")
            time.sleep(0.3)
        time.sleep(_SETTLE_S)
        table = read_process_table()
        agents = [pid for pid in _job_processes(launcher.pid) if pid in table and is_agent(table[pid].cmdline)]
        _say(f"   the job is stuck; $ torchtriage diagnose --pid {agents[0] if agents else launcher.pid}\n", quiet)
        verdict = diagnose_live(agents[:1] or None, out_dir / "captures")
    finally:
        _stop(launcher)
    _say(render_text(verdict), quiet)
    _say("   (the job was stopped)", quiet)
    return verdict


def run(args: argparse.Namespace) -> int:
    if not 2 <= args.ranks <= 16 or not 0 <= args.culprit < args.ranks or args.step < 1 or args.timeout < 1:
        raise UsageError("need 2 <= --ranks <= 16, 0 <= --culprit < --ranks, --step >= 1 and --timeout >= 1.")
    if importlib.util.find_spec("torch") is None:
        raise EnvironmentProblem("the demo runs a real torchrun job and needs torch: pip install torch")
    out_dir = Path(args.out or tempfile.mkdtemp(prefix="torchtriage-demo-")).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    quiet = args.json
    verdicts: dict[str, Verdict] = {}
    if args.part in ("log", "both"):
        verdicts["log"] = _after_the_fact(args, out_dir, quiet)
    if args.part in ("live", "both"):
        verdicts["live"] = _live(args, out_dir, quiet)
    if args.json:
        print(json_text({part: v.to_json() for part, v in verdicts.items()}))
    wrong = {part: v.culprit_ranks for part, v in verdicts.items() if v.culprit_ranks != [args.culprit]}
    if not wrong:
        _say(f"\nThe injected culprit was rank {args.culprit}: every diagnosis names it.", quiet)
        return exit_codes.OK
    _say(
        f"\nThe injected culprit was rank {args.culprit}, but {wrong} was named: this is a bug in torchtriage; "
        f"please report it with the files in {out_dir}.",
        quiet,
    )
    return exit_codes.PROBLEM_FOUND
