"""Writing CUDA memory snapshots of any size, byte for byte as `pickle.dump(snapshot, f)` would.

A snapshot of gigabytes cannot be built as Python objects and then pickled (it would need several times
its size in memory), so this module writes the pickle itself, streaming, with the opcodes the pickler
emits at protocol 4 (the default of `torch.cuda.memory._dump_snapshot`): objects seen before referenced
with BINGET, lists and dicts in batches of 1000, and FRAME headers every 64 KiB.
`tests/test_pickle_stream.py` checks the output equals `pickle.dumps` on data small enough to build.

The objects are laid out as torch lays them out (recorded on torch 2.11): one dict per distinct frame,
shared by every stack that holds it; a stack list per allocation, shared by the events of that block
(its free refers back to it); strings shared, except the `"N/A"` of `compile_context`, new in each event.

A stack written once, after its frames were memoized, is written again as the same bytes (as the
pickler would), which keeps writing a gigabyte to a minute or so.
"""

from __future__ import annotations

import bisect
import random
import struct
from collections.abc import Iterator
from typing import Any, BinaryIO

_FRAME_TARGET = 64 * 1024
_BATCH = 1000


class Lazy:
    """A list written from an iterator: `count` items, produced while writing."""

    def __init__(self, count: int, items: Iterator[Any]) -> None:
        self.count, self.items = count, items


class Frames(list):
    """A stack: a list of shared frame dicts. `key` names its content (equal keys, equal bytes once its
    frames are memoized); a Frames that is referred to again (an allocation's, by its free) is memoized
    by identity until `last` is set on its last use."""

    def __init__(self, frames: list, key: Any) -> None:
        super().__init__(frames)
        self.key, self.shared, self.last = key, False, False


class Frame(dict):
    """A frame dict that many stacks share: memoized by identity, referred to after its first write."""


class Fresh(str):
    """A string written anew each time (and memoized, as the pickler does, though never referred to)."""


