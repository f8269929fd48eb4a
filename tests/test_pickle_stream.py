"""The streaming restricted unpickler: same values as pickle.loads, nothing run, every bad byte a clear error;
and memory snapshots read through it: the same analysis as a whole load, in a fraction of the memory."""

from __future__ import annotations

import io
import pickle
import random
import sys
import tracemalloc
from pathlib import Path

import pytest

from torchtriage.analysis.memory import analyse_snapshot, fold_frames, read_snapshot, snapshot_from_data
from torchtriage.sources import pickle_stream
from torchtriage.sources.memory_snapshot import _read_snapshot
from torchtriage.sources.pickle_stream import StreamingUnpickler
from torchtriage.sources.safe_pickle import PickleCorrupt, PickleError, PickleRefused, safe_loads

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from snapshot_writer import Frame, Frames, Fresh, Lazy, PickleWriter, synthetic_snapshot  # noqa: E402

SHARED = ["shared", 1]
PLAIN = {
    "ints": [0, 1, 255, 256, 65535, 65536, -1, -(2**31), 2**31 - 1, 2**31, 2**63, -(2**70), 10**40],
    "floats": [0.0, -1.5, 1e300, float("inf")],
    "text": ["", "a", "é€😀", "x" * 300, "y" * 70_000],
    "bytes": [b"", b"\x00\xff", bytes(300)],
    "bytearray": bytearray(b"abc"),
    "consts": [None, True, False],
    "tuples": [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)],
    "sets": [set(), {1, 2}, frozenset({"a"})],
    "nested": {"a": [{"b": [1, {"c": ()}]}], 5: "int key", (1, 2): "tuple key"},
    "batches": list(range(2500)),
    "big_dict": {f"k{i}": i for i in range(1200)},
    "shared": [SHARED, SHARED, {"again": SHARED}],
}


def _load(data: bytes):
    return StreamingUnpickler(io.BytesIO(data)).load()


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_plain_data_reads_as_pickle_loads(protocol):
    """Whatever the protocol spells with opcodes alone reads as pickle.loads reads it; what it spells by
    naming a global (sets before protocol 4, bytes before 3, bytearray before 5) is refused by both readers."""
    accepted = 0
    for name, value in PLAIN.items():
        data = pickle.dumps(value, protocol=protocol)
        try:
            expected = safe_loads(data)
        except PickleRefused:
            with pytest.raises(PickleRefused):
                _load(data)
            continue
        assert _load(data) == expected == pickle.loads(data), name
        accepted += 1
    assert accepted >= (len(PLAIN) if protocol == 5 else 8)


def test_buffer_boundaries_anywhere(monkeypatch):
    """Tiny read chunks put every opcode and argument across a refill at some point."""
    monkeypatch.setattr(pickle_stream, "_CHUNK", 7)
    monkeypatch.setattr(pickle_stream, "_LOOKAHEAD", 13)
    data = pickle.dumps(PLAIN, protocol=5)
    assert _load(data) == pickle.loads(data)
    text = {k: v for k, v in PLAIN.items() if k not in ("bytes", "bytearray", "sets")}
    for protocol in (0, 2):
        data = pickle.dumps(text, protocol=protocol)
        assert _load(data) == pickle.loads(data)


@pytest.mark.parametrize(
    "value",
    [
        print,  # GLOBAL / STACK_GLOBAL
        pickle.PickleError("x"),  # REDUCE
        io.BytesIO(b"x"),  # a class with __reduce_ex__ state
        Path("/etc/passwd"),
    ],
)
def test_anything_but_plain_data_is_refused(value):
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        try:
            data = pickle.dumps({"segments": [value]}, protocol=protocol)
        except (TypeError, pickle.PicklingError):
            continue
        with pytest.raises(PickleRefused, match="refused without running anything"):
            _load(data)


def test_a_hostile_pickle_runs_nothing(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    with pytest.raises(PickleRefused):
        _load(pickle.dumps({"device_traces": [[Evil()]]}))
    assert not marker.exists()


def test_every_truncation_is_a_clear_error():
    data = pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "frames": [{"line": 1}]}]]})
    for cut in range(len(data)):
        with pytest.raises(PickleCorrupt, match="truncated|empty|corrupt"):
            _load(data[:cut])


