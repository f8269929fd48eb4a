"""What the crafted inputs of tests/crafted_files.py are made of: artifacts written from nothing in the shape each
writer gives them (a rank's flight-recorder dump, a profiler trace, a memory snapshot, py-spy's threads,
torchtriage's own records), values no field should hold, and JSON written by hand where json.dumps refuses to
write what an attacker can (NaN, 1e400, 500-digit integers, repeated keys).
"""

from __future__ import annotations

import functools
import json
import random

ESCAPES = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b[31m\x9b1m\u202e\r"
MARKUP = "<script>alert(1)</script><img src=x onerror=alert(2)>"  # must never reach an HTML page as markup
OOM = (
    "[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {r} has a total "
    "capacity of 79.10 GiB of which 1.12 GiB is free.\n"
)

# ------------------------------------------------------------------------------------------ JSON, by hand


class Raw(str):
    """JSON text written as it is: `NaN`, `1e400`, an integer of 500 digits, a cut-off value."""


class Dup(list):
    """An object with its (key, value) pairs in order, keys repeated as they come."""


def to_json(value) -> str:
    """JSON text of `value`, where Raw and Dup write what json.dumps refuses to."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Dup):
        return "{" + ",".join(f"{json.dumps(str(k))}:{to_json(v)}" for k, v in value) + "}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{to_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple, set, frozenset)):  # a pickle's hostile set is JSON's array
        return "[" + ",".join(map(to_json, value)) + "]"
    return json.dumps(value)  # NaN and Infinity as Python writes them


def json_bytes(value) -> bytes:
    return to_json(value).encode("utf-8", "surrogatepass")


# ------------------------------------------------------------------------------------------- hostile values


def hostile(rng: random.Random, in_json: bool) -> tuple[str, object]:
    """(what it is, a value of the wrong kind, range or shape) for any field."""
    values: list[tuple[str, object]] = [
        ("0", 0),
        ("-1", -1),
        ("-2^63", -(2**63)),
        ("2^63", 2**63),
        ("2^64", 2**64),
        ("20 nines", 99999999999999999999),
        ("-999999999999", -999999999999),
        ("the largest rank", 1_048_575),
        ("the largest world", 1_048_576),
        ("2^62", 2**62),
        ("1e300", 1e300),
        ("the largest float", 1.7976931348623157e308),
        ("-1e300", -1e300),
        ("the smallest float", 5e-324),
        ("1.5", 1.5),
        ("-0.0", -0.0),
        ("NaN", float("nan")),
        ("Infinity", float("inf")),
        ("-Infinity", float("-inf")),
        ("True", True),
        ("None", None),
        ("empty text", ""),
        ("digits as text", "12"),
        ("a superscript digit", "²"),
        ("Arabic-Indic digits", "٣٤"),
        ("fullwidth digits", "１２"),
        ("4000 digits as text", "9" * 4000),
        ("20 digits as text", "99999999999999999999"),
        ("text", "abc"),
        ("100k text", "x" * 100_000),
        ("escapes", ESCAPES),
        ("markup", MARKUP),
        ("lone surrogate", "\ud800 \udfff"),
        ("NUL", "a\x00b"),
        ("RTL override", "\u202eevil\u202c"),
        ("empty list", []),
        ("empty object", {}),
        ("mixed list", [1, "2", None, [3], {"4": 5}]),
        ("nested object", {"a": {"b": [1, {"c": None}]}}),
        ("10^5 list", list(range(100_000))),
        ("list of lists", [[i, [i]] for i in range(1000)]),
        ("nested 150", functools.reduce(lambda inner, _: [inner], range(150), 0)),
    ]
    if in_json:
        values += [
            ("1e400", Raw("1e400")),
            ("-1e400", Raw("-1e400")),
            ("500 digits", Raw("9" * 500)),
            ("1e-400", Raw("1e-400")),
            ("float 5000 digits", Raw("0." + "3" * 5000)),
            ("duplicate keys", Dup([("a", 1), ("a", [2]), ("a", {"a": None})])),
        ]
    else:
        values += [
            ("bytes", b"\xff\xfe\x00"),
            ("tuple", (1, "2")),
            ("frozenset", frozenset({1, 2})),
            ("int keys", {0: 1, None: 2, (1, 2): 3}),
            ("bytearray", bytearray(b"12")),
            ("complex nesting", {"a": [(1, 2), {3: frozenset()}]}),
            ("1000-digit int", 10**999),
        ]
    return rng.choice(values)


def _paths(tree, limit: int = 2000) -> list[tuple]:
    """Paths to every value of a tree (lists: their first items only)."""
    found, todo = [], [((), tree)]
    while todo and len(found) < limit:
        path, node = todo.pop()
        if isinstance(node, dict):
            items = list(node.items())
        elif isinstance(node, (list, tuple)):
            items = list(enumerate(node[:4]))
        else:
            items = []
        for key, value in items:
            found.append(path + (key,))
            todo.append((path + (key,), value))
    return found


def _replace(tree, path: tuple, value):
    """A copy of `tree` with the value at `path` replaced (tuples rebuilt as tuples)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(tree, dict):
        copy = dict(tree)
        copy[head] = _replace(tree[head], rest, value)
        return copy
    items = list(tree)
    items[head] = _replace(items[head], rest, value)
    return tuple(items) if isinstance(tree, tuple) else items


def _delete(tree, path: tuple):
    if len(path) == 1:
        if isinstance(tree, dict):
            return {k: v for k, v in tree.items() if k != path[0]}
        return [v for i, v in enumerate(tree) if i != path[0]]
    head = path[0]
    copy = dict(tree) if isinstance(tree, dict) else list(tree)
    copy[head] = _delete(tree[head], path[1:])
    return copy


def attack_tree(rng: random.Random, tree, in_json: bool, touches: int = 1) -> tuple[str, object]:
    """`tree` with `touches` of its values replaced by hostile ones (or removed), and what was done."""
    said = []
    for _ in range(touches):
        paths = _paths(tree)
        if not paths:  # everything removed already
            break
        if rng.random() < 0.9:  # a record whose schema is wrong is skipped whole: mostly keep it, reach the rest
            paths = [p for p in paths if "schema" not in p] or paths
        path = rng.choice(paths)
        shown = "/".join(map(str, path))[:80]
        if rng.random() < 0.15:
            tree = _delete(tree, path)
            said.append(f"{shown} removed")
            continue
        what, value = hostile(rng, in_json)
        tree = _replace(tree, path, value)
        said.append(f"{shown} = {what}")
    return "; ".join(said), tree


# -------------------------------------------------------------------------------------------- templates

T0 = 1_796_007_363_818_259_882


def fr_entry(index: int, state: str = "completed", name: str = "nccl:all_reduce", pg: str = "0") -> dict:
    return {
        "record_id": index,
        "pg_id": 0,
        "process_group": (pg, "default_pg"),
        "collective_seq_id": index + 1,
        "p2p_seq_id": 0,
        "op_id": index + 1,
        "profiling_name": name,
        "time_created_ns": T0 + index * 1_000_000,
        "input_sizes": [[4096]],
        "input_dtypes": ["Float"],
        "output_sizes": [[4096]],
        "output_dtypes": ["Float"],
        "state": state,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": T0 + index * 1_000_000 + 500 if state == "completed" else None,
        "retired": state == "completed",
        "timeout_ms": 600_000,
        "is_p2p": False,
        "frames": [
            {"filename": "/job/train.py", "line": 88, "name": "train_step"},
            {"filename": "/venv/torch/distributed/distributed_c10d.py", "line": 2501, "name": "all_reduce"},
        ],
        "thread_id": "140012032377152",
        "thread_name": "python",
    }


def fr_dump(rank: int, world: int, entries: int) -> dict:
    """A genuine-looking dump of rank `rank`: the last rank stops one collective short of its peers."""
    done = entries - 1 if rank == world - 1 else entries
    rows = [fr_entry(i) for i in range(done - 1)] + [fr_entry(done - 1, state="scheduled")]
    return {
        "version": "2.10",
        "comm_lib_version": "2.21.5",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": done,
                "last_started_collective": done,
                "last_completed_collective": done - 1,
            }
        },
        "entries": rows,
    }


