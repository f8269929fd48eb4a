"""The case table of hangs across process groups: each family x size, verdict right or not, time to verdict.

Usage: python benchmarks/cross_group.py [--ranks 1024 4096 16384] [--steps 100] [--cases ...] [--group-size N]
       [--format torch|plain] [--torch] [--floor]

For each case and size, writes a post-mortem folder as `torchtriage run` leaves it (every rank's stack in
py-spy's text form, `rankNN.txt`, and its NCCL flight-recorder dump under `fr/`, pickle, states recorded),
of a job whose world is cut into two halves (or, with --group-size N, into groups of N ranks, so that each
group's ranks have groups of their own, as tensor-parallel groups do): every step all_reduces in the rank's
half (`sync_subgroup`),
then on the world (`sync_world`), for --steps steps; at the last one the culprit departs as the case
says (the families of tests/jobs/cross_group.py, recorded for real in tests/fixtures/fr_cross_group).
The dumps are written as torch's pickler writes them (--format torch): each distinct string once, then
referred to (its memo goes by value), a frame's dict shared by the entries called from it, `pg_id` the
group's id in its process (0 for the world, 1 for the rank's subgroup) and `pg_status` keyed by it; and, as
on NCCL, whose ops return at once, a rank has issued the rest of its step behind the op it waits in
(tests/fixtures/fr_cross_group_nccl). With --format plain they are Python's pickle of fresh objects (every
entry's strings and frames its own, `pg_id` the group's name), each rank stopped at the op it waits in, as
this benchmark wrote them before:

    world_for_subgroup   the culprit all_reduces on the world where its half uses the half's group
    opposite_order       it calls the world all_reduce before its half's
    subgroup_barrier     it enters a barrier on its half where its peers call the world all_reduce
    early_exit           it waits in the world barrier of the end of training

Then times `torchtriage diagnose DIR --json` (stacks and flight recorder fused) and prints whether it
named the culprit alone, its peak memory, and, with --torch, PyTorch's `fr_trace` on the same dumps
(its culprit and time: the ratio); with --floor, the C unpickler alone over the same dumps on every core
(the part of the time no reader of these pickles avoids). Targets: the culprit named in every case;
16,384 ranks in <= 10 s and <= 1 GB on 2 cores.
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
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from measure import run_measured  # benchmarks/measure.py: run as scripts, this folder is on sys.path

CASES = ("world_for_subgroup", "opposite_order", "subgroup_barrier", "early_exit")
LIB = "/opt/venv/lib/python3.12/site-packages/torch/distributed"
JOB = "/workspace/train.py"
LINES = {
    "sync_subgroup": 54,
    "sync_world": 58,
    "all_reduce_on_the_world_instead": 62,
    "wait_for_subgroup": 66,
    "end_of_training": 70,
}


def _frames(op: str, function: str) -> list[dict]:
    return [
        {"name": op, "filename": f"{LIB}/distributed_c10d.py", "line": 3068 if op == "all_reduce" else 4712},
        {"name": "wrapper", "filename": f"{LIB}/c10d_logger.py", "line": 83},
        {"name": function, "filename": JOB, "line": LINES[function]},
        {"name": "step", "filename": JOB, "line": 77},
        {"name": "main", "filename": JOB, "line": 111},
    ]


def program(
    case: str, rank: int, world: int, culprit: int, steps: int, half: int, issued_ahead: bool = True
) -> list[tuple[str, str, str, bool]]:
    """This rank's ops in order: (group, op, function, completes); `half` is the size of its subgroup.

    `issued_ahead`: as on NCCL, whose ops return at once, a rank has issued the rest of its step behind the op
    it waits in (recorded pending too); as on gloo, it stops at that op."""
    sub = str(1 + rank // half)
    ops = []
    for _ in range(steps - 1):
        ops += [(sub, "all_reduce", "sync_subgroup", True), ("0", "all_reduce", "sync_world", True)]
    in_culprits_half = rank // half == culprit // half
    if rank == culprit:
        last = {
            "world_for_subgroup": [("0", "all_reduce", "all_reduce_on_the_world_instead", False)]
            + [("0", "all_reduce", "sync_world", False)] * issued_ahead,
            "opposite_order": [("0", "all_reduce", "sync_world", False)]
            + [(sub, "all_reduce", "sync_subgroup", False)] * issued_ahead,
            "subgroup_barrier": [
                (sub, "all_reduce", "sync_subgroup", True),
                (sub, "barrier", "wait_for_subgroup", False),
            ],
            "early_exit": [("0", "barrier", "end_of_training", False)],
        }[case]
    elif in_culprits_half and case != "subgroup_barrier":
        last = [(sub, "all_reduce", "sync_subgroup", False)]  # waits for the culprit in the half
        last += [("0", "all_reduce", "sync_world", False)] * issued_ahead
    else:
        last = [(sub, "all_reduce", "sync_subgroup", True), ("0", "all_reduce", "sync_world", False)]
    return ops + last


def make_dump(
    case: str, rank: int, world: int, culprit: int, steps: int, config: dict, half: int, form: str = "torch"
) -> bytes:
    records, seqs, status = [], {}, {}
    t0 = 1_796_007_263_000_000_000 + rank * 1000
    frames_of: dict[tuple[str, str], list[dict]] = {}
    for i, (group, op, function, completes) in enumerate(
        program(case, rank, world, culprit, steps, half, issued_ahead=form == "torch")
    ):
        seq = seqs[group] = seqs.get(group, 0) + 1
        enqueued, completed = status.get(group, (0, 0))
        status[group] = (seq, seq if completes else completed)
        if form == "torch":  # one dict per distinct frame, a new list per entry
            frames = list(frames_of.setdefault((op, function), _frames(op, function)))
        else:
            frames = _frames(op, function)
        records.append(
            {
                "frames": frames,
                "record_id": i,
                "pg_id": (0 if group == "0" else 1) if form == "torch" else int(group),
                "process_group": (group, "default_pg" if group == "0" else f"half{group}"),
                "collective_seq_id": seq,
                "p2p_seq_id": 0,
                "op_id": seq,
                "profiling_name": f"nccl:{op}",
                "time_created_ns": t0 + i * 1_000_000,
                "input_sizes": [[4096]] if op == "all_reduce" else [],
                "input_dtypes": ["Float"] if op == "all_reduce" else [],
                "output_sizes": [[4096]] if op == "all_reduce" else [],
                "output_dtypes": ["Float"] if op == "all_reduce" else [],
                "state": "completed" if completes else "scheduled",
                "time_discovered_started_ns": None,
                "time_discovered_completed_ns": t0 + i * 1_000_000 + 500_000 if completes else None,
                "retired": completes,
                "timeout_ms": 600_000,
                "is_p2p": False,
            }
        )
    own = {"0": config["0"], str(1 + rank // half): config[str(1 + rank // half)]}
    pg_status = {
        (str(0 if g == "0" else 1) if form == "torch" else g): {
            "last_enqueued_collective": e,
            "last_started_collective": -1,
            "last_completed_collective": c,
        }
        for g, (e, c) in status.items()
    }
    dump = {
        "version": "2.10",
        "pg_config": own,
        "comm_lib_version": "2.28.9",
        "pg_status": pg_status,
        "entries": records,
    }
    return pickle.dumps(_strings_by_value(dump, {}) if form == "torch" else dump, protocol=2)


def _strings_by_value(value, seen: dict, made: dict | None = None):
    """The value with equal strings made one object, so that pickle's memo (by object) writes each once; a
    container shared stays shared (`made`: id -> its copy)."""
    made = {} if made is None else made
    if type(value) is str:
        return seen.setdefault(value, value)
    if type(value) not in (dict, list, tuple):
        return value
    if id(value) in made:
        return made[id(value)]
    if type(value) is dict:
        copy = {_strings_by_value(k, seen, made): _strings_by_value(v, seen, made) for k, v in value.items()}
    else:
        copy = type(value)(_strings_by_value(item, seen, made) for item in value)
    made[id(value)] = copy
    return copy


def make_stack(case: str, rank: int, world: int, culprit: int, half: int) -> str:
    group, op, function, _ = program(case, rank, world, culprit, 1, half, issued_ahead=False)[-1]  # where it blocks
    frames = _frames(op, function)
    lines = [
        f"Process {40000 + rank}: python {JOB}",
        "Python v3.12.3 (/opt/venv/bin/python3)",
        "",
        'Thread 0x7f00 (idle): "MainThread"',
    ]
    lines += [f"    {f['name']} ({f['filename']}:{f['line']})" for f in frames]
    return "\n".join(lines) + "\n"


def _write_one(args: tuple) -> None:
    folder, case, rank, world, culprit, steps, config, half, form = args
    dump = make_dump(case, rank, world, culprit, steps, config, half, form)
    (Path(folder) / "fr" / f"nccl_trace_rank_{rank}").write_bytes(dump)
    (Path(folder) / f"rank{rank:02d}.txt").write_text(make_stack(case, rank, world, culprit, half))


def write_case(
    folder: Path, case: str, world: int, culprit: int, steps: int, half: int | None = None, form: str = "torch"
) -> None:
    """`half`: the ranks of each subgroup (default: half the world); `form`: "torch" or "plain" (see above)."""
    (folder / "fr").mkdir(parents=True)
    half = half or world // 2
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
    for h in range(world // half):
        name = str(1 + h)
        config[name] = {"name": name, "desc": f"half{name}", "ranks": str(list(range(h * half, (h + 1) * half)))}
    jobs = [(str(folder), case, r, world, culprit, steps, config, half, form) for r in range(world)]
    with ProcessPoolExecutor() as pool:
        list(pool.map(_write_one, jobs, chunksize=64))


def _unpickle_share(paths: list[str]) -> None:
    for path in paths:
        with open(path, "rb") as handle:
            pickle.loads(handle.read())


def unpickling_floor(folder: Path) -> float:
    """Seconds the C unpickler alone takes over the folder's dumps on every core: no reader can go below it."""
    import time

    paths = sorted(str(p) for p in (folder / "fr").iterdir())
    jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    started = time.perf_counter()
    with ProcessPoolExecutor(jobs) as pool:
        list(pool.map(_unpickle_share, [paths[i::jobs] for i in range(jobs)]))
    return time.perf_counter() - started


