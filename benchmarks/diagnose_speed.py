"""Time to a verdict of `torchtriage diagnose` on a live hung job, against dumping the ranks by hand.

Usage: python benchmarks/diagnose_speed.py [--ranks 8 64]

For each size, starts tests/jobs/hang.py under torchrun with the gloo backend on CPU (HANG_MODE=skip:
the last rank sleeps while the others wait in all_reduce), waits until every rank has reached the
hang, then times from the command's start:
- `torchtriage diagnose --pid <agent> --json` — discovery, preflight, py-spy on all ranks at once,
  analysis and the fused verdict;
- the manual way users take today: `py-spy dump --pid` on each rank, one after the other (and
  reading them is still left to do).
Prints both times, the ratio and the culprit named. Targets: <= 5 s at 8 ranks, <= 2 s at 64 ranks on one node.
Each worker imports torch (about 150-300 MB each): 64 ranks need a machine with the memory for them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from hung_job import HungJob  # noqa: E402

PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[8])
    args = parser.parse_args()
    for ranks in args.ranks:
        culprit = ranks - 1
        print(f"{ranks} ranks (gloo, CPU), culprit rank {culprit}: starting the job ...", flush=True)
        with HungJob(mode="skip", culprit=culprit, ranks=ranks, ready_timeout=600) as job:
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "torchtriage", "diagnose", "--pid", str(job.proc.pid), "--json"],
                capture_output=True,
                text=True,
            )
            ours = time.perf_counter() - start
            verdict = json.loads(done.stdout) if done.stdout.strip() else {}
            start = time.perf_counter()
            for pid in job.ready.values():
                subprocess.run([PY_SPY, "dump", "--pid", str(pid)], capture_output=True)
            manual = time.perf_counter() - start
        target = 5.0 if ranks <= 8 else 2.0
        print(
            f"  torchtriage diagnose: {ours:6.2f} s  culprit {verdict.get('culprit_ranks')} "
            f"(truth [{culprit}], sources {verdict.get('facts', {}).get('sources_used')})"
        )
        print(f"  py-spy dump, rank after rank (no verdict): {manual:6.2f} s; ratio {manual / ours:.1f}x")
        print(f"  target <= {target:g} s at {ranks} ranks: {'MET' if ours <= target else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
