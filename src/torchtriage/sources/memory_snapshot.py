"""CUDA caching-allocator snapshots (`torch.cuda.memory._dump_snapshot`), read safely into a lean form.

The pickle holds plain data only, so it is never given to `pickle.load`. A snapshot of gigabytes is
almost all history: one dict per allocator event, each with its stack (a list of frame dicts, shared
with other stacks). Held as Python objects that is about five times the file, so the file is read as a stream
(`pickle_stream`): each event is reduced, as it is read, to five numbers in typed arrays and the index
of its *site*, the result of the caller's `fold` of its stack (identical stacks are folded once).
What stays in memory is a few dozen bytes per event, whatever the depth of the stacks.

Formats tolerated:
- torch >= 2.1: `{"segments": [...], "device_traces": [[event, ...] per device], ...}`, blocks with
  `frames` (and `requested_size`), trace events with `action`, `addr`, `size`, `frames`;
- torch 2.0: blocks carry `history: [{"addr", "real_size", "frames"}]` instead of `frames`;
- torch 1.x `torch.cuda.memory_snapshot()` output: a bare list of segments, no trace.
"""

from __future__ import annotations

import io
import os
import zlib
from array import array
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, NamedTuple

from torchtriage.errors import InputError
from torchtriage.sources.fields import FieldError, as_int, as_text, describe
from torchtriage.sources.isolated import Stopped, call_isolated
from torchtriage.sources.limits import LimitExceeded, seconds_for_size
from torchtriage.sources.pickle_stream import FlatList, SharedContainer, Sink, StreamingUnpickler
from torchtriage.sources.safe_pickle import PickleError, safe_loads
from torchtriage.sources.streams import open_counted, read_whole

# What each trace action does: to allocated memory (`alloc`, `free*`), to reserved memory (`segment_*`).
ALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE, OOM, OTHER = range(6)
ACTION_KINDS = {
    "alloc": ALLOC,
    "free_completed": FREE,
    "free": FREE,  # before torch 2.1
    "segment_alloc": SEGMENT_ALLOC,
    "segment_map": SEGMENT_ALLOC,
    "segment_free": SEGMENT_FREE,
    "segment_unmap": SEGMENT_FREE,
    "oom": OOM,
    "free_requested": OTHER,
    "snapshot": OTHER,
}
# Unknown actions are looked for among the first events of each device only: enough to notice a newer format.
_ACTIONS_CHECKED = 1000
_STACK_CACHE_LIMIT = 50_000
_NO_TIME = -1
_PROGRESS_EVERY = 200_000

Fold = Callable[[list], Hashable]


class Block(NamedTuple):
    device: int
    segment_address: int
    address: int
    size: int
    requested_size: int
    state: str  # "active_allocated" | "active_pending_free" | "inactive"
    site: Any  # the caller's fold of the block's stack


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
class DeviceHistory:
    """One device's recorded events, as columns: event i is (kind[i], addr[i], size[i], time_us[i], site[i])."""

    kind: array = field(default_factory=lambda: array("B"))
    addr: array = field(default_factory=lambda: array("q"))
    size: array = field(default_factory=lambda: array("q"))
    time_us: array = field(default_factory=lambda: array("q"))  # -1 where the event has no time
    site: array = field(default_factory=lambda: array("i"))  # an index into MemorySnapshot.sites
    device_free: dict[int, int] = field(default_factory=dict)  # by event index, for OOM events

    def __len__(self) -> int:
        return len(self.kind)


@dataclass
class MemorySnapshot:
    """A snapshot reduced to what the analysis needs: segments, live blocks, and each device's history."""

    path: str
    format: str  # "torch>=2.1", "torch-2.0", "segments-only"
    segments: list[SegmentInfo] = field(default_factory=list)
    block_list: list[Block] = field(default_factory=list)
    histories: dict[int, DeviceHistory] = field(default_factory=dict)
    sites: list[Any] = field(default_factory=list)  # folded stacks, each stored once
    allocator_settings: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def segment_infos(self) -> Iterator[SegmentInfo]:
        return iter(self.segments)

    def blocks(self) -> Iterator[Block]:
        return iter(self.block_list)

    def devices_with_traces(self) -> list[int]:
        return sorted(device for device, history in self.histories.items() if len(history))

    def has_history(self) -> bool:
        return bool(self.devices_with_traces())

    def history(self, device: int) -> DeviceHistory:
        return self.histories.get(device) or DeviceHistory()

    def devices(self) -> list[int]:
        found = {segment.device for segment in self.segments}
        found.update(self.devices_with_traces())
        return sorted(found)


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError, OverflowError):
        return 0


