"""CUDA caching-allocator snapshots (`torch.cuda.memory._dump_snapshot`), read safely and iterated lazily.

The pickle holds plain data only, so it goes through the restricted unpickler (never `pickle.load`).
The loaded dict is walked with generators that yield small records one at a time: a snapshot of
gigabytes is never copied into a second structure.

Formats tolerated:
- torch ≥ 2.1: `{"segments": [...], "device_traces": [[event, ...] per device], ...}`, blocks with
  `frames` (and `requested_size`), trace events with `action`, `addr`, `size`, `frames`;
- torch 2.0: blocks carry `history: [{"addr", "real_size", "frames"}]` instead of `frames`;
- torch 1.x `torch.cuda.memory_snapshot()` output: a bare list of segments, no trace.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from torchtriage.errors import InputError
from torchtriage.sources.safe_pickle import PickleError, safe_loads

# Trace actions, by what they do to allocated (`alloc`/`free`) and reserved (`segment`) memory.
ALLOC_ACTIONS = frozenset({"alloc"})
FREE_ACTIONS = frozenset({"free_completed", "free"})  # "free" in snapshots older than torch 2.1
SEGMENT_ALLOC_ACTIONS = frozenset({"segment_alloc", "segment_map"})
SEGMENT_FREE_ACTIONS = frozenset({"segment_free", "segment_unmap"})
KNOWN_ACTIONS = (
    ALLOC_ACTIONS
    | FREE_ACTIONS
    | SEGMENT_ALLOC_ACTIONS
    | SEGMENT_FREE_ACTIONS
    | {
        "free_requested",
        "oom",
        "snapshot",
    }
)


class Frame(NamedTuple):
    filename: str
    line: int
    name: str


class Block(NamedTuple):
    device: int
    segment_address: int
    address: int
    size: int
    requested_size: int
    state: str  # "active_allocated" | "active_pending_free" | "inactive"
    frames: list  # raw frame dicts, innermost first (folded by the analysis)


class TraceEvent(NamedTuple):
    index: int
    action: str
    addr: int
    size: int
    time_us: int | None
    device_free: int | None  # only on "oom"
    frames: list


@dataclass(frozen=True)
class SegmentInfo:
    device: int
    address: int
    total_size: int
    allocated_size: int
    stream: int
    segment_type: str
    is_expandable: bool
    largest_free_block: int


@dataclass
class MemorySnapshot:
    """A loaded snapshot: the raw plain data plus what was learned about its format."""

    path: str
    raw: dict[str, Any]
    format: str  # "torch>=2.1", "torch-2.0", "segments-only"
    allocator_settings: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    # -- lazy views: generators over the raw data, nothing copied --
    def segments(self) -> Iterator[dict[str, Any]]:
        for segment in self.raw.get("segments") or ():
            if isinstance(segment, dict):
                yield segment

    def segment_infos(self) -> Iterator[SegmentInfo]:
        for segment in self.segments():
            blocks = segment.get("blocks") or ()
            allocated = segment.get("allocated_size")
            if allocated is None:
                allocated = sum(_int(b.get("size")) for b in blocks if str(b.get("state", "")).startswith("active"))
            largest_free = max((_int(b.get("size")) for b in blocks if b.get("state") == "inactive"), default=0)
            yield SegmentInfo(
                device=_int(segment.get("device")),
                address=_int(segment.get("address")),
                total_size=_int(segment.get("total_size")),
                allocated_size=_int(allocated),
                stream=_int(segment.get("stream")),
                segment_type=str(segment.get("segment_type", "")),
                is_expandable=bool(segment.get("is_expandable", False)),
                largest_free_block=largest_free,
            )

    def blocks(self) -> Iterator[Block]:
        for segment in self.segments():
            device = _int(segment.get("device"))
            seg_address = _int(segment.get("address"))
            address = seg_address
            for block in segment.get("blocks") or ():
                if not isinstance(block, dict):
                    continue
                size = _int(block.get("size"))
                frames = block.get("frames")
                if frames is None:  # torch 2.0: the stack lives in the block's history
                    history = block.get("history") or ()
                    frames = history[-1].get("frames", []) if history and isinstance(history[-1], dict) else []
                yield Block(
                    device=device,
                    segment_address=seg_address,
                    address=_int(block.get("address", address)),
                    size=size,
                    requested_size=_int(block.get("requested_size", size)),
                    state=str(block.get("state", "unknown")),
                    frames=frames if isinstance(frames, list) else [],
                )
                address += size

    def devices_with_traces(self) -> list[int]:
        traces = self.raw.get("device_traces") or []
        return [device for device, trace in enumerate(traces) if trace]

    def has_history(self) -> bool:
        return bool(self.devices_with_traces())

    def trace(self, device: int) -> Iterator[TraceEvent]:
        traces = self.raw.get("device_traces") or []
        if device >= len(traces):
            return
        for index, event in enumerate(traces[device] or ()):
            if not isinstance(event, dict):
                continue
            frames = event.get("frames")
            yield TraceEvent(
                index=index,
                action=str(event.get("action", "")),
                addr=_int(event.get("addr")),
                size=_int(event.get("size")),
                time_us=event.get("time_us"),
                device_free=event.get("device_free"),
                frames=frames if isinstance(frames, list) else [],
            )

    def devices(self) -> list[int]:
        found = {_int(s.get("device")) for s in self.segments()}
        found.update(self.devices_with_traces())
        return sorted(found)


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def frame_of(raw: Any) -> Frame | None:
    if not isinstance(raw, dict):
        return None
    return Frame(str(raw.get("filename", "")), _int(raw.get("line")), str(raw.get("name", "")))


def interpret(data: Any, path: str = "<memory>") -> MemorySnapshot:
    """Recognise the snapshot format of already unpickled data (a pure function, tested on data)."""
    if isinstance(data, list):
        if all(isinstance(s, dict) and "blocks" in s for s in data[:10]):
            return MemorySnapshot(
                path,
                {"segments": data, "device_traces": []},
                "segments-only",
                problems=[
                    "this snapshot has no allocation history (torch.cuda.memory_snapshot() of an old torch, or "
                    "_record_memory_history was not enabled): no peak, no OOM event, no allocation timeline"
                ],
            )
        raise InputError(f"{path}: a list, but not a list of allocator segments: not a CUDA memory snapshot.")
    if not isinstance(data, dict):
        raise InputError(
            f"{path}: the pickle holds a {type(data).__name__}, not a CUDA memory snapshot (expected a dict with "
            "'segments' and 'device_traces', as written by torch.cuda.memory._dump_snapshot)."
        )
    if "segments" not in data and "device_traces" not in data:
        keys = ", ".join(sorted(map(str, data))[:8]) or "none"
        raise InputError(
            f"{path}: not a CUDA memory snapshot: no 'segments' or 'device_traces' key (its keys: {keys}). "
            "Is this a flight-recorder dump? Try `torchtriage fr` on it."
        )
    segments = data.get("segments")
    traces = data.get("device_traces")
    if segments is not None and not isinstance(segments, list):
        raise InputError(f"{path}: 'segments' is a {type(segments).__name__}, not a list: an unknown snapshot format.")
    if traces is not None and (not isinstance(traces, list) or any(not isinstance(t, list) for t in traces)):
        raise InputError(f"{path}: 'device_traces' is not a list of per-device lists: an unknown snapshot format.")
    problems: list[str] = []
    fmt = "torch>=2.1"
    first_block = next((b for s in segments or () if isinstance(s, dict) for b in s.get("blocks") or ()), None)
    if isinstance(first_block, dict) and "history" in first_block and "frames" not in first_block:
        fmt = "torch-2.0"
    unknown = set()
    for trace in traces or ():
        for event in trace[:1000]:
            action = event.get("action") if isinstance(event, dict) else None
            if action not in KNOWN_ACTIONS:
                unknown.add(str(action))
    if unknown:
        problems.append(
            f"trace actions this version of torchtriage does not know were ignored: {', '.join(sorted(unknown))} "
            "(a snapshot from a newer torch?)"
        )
    if not traces or not any(traces):
        problems.append(
            "no allocation history in this snapshot (enable it with "
            "torch.cuda.memory._record_memory_history(max_entries=100000) before the failure): "
            "no peak, no OOM event, sites are those of the blocks alive when it was taken"
        )
    settings = data.get("allocator_settings")
    return MemorySnapshot(path, data, fmt, settings if isinstance(settings, dict) else {}, problems)


def load_snapshot(path: str) -> MemorySnapshot:
    """Read and recognise one snapshot file; every failure is an InputError naming the file."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except IsADirectoryError:
        raise InputError(f"{path}: a folder; give the snapshot file (the .pickle written by _dump_snapshot).") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read it ({err.strerror or err}).") from None
    if data[:2] == b"\x1f\x8b":
        import gzip

        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise InputError(f"{path}: a gzip file that cannot be decompressed ({err}); is it truncated?") from None
    if data[:1] in (b"{", b"["):
        raise InputError(
            f"{path}: this is JSON, not a pickled memory snapshot; a profiler trace? Try `torchtriage trace {path}`."
        )
    try:
        value = safe_loads(data)
    except PickleError as err:
        raise InputError(f"{os.fspath(path)}: cannot be read as a memory snapshot: {err}.") from None
    del data
    return interpret(value, path)