def test_corrupt_bytes_never_escape_as_other_errors():
    rng = random.Random(5)
    data = bytearray(_snapshot_bytes(60))
    for _ in range(400):
        broken = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            broken[rng.randrange(len(broken))] = rng.randrange(256)
        try:
            _load(bytes(broken))
        except PickleError:
            pass


def _snapshot_bytes(events: int, **kwargs) -> bytes:
    out = io.BytesIO()
    PickleWriter(out).dump(synthetic_snapshot(events, stacks=40, live_blocks=50, seed=3, **kwargs))
    return out.getvalue()


def _as_objects(value, copies=None):
    """The writer's lazy snapshot as the objects torch pickles: shared frames and stacks stay shared
    (one copy each), a fresh string stays a new object each time."""
    copies = {} if copies is None else copies
    if isinstance(value, Fresh):
        return str(value)
    if isinstance(value, (Frame, Frames)):
        if id(value) not in copies:
            copies[id(value)] = (value, _as_objects(dict(value) if isinstance(value, Frame) else list(value), copies))
        return copies[id(value)][1]
    if isinstance(value, Lazy):
        return [_as_objects(item, copies) for item in value.items]
    if isinstance(value, list):
        return [_as_objects(item, copies) for item in value]
    if isinstance(value, dict):
        return {key: _as_objects(item, copies) for key, item in value.items()}
    return value


def test_snapshot_writer_writes_what_pickle_writes():
    """The benchmark's writer is byte for byte the pickler, frames of 64 KiB included."""
    for events in (3, 2500):
        written = _snapshot_bytes(events)
        assert len(written) > 65536 or events == 3
        objects = _as_objects(synthetic_snapshot(events, stacks=40, live_blocks=50, seed=3))
        assert written == pickle.dumps(objects, protocol=4)


def test_streamed_snapshot_is_analysed_exactly_as_a_whole_one(tmp_path):
    data = _snapshot_bytes(5000)
    path = tmp_path / "big.pickle"
    path.write_bytes(data)
    streamed = read_snapshot(str(path))
    whole = snapshot_from_data(pickle.loads(data), str(path))
    for device in (0,):
        a, b = streamed.history(device), whole.history(device)
        assert len(a) == 5000
        assert (a.kind, a.addr, a.size, a.time_us, a.device_free) == (b.kind, b.addr, b.size, b.time_us, b.device_free)
        assert [streamed.sites[i] for i in a.site] == [whole.sites[i] for i in b.site]
    assert streamed.block_list == whole.block_list and streamed.segments == whole.segments
    facts = [analyse_snapshot(s).primary.to_facts() for s in (streamed, whole)]
    assert facts[0] == facts[1]
    assert facts[0]["oom"]["requested"] == 80 << 30 and facts[0]["history_events"] == 5000


def _python_memory_peak(read, path: Path) -> int:
    tracemalloc.start()
    try:
        read(path)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_grows_far_slower_than_a_whole_load(tmp_path):
    """The history is reduced as it is read: 50,000 more events cost the streaming reader a small
    fraction of what they cost pickle.load (which holds every event as a dict)."""
    ours, whole, sizes = [], [], []
    for events in (10_000, 60_000):
        path = tmp_path / f"{events}.pickle"
        with open(path, "wb") as file:
            PickleWriter(file).dump(synthetic_snapshot(events, stacks=300, live_blocks=500, seed=1))
        sizes.append(path.stat().st_size)
        # The reader itself, in this process: the command runs it in a child, where tracemalloc here sees nothing.
        ours.append(_python_memory_peak(lambda at: _read_snapshot(str(at), fold_frames, None), path))
        whole.append(_python_memory_peak(lambda at: pickle.loads(at.read_bytes()), path))
    growth, whole_growth = ours[1] - ours[0], whole[1] - whole[0]
    assert whole_growth > 3 * (sizes[1] - sizes[0])  # a whole load: several times the file
    assert growth < whole_growth / 6, (sizes, ours, whole)


