"""How often `torchtriage run` calls a healthy job stalled: this tree against another commit, many runs.

Usage: python benchmarks/stall_false_alarms.py [--base REF] [--runs 5] [--seconds 12] [--stall 2]

Runs tests/jobs/harm_job.py (2 ranks, torchrun + gloo, DDP) in its `busy` mode (steps as fast as they go: the
main thread almost always inside backward() when the watchdog looks) and its `idle` mode (each step waits
0.5 s in the gradient all_reduce for rank 0), under `run --stall-seconds STALL`, from this tree and from REF
(checked out into a temporary worktree), alternating. Prints, per tree and mode, how many runs left a stall
verdict in the run folder (every one is false: the jobs never stop moving) and how many ended with exit 0.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from base_tree import base_src  # benchmarks/base_tree.py: run as scripts, this folder is on sys.path

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "jobs" / "harm_job.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
LAUNCHER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
            "MASTER_PORT")  # fmt: skip


def _one_run(src: Path, mode: str, out: Path, seconds: float, stall: float) -> tuple[bool, int]:
    """(a stall verdict was written, the exit code)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER and not k.startswith("TORCHELASTIC_")}
    env.update(PYTHONPATH=str(src), HARM_MODE=mode, HARM_SECONDS=str(seconds), HARM_PAUSE="0.5")
    command = [sys.executable, "-m", "torchtriage", "run", "--out", str(out), "--stall-seconds", str(stall), "--",
               str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(JOB)]  # fmt: skip
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=seconds * 10 + 120, check=False)  # fmt: skip
    return (out / "hang" / "verdict.json").exists(), done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="3ac590f")  # the last commit before progress counters
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--stall", type=float, default=2.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, base_src(args.base, Path(tmp)) as base:
        trees = {"this tree": ROOT / "src", args.base: base}
        counts = {(tree, mode): [0, 0] for tree in trees for mode in ("busy", "idle")}
        for run in range(args.runs):
            for mode in ("busy", "idle"):
                for tree, src in trees.items():
                    stalled, code = _one_run(src, mode, Path(tmp) / f"{tree}-{mode}-{run}", args.seconds, args.stall)
                    counts[tree, mode][0] += stalled
                    counts[tree, mode][1] += code == 0
    print(f"{args.runs} runs each, {args.seconds:g} s of steps, --stall-seconds {args.stall:g}")
    print(f"{'tree':<14}{'mode':<6}{'false stall verdicts':>22}{'exit 0':>8}")
    for (tree, mode), (stalled, clean) in counts.items():
        print(f"{tree:<14}{mode:<6}{f'{stalled} of {args.runs}':>22}{f'{clean} of {args.runs}':>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