# What a snapshot's numbers can be. A size is bytes of one device's memory: 1 PiB is far past any device, so
# a size beyond it, or below 0, is a crafted or corrupt file (a negative one made a verdict of "-16 GiB").
# An OOM event's size is what was asked for, which a wrong shape can make anything up to the allocator's
# size_t; an address is a pointer, stored as a signed 64-bit column.
_MAX_BYTES = 1 << 50
_MAX_ADDRESS = (1 << 63) - 1
_MAX_DEVICE = (1 << 16) - 1
_SIZE = (_MAX_BYTES, "a size in bytes (0 to 1 PiB)")
_REQUEST = (_MAX_ADDRESS, "a size in bytes (0 to 2^63)")
_ADDRESS = (_MAX_ADDRESS, "an address (0 to 2^63)")
_DEVICE = (_MAX_DEVICE, "a device index (0 to 65535)")


def _checked(value: Any, field: str, bound: tuple[int, str]) -> int:
    """A size, an address or a device index from the snapshot: an int from 0 to the bound's (None and other
    empty values are 0, as they always were); anything else is a FieldError naming the field."""
    high, wanted = bound
    if type(value) is int and 0 <= value <= high:  # nearly always: no conversion
        return value
    if type(value) in (type(None), str, list, tuple, dict) and not value:
        return 0
    number = as_int(value, -1, 0, high)
    if number < 0:
        raise FieldError(field, value, wanted)
    return number