def trace_event(kind: str, ts: float, dur: float, **args) -> dict:
    names = {
        "step": ("user_annotation", "ProfilerStep#3", 608, 608),
        "op": ("cpu_op", "aten::mm", 608, 608),
        "kernel": ("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 7),
        "compute": ("kernel", "sm90_xmma_gemm_bf16", 0, 7),
    }
    cat, name, pid, tid = names[kind]
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def trace(rank: int, world: int = 2) -> dict:
    """Three profiled steps: a launch, a GEMM and an all-reduce each (the CPU's record of it, its launch and its
    kernel, tied by correlation and external ids); the last rank's all-reduce waits longer."""
    base = 5_152_135_549_995.0 + rank * 3
    events = [{"name": "process_name", "ph": "M", "ts": base, "pid": 608, "tid": 0, "args": {"name": "python"}}]
    for step in range(3):
        start, ext = base + step * 4000, 100 + step
        events.append({**trace_event("step", start, 3800), "name": f"ProfilerStep#{step}"})
        events.append(trace_event("op", start + 10, 200))
        events.append(
            {
                **trace_event("op", start + 250, 30),
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "args": {"correlation": step * 3, "External id": ext - 50},
            }
        )
        events.append(trace_event("compute", start + 300, 1500, device=0, stream=7, correlation=step * 3))
        events.append(
            {
                **trace_event("op", start + 1850, 40),
                "name": "record_param_comms",
                "args": {
                    "Collective name": "allreduce",
                    "Process Group Name": "0",
                    "Process Group Description": "default_pg",
                    "Process Group Ranks": str(list(range(world))),
                    "Group size": world,
                    "In msg nelems": 4096,
                    "Out msg nelems": 4096,
                    "dtype": "Float",
                    "External id": ext,
                    "Seq": step + 1,
                },
            }
        )
        events.append(
            {
                **trace_event("op", start + 1860, 20),
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "args": {"correlation": step * 3 + 1, "External id": ext},
            }
        )
        wait = 800 + (world - 1 - rank) * 300
        events.append(
            trace_event(
                "kernel", start + 1900, wait, device=0, stream=7, correlation=step * 3 + 1, **{"External id": ext}
            )
        )
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150_000_000_000}],
        "distributedInfo": {
            "backend": "nccl",
            "rank": rank,
            "world_size": world,
            "pg_count": 1,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": world, "ranks": list(range(world))}],
        },
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1_796_000_000_000_000_000,
        "traceEvents": events,
    }


