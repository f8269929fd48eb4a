"""Cross-rank consistency checks: `assert_rank_uniform(value, label=...)`.

Every rank of a process group hashes its value into a 64-bit digest; ONE all-reduce (MAX over
`[hi, lo, -hi, -lo, failed]`, 40 bytes) tells every rank whether all digests are equal. Only when they are
not, the ranks gather short per-rank summaries (a JSON all-gather) and every rank builds the same report,
grouped by distinct value:

    assert_rank_uniform('batch'): 2 distinct values across ranks 0-7
      ranks 0-6: tensor (8, 4096) bfloat16 #1f0c9a2e
      rank 7: tensor (8, 4095) bfloat16 #77b01c4d

How values are compared: tensors by shape, dtype and raw bytes (the bytes are reinterpreted as uint8 with
torch and hashed on the CPU, so bf16/fp8 never go through numpy; the device index is not compared);
lists, tuples, dicts (key order ignored), sets and dataclasses recursively; scalars and strings by type and
repr; other objects by their attributes, or their repr when it holds no memory address. A DTensor is
compared by global shape, dtype and placements, not by its local shard.

It cannot find a NaN (or any wrong value) that every rank computes identically: it checks agreement, not
correctness.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import hashlib
import json
import logging
import struct
import sys
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

from torchtriage.ranks import format_ranks
from torchtriage.runtime.env import strict_default

logger = logging.getLogger("torchtriage.runtime")

MAX_LEAVES = 256  # leaf summaries kept per rank for a mismatch report
MAX_SUMMARY = 160
_CHUNK_BYTES = 64 << 20  # tensors are copied to the CPU in slices of this size for hashing


class RankDivergenceError(RuntimeError):
    """Raised on every rank by a strict `assert_rank_uniform` when ranks hold different values."""


# -- presenting ranks --------------------------------------------------------------------------------


def group_by_value(
    values: Sequence[Any], ranks: Sequence[int] | None = None, key: Callable[[Any], Hashable] | None = None
) -> list[tuple[Any, list[int]]]:
    """Group `values[i]` (held by `ranks[i]`, default i) by equal `key(value)`; ordered by first rank."""
    ranks = list(range(len(values))) if ranks is None else list(ranks)
    groups: dict[Hashable, tuple[Any, list[int]]] = {}
    for value, rank in zip(values, ranks, strict=True):
        k = key(value) if key is not None else value
        if k not in groups:
            groups[k] = (value, [])
        groups[k][1].append(rank)
    return list(groups.values())


# -- encoding ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Encoded:
    """A value's 64-bit digest, a short summary, and (path, summary, digest) per leaf for reports."""

    digest: bytes
    summary: str
    leaves: list[tuple[str, str, str]]
    truncated: bool = False


def _short(text: str) -> str:
    return text if len(text) <= MAX_SUMMARY else text[: MAX_SUMMARY - 3] + "..."


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _shape(shape: Iterable[int]) -> str:
    dims = tuple(int(d) for d in shape)
    return str(dims)


def _is_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _hash_tensor_bytes(tensor: Any, hasher: Any) -> None:
    """Feed the raw bytes of `tensor` to `hasher`, reinterpreted as uint8 by torch (never through numpy)."""
    import torch

    flat = tensor.detach()
    if flat.is_conj():
        flat = flat.resolve_conj()
    if flat.is_neg():
        flat = flat.resolve_neg()
    if flat.is_quantized:
        flat = flat.int_repr()
    flat = flat.reshape(-1).contiguous()
    if flat.numel() == 0:
        return
    raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
    for start in range(0, raw.numel(), _CHUNK_BYTES):
        chunk = raw[start : start + _CHUNK_BYTES].cpu().contiguous()
        hasher.update(ctypes.string_at(chunk.data_ptr(), chunk.numel()))


def _tensor_leaf(tensor: Any) -> tuple[bytes, str]:
    hasher = hashlib.blake2b(digest_size=8)
    dtype = _dtype_name(tensor.dtype)
    if hasattr(tensor, "placements") and hasattr(tensor, "to_local"):  # DTensor: local shards differ by design
        header = f"dtensor|{_shape(tensor.shape)}|{dtype}|{tensor.placements!r}"
        hasher.update(header.encode())
        return hasher.digest(), f"dtensor {_shape(tensor.shape)} {dtype} {tensor.placements!r}"
    header = f"tensor|{_shape(tensor.shape)}|{dtype}|{tensor.layout}"
    hasher.update(header.encode())
    if tensor.is_meta:
        return hasher.digest(), f"meta tensor {_shape(tensor.shape)} {dtype}"
    if tensor.is_sparse:
        coalesced = tensor.detach().coalesce()
        _hash_tensor_bytes(coalesced.indices(), hasher)
        _hash_tensor_bytes(coalesced.values(), hasher)
    else:
        _hash_tensor_bytes(tensor, hasher)
    digest = hasher.digest()
    return digest, f"tensor {_shape(tensor.shape)} {dtype} #{digest.hex()[:8]}"


