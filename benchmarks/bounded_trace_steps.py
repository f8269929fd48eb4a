"""What a profiler trace of many steps costs to summarise: this tree's `summarise_rank` against another commit's.

Usage: python benchmarks/bounded_trace_steps.py [--base REF] [--base-src DIR] [--steps 2000,10000] [--runs 3]

Writes, for each count, two traces of that many `ProfilerStep#N` (one with a GPU: a kernel launched per step; one
CPU-only), each step holding a `data` range and a collective; checks REF (default: the commit before each step's
record was looked up instead of searched for) out into a temporary worktree (or takes its src folder from
`--base-src`) and times, in a process of each tree in turn, `summarise_rank` of each trace once read. Linear work
keeps the time per step flat as the steps grow; the analysis before searched the list of steps once per step
(and, CPU-only, every collective once per step).
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
TIMED = (
    "import sys, time; from torchtriage.analysis.trace import summarise_rank; "
    "from torchtriage.sources.profiler_trace import read_trace; trace = read_trace(sys.argv[1]); "
    "start = time.perf_counter(); summarise_rank(trace); print(time.perf_counter() - start)"
)
COMM_ARGS = {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024, "dtype": "Float",
             "Process Group Name": "0", "Process Group Ranks": "[0, 1]", "Group size": 2}  # fmt: skip


def _event(cat: str, name: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def _write(path: Path, steps: int, gpu: bool) -> None:
    events = []
    for index in range(steps):
        start = index * 1000.0
        events += [
            _event("user_annotation", f"ProfilerStep#{index}", start, 999),
            _event("user_annotation", "data", start, 100),
            _event("cpu_op", "record_param_comms", start + 7, 50, **COMM_ARGS, **{"External id": index}),
        ]
        if gpu:
            events.append(_event("cuda_runtime", "cudaLaunchKernel", start + 1, 1, correlation=index))
            kernel = _event("kernel", "sm90_gemm", start + 10, 500, correlation=index, **{"External id": index})
            events.append(kernel | {"pid": 0, "tid": 7})
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": events}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="868292f")
    parser.add_argument("--steps", default="2000,10000", help="the traces' step counts, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--base-src", type=Path, help="REF's src folder, already checked out (no worktree is made)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, base_src(args.base, Path(tmp), args.base_src) as base:
        for steps in (int(count) for count in args.steps.split(",")):
            for gpu in (True, False):
                trace = Path(tmp) / f"steps_{steps}_{'gpu' if gpu else 'cpu'}.json"
                _write(trace, steps, gpu)
                pairs = [
                    (printed_number(ROOT / "src", TIMED, str(trace)), printed_number(base, TIMED, str(trace)))
                    for _ in range(args.runs)
                ]
                this, other = (statistics.median(times) for times in zip(*pairs, strict=True))
                ratios = [a / b for a, b in pairs]
                print(f"{steps:>7,} steps ({'GPU' if gpu else 'CPU-only'}): this {this:7.3f} s, {args.base} "
                      f"{other:7.3f} s; ratio {statistics.median(ratios):.4f} "
                      f"(min {min(ratios):.4f}, max {max(ratios):.4f})", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