def frames_of(site: str) -> list[dict]:
    return [
        {"name": "c10::cuda::CUDACachingAllocator::malloc", "filename": "CUDACachingAllocator.cpp", "line": 0},
        {"name": "forward", "filename": f"/job/{site}.py", "line": 42},
    ]


def snapshot() -> dict:
    blocks = [
        {
            "address": 0x7F00_0000_0000,
            "size": 2 << 30,
            "requested_size": 2 << 30,
            "state": "active_allocated",
            "frames": frames_of("model"),
        },
        {"address": 0x7F00_8000_0000, "size": 1 << 30, "requested_size": 0, "state": "inactive", "frames": []},
    ]
    segment = {
        "device": 0,
        "address": 0x7F00_0000_0000,
        "total_size": 3 << 30,
        "allocated_size": 2 << 30,
        "active_size": 2 << 30,
        "requested_size": 2 << 30,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "blocks": blocks,
        "frames": frames_of("model"),
    }
    events = [
        {
            "action": "segment_alloc",
            "addr": 0x7F00_0000_0000,
            "size": 3 << 30,
            "stream": 0,
            "time_us": 1_000,
            "frames": frames_of("model"),
        },
        {
            "action": "alloc",
            "addr": 0x7F00_0000_0000,
            "size": 2 << 30,
            "stream": 0,
            "time_us": 1_010,
            "frames": frames_of("model"),
        },
        {
            "action": "oom",
            "addr": 0,
            "size": 4 << 30,
            "stream": 0,
            "time_us": 1_020,
            "device_free": 1 << 30,
            "frames": frames_of("step"),
        },
    ]
    return {
        "segments": [segment],
        "device_traces": [events],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "expandable_segments": False},
        "external_annotations": [],
    }