def torch_fr_trace(folder: Path, timeout: float):
    """PyTorch's analyzer on the dumps: the ranks it blames ("Culprit rank N", "missing ranks: {...}")."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.flight_recorder.fr_trace",
        str(folder / "fr"),
        "-p",
        "nccl_trace_rank_",
    ]
    done = run_measured(command, timeout, merge_stderr=True)
    blamed = {int(r) for r in re.findall(r"Culprit rank (\d+)", done["out"])}
    for listed in re.findall(r"missing ranks: \{([\d, ]*)\}", done["out"]):
        blamed |= {int(r) for r in listed.split(",") if r.strip()}
    return done, sorted(blamed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--format", choices=("torch", "plain"), default="torch", help="how the dumps are pickled")
    parser.add_argument(
        "--group-size", type=int, help="ranks per subgroup (default: half the world); 8 gives every 8 ranks a group"
    )
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--torch", action="store_true", help="also run PyTorch's fr_trace on the dumps")
    parser.add_argument("--floor", action="store_true", help="also time the C unpickler alone over the dumps")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="cross_group_"))
    print(
        f"python {sys.version.split()[0]}, {len(os.sched_getaffinity(0))} cores; "
        f"{args.steps} steps, {2 * args.steps} entries per dump; dumps pickled as {args.format}; "
        f"subgroups of {args.group_size or 'half the world'}"
    )
    print(
        f"{'case':<20} {'ranks':>6}  {'culprit':>7}  {'named':<8} {'right':<5} {'time':>7} {'peak MB':>8}  decided by"
    )
    wrong = 0
    try:
        for world in args.ranks:
            for case in args.cases:
                culprit = world // 2 + world // 3 if case != "early_exit" else world // 3  # one in each half
                folder = base / f"{case}_{world}"
                write_case(folder, case, world, culprit, args.steps, args.group_size, args.format)
                done = run_measured([sys.executable, "-m", "torchtriage", "diagnose", str(folder), "--json"], 600)
                verdict = json.loads(done["out"]) if done["out"].strip().startswith("{") else {}
                named = verdict.get("culprit_ranks")
                right = named == [culprit]
                wrong += not right
                decided = verdict.get("facts", {}).get("flight_recorder", {}).get("decided_by", "")
                print(
                    f"{case:<20} {world:>6}  {culprit:>7}  {str(named):<8} {'yes' if right else 'NO':<5} "
                    f"{done['wall_s']:>6.2f}s {done['peak_mb']:>8.0f}  {decided}"
                )
                if args.floor:
                    floor = unpickling_floor(folder)
                    print(f"{'  unpickling alone':<20} {world:>6}  {'':>7}  {'':<8} {'':<5} {floor:>6.2f}s", end="")
                    print("  (the C unpickler over the dumps, on every core)")
                if args.torch:
                    theirs, blamed = torch_fr_trace(folder, 900)
                    shown = str(blamed) if len(blamed) < 4 else f"{len(blamed)} ranks"
                    print(
                        f"{'  PyTorch fr_trace':<20} {world:>6}  {culprit:>7}  {shown:<8} "
                        f"{'yes' if blamed == [culprit] else 'NO':<5} {theirs['wall_s']:>6.2f}s "
                        f"{theirs['peak_mb']:>8.0f}  ratio {theirs['wall_s'] / max(done['wall_s'], 1e-9):.1f}x"
                    )
                shutil.rmtree(folder)
        print(
            f"\n{'every case right' if not wrong else f'{wrong} case(s) wrong'}; "
            "target at 16384 ranks: <= 10 s, <= 1024 MB"
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