class _Builder:
    """Reduces segments and events, one at a time, to a MemorySnapshot."""

    def __init__(self, path: str, fold: Fold, progress: Callable[[int], None] | None = None) -> None:
        self.snapshot = MemorySnapshot(path, "torch>=2.1")
        self._progress = progress
        self._events = 0
        self._fold = fold
        self._site_index: dict[Hashable, int] = {}
        self._stacks: dict[tuple, int] = {}
        self._by_frames: dict[tuple, tuple[int, list]] = {}
        self._unknown_actions: set[str] = set()

    # -- sites --
    def _site(self, frames: Any) -> int:
        if isinstance(frames, FlatList):  # identical stacks read as one shared object: fold it once
            return frames.summary(self._intern_frames)
        if not isinstance(frames, list):
            frames = []
        key = tuple((f.get("filename"), f.get("line"), f.get("name")) if isinstance(f, dict) else None for f in frames)
        index = self._stacks.get(key)
        if index is None:
            if len(self._stacks) >= _STACK_CACHE_LIMIT:
                self._stacks.clear()
            index = self._stacks[key] = self._intern(frames)
        return index

    def _intern_frames(self, frames: list) -> int:
        """A streamed stack's site. Its frame dicts are the reader's own objects, alive in its memo, and torch
        shares one dict per distinct frame: the same frames in another list are known by their identities."""
        key = tuple(map(id, frames))
        known = self._by_frames.get(key)
        if known is None:
            if len(self._by_frames) >= _STACK_CACHE_LIMIT:
                self._by_frames.clear()
            # The entry holds the frames, so the identities in its key stay theirs while it exists.
            known = self._by_frames[key] = (self._intern(frames), frames)
        return known[0]

    def _intern(self, frames: list) -> int:
        folded = self._fold(frames)
        index = self._site_index.get(folded)
        if index is None:
            index = self._site_index[folded] = len(self.snapshot.sites)
            self.snapshot.sites.append(folded)
        return index

    def _number(self, value: Any, field: str, bound: tuple[int, str]) -> int:
        try:
            return _checked(value, field, bound)
        except FieldError as err:
            raise InputError(
                f"{self.snapshot.path}: {err}: not a memory snapshot torch wrote (corrupt or crafted); nothing in "
                "it was analysed (take the snapshot again with torch.cuda.memory._dump_snapshot)."
            ) from None

    # -- segments and their blocks --
    def add_segment(self, segment: Any) -> None:
        if not isinstance(segment, dict):
            raise InputError(f"{self.snapshot.path}: a segment is a {type(segment).__name__}, not a dict: "
                             "not a CUDA memory snapshot.")  # fmt: skip
        where = f"segments[{len(self.snapshot.segments)}]"
        number = self._number
        device = number(segment.get("device"), f"{where}.device", _DEVICE)
        seg_address = number(segment.get("address"), f"{where}.address", _ADDRESS)
        address = seg_address
        allocated = largest_free = 0
        blocks = segment.get("blocks")
        if isinstance(blocks, FlatList):  # blocks without stacks, matched as one span
            blocks = blocks.items or []
        elif not isinstance(blocks, list):
            blocks = []
        for index, block in enumerate(blocks):
            if not isinstance(block, dict):
                continue
            size = number(block.get("size"), f"{where}.blocks[{index}].size", _SIZE)
            state = as_text(block.get("state", "unknown"), "unknown")
            frames = block.get("frames")
            if frames is None and "history" in block:  # torch 2.0: the stack lives in the block's history
                self.snapshot.format = "torch-2.0"
                history = block.get("history") or ()
                frames = history[-1].get("frames", []) if history and isinstance(history[-1], dict) else []
            if state.startswith("active"):
                allocated += size
                self.snapshot.block_list.append(
                    Block(
                        device,
                        seg_address,
                        number(block.get("address", address), f"{where}.blocks[{index}].address", _ADDRESS),
                        size,
                        number(block.get("requested_size", size), f"{where}.blocks[{index}].requested_size", _SIZE),
                        state,
                        self.snapshot.sites[self._site(frames)],
                    )
                )
            elif state == "inactive":
                largest_free = max(largest_free, size)
            address += size
        reported = segment.get("allocated_size")
        self.snapshot.segments.append(
            SegmentInfo(
                device=device,
                address=seg_address,
                total_size=number(segment.get("total_size"), f"{where}.total_size", _SIZE),
                allocated_size=allocated if reported is None else number(reported, f"{where}.allocated_size", _SIZE),
                stream=_int(segment.get("stream")),
                segment_type=as_text(segment.get("segment_type", "")),
                is_expandable=bool(segment.get("is_expandable", False)),
                largest_free_block=largest_free,
            )
        )

    # -- history --
    def add_event(self, device: int, event: Any) -> None:
        if not isinstance(event, dict):
            return
        history = self.snapshot.histories.get(device)
        if history is None:
            history = self.snapshot.histories[device] = DeviceHistory()
        action = event.get("action")
        kind = ACTION_KINDS.get(action) if isinstance(action, str) else None
        if kind is None:
            kind = OTHER
            if len(history) < _ACTIONS_CHECKED:
                self._unknown_actions.add(as_text(action, describe(action)))
        time_us = event.get("time_us")
        where = f"device_traces[{device}][{len(history)}]"
        address = self._number(event.get("addr"), f"{where}.addr", _ADDRESS)
        size = self._number(event.get("size"), f"{where}.size", _REQUEST if kind == OOM else _SIZE)
        history.kind.append(kind)
        history.addr.append(address)
        history.size.append(size)
        history.time_us.append(_NO_TIME if time_us is None else _clamp(time_us))
        history.site.append(self._site(event.get("frames")))
        if kind == OOM and event.get("device_free") is not None:
            free = self._number(event.get("device_free"), f"{where}.device_free", _SIZE)
            history.device_free[len(history) - 1] = free
        self._events += 1
        if self._progress is not None and self._events % _PROGRESS_EVERY == 0:
            self._progress(self._events)

    def finish(self, rest: dict[str, Any], segments_only: bool = False) -> MemorySnapshot:
        snapshot = self.snapshot
        settings = rest.get("allocator_settings")
        snapshot.allocator_settings = settings if isinstance(settings, dict) else {}
        if segments_only:
            snapshot.format = "segments-only"
            snapshot.problems.append(
                "this snapshot has no allocation history (torch.cuda.memory_snapshot() of an old torch, or "
                "_record_memory_history was not enabled): no peak, no OOM event, no allocation timeline"
            )
            return snapshot
        if self._unknown_actions:
            snapshot.problems.append(
                "trace actions this version of torchtriage does not know were ignored: "
                f"{', '.join(sorted(self._unknown_actions))} (a snapshot from a newer torch?)"
            )
        if not snapshot.has_history():
            snapshot.problems.append(
                "no allocation history in this snapshot (enable it with "
                "torch.cuda.memory._record_memory_history(max_entries=100000) before the failure): "
                "no peak, no OOM event, sites are those of the blocks alive when it was taken"
            )
        return snapshot


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _clamp(value: Any) -> int:
    """An int64 column value: addresses, sizes and times always fit; anything else reads as 0."""
    if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:  # nearly always: no conversion
        return value
    number = _int(value)
    return number if _INT64_MIN <= number <= _INT64_MAX else 0


