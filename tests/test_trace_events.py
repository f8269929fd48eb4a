"""One huge or deeply nested event of a profiler trace is read in linear time: the streaming reader decodes an
event that does not fit its buffer again from its start only after reading as much again as it holds, so the
characters it decodes stay within a few times the file's size (one chunk at a time, a 58 MB event was decoded
58 times over). The bound is a count of the characters handed to the JSON decoder, not a time."""

from __future__ import annotations

import json

import pytest

from torchtriage.sources import profiler_trace
from torchtriage.sources.profiler_trace import TraceReadError, read_trace

CHUNK = 1 << 16  # the reader's chunk, made small so that a 4 MB event spans 64 of them
KERNEL = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ts": 10.0, "dur": 5.0}


class CountingDecoder(json.JSONDecoder):
    """The reader's decoder, counting the characters each attempt may read: to the value's end when it
    decodes, to the buffer's end when it does not (an incomplete value is read to the end of what is there)."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0
        self.characters = 0

    def raw_decode(self, s, idx=0):
        self.attempts += 1
        try:
            value, end = super().raw_decode(s, idx)
        except json.JSONDecodeError:
            self.characters += len(s) - idx
            raise
        self.characters += end - idx
        return value, end


@pytest.fixture
def decoder(monkeypatch) -> CountingDecoder:
    counting = CountingDecoder()
    monkeypatch.setattr(profiler_trace._Scanner, "_decoder", counting)
    monkeypatch.setattr(profiler_trace, "_CHUNK", CHUNK)
    return counting


def _trace(tmp_path, big_event: str, cut: int | None = None):
    text = '{"traceEvents": [' + json.dumps(KERNEL) + ", " + big_event + ", " + json.dumps(KERNEL) + "]}"
    path = tmp_path / "trace_rank0.json"
    path.write_text(text[:cut])
    return path, len(text)


BIG = 4 << 20
EVENTS = {
    "a list of a million numbers": json.dumps(
        {"ph": "X", "cat": "cpu_op", "name": "op", "ts": 1, "dur": 1, "args": {"Input Dims": [[1] * (BIG // 3)]}}
    ),  # fmt: skip
    "a string of 4 MB": json.dumps({"ph": "i", "name": "note", "args": {"text": "x" * BIG}}),
    "arrays nested 500 deep": '{"ph": "X", "name": "op", "args": {"a": '
    + "[" * 500
    + ",".join(["7"] * (BIG // 2))
    + "]" * 500
    + "}}",
}


@pytest.mark.parametrize("shape", EVENTS)
def test_one_event_larger_than_many_chunks_is_decoded_a_few_times_over_not_once_per_chunk(tmp_path, decoder, shape):
    path, size = _trace(tmp_path, EVENTS[shape])
    trace = read_trace(str(path))
    assert trace.events == 3 and len(trace.gpu_ts) == 2  # the kernels on either side of it are read
    assert decoder.characters <= 4 * size, f"{decoder.characters:,} characters decoded for a {size:,}-byte file"
    # Decoded again each time its buffer doubles: log2(4 MB / 64 KB) = 6 retries, not 64.
    assert decoder.attempts <= 3 + 2 + 8, decoder.attempts


def test_a_huge_event_cut_off_is_named_truncated_after_the_events_before_it(tmp_path, decoder):
    path, size = _trace(tmp_path, EVENTS["a list of a million numbers"], cut=BIG // 2)
    trace = read_trace(str(path))
    assert trace.partial and trace.events == 1
    assert "the file is truncated" in trace.problems[0]
    assert decoder.characters <= 4 * size


def test_an_event_past_the_largest_an_event_may_be_is_refused_not_read_whole(tmp_path, decoder, monkeypatch):
    monkeypatch.setattr(profiler_trace, "_MAX_EVENT_CHARS", 1 << 20)
    path, _ = _trace(tmp_path, EVENTS["a string of 4 MB"])
    trace = read_trace(str(path))
    assert trace.partial and trace.events == 1 and "invalid JSON" in trace.problems[0]


def test_nesting_deeper_than_the_decoder_goes_is_refused_with_a_reason(tmp_path, decoder):
    path = tmp_path / "trace_rank0.json"
    path.write_text('{"traceEvents": [{"args": ' + "[" * 100_000 + "]" * 100_000 + "}]}")
    with pytest.raises(TraceReadError, match="nested too deep"):
        read_trace(str(path))