def _scalar_leaf(obj: Any) -> tuple[bytes, str] | None:
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        text = f"{type(obj).__name__}|{obj!r}"
        return text.encode(), _short(repr(obj))
    if isinstance(obj, enum.Enum):
        text = f"{type(obj).__qualname__}.{obj.name}"
        return text.encode(), text
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, (torch.dtype, torch.device)):
        return f"{type(obj).__name__}|{obj}".encode(), str(obj)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, numpy.ndarray):
        hasher = hashlib.blake2b(f"ndarray|{obj.shape}|{obj.dtype}".encode(), digest_size=8)
        hasher.update(numpy.ascontiguousarray(obj).tobytes())
        return hasher.digest(), f"ndarray {_shape(obj.shape)} {obj.dtype} #{hasher.hexdigest()[:8]}"
    if numpy is not None and isinstance(obj, numpy.generic):
        return f"{type(obj).__name__}|{obj!r}".encode(), repr(obj)
    return None


class _Encoder:
    def __init__(self) -> None:
        self.hasher = hashlib.blake2b(digest_size=8)
        self.leaves: list[tuple[str, str, str]] = []
        self.truncated = False
        self._active: set[int] = set()

    def token(self, text: str) -> None:
        self.hasher.update(text.encode())
        self.hasher.update(b"\x00")

    def leaf(self, path: str, data: bytes, summary: str) -> None:
        digest = hashlib.blake2b(data, digest_size=8).hexdigest()
        self.token(f"leaf|{path}|{digest}")
        if len(self.leaves) < MAX_LEAVES:
            self.leaves.append((path, _short(summary), digest))
        else:
            self.truncated = True

    def walk(self, obj: Any, path: str) -> None:
        if _is_tensor(obj):
            data, summary = _tensor_leaf(obj)
            self.leaf(path, data, summary)
            return
        scalar = _scalar_leaf(obj)
        if scalar is not None:
            self.leaf(path, *scalar)
            return
        if id(obj) in self._active:
            self.leaf(path, b"<cycle>", "<cycle>")
            return
        self._active.add(id(obj))
        try:
            self._walk_container(obj, path)
        finally:
            self._active.discard(id(obj))

    def _walk_container(self, obj: Any, path: str) -> None:
        kind = type(obj).__qualname__
        if isinstance(obj, Mapping):
            items = sorted(((_key_text(k), v) for k, v in obj.items()), key=lambda item: item[0])
            self.token(f"map|{kind}|{len(items)}")
            for key, value in items:
                self.walk(value, f"{path}[{key}]")
        elif isinstance(obj, (list, tuple)):
            self.token(f"seq|{kind}|{len(obj)}")
            for index, value in enumerate(obj):
                self.walk(value, f"{path}[{index}]")
        elif isinstance(obj, (set, frozenset)):
            members = sorted(encode(member).digest.hex() for member in obj)
            self.leaf(path, f"set|{kind}|{members}".encode(), f"{kind} of {len(obj)} items")
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            self.token(f"dataclass|{kind}")
            for field in dataclasses.fields(obj):
                self.walk(getattr(obj, field.name), f"{path}.{field.name}")
        else:
            text = repr(obj)
            if " at 0x" in text and hasattr(obj, "__dict__"):  # the default repr: compare attributes instead
                self.token(f"object|{kind}")
                for name, value in sorted(vars(obj).items()):
                    self.walk(value, f"{path}.{name}")
            else:
                self.leaf(path, f"repr|{kind}|{text}".encode(), text)


def _key_text(key: Any) -> str:
    return repr(key) if not isinstance(key, enum.Enum) else f"{type(key).__qualname__}.{key.name}"


def _top_summary(value: Any, encoder: _Encoder) -> str:
    if len(encoder.leaves) == 1 and encoder.leaves[0][0] == "":
        return encoder.leaves[0][1]
    count = len(value) if hasattr(value, "__len__") else None
    size = "" if count is None else f", {count} item{'s' if count != 1 else ''}"
    return f"{type(value).__qualname__}{size} #{encoder.hasher.hexdigest()[:8]}"


def encode(value: Any) -> Encoded:
    """A stable digest of `value` plus the summaries a mismatch report shows (see the module docstring)."""
    encoder = _Encoder()
    encoder.walk(value, "")
    return Encoded(encoder.hasher.digest(), _top_summary(value, encoder), encoder.leaves, encoder.truncated)


# -- the report --------------------------------------------------------------------------------------


@dataclasses.dataclass
class RankReport:
    """What one rank contributes to a mismatch report (plain data: it travels through all_gather_object)."""

    digest: str
    summary: str
    leaves: list[tuple[str, str, str]]
    error: str | None = None
    strict: bool = False
    label: str = ""