# -- from already unpickled data (small files, and data built in memory) --
def interpret(data: Any, path: str, fold: Fold) -> MemorySnapshot:
    """Recognise and reduce already unpickled snapshot data (a pure function, tested on data)."""
    builder = _Builder(path, fold)
    if isinstance(data, list):
        if not all(isinstance(s, dict) and "blocks" in s for s in data[:10]):
            raise InputError(f"{path}: a list, but not a list of allocator segments: not a CUDA memory snapshot.")
        for segment in data:
            builder.add_segment(segment)
        return builder.finish({}, segments_only=True)
    _check_top_level(data, path)
    for segment in data.get("segments") or ():
        builder.add_segment(segment)
    for device, trace in enumerate(data.get("device_traces") or ()):
        for event in trace:
            builder.add_event(device, event)
    return builder.finish(data)


def _check_top_level(data: Any, path: str) -> None:
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
    segments, traces = data.get("segments"), data.get("device_traces")
    if segments is not None and not isinstance(segments, list):
        raise InputError(f"{path}: 'segments' is a {type(segments).__name__}, not a list: an unknown snapshot format.")
    if traces is not None and (not isinstance(traces, list) or any(not isinstance(t, list) for t in traces)):
        raise InputError(f"{path}: 'device_traces' is not a list of per-device lists: an unknown snapshot format.")


# -- from a file, as a stream --
class _SegmentSink(Sink):
    __slots__ = ("builder",)

    def __init__(self, builder: _Builder) -> None:
        super().__init__()
        self.builder = builder

    def take(self, items: list) -> None:
        for segment in items:
            self.builder.add_segment(segment)


class _EventSink(Sink):
    __slots__ = ("builder", "device")

    def __init__(self, builder: _Builder, device: int) -> None:
        super().__init__()
        self.builder, self.device = builder, device

    def take(self, items: list) -> None:
        add, device = self.builder.add_event, self.device
        for event in items:
            add(device, event)


class _TraceLists(Sink):
    """`device_traces`: its items are the per-device event sinks, already consumed."""

    __slots__ = ("taken",)

    def __init__(self) -> None:
        super().__init__()
        self.taken = 0

    def take(self, items: list) -> None:
        if any(not isinstance(item, _EventSink) for item in items):
            raise PickleError("'device_traces' holds something other than per-device lists")
        self.taken += len(items)


