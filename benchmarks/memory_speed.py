"""`torchtriage memory` against PyTorch's own snapshot tool, on one synthetic snapshot of about --mb MB.

Usage: python benchmarks/memory_speed.py [--mb 1024] [--stacks 3000] [--peer-timeout 1800] [--trace-plot]
                                        [--ours-only] [--keep DIR]

Writes a CUDA memory snapshot with `snapshot_writer` (byte for byte what `pickle.dump` writes for torch's
snapshot dict: one device, a history of allocations and frees each with a 30-frame stack drawn from 3000
distinct stacks, 20,000 live blocks, an OOM as the last event), then runs, each in its own process:
  ours: python -m torchtriage memory PATH --json
  peer: python -m torch.cuda._memory_viz stats PATH       (pickle.load of the file, a summary of its segments)
  with --trace-plot also
        python -m torch.cuda._memory_viz trace_plot PATH -o OUT.html   (the page of the upstream viewer)
and prints each one's wall time and peak memory (summed RSS of the process tree, sampled every 10 ms),
and the ratios. `stats` reads the history but does nothing with it, so it is the least any tool that
loads the pickle can cost; ours replays the history twice and folds every stack to its site.
Issue 5: "snapshots of gigabytes must work (the upstream viewer crashes above 1 GB)".

The peer needs torch; without it only our side runs, and that is said.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from measure import run_measured  # benchmarks/measure.py: run as scripts, this folder is on sys.path
from snapshot_writer import write_snapshot

BYTES_PER_EVENT = 139  # measured on the writer's output: a 30-frame stack of references, 8 fields


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024, help="size of the snapshot to write (MB)")
    parser.add_argument(
        "--stacks", type=int, default=3000, help="distinct stacks in the history (real jobs: thousands)"
    )
    parser.add_argument("--peer-timeout", type=float, default=1800)
    parser.add_argument("--trace-plot", action="store_true", help="also time _memory_viz trace_plot")
    parser.add_argument("--keep", metavar="DIR", help="write the snapshot here and keep it")
    parser.add_argument(
        "--ours-only", action="store_true", help="skip the peer (it needs about 12 times the file in memory)"
    )
    args = parser.parse_args()

    folder = args.keep or tempfile.mkdtemp(prefix="memory-speed-")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "snapshot.pickle")
    events = args.mb * 2**20 // BYTES_PER_EVENT
    started = time.perf_counter()
    write_snapshot(path, events, stacks=args.stacks)
    size = os.path.getsize(path)
    print(
        f"snapshot: {size / 2**20:.0f} MB, {events} history events (written in {time.perf_counter() - started:.0f} s)"
    )

    try:
        rows = [("torchtriage memory", run_measured([sys.executable, "-m", "torchtriage", "memory", path, "--json"],
                                                    args.peer_timeout))]  # fmt: skip
        verdict = json.loads(rows[0][1]["out"])
        device = verdict["facts"]["devices"][0]
        assert device["history_events"] == events, device["history_events"]
        assert device["oom"]["requested"] == 80 << 30, device["oom"]
        print(f"ours: {verdict['summary']}")
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch is not installed: the peer side is skipped")
        else:
            viz = [sys.executable, "-W", "ignore", "-m", "torch.cuda._memory_viz"]
            if not args.ours_only:
                rows.append(("_memory_viz stats", run_measured([*viz, "stats", path], args.peer_timeout)))
            if args.trace_plot and not args.ours_only:
                html = os.path.join(folder, "trace_plot.html")
                rows.append(("_memory_viz trace_plot", run_measured([*viz, "trace_plot", path, "-o", html],
                                                                    args.peer_timeout)))  # fmt: skip
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)

    return _table(rows, size)


def _table(rows: list, size: int) -> int:
    print(f"\n{'tool':<24} {'wall s':>8} {'peak MB':>9} {'peak / file':>12}  status")
    for name, result in rows:
        status = "timed out" if result["timed_out"] else f"exit {result['rc']}"
        if result["rc"] not in (0, 1) and not result["timed_out"]:
            status += " " + (result["err"].strip().splitlines() or [""])[-1][:60]
        share = result["peak_mb"] * 2**20 / size
        print(f"{name:<24} {result['wall_s']:>8.1f} {result['peak_mb']:>9.0f} {share:>12.2f}  {status}")
    ours = rows[0][1]
    for name, result in rows[1:]:
        print(f"{name} / ours: {result['wall_s'] / ours['wall_s']:.1f}x the time, "
              f"{result['peak_mb'] / ours['peak_mb']:.1f}x the memory")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