class PickleWriter:
    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._frame = bytearray()
        self._memo: dict[int, int] = {}  # id(object) -> memo index, for strings, Frame dicts and shared Frames
        self._keep: list[Any] = []  # keeps memoized strings and frames alive, so their ids stay theirs
        self._next = 0
        # Frames.key -> (bytes, memo entries inside, offsets where the pickler would check for a frame boundary)
        self._stacks: dict[Any, tuple[bytes, int, list[int]]] = {}
        self._recording: list[int] | None = None

    def dump(self, obj: Any) -> None:
        self._file.write(b"\x80\x04")
        self._save(obj)
        self._frame += b"."
        self._commit(force=True)

    def _commit(self, force: bool = False) -> None:
        if len(self._frame) >= _FRAME_TARGET or (force and self._frame):
            if len(self._frame) >= 4:
                self._file.write(b"\x95" + struct.pack("<Q", len(self._frame)))
            self._file.write(self._frame)
            self._frame = bytearray()

    def _memoize(self) -> None:
        self._frame += b"\x94"
        self._next += 1

    def _save(self, obj: Any) -> None:  # noqa: C901 - one case per type, as the pickler has
        self._commit()
        if self._recording is not None:
            self._recording.append(len(self._frame))
        out = self._frame
        if obj is None:
            out += b"N"
        elif obj is True:
            out += b"\x88"
        elif obj is False:
            out += b"\x89"
        elif isinstance(obj, int):
            if 0 <= obj < 256:
                out += b"K" + bytes((obj,))
            elif 0 <= obj < 65536:
                out += b"M" + struct.pack("<H", obj)
            elif -(1 << 31) <= obj < (1 << 31):
                out += b"J" + struct.pack("<i", obj)
            else:
                data = obj.to_bytes((obj.bit_length() + 8) // 8, "little", signed=True)
                if obj < 0 and len(data) > 1 and data[-1] == 0xFF and data[-2] & 0x80:
                    data = data[:-1]
                out += b"\x8a" + bytes((len(data),)) + data
        elif isinstance(obj, float):
            out += b"G" + struct.pack(">d", obj)
        elif isinstance(obj, (str, Frame, Frames)) and id(obj) in self._memo:
            index = self._memo[id(obj)]
            out += b"h" + bytes((index,)) if index < 256 else b"j" + struct.pack("<I", index)
            if isinstance(obj, Frames) and obj.last:
                del self._memo[id(obj)]
        elif isinstance(obj, str):
            data = obj.encode("utf-8", "surrogatepass")
            out += (b"\x8c" + bytes((len(data),)) if len(data) < 256 else b"X" + struct.pack("<I", len(data))) + data
            if not isinstance(obj, Fresh):
                self._memo[id(obj)] = self._next
                self._keep.append(obj)
            self._memoize()
        elif isinstance(obj, Frames) and obj.key in self._stacks:
            if obj.shared:
                self._memo[id(obj)] = self._next
            self._replay(*self._stacks[obj.key])
        elif isinstance(obj, (list, Lazy)):
            start, first = len(out), self._next
            known = len(self._memo)
            record = isinstance(obj, Frames) and self._recording is None
            if record:
                self._recording = []
                if obj.shared:
                    self._memo[id(obj)] = self._next
                    known += 1
            out += b"]"
            self._memoize()
            count, items = (obj.count, obj.items) if isinstance(obj, Lazy) else (len(obj), iter(obj))
            self._batches(count, items, b"e", b"a")
            if record:
                offsets, self._recording = self._recording, None
                if len(self._memo) == known and self._frame is out:  # all its frames were memoized already
                    self._stacks[obj.key] = (bytes(out[start:]), self._next - first, [o - start for o in offsets])
        elif isinstance(obj, dict):
            if isinstance(obj, Frame):
                self._memo[id(obj)] = self._next
                self._keep.append(obj)
            out += b"}"
            self._memoize()
            pairs = iter(obj.items())
            self._batches(len(obj), pairs, b"u", b"s", pairs=True)
        else:
            raise TypeError(f"not plain data: {type(obj).__name__}")

    def _replay(self, data: bytes, entries: int, offsets: list[int]) -> None:
        """Write a stack's bytes again, committing a frame where the pickler would (before an object)."""
        done = 0
        while True:
            at = bisect.bisect_left(offsets, _FRAME_TARGET - len(self._frame) + done)
            if at == len(offsets):
                break
            self._frame += data[done : offsets[at]]
            done = offsets[at]
            self._commit()
        self._frame += data[done:]
        self._next += entries

    def _batches(self, count: int, items: Iterator[Any], many: bytes, one: bytes, pairs: bool = False) -> None:
        def save(item: Any) -> None:
            if pairs:
                self._save(item[0])
                self._save(item[1])
            else:
                self._save(item)

        if count == 0:
            return
        if count == 1:
            save(next(items))
            self._frame += one
            return
        left = count
        while left:
            self._frame += b"("
            for _ in range(min(left, _BATCH)):
                save(next(items))
            left -= min(left, _BATCH)
            self._frame += many


# -- a training job's allocator history, synthetic but shaped like a real one --
_NATIVE = [
    ("torch::unwind::unwind()", "??"),
    ("torch::CapturedTraceback::gather(bool, bool, bool)", "??"),
    ("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp"),
    (
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, "
        "CUstream_st*)",
        "??",
    ),
    (
        "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long, "
        "CUstream_st*)",
        "??",
    ),
    (
        "at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, "
        "std::optional<c10::MemoryFormat>)",
        "??",
    ),
    ("at::native::empty_cuda(c10::ArrayRef<long>, ...)", "??"),
    ("at::_ops::empty_memory_format::call(c10::ArrayRef<c10::SymInt>, ...)", "??"),
]
_TAIL = [("_PyEval_EvalFrameDefault", "??"), ("PyObject_Call", "??"), ("Py_RunMain", "??"), ("_start", "??")]
_OPS = ["mm", "addmm", "bmm", "empty_like", "native_layer_norm", "gelu", "softmax", "add", "mul", "cat"]
_LIBRARY = "/venv/lib/python3.11/site-packages/torch/nn/modules/"


def _stack_pool(count: int, rng: random.Random) -> list[list[tuple[str, str, int]]]:
    """`count` distinct 30-frame stacks over a few hundred code locations, as (name, filename, line)."""
    files = [f"/workspace/model/layer{i}.py" for i in range(40)] + [_LIBRARY + m for m in ("linear.py", "module.py")]
    stacks = []
    for _ in range(count):
        op = rng.choice(_OPS)
        native = [(name.replace("empty_memory_format", f"{op}"), file, 0) for name, file in _NATIVE]
        python = [
            (
                rng.choice(["forward", "_call_impl", "_wrapped_call_impl", "train_step"]),
                rng.choice(files),
                rng.randrange(1, 400),
            )
            for _ in range(30 - len(native) - len(_TAIL))
        ]
        stacks.append(native + python + [(name, file, 0) for name, file in _TAIL])
    return stacks


def synthetic_snapshot(events: int, stacks: int = 3000, live_blocks: int = 20_000, seed: int = 0) -> dict:
    """A one-device snapshot: `events` history events (allocations and frees, an OOM last), `live_blocks`
    live blocks in the segments. Returns the top-level dict with its history as a Lazy list."""
    rng = random.Random(seed)
    strings: dict[Any, str] = {}

    def s(text: str) -> str:  # one object per distinct string, as torch's snapshot has
        return strings.setdefault(text, text)

    pool = _stack_pool(stacks, rng)
    frames: dict[tuple, Frame] = {}

    def frame(name: str, file: str, line: int) -> Frame:
        key = (name, file, line)
        if key not in frames:
            frames[key] = Frame({s("name"): s(name), s("filename"): s(file), s("line"): line})
        return frames[key]

    stack_frames = [[frame(*f) for f in stack] for stack in pool]

    def stack(number: int) -> Frames:
        return Frames(stack_frames[number], number)

    mib = 1 << 20
    base = 0x7F0000000000
    blocks = [
        {
            s("address"): base + i * 2 * mib,
            s("size"): 2 * mib,
            s("requested_size"): 2 * mib,
            s("state"): s("active_allocated"),
            s("frames"): stack(i % len(pool)),
        }
        for i in range(live_blocks)
    ]
    segment = {
        s("device"): 0,
        s("address"): base,
        s("total_size"): live_blocks * 2 * mib,
        s("allocated_size"): live_blocks * 2 * mib,
        s("active_size"): live_blocks * 2 * mib,
        s("requested_size"): live_blocks * 2 * mib,
        s("stream"): 0,
        s("segment_type"): s("large"),
        s("segment_pool_id"): [0, 0],
        s("is_expandable"): False,
        s("blocks"): blocks,
        s("frames"): stack(0),
    }

    def event(action: str, addr: int, size: int, time_us: int, frames: Frames) -> dict:
        return {
            s("action"): s(action),
            s("addr"): addr,
            s("size"): size,
            s("stream"): 0,
            s("time_us"): time_us,
            s("compile_context"): Fresh("N/A"),
            s("user_metadata"): s(""),
            s("frames"): frames,
        }

    def history() -> Iterator[dict]:
        live: list[tuple[int, int, Frames]] = []
        time_us = 1_796_007_560_374_427
        scratch = base + (1 << 40)
        for i in range(events - 1):
            time_us += rng.randrange(1, 50)
            if live and (rng.random() < 0.49 or len(live) > 4000):
                addr, size, frames = live.pop(rng.randrange(len(live)))
                frames.last = True  # the free refers back to its allocation's stack, for the last time
                yield event("free_completed", addr, size, time_us, frames)
            else:
                addr, size = scratch + i * 4096, rng.choice((512, 4096, mib, 16 * mib, 64 * mib))
                frames = stack(rng.randrange(len(pool)))
                frames.shared = True
                live.append((addr, size, frames))
                yield event("alloc", addr, size, time_us, frames)
        oom = event("oom", 0, 80 << 30, time_us + 1, stack(0))
        oom[s("device_free")] = 1 << 30
        yield oom

    return {
        s("segments"): [segment],
        s("device_traces"): [Lazy(events, history())],
        s("allocator_settings"): {s("PYTORCH_CUDA_ALLOC_CONF"): s(""), s("expandable_segments"): False},
    }


def write_snapshot(path: str, events: int, **kwargs: Any) -> None:
    with open(path, "wb") as file:
        PickleWriter(file).dump(synthetic_snapshot(events, **kwargs))
