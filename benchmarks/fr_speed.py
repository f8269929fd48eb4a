"""`torchtriage fr` against PyTorch's own flight-recorder analyzer, on identical synthetic dumps.

Usage: python benchmarks/fr_speed.py [--ranks 1024 4096] [--entries 200] [--torch-timeout 900] [--keep DIR]

For each size, writes one dump per rank in the real format (protocol-2 pickles as torch's C++ pickler writes
them: shared frame dicts and strings memoized, `pg_config` ranks as a string, `pg_status` counters), with one
injected bug: rank CULPRIT (not rank 0, which PyTorch's analyzer always trusts) all_reduces a different size
from a different call site at seq ENTRIES-20. Then runs, one after the other on the same files,
`python -m torch.distributed.flight_recorder.fr_trace DIR -p nccl_trace_rank_` and
`python -m torchtriage fr DIR --json`, and prints each one's wall time, peak memory (the summed RSS of the
process tree, sampled every 10 ms, and ru_maxrss) and the culprit it names, and the ratio.
Targets: >= 20x faster than PyTorch's at 1024x200; 4096x200 in <= 10 s with <= 1 GB peak on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from measure import run_measured  # benchmarks/measure.py: run as scripts, this folder is on sys.path

PREFIX = "nccl_trace_rank_"
LIB = "/opt/venv/lib/python3.12/site-packages/torch/distributed"
_TORCH_FRAMES = (
    {"name": "all_reduce", "filename": f"{LIB}/distributed_c10d.py", "line": 3068},
    {"name": "wrapper", "filename": f"{LIB}/c10d_logger.py", "line": 83},
)
_USER = [{"name": "train_step", "filename": "/workspace/train.py", "line": 88}]
_BAD_USER = [{"name": "train_step", "filename": "/workspace/train.py", "line": 91}]
_OUTER = (
    {"name": "train", "filename": "/workspace/train.py", "line": 140},
    {"name": "<module>", "filename": "/workspace/train.py", "line": 171},
)


def make_dump(rank: int, world: int, entries: int, culprit: int, ranks_text: str) -> bytes:
    bad_seq = entries - 20
    good_frames = [*_TORCH_FRAMES, *_USER, *_OUTER]
    bad_frames = [*_TORCH_FRAMES, *_BAD_USER, *_OUTER]
    records = []
    t0 = 1_796_007_263_000_000_000 + rank * 1000
    for i in range(entries):
        seq = i + 1
        bad = rank == culprit and seq == bad_seq
        numel = 8192 if bad else 4096
        last = seq == entries
        records.append(
            {
                "frames": list(bad_frames if bad else good_frames),
                "record_id": i,
                "pg_id": 0,
                "process_group": ("0", "default_pg"),
                "thread_name": "pt_main_thread",
                "thread_id": "140576359305536",
                "collective_seq_id": seq,
                "p2p_seq_id": 0,
                "op_id": seq,
                "profiling_name": "nccl:all_reduce",
                "time_created_ns": t0 + i * 1_000_000,
                "input_sizes": [[numel]],
                "input_dtypes": ["Float"],
                "output_sizes": [[numel]],
                "output_dtypes": ["Float"],
                "state": "scheduled" if last else "completed",
                "time_discovered_started_ns": None,
                "time_discovered_completed_ns": None if last else t0 + i * 1_000_000 + 500_000,
                "retired": not last,
                "timeout_ms": 600_000,
                "is_p2p": False,
            }
        )
    dump = {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks_text}},
        "comm_lib_version": "2.28.9",
        "pg_status": {
            "0": {
                "last_enqueued_collective": entries,
                "last_started_collective": -1,
                "last_completed_collective": entries - 1,
            }
        },
        "entries": records,
    }
    return pickle.dumps(dump, protocol=2)


def _write_one(args: tuple) -> None:
    folder, rank, world, entries, culprit, ranks_text = args
    (Path(folder) / f"{PREFIX}{rank}").write_bytes(make_dump(rank, world, entries, culprit, ranks_text))


def write_dumps(folder: Path, world: int, entries: int, culprit: int) -> None:
    ranks_text = str(list(range(world)))
    jobs = [(str(folder), r, world, entries, culprit, ranks_text) for r in range(world)]
    with ProcessPoolExecutor() as pool:
        list(pool.map(_write_one, jobs, chunksize=64))


def torch_culprits(output: str) -> list[int]:
    return sorted({int(r) for r in re.findall(r"Culprit rank (\d+)", output)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--entries", type=int, default=200)
    parser.add_argument("--torch-timeout", type=float, default=900)
    parser.add_argument("--skip-torch-above", type=int, default=1 << 30, help="do not run PyTorch's above N ranks")
    parser.add_argument("--keep", metavar="DIR", help="write the dumps under DIR and keep them")
    args = parser.parse_args()
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="fr_speed_"))
    print(f"python {sys.version.split()[0]}, {len(os.sched_getaffinity(0))} cores; dumps under {base}")
    try:
        for world in args.ranks:
            culprit = world // 3 + 1
            folder = base / f"{world}x{args.entries}"
            if not folder.exists():
                folder.mkdir(parents=True)
                t = time.perf_counter()
                write_dumps(folder, world, args.entries, culprit)
                size = sum(f.stat().st_size for f in folder.iterdir()) / 2**20
                print(
                    f"\n{world} ranks x {args.entries} entries: wrote {size:.0f} MB in {time.perf_counter() - t:.1f} s"
                )
            else:
                print(f"\n{world} ranks x {args.entries} entries (reusing {folder})")
            print(f"  injected: rank {culprit} all_reduces 8192 elements instead of 4096 at seq {args.entries - 20}")

            ours = run_measured(
                [sys.executable, "-m", "torchtriage", "fr", str(folder), "--json"], 600, merge_stderr=True
            )
            verdict = json.loads(ours["out"][ours["out"].index("{") :]) if "{" in ours["out"] else {}
            ours_culprits = verdict.get("culprit_ranks")
            print(
                f"  torchtriage fr : {ours['wall_s']:7.2f} s  peak {ours['peak_mb']:6.0f} MB  "
                f"culprit {ours_culprits}  (exit {ours['rc']})"
            )
            if world > args.skip_torch_above:
                print("  PyTorch fr_trace: skipped (--skip-torch-above)")
                continue
            theirs = run_measured(
                [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder), "-p", PREFIX],
                args.torch_timeout,
                merge_stderr=True,  # it logs the culprit on stderr
            )
            if theirs["timed_out"]:
                print(f"  PyTorch fr_trace: did not finish in {args.torch_timeout:.0f} s")
                continue
            their_culprits = torch_culprits(theirs["out"])
            print(
                f"  PyTorch fr_trace: {theirs['wall_s']:7.2f} s  peak {theirs['peak_mb']:6.0f} MB  "
                f"culprit {their_culprits}  (exit {theirs['rc']})"
            )
            print(
                f"  ratio: torchtriage is {theirs['wall_s'] / ours['wall_s']:.1f}x faster; same culprit: "
                f"{ours_culprits == their_culprits} (truth: [{culprit}])"
            )
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