def format_divergence(label: str, reports: Sequence[RankReport], ranks: Sequence[int], max_paths: int = 8) -> str:
    """The grouped report every rank prints or raises; a pure function of the gathered reports."""
    groups = group_by_value(reports, ranks, key=lambda r: (r.digest, r.error))
    where = format_ranks(ranks)
    if all(r.error is not None for r in reports) and len({r.error for r in reports}) == 1:
        return (
            f"assert_rank_uniform({label!r}): could not compare the value on {where}: {reports[0].error}. "
            "Pass tensors, numbers, strings or containers of them."
        )
    lines = [f"assert_rank_uniform({label!r}): {len(groups)} distinct values across {where}"]
    for report, members in groups:
        text = f"could not encode: {report.error}" if report.error else report.summary
        lines.append(f"  {format_ranks(members)}: {text}")
    differing = _differing_paths(reports, ranks)
    nonroot = [path for path in differing if path != ""]
    shown = nonroot[:max_paths]
    for path in shown:
        lines.append(f"  differs at {label}{path}:")
        values = [dict((p, (s, d)) for p, s, d in r.leaves).get(path, ("<absent>", "")) for r in reports]
        for (summary, _), members in group_by_value(values, ranks):
            lines.append(f"    {format_ranks(members)}: {summary}")
    if len(nonroot) > len(shown):
        lines.append(f"  ... and {len(nonroot) - len(shown)} more differing entries")
    lines.append(
        "  Every rank of the group must hold the same value here: look for rank-dependent config, data or seeds."
    )
    return "\n".join(lines)


def _differing_paths(reports: Sequence[RankReport], ranks: Sequence[int]) -> list[str]:
    order: dict[str, None] = {}
    per_rank = []
    for report in reports:
        leaves = {path: digest for path, _, digest in report.leaves}
        per_rank.append(leaves)
        order.update(dict.fromkeys(leaves))
    return [path for path in order if len({leaves.get(path) for leaves in per_rank}) > 1]


# -- the collective check ----------------------------------------------------------------------------


def _collective_device(group: Any) -> Any:
    import torch
    from torch.distributed import distributed_c10d as c10d

    try:
        return c10d._get_object_coll_device(group)
    except Exception:  # noqa: BLE001 - older/newer torch: fall back on the backend's name
        backend = str(c10d.get_backend(group))
        return torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")


def _all_gather_json(payload: Any, group: Any, size: int) -> list[Any]:
    """all_gather_object without pickle or numpy (torch's needs numpy): JSON bytes in uint8 tensors."""
    import torch
    import torch.distributed as dist

    device = _collective_device(group)
    data = json.dumps(payload).encode()
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    lengths = [torch.zeros_like(length) for _ in range(size)]
    dist.all_gather(lengths, length, group=group)
    longest = max(int(n.item()) for n in lengths)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    mine = mine.to(device)
    buffers = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(buffers, mine, group=group)
    out = []
    for buffer, n in zip(buffers, lengths, strict=True):
        cpu = buffer.cpu().contiguous()
        out.append(json.loads(ctypes.string_at(cpu.data_ptr(), int(n.item()))))
    return out


def assert_rank_uniform(value: Any, *, group: Any = None, label: str, strict: bool | None = None) -> bool:
    """Check that every rank of `group` (default: all ranks) holds the same `value`; True if they do.

    Every member of the group must call it at the same point (it is a collective); ranks outside
    `group` and processes without a process group return True at once. The happy path costs hashing
    `value` on the CPU plus one all-reduce of 40 bytes. On a mismatch every rank logs the same grouped
    report as a warning and returns False, or, when strict, raises `RankDivergenceError` with that report
    on every rank. `strict=None` takes `TORCHTRIAGE_STRICT` (default off); if any rank is strict, all are.

    It cannot find a NaN (or any wrong value) that every rank computes identically.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return True
    import torch

    if group is not None and dist.distributed_c10d._rank_not_in_group(group):
        return True
    size = dist.get_world_size(group)
    if size <= 1:
        return True
    strict = strict_default() if strict is None else bool(strict)
    try:
        encoded, error = encode(value), None
        hi, lo = struct.unpack(">II", encoded.digest)
    except Exception as err:  # noqa: BLE001 - never raise before the collective: the peers would hang
        encoded, error = None, f"{type(err).__name__}: {err}"
        hi = lo = 0
    # MAX of [h, -h] gives max and -min: equal iff every rank has the same h. The flag forces a report.
    words = torch.tensor([hi, lo, -hi, -lo, 1 if error else 0], dtype=torch.int64, device=_collective_device(group))
    dist.all_reduce(words, op=dist.ReduceOp.MAX, group=group)
    max_hi, max_lo, neg_min_hi, neg_min_lo, failed = words.tolist()
    if max_hi == -neg_min_hi and max_lo == -neg_min_lo and not failed:
        return True

    mine = RankReport(
        digest=encoded.digest.hex() if encoded else "",
        summary=encoded.summary if encoded else "",
        leaves=encoded.leaves if encoded else [],
        error=error,
        strict=strict,
        label=label,
    )
    gathered = _all_gather_json(dataclasses.asdict(mine), group, size)
    reports = [RankReport(**{**item, "leaves": [tuple(leaf) for leaf in item["leaves"]]}) for item in gathered]
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(size))
    message = format_divergence(reports[0].label, reports, ranks)
    if any(report.strict for report in reports):
        raise RankDivergenceError(message)
    logger.warning(message)
    return False