class _SnapshotReader(StreamingUnpickler):
    """Puts sinks where the snapshot's `segments` and per-device traces would be built."""

    def __init__(self, stream: BinaryIO, builder: _Builder) -> None:
        super().__init__(stream)
        self.builder = builder

    def new_list(self) -> list:
        stack, metastack = self.stack, self.metastack
        # A per-device trace: an item of `device_traces`, appended alone (APPEND) or in a batch (MARK ... APPENDS).
        if stack and type(stack[-1]) is _TraceLists:
            return self._sink(_EventSink(self.builder, stack[-1].taken))
        if metastack and metastack[-1] and type(metastack[-1][-1]) is _TraceLists:
            return self._sink(_EventSink(self.builder, metastack[-1][-1].taken + len(stack)))
        key = self._top_level_key()
        if key == "segments":
            return self._sink(_SegmentSink(self.builder))
        if key == "device_traces":
            return self._sink(_TraceLists())
        return []

    def _sink(self, sink: Sink) -> Sink:
        self.streaming = True
        return sink

    def _top_level_key(self) -> Any:
        """The key whose value is being built, when it is a value of the top-level dict."""
        stack, metastack = self.stack, self.metastack
        if len(metastack) == 1 and len(metastack[0]) == 1 and type(metastack[0][0]) is dict and len(stack) % 2:
            return stack[-1]  # inside the top-level SETITEMS batch: key, value, ..., key
        if not metastack and len(stack) == 2 and type(stack[0]) is dict:
            return stack[1]  # a one-key dict: SETITEM
        return None


def load_snapshot(path: str, fold: Fold, progress: Callable[[int], None] | None = None) -> MemorySnapshot:
    """Read one snapshot file, reducing each stack with `fold`; every failure is an InputError naming the file.

    The file is read in a bounded child (sources/isolated.py): a crafted file that crashes, exhausts or
    stalls its reader is an InputError like any other. `progress`, if given, is called with the number of
    history events read so far, every 200,000.
    """
    try:
        extra = seconds_for_size(os.path.getsize(path))
    except OSError:
        extra = 0.0
    read = call_isolated(lambda tick: _read_snapshot(path, fold, tick if progress else None), progress, extra)
    if isinstance(read, Stopped):
        raise InputError(f"{path}: {read.message()}.")
    return read


def _read_snapshot(path: str, fold: Fold, progress: Callable[[int], None] | None) -> MemorySnapshot:
    try:
        with open_counted(path, "the snapshot", streamed=True) as stream:
            head = stream.peek(4096)[:4096]
            if head[:1] in (b"{", b"["):
                raise InputError(
                    f"{path}: this is JSON, not a pickled memory snapshot; a profiler trace? "
                    f"Try `torchtriage trace {path}`."
                )
            if not head:
                raise InputError(f"{path}: cannot be read as a memory snapshot: the file is empty.")
            # Snapshots stream; anything else (an old bare list of segments, another pickle) is small or not
            # a snapshot at all, and the C unpickler reads it faster and says what it is.
            if b"segments" in head or b"device_traces" in head:
                try:
                    return _stream(stream, path, fold, progress)
                except SharedContainer:
                    pass
        data = safe_loads(read_whole(path, "the snapshot")[0])
    except IsADirectoryError:
        raise InputError(f"{path}: a folder; give the snapshot file (the .pickle written by _dump_snapshot).") from None
    except (EOFError, zlib.error) as err:
        raise InputError(f"{path}: a gzip file that cannot be decompressed ({err}); is it truncated?") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read it ({getattr(err, 'strerror', None) or err}).") from None
    except PickleError as err:
        raise InputError(f"{path}: cannot be read as a memory snapshot: {err}.") from None
    except LimitExceeded as err:
        raise InputError(f"{path}: {err}.") from None
    return interpret(data, path, fold)


def _stream(stream: BinaryIO, path: str, fold: Fold, progress: Callable[[int], None] | None) -> MemorySnapshot:
    builder = _Builder(path, fold, progress)
    reader = _SnapshotReader(io.BufferedReader(stream) if not hasattr(stream, "peek") else stream, builder)
    top = reader.load()
    if not isinstance(top, dict) or not (
        isinstance(top.get("segments"), _SegmentSink) or isinstance(top.get("device_traces"), _TraceLists)
    ):
        # "segments" appeared near the start but not as a snapshot's key: judge the data as it is.
        return interpret(top, path, fold)
    _check_top_level(top, path)  # the other key may still be of the wrong kind
    return builder.finish(top)
