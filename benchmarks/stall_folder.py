"""A stall at thousands of ranks, as `torchtriage run` meets it: every rank's watchdog writes its files into the
run folder, and the reporter waits for them (with a bound) and reads them into the verdict.

Usage: python benchmarks/stall_folder.py [--ranks 16384] [--spread 5] [--missing 0] [--case world_for_subgroup]

The ranks' files (a stack and a flight-recorder dump each, as benchmarks/cross_group.py writes them: a job cut
in two halves, one rank departing) are made beforehand in a staging folder. Then, in a real TCPStore, the
ranks arrive: each rank's files are moved into the run folder at a moment drawn evenly over --spread seconds
(the watchdogs fire at slightly different moments) and the rank adds one to the store's `dumped` counter,
exactly as a watchdog does after dumping. `--missing N` ranks never arrive (their host is gone).

Meanwhile the reporter runs the watchdog's own `_write_verdict`: it polls the counter until every rank has
dumped or its bound passes, then runs `torchtriage diagnose DIR --write-verdict DIR`. Prints the moment the
last rank arrived, how long the reporter waited, how long the read took, the culprit named against the truth.
Target (issue 15): the read at 16,384 ranks in <= 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import cross_group  # benchmarks/cross_group.py: run as scripts, this folder is on sys.path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def arrive(
    staging: Path, run_dir: Path, ranks: list[int], spread: float, store, prefix: str, t0: float, arrived: list
) -> None:
    """Move each rank's files into the run folder at its moment, then count it as the watchdog does."""
    moments = sorted((random.uniform(0, spread), rank) for rank in ranks)
    (run_dir / "fr").mkdir(parents=True, exist_ok=True)
    for moment, rank in moments:
        delay = t0 + moment - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        os.rename(staging / "fr" / f"nccl_trace_rank_{rank}", run_dir / "fr" / f"nccl_trace_rank_{rank}")
        os.rename(staging / f"rank{rank:02d}.txt", run_dir / f"rank{rank:02d}.txt")
        store.add(prefix + "dumped", 1)
        arrived.append(time.monotonic())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=16384)
    parser.add_argument("--spread", type=float, default=5.0, help="seconds over which the ranks' files arrive")
    parser.add_argument("--missing", type=int, default=0, help="ranks whose files never arrive")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--case", default="world_for_subgroup", choices=cross_group.CASES)
    args = parser.parse_args()

    from torch.distributed import TCPStore

    from torchtriage.protocol import WATCHDOG_STORE_PREFIX
    from torchtriage.runtime import watchdog

    world = args.ranks
    culprit = world // 2 + world // 3 if args.case != "early_exit" else world // 3
    base = Path(tempfile.mkdtemp(prefix="stall_folder_"))
    staging, run_dir = base / "staging", base / "run"
    try:
        started = time.perf_counter()
        cross_group.write_case(staging, args.case, world, culprit, args.steps)
        print(f"{world} ranks, {2 * args.steps} entries per dump: made in {time.perf_counter() - started:.0f} s")
        arriving = [r for r in range(world) if r != culprit]
        random.seed(0)
        missing = set(random.sample(arriving, args.missing)) if args.missing else set()
        arriving = [r for r in range(world) if r not in missing]

        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
        os.environ.update(RANK="0", WORLD_SIZE=str(world))
        reporter = watchdog.HangWatchdog(out_dir=run_dir, report=True)
        t0, arrived = time.monotonic(), []
        mover = threading.Thread(
            target=arrive, args=(staging, run_dir, arriving, args.spread, store, WATCHDOG_STORE_PREFIX, t0, arrived)
        )
        mover.start()
        diagnosed: dict[str, float] = {}
        real_run = watchdog.subprocess.run

        def timed_run(*a, **k):  # the reporter's analysis, timed apart from its wait
            diagnosed["start"] = time.monotonic()
            try:
                return real_run(*a, **k)
            finally:
                diagnosed["end"] = time.monotonic()

        watchdog.subprocess.run = timed_run
        reporter._write_verdict(store)
        mover.join()
        verdict_file = run_dir / f"{watchdog.VERDICT_STEM}.json"
        verdict = json.loads(verdict_file.read_text()) if verdict_file.exists() else {}
        named = verdict.get("culprit_ranks")
        read_s = diagnosed.get("end", t0) - diagnosed.get("start", t0)
        print(f"  ranks arrived over {args.spread:.1f} s; {len(missing)} never arrived (the reporter's bound: "
              f"{watchdog._REPORT_WAIT_S:.0f} s)")  # fmt: skip
        print(f"  the reporter waited {diagnosed.get('start', t0) - t0:6.2f} s from the stall")
        print(f"  it read the folder in {read_s:6.2f} s (target <= 10 s)")
        print(f"  the verdict came {diagnosed.get('end', t0) - arrived[-1]:6.2f} s after the last file arrived")
        print(f"  culprit named {named}, truth [{culprit}]: {'right' if named == [culprit] else 'WRONG'}")
        return 0 if named == [culprit] else 1
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