def test_a_shared_container_falls_back_to_a_whole_load(tmp_path):
    """Pickles built in Python may reference one stack from many events; they are read whole instead."""
    stack = [{"filename": "/w/train.py", "line": 3, "name": "step"}]
    trace = [{"action": "alloc", "addr": i, "size": 1 << 20, "frames": stack} for i in range(3)]
    path = tmp_path / "shared.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}))
    report = analyse_snapshot(read_snapshot(str(path)))
    assert report.primary.top_sites(1)[0].site == "/w/train.py:3 in step"
    assert report.primary.peak_allocated == 3 << 20


def test_progress_is_reported_while_a_long_history_is_read(tmp_path, monkeypatch):
    from torchtriage.sources import memory_snapshot

    monkeypatch.setattr(memory_snapshot, "_PROGRESS_EVERY", 1000)
    path = tmp_path / "s.pickle"
    path.write_bytes(_snapshot_bytes(2500))
    seen: list[int] = []
    read_snapshot(str(path), seen.append)
    assert seen == [1000, 2000]


def test_progress_line_only_on_a_terminal(monkeypatch, capsys):
    from torchtriage.cli.progress import counting

    with counting("/x/snap.pickle") as report:
        assert report is None  # captured stderr is not a terminal: nothing is printed
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with counting("/x/snap.pickle", "history events") as report:
        report(1_200_000)
    err = capsys.readouterr().err
    assert "reading snap.pickle: 1,200,000 history events" in err and err.endswith("\r\x1b[K")


def test_gzipped_snapshots_stream_and_a_cut_gzip_is_named(tmp_path, capsys):
    import gzip

    from torchtriage import exit_codes
    from torchtriage.cli import main

    data = _snapshot_bytes(3000)
    packed = gzip.compress(data)
    path = tmp_path / "s.pickle.gz"
    path.write_bytes(packed)
    streamed = analyse_snapshot(read_snapshot(str(path))).primary.to_facts()
    whole = analyse_snapshot(snapshot_from_data(pickle.loads(data), str(path))).primary.to_facts()
    assert streamed == whole and streamed["history_events"] == 3000
    path.write_bytes(packed[: len(packed) // 2])
    assert main(["memory", str(path)]) == exit_codes.BAD_INPUT
    assert "gzip" in capsys.readouterr().err


FIXTURES = Path(__file__).parent / "fixtures"
REAL_SNAPSHOTS = sorted(
    [FIXTURES / "h200x2" / "oom_snapshot.pickle"]
    + list((FIXTURES / "h200x2_runtime").glob("*/*.pickle"))
    + list((FIXTURES / "h200x2_runtime").glob("*/*.pickle.gz"))
)


@pytest.mark.parametrize("path", REAL_SNAPSHOTS, ids=lambda p: p.name)
def test_real_snapshots_stream_without_falling_back_and_agree_with_a_whole_load(path):
    """Snapshots recorded on H200s with torch 2.11 (shared frame dicts, stacks shared by an allocation and
    its free): the streaming reader reads them itself and finds exactly what a whole load finds."""
    import gzip

    from torchtriage.analysis.memory import fold_frames
    from torchtriage.sources.memory_snapshot import _stream

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as stream:
        streamed = _stream(stream, str(path), fold_frames, None)  # SharedContainer here would be a fallback
    with opener(path, "rb") as stream:
        whole = snapshot_from_data(pickle.loads(stream.read()), str(path))
    facts = [[d.to_facts() for d in analyse_snapshot(s).devices] for s in (streamed, whole)]
    assert facts[0] == facts[1] and facts[0]
    if path.name == "train_snapshot.pickle.gz":  # 12 steps of a 6-block MLP with AdamW, 4,000 entries kept
        device = facts[0][0]
        assert device["history_events"] == 4000
        assert device["top_sites"][0]["site"].endswith("tests/gpu/check_snapshot_stream.py:49 in train")
