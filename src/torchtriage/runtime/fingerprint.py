"""Collective fingerprint checking: catch a mismatched collective before it hangs.

Inside `with check_collectives():` (or for a whole run with `TORCHTRIAGE_CHECK_COLLECTIVES=1`, which
`init_distributed()` honours through `enable_from_env()`), every call to these `torch.distributed`
functions is checked before it is issued: all_reduce, all_gather, all_gather_into_tensor,
reduce_scatter, reduce_scatter_tensor, broadcast, all_to_all, all_to_all_single, barrier, reduce,
gather, scatter.

The check goes through the c10d store, never through the communicator that would hang: each rank
publishes a fingerprint of the call (op, reduce op, root, shapes, dtypes, call site) under a key for
(process group, per-group sequence number) and waits, bounded, for its peers' fingerprints. When they
disagree, every rank raises the same `CollectiveMismatchError`, with expected vs actual per rank, before
the mismatched collective is issued. When ranks wait on each other at collectives of different process
groups (a cycle no rank can leave), they raise too, naming the cycle. When a peer never arrives, the wait
ends after `TORCHTRIAGE_CHECK_COLLECTIVES_TIMEOUT` seconds (default: `DIST_NCCL_TIMEOUT_MINUTES`) with the
peer's last known collective.

Cost (debug time only; zero when off, since nothing is patched): four store round trips per collective
(set, wait, read, delete) to the store on rank 0, each reading O(group size) keys; measured at about
1 ms per collective with 2 ranks on a busy 2-core CPU host (benchmarks/fingerprint_cost.py), so it is
for debugging runs, not production. It sees only calls made through the
`torch.distributed` / `distributed_c10d` module attributes: functional collectives, DTensor redistribution
and DDP's C++ reducer bypass it, as do functions imported by name before it was enabled.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from torchtriage.runtime.consensus import format_ranks, group_by_value
from torchtriage.runtime.env import env_flag, env_positive_float, nccl_timeout

ENABLE_ENV = "TORCHTRIAGE_CHECK_COLLECTIVES"
TIMEOUT_ENV = "TORCHTRIAGE_CHECK_COLLECTIVES_TIMEOUT"
STORE_PREFIX = "torchtriage/fp/"
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "reduce",
    "gather",
    "scatter",
    "all_gather_single",  # torch >= 2.13 names of all_gather_into_tensor / reduce_scatter_tensor
    "reduce_scatter_single",
)
# One op under two names: compared as the same op, and a call through one that reaches the other is checked once.
ALIASES = {"all_gather_single": "all_gather_into_tensor", "reduce_scatter_single": "reduce_scatter_tensor"}
_FIRST_WAIT_S = 2.0  # the happy path blocks in one store wait; after this the wait polls for deadlocks
_POLL_S = 0.5


class CollectiveMismatchError(RuntimeError):
    """Raised on every rank when ranks are about to issue collectives that do not match."""


# -- fingerprints (plain JSON-able dicts) -----------------------------------------------------------


def _shape(tensor: Any) -> list[int] | None:
    return None if tensor is None else [int(d) for d in tensor.shape]


def _dtype(tensor: Any) -> str | None:
    return None if tensor is None else str(tensor.dtype).removeprefix("torch.")


def _red_op(op: Any) -> str:
    name = getattr(op, "name", None)
    return str(name) if name else str(op).rsplit(".", 1)[-1]


def _splits(splits: Any, tensor: Any, size: int) -> list[int] | None:
    if splits is not None:
        return [int(s) for s in splits]
    rows = int(tensor.shape[0]) if tensor.dim() > 0 else 1
    return [rows // size] * size if rows % size == 0 else None


def describe_call(op: str, args: dict[str, Any], group_size: int) -> tuple[dict, dict]:
    """(fields every rank must agree on, per-rank data for cross checks) of one collective call."""
    fields: dict[str, Any] = {}
    cross: dict[str, Any] = {}
    if op in ("all_reduce", "reduce", "broadcast"):
        fields.update(shape=_shape(args["tensor"]), dtype=_dtype(args["tensor"]))
    if op in ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"):
        fields["reduce_op"] = _red_op(args.get("op"))
    if op in ("reduce", "gather"):
        fields.update(dst=args.get("dst"), group_dst=args.get("group_dst"))
    if op in ("broadcast", "scatter"):
        fields.update(src=args.get("src"), group_src=args.get("group_src"))
    if op == "all_gather":
        outputs = args["tensor_list"]
        fields.update(dtype=_dtype(args["tensor"]), output_shapes=[_shape(t) for t in outputs])
        cross["input_shape"] = _shape(args["tensor"])
    elif op == "all_gather_into_tensor":
        fields.update(input_shape=_shape(args["input_tensor"]), output_shape=_shape(args["output_tensor"]))
        fields["dtype"] = _dtype(args["input_tensor"])
    elif op == "reduce_scatter":
        fields.update(dtype=_dtype(args["output"]), input_shapes=[_shape(t) for t in args["input_list"]])
        cross["output_shape"] = _shape(args["output"])
    elif op == "reduce_scatter_tensor":
        fields.update(input_shape=_shape(args["input"]), output_shape=_shape(args["output"]))
        fields["dtype"] = _dtype(args["input"])
    elif op == "all_to_all":
        inputs, outputs = args["input_tensor_list"], args["output_tensor_list"]
        fields.update(dtype=_dtype(inputs[0]) if inputs else None, count=len(inputs))
        cross.update(input_shapes=[_shape(t) for t in inputs], output_shapes=[_shape(t) for t in outputs])
    elif op == "all_to_all_single":
        inp, out = args["input"], args["output"]
        fields.update(dtype=_dtype(inp), row_shape=_shape(inp)[1:], output_row_shape=_shape(out)[1:])
        cross.update(
            input_splits=_splits(args.get("input_split_sizes"), inp, group_size),
            output_splits=_splits(args.get("output_split_sizes"), out, group_size),
        )
    elif op in ("gather", "scatter"):
        fields.update(shape=_shape(args["tensor"]), dtype=_dtype(args["tensor"]))
        listed = args.get("gather_list" if op == "gather" else "scatter_list")
        cross["root_shapes"] = None if listed is None else [_shape(t) for t in listed]
    return fields, cross


def _call_text(fp: dict) -> str:
    parts = [f"{key}={_value_text(value)}" for key, value in fp["fields"].items() if value is not None]
    parts += [f"{key}={_value_text(value)}" for key, value in fp["cross"].items() if value is not None]
    return f"{fp['op']}({', '.join(parts)})"


def _value_text(value: Any) -> str:
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return str(tuple(value))
    if isinstance(value, list):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    return str(value)


def find_mismatches(fps: Sequence[dict], ranks: Sequence[int]) -> list[str]:
    """What disagrees among the fingerprints of one collective (`fps[i]` from global rank `ranks[i]`)."""
    problems: list[str] = []

    def grouped(values: Sequence[Any]) -> str:
        groups = group_by_value(values, ranks, key=lambda v: json.dumps(v, sort_keys=True))
        groups.sort(key=lambda item: -len(item[1]))  # the most common value first: "expected"
        return "; ".join(f"{format_ranks(members)}: {_value_text(value)}" for value, members in groups)

    ops = [fp["op"] for fp in fps]
    if len(set(ops)) > 1:
        return [f"op: {grouped(ops)}"]
    names = sorted({key for fp in fps for key in fp["fields"]})
    for name in names:
        values = [fp["fields"].get(name) for fp in fps]
        if len({json.dumps(v, sort_keys=True) for v in values}) > 1:
            problems.append(f"{name}: {grouped(values)}")
    if problems:
        return problems
    op, size = ops[0], len(fps)
    if op == "all_gather":
        expected = fps[0]["fields"]["output_shapes"]
        for i, fp in enumerate(fps):
            if i < len(expected) and fp["cross"]["input_shape"] != expected[i]:
                problems.append(
                    f"input shape: rank {ranks[i]} sends {_value_text(fp['cross']['input_shape'])} but every "
                    f"rank expects {_value_text(expected[i])} from it"
                )
    elif op == "reduce_scatter":
        expected = fps[0]["fields"]["input_shapes"]
        for i, fp in enumerate(fps):
            if i < len(expected) and fp["cross"]["output_shape"] != expected[i]:
                problems.append(
                    f"output shape: rank {ranks[i]} receives into {_value_text(fp['cross']['output_shape'])} but "
                    f"every rank sends it {_value_text(expected[i])}"
                )
    elif op in ("all_to_all", "all_to_all_single"):
        send, recv = ("input_shapes", "output_shapes") if op == "all_to_all" else ("input_splits", "output_splits")
        for i in range(size):
            for j in range(size):
                sent = (fps[i]["cross"][send] or [None] * size)[j] if fps[i]["cross"][send] is not None else None
                got = (fps[j]["cross"][recv] or [None] * size)[i] if fps[j]["cross"][recv] is not None else None
                if sent != got:
                    problems.append(
                        f"{send.split('_')[1]}: rank {ranks[i]} sends {_value_text(sent)} to rank {ranks[j]}, "
                        f"which expects {_value_text(got)}"
                    )
    elif op in ("gather", "scatter"):
        for fp in fps:
            listed = fp["cross"]["root_shapes"]
            if listed is None:
                continue
            for i, other in enumerate(fps):
                if i < len(listed) and listed[i] != other["fields"]["shape"]:
                    problems.append(
                        f"root list: entry {i} is {_value_text(listed[i])} but rank {ranks[i]} has "
                        f"{_value_text(other['fields']['shape'])}"
                    )
    return problems[:16]


def format_mismatch(fps: Sequence[dict], ranks: Sequence[int], problems: Sequence[str]) -> str:
    first = fps[0]
    lines = [
        f"check_collectives: collective #{first['seq']} on process group {first['group']} "
        f"({format_ranks(ranks)}) does not match across ranks; issuing it would hang or corrupt data.",
        *(f"  {problem}" for problem in problems),
        "  per rank:",
    ]
    calls = [f"{_call_text(fp)} at {fp['site']}" for fp in fps]
    for call, members in group_by_value(calls, ranks):
        lines.append(f"    {format_ranks(members)}: {call}")
    lines.append(
        "  Every rank of a group must issue the same collectives in the same order with matching shapes and "
        "dtypes: look for rank-dependent branches, model config or batch shapes at the lines above."
    )
    return "\n".join(lines)


# -- the store side channel --------------------------------------------------------------------------


def _call_site() -> str:
    torch_dir = os.path.dirname(sys.modules["torch"].__file__)
    here = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(torch_dir) and not filename.startswith(here) and "contextlib" not in filename:
            return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "<unknown>"


class _Checker:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    def check(self, op: str, args: dict[str, Any]) -> None:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        if not dist.is_initialized():
            return
        group = args.get("group")
        group = c10d._get_default_group() if group is None else group
        if c10d._rank_not_in_group(group):
            return
        ranks = dist.get_process_group_ranks(group)
        if len(ranks) <= 1:
            return
        name = group.group_name
        with _lock:
            seq = _sequences.get(name, 0)
            _sequences[name] = seq + 1
        me, my_index = dist.get_rank(), dist.get_rank(group)
        fields, cross = describe_call(op, args, len(ranks))
        site = _call_site()
        fp = {"op": op, "group": name, "seq": seq, "fields": fields, "cross": cross, "site": site, "rank": me}
        store = c10d._get_default_store()
        keys = [f"{STORE_PREFIX}{name}/{seq}/{i}" for i in range(len(ranks))]
        state = {"group": name, "seq": seq, "ranks": ranks, "op": op, "site": site}
        # One request; the state is written before the key (multi_set applies in order): see _deadlock.
        store.multi_set([f"{STORE_PREFIX}state/{me}", keys[my_index]], [json.dumps(state), json.dumps(fp)])
        self._wait(store, keys, ranks, me, state)
        fps = [json.loads(raw) for raw in store.multi_get(keys)]
        if seq > 0:  # every peer has passed #seq-1 once all #seq keys exist
            store.delete_key(f"{STORE_PREFIX}{name}/{seq - 1}/{my_index}")
        problems = find_mismatches(fps, ranks)
        if problems:
            raise CollectiveMismatchError(format_mismatch(fps, ranks, problems))

    def _wait(self, store: Any, keys: list[str], ranks: list[int], me: int, state: dict) -> None:
        started = time.monotonic()
        try:
            store.wait(keys, timedelta(seconds=min(_FIRST_WAIT_S, self.timeout_s)))
            return
        except Exception:  # noqa: BLE001 - DistStoreError: a peer is late; poll, watching for deadlocks
            pass
        while True:
            missing = [ranks[i] for i, key in enumerate(keys) if not store.check([key])]
            if not missing:
                return
            cycle = _deadlock(store, me)
            if cycle is not None:
                raise CollectiveMismatchError(cycle)
            waited = time.monotonic() - started
            if waited >= self.timeout_s:
                raise CollectiveMismatchError(_timeout_message(store, state, missing, waited))
            time.sleep(_POLL_S)


def _state(store: Any, rank: int) -> dict | None:
    key = f"{STORE_PREFIX}state/{rank}"
    return json.loads(store.get(key)) if store.check([key]) else None


def _waiting_for(store: Any, state: dict) -> int | None:
    """The first rank that has not reached the collective `state` describes (None: nobody missing)."""
    for index, rank in enumerate(state["ranks"]):
        if not store.check([f"{STORE_PREFIX}{state['group']}/{state['seq']}/{index}"]):
            return rank
    return None


def _deadlock(store: Any, me: int) -> str | None:
    """A cycle of ranks each waiting at a checked collective for the next one; its description, or None.

    A rank publishes its state before its fingerprint key and only moves on once every key of its
    collective exists, so a chain whose states are unchanged on a second read is really stuck.
    """
    chain: list[tuple[int, dict]] = []
    seen: dict[int, int] = {}
    rank = me
    while rank not in seen:
        state = _state(store, rank)
        if state is None:
            return None
        nxt = _waiting_for(store, state)
        if nxt is None:
            return None
        seen[rank] = len(chain)
        chain.append((rank, state))
        rank = nxt
    cycle = chain[seen[rank] :]
    if any(_state(store, r) != s for r, s in cycle):
        return None
    start = min(range(len(cycle)), key=lambda i: cycle[i][0])
    cycle = cycle[start:] + cycle[:start]
    lines = ["check_collectives: deadlock: these ranks wait for each other at collectives that can never pair up:"]
    for index, (r, s) in enumerate(cycle):
        nxt = cycle[(index + 1) % len(cycle)][0]
        lines.append(
            f"  rank {r}: {s['op']} #{s['seq']} on process group {s['group']} ({format_ranks(s['ranks'])}) "
            f"at {s['site']}, waiting for rank {nxt}"
        )
    lines.append(
        "  Every rank must issue collectives on the same process groups in the same order: look for a "
        "rank-dependent branch or group choice at the lines above."
    )
    return "\n".join(lines)


def _timeout_message(store: Any, state: dict, missing: list[int], waited: float) -> str:
    lines = [
        f"check_collectives: {format_ranks(missing)} did not reach {state['op']} #{state['seq']} on process group "
        f"{state['group']} at {state['site']} within {waited:.0f}s ({TIMEOUT_ENV}).",
    ]
    for rank in missing:
        peer = _state(store, rank)
        if peer is None:
            lines.append(f"  rank {rank} has issued no checked collective.")
        else:
            lines.append(
                f"  rank {rank} last issued {peer['op']} #{peer['seq']} on process group {peer['group']} at "
                f"{peer['site']}."
            )
    lines.append("  Look at what those ranks do after that point: a skipped collective, an exception or a slow step.")
    return "\n".join(lines)


# -- patching ----------------------------------------------------------------------------------------

_lock = threading.Lock()
_inside = threading.local()  # set while a checked call runs: collectives it makes itself are not checked again
_depth = 0
_originals: dict[str, Any] = {}
# Per process group, for the whole process: keys are never reused when checking is turned off and on again.
_sequences: dict[str, int] = {}
_checker: _Checker | None = None


def _wrap(name: str, original: Any) -> Any:
    import functools
    import inspect

    signature = inspect.signature(original)

    op = ALIASES.get(name, name)

    @functools.wraps(original)
    def checked(*args, **kwargs):
        checker = _checker
        if checker is None or getattr(_inside, "active", False):
            return original(*args, **kwargs)
        _inside.active = True
        try:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            checker.check(op, bound.arguments)
            return original(*args, **kwargs)
        finally:
            _inside.active = False

    checked.__torchtriage_original__ = original
    return checked


def _default_timeout_s() -> float:
    return env_positive_float(TIMEOUT_ENV, nccl_timeout().total_seconds())


def enable(timeout: float | timedelta | None = None) -> None:
    """Start checking (nests: each enable needs one disable). `timeout`: seconds to wait for late peers."""
    global _depth, _checker
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    with _lock:
        _depth += 1
        if _depth > 1:
            return
        _checker = _Checker(float(timeout) if timeout else _default_timeout_s())
        for name in COLLECTIVES:
            original = getattr(c10d, name, None)
            if original is None:  # an older torch without this name
                continue
            original = getattr(original, "__torchtriage_original__", original)
            _originals[name] = original
            wrapper = _wrap(name, original)
            setattr(c10d, name, wrapper)
            setattr(dist, name, wrapper)


def disable() -> None:
    """Undo one `enable`; the last one restores torch's functions."""
    global _depth, _checker
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    with _lock:
        if _depth == 0:
            return
        _depth -= 1
        if _depth > 0:
            return
        for name, original in _originals.items():
            for module in (c10d, dist):
                if getattr(getattr(module, name), "__torchtriage_original__", None) is original:
                    setattr(module, name, original)
        _originals.clear()
        _checker = None


def is_enabled() -> bool:
    return _depth > 0


def enable_from_env() -> bool:
    """Enable for the rest of the run when `TORCHTRIAGE_CHECK_COLLECTIVES` is true; returns whether it did."""
    if env_flag(ENABLE_ENV, False) and not is_enabled():
        enable()
        return True
    return False


class check_collectives:  # noqa: N801 - used like a function: `with check_collectives():`
    """Context manager: check every collective issued inside it (see the module docstring)."""

    def __init__(self, timeout: float | timedelta | None = None) -> None:
        self.timeout = timeout

    def __enter__(self) -> check_collectives:
        enable(self.timeout)
        return self

    def __exit__(self, *exc: object) -> None:
        disable()
