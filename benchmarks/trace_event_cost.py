"""What one huge profiler-trace event costs to read: this tree's `read_trace` against another commit's.

Usage: python benchmarks/trace_event_cost.py [--base REF] [--base-src DIR] [--sizes 4,16,58] [--runs 3]

Writes, for each size, a trace of one kernel, one event of that many MB (`args` holding a list of numbers, the
shape of a huge "Input Dims"), and another kernel; checks REF (default: the commit before the reader decoded
a value that does not fit its buffer only after doubling it) out into a temporary worktree (or takes its src
folder from `--base-src`) and times, in a process of each tree in turn, `read_trace` of each file. Linear
reading keeps MB/s flat as the event grows; the reader before decoded the event again for every 1 MB chunk
it read (quadratic).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from base_tree import base_src, printed_number  # benchmarks/base_tree.py: run as scripts, this folder is on sys.path

ROOT = Path(__file__).resolve().parents[1]
KERNEL = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ts": 10.0, "dur": 5.0}
TIMED = (
    "import sys, time; from torchtriage.sources.profiler_trace import read_trace; "
    "start = time.perf_counter(); read_trace(sys.argv[1]); print(time.perf_counter() - start)"
)


def _write(path: Path, megabytes: int) -> None:
    event = {"ph": "X", "cat": "cpu_op", "name": "op", "ts": 1, "dur": 1, "args": {"Input Dims": [[1]]}}
    text = json.dumps(event).replace("[[1]]", "[[" + ",".join(["1"] * (megabytes << 19)) + "]]")
    path.write_text('{"traceEvents": [' + json.dumps(KERNEL) + ", " + text + ", " + json.dumps(KERNEL) + "]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="3ac590f")
    parser.add_argument("--sizes", default="4,16,58", help="the event's size in MB, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--base-src", type=Path, help="REF's src folder, already checked out (no worktree is made)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, base_src(args.base, Path(tmp), args.base_src) as base:
        for megabytes in (int(size) for size in args.sizes.split(",")):
            trace = Path(tmp) / f"event_{megabytes}mb.json"
            _write(trace, megabytes)
            size = trace.stat().st_size / (1 << 20)
            pairs = [
                (printed_number(ROOT / "src", TIMED, str(trace)), printed_number(base, TIMED, str(trace)))
                for _ in range(args.runs)
            ]
            this, other = (statistics.median(times) for times in zip(*pairs, strict=True))
            ratios = [a / b for a, b in pairs]
            print(f"one event of {size:5.1f} MB: this {this:7.2f} s ({size / this:5.1f} MB/s), {args.base} "
                  f"{other:7.2f} s ({size / other:5.1f} MB/s); ratio {statistics.median(ratios):.3f} "
                  f"(min {min(ratios):.3f}, max {max(ratios):.3f})", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