def pyspy_threads(rank: int, waiting: bool = True) -> list[dict]:
    frame = {
        "name": "all_reduce",
        "filename": "/venv/torch/distributed/distributed_c10d.py",
        "module": None,
        "short_filename": "distributed_c10d.py",
        "line": 2501,
        "locals": None,
        "is_entry": False,
    }
    user = {**frame, "name": "train_step", "filename": "/job/train.py", "short_filename": "train.py", "line": 88}
    frames = [frame, user] if waiting else [{**user, "name": "compute"}]
    return [
        {
            "pid": 1000 + rank,
            "thread_id": 140709251864256,
            "thread_name": "MainThread",
            "os_thread_id": 1000 + rank,
            "active": not waiting,
            "owns_gil": False,
            "frames": frames,
        }
    ]


def identity(rank: int, world: int = 4) -> dict:
    return {
        "schema": "torchtriage.identity/1",
        "rank": rank,
        "local_rank": rank,
        "world_size": world,
        "host": f"node-{rank // 2}",
        "pid": 4000 + rank,
        "attempt": 0,
        "restart_count": 0,
        "run_id": "job",
        "started_at": "2026-01-01T00:00:00Z",
        "gpu": {"index": rank, "uuid": f"GPU-0000-{rank}", "pci_bus_id": f"00000000:0{rank}:00.0"},
    }


def run_exit() -> dict:
    return {
        "schema": "torchtriage.run_exit/1",
        "line": "torchtriage run: the launcher exited 1",
        "exit_code": 1,
        "signal": None,
        "forwarded_signals": [],
        "launcher": ["torchrun", "train.py"],
        "started_at": "2026-01-01T00:00:00Z",
        "ended_at": "2026-01-01T01:00:00Z",
        "seconds": 3600.0,
    }


def capture_summary(world: int = 4) -> dict:
    processes = [
        {"rank": r, "local_rank": r, "pid": 4000 + r, "world_size": world, "local_world_size": world}
        for r in range(world - 1)
    ]
    return {"schema": "torchtriage.dump", "schema_version": 1, "host": "node-0", "kind": "dump", "processes": processes}


def nonfinite() -> dict:
    return {
        "schema": "torchtriage.nonfinite/1",
        "line": "torchtriage nonfinite: step 12: NaN first in rank 1's loss; suspect: data (batch 7)",
        "step": 12,
        "grad_norm": None,
        "seen_on": [1],
        "ranks": {"1": {"batch_index": 7, "sample_ids": [1, 2], "origin": "loss"}},
        "suspect": "data",
        "evidence": "batch 7",
    }


def monitor_window(rank: int, last: int) -> dict:
    return {
        "schema": "torchtriage.monitor/2",
        "rank": rank,
        "first_step": last - 49,
        "last_step": last,
        "step_ms_p50": 100.0 + rank,
        "step_ms_max": 120.0,
        "data_ms": 5.0,
        "forward_ms": 30.0,
        "backward_ms": 60.0,
        "gpu_forward_ms": 28.0,
        "tokens_per_s": 1e5,
        "mfu": 0.4,
    }


def straggler(rank: int, step: int) -> dict:
    return {
        "schema": "torchtriage.straggler/2",
        "line": f"torchtriage monitor: rank {rank} is slow at step {step}",
        "rank": rank,
        "step": step,
        "phase": "compute",
    }
