"""PyTorch profiler (Kineto) Chrome traces, streamed: one event object decoded at a time.

A trace of gigabytes never sits in memory as Python objects. The top-level object is scanned by hand;
the `traceEvents` array is decoded one element at a time with `json.JSONDecoder.raw_decode` over a
buffer refilled in chunks (gzip or plain), and each event is reduced at once to the few numbers the
analysis needs (GPU intervals as floats in arrays, step and annotation ranges, collective records).

Classification of GPU activities (compute, communication, memory) is data: `knowledge/kernels.toml`.
"""

from __future__ import annotations

import codecs
import io
import json
import math
import re
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torchtriage.knowledge.kernels import COMMUNICATION, KernelTable, kernel_table
from torchtriage.model import SourceKind
from torchtriage.sources import limits
from torchtriage.sources.fields import as_int, as_text, describe, is_plain_int, json_reason
from torchtriage.sources.limits import LimitExceeded
from torchtriage.sources.registry import rank_from_name
from torchtriage.sources.streams import open_counted

_CHUNK = 1 << 20
_BLANKS = re.compile(r"[ \t\r\n]*")
_MAX_EVENT_CHARS = 64 << 20  # one event bigger than this is not truncation but garbage
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_TIME_RANGE = 1 << 62  # µs: beyond any clock


class TraceReadError(ValueError):
    """The trace cannot be read (fully): the message names the problem; `partial` says if events were read."""

    def __init__(self, message: str, partial: bool = False) -> None:
        super().__init__(message)
        self.partial = partial


# ----------------------------------------------------------------------------- streaming JSON


class _Scanner:
    """Scan a JSON document held in a text stream, decoding values one at a time."""

    _decoder = json.JSONDecoder()

    def __init__(self, stream: io.BufferedIOBase, path: str) -> None:
        self.stream = stream
        # Decoded here rather than by a TextIOWrapper: read1() hands over what was decompressed before a
        # truncation, so the events in it are still used.
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.path = path
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.events_read = 0

    def _fill(self, at_least: int = 0) -> bool:
        """Append the next chunk, or as many as make `at_least` more characters; False at the end."""
        if self.eof:
            return False
        try:
            pieces = []
            size = 0
            while True:
                data = self.stream.read1(_CHUNK)
                pieces.append(self.decoder.decode(data, final=not data))
                size += len(data)
                if not data or size >= at_least:
                    break
            chunk = "".join(pieces)
        except LimitExceeded as err:
            raise TraceReadError(str(err), partial=self.events_read > 0) from None
        except (EOFError, zlib.error) as err:
            raise TraceReadError(
                f"the gzip stream is truncated or corrupt ({err}): the file was cut off while being written or copied",
                partial=self.events_read > 0,
            ) from None
        except UnicodeDecodeError as err:
            raise TraceReadError(f"not UTF-8 text ({err.reason}): not a JSON trace") from None
        except OSError as err:
            raise TraceReadError(f"cannot read it ({err})") from None
        if not data:
            self.eof = True
        if not size:
            return False
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        return True

    def _fill_for_value(self) -> bool:
        """More text for a value that did not end in the buffer: as much again as it holds of it so far, so that
        a value of n characters is decoded from its start O(log n) times, O(n) characters in all (a chunk at a
        time, a 58 MB event was decoded 58 times over: quadratic)."""
        pending = len(self.buf) - self.pos
        if pending >= _MAX_EVENT_CHARS:
            return False
        return self._fill(min(max(pending, _CHUNK), _MAX_EVENT_CHARS - pending))

    def peek(self) -> str:
        """The next non-blank character ('' at the end), without consuming it."""
        while True:
            buf = self.buf
            pos = self.pos = _BLANKS.match(buf, self.pos).end()  # blanks skipped in C, megabytes of them too
            if pos < len(buf):
                return buf[pos]
            if not self._fill():
                return ""

    def expect(self, char: str, what: str) -> None:
        found = self.peek()
        if found != char:
            shown = repr(found) if found else "the end of the file"
            raise TraceReadError(f"invalid JSON: expected {char!r} {what}, found {shown}", partial=self.events_read > 0)
        self.pos += 1

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                value, end = self._decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as err:
                if self._fill_for_value():
                    continue
                if self.eof and (err.pos >= len(self.buf) - 1 or err.msg.startswith("Unterminated")):
                    raise TraceReadError(
                        "the JSON ends in the middle of a value: the file is truncated (the profiler was killed "
                        "while exporting?)",
                        partial=self.events_read > 0,
                    ) from None
                raise TraceReadError(
                    f"invalid JSON ({err.msg}) after {self.events_read} events", partial=self.events_read > 0
                ) from None
            except (ValueError, RecursionError) as err:  # an integer of thousands of digits; nesting too deep
                raise TraceReadError(
                    f"{json_reason(err)}, after {self.events_read} events", partial=self.events_read > 0
                ) from None
            # A number or literal that ends exactly at the buffer's end may continue in the next chunk.
            if end == len(self.buf) and not self.eof and not isinstance(value, (dict, list, str)):
                if self._fill():
                    continue
            self.pos = end
            return value


def stream_trace(path: str, on_header: Callable[[str, Any], None]) -> Iterator[dict]:
    """Yield the events of `traceEvents` one by one; every other top-level key goes to `on_header`."""
    try:
        stream = open_counted(path, "the trace", streamed=True)
    except IsADirectoryError:
        raise TraceReadError("a folder, not a trace file") from None
    except OSError as err:
        raise TraceReadError(f"cannot open it ({err.strerror or err})") from None
    with stream:
        scanner = _Scanner(stream, path)
        first = scanner.peek()
        if first == "":
            raise TraceReadError("the file is empty")
        if first == "[":  # the bare-array form of the Chrome trace format
            yield from _array(scanner)
            return
        scanner.expect("{", "at the start of a Chrome trace (a JSON object with a 'traceEvents' array)")
        found_events = False
        while True:
            if scanner.peek() == "}":
                scanner.pos += 1
                break
            key = scanner.value()
            if not isinstance(key, str):
                raise TraceReadError("invalid JSON: an object key is not a string")
            scanner.expect(":", f"after the key {key!r}")
            if key == "traceEvents":
                found_events = True
                yield from _array(scanner)
            else:
                on_header(key, scanner.value())
            following = scanner.peek()
            if following == ",":
                scanner.pos += 1
            elif following != "}":
                if following == "":
                    raise TraceReadError("the JSON ends before its closing '}': the file is truncated", partial=True)
                raise TraceReadError(f"invalid JSON: expected ',' or '}}' after the key {key!r}", partial=True)
        if not found_events:
            raise TraceReadError("a JSON object without a 'traceEvents' array: not a PyTorch profiler trace")


def _array(scanner: _Scanner) -> Iterator[dict]:
    scanner.expect("[", "to open 'traceEvents'")
    if scanner.peek() == "]":
        scanner.pos += 1
        return
    while True:
        event = scanner.value()
        scanner.events_read += 1
        if isinstance(event, dict):
            yield event
        following = scanner.peek()
        if following == ",":
            scanner.pos += 1
        elif following == "]":
            scanner.pos += 1
            return
        elif following == "":
            raise TraceReadError(
                f"the file ends inside 'traceEvents' after {scanner.events_read} events: it is truncated", partial=True
            )
        else:
            raise TraceReadError(f"invalid JSON: expected ',' or ']' after event {scanner.events_read}", partial=True)


# ----------------------------------------------------------------------------- records


@dataclass
class CollectiveRecord:
    """One collective call as the CPU recorded it (`record_param_comms`), with its GPU kernel when found."""

    name: str
    kind: str
    pg_name: str
    pg_desc: str
    pg_ranks: str
    group_size: int
    in_nelems: int
    out_nelems: int
    dtype: str
    ts: float
    dur: float
    external_id: int | None
    seq: int | None
    gpu_ts: float | None = None
    gpu_dur: float | None = None


@dataclass
class RankTrace:
    """What one rank's trace holds, reduced to what the analysis needs (sizes independent of the trace's)."""

    path: str
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    pg_config: list = field(default_factory=list)
    steps: list = field(default_factory=list)  # (number, ts, end), CPU side
    annotations: list = field(default_factory=list)  # (name, ts, end), CPU user ranges
    gpu_ts: array = field(default_factory=lambda: array("d"))
    gpu_end: array = field(default_factory=lambda: array("d"))
    gpu_kind: array = field(default_factory=lambda: array("b"))
    gpu_corr: array = field(default_factory=lambda: array("q"))
    gpu_ext: array = field(default_factory=lambda: array("q"))
    launch_corr: array = field(default_factory=lambda: array("q"))
    launch_ts: array = field(default_factory=lambda: array("d"))
    collectives: list = field(default_factory=list)  # CollectiveRecord, CPU side
    comm_kernels: dict = field(default_factory=dict)  # external id -> (ts, dur), GPU side
    events: int = 0
    bad_times: int = 0  # complete events whose ts or dur is not a finite number
    problems: list = field(default_factory=list)
    partial: bool = False

    @property
    def has_gpu(self) -> bool:
        return len(self.gpu_ts) > 0


def _time(value: Any) -> float | None:
    """A time stamp or duration in µs: a finite number, else None (a trace that says NaN is broken)."""
    if type(value) is float:
        return value if math.isfinite(value) else None
    if type(value) is int:
        return float(value) if -_TIME_RANGE < value < _TIME_RANGE else None
    return None


def _args(event: dict) -> dict:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _int(value: Any, default: int = 0) -> int:
    return as_int(value, default)


def _collective_from_args(name: str, args: dict, ts: float, dur: float, table: KernelTable) -> CollectiveRecord:
    coll = as_text(args.get("Collective name")) or name
    seq = args.get("Seq") if "Seq" in args else args.get("seq")
    return CollectiveRecord(
        name=coll,
        kind=table.collective_kind(coll),
        pg_name=as_text(args.get("Process Group Name")),
        pg_desc=as_text(args.get("Process Group Description")),
        pg_ranks=as_text(args.get("Process Group Ranks")),
        group_size=_int(args.get("Group size"), 0),
        in_nelems=_int(args.get("In msg nelems")),
        out_nelems=_int(args.get("Out msg nelems")),
        dtype=as_text(args.get("dtype")),
        ts=ts,
        dur=dur,
        external_id=_int(args.get("External id"), -1) if "External id" in args else None,
        seq=_int(seq, -1) if seq is not None else None,
    )


def _collective_from_backend_op(name: str, args: dict, ts: float, dur: float, table: KernelTable) -> CollectiveRecord:
    nelems = 0
    shapes = args.get("Input Dims")
    for dims in shapes if isinstance(shapes, list) else ():
        if isinstance(dims, list) and dims and all(is_plain_int(d) for d in dims):
            nelems += math.prod(dims)
    nelems = nelems if nelems < (1 << 63) else 0  # no tensor holds more
    names = args.get("Input type")
    types = [as_text(t) for t in names if t] if isinstance(names, list) else []
    backend, _, op = name.partition(":")
    return CollectiveRecord(
        name=op,
        kind=table.collective_kind(op),
        pg_name=backend,
        pg_desc="",
        pg_ranks="",
        group_size=0,
        in_nelems=nelems,
        out_nelems=nelems,
        dtype=types[0] if types else "",
        ts=ts,
        dur=dur,
        external_id=None,
        seq=None,
    )


def read_trace(path: str, table: KernelTable | None = None, progress: Callable[[int], None] | None = None) -> RankTrace:
    """Read one rank's trace, streaming. Unreadable parts become `problems` (and `partial`) when events were read;
    a trace from which nothing could be read raises TraceReadError."""
    table = table or kernel_table()
    trace = RankTrace(path)
    header: dict[str, Any] = {}

    def on_header(key: str, value: Any) -> None:
        if key == "distributedInfo" and isinstance(value, dict):
            header["dist"] = value

    classify = table.classify
    record_names = table.collective_record_names
    backend_prefixes = table.backend_prefixes
    backend_records: list[CollectiveRecord] = []
    gpu_categories = table.gpu_categories
    try:
        for event in stream_trace(path, on_header):
            trace.events += 1
            if progress is not None and trace.events % 200_000 == 0:
                progress(trace.events)
            if event.get("ph") != "X":
                continue
            cat = event.get("cat")
            name = event.get("name")
            if not isinstance(name, str) or not isinstance(cat, (str, type(None))):
                continue
            ts, dur = _time(event.get("ts")), _time(event.get("dur", 0.0))
            if ts is None or dur is None:
                trace.bad_times += 1
                continue
            if cat in gpu_categories:
                kind = classify(cat, name)
                if kind is None:
                    continue
                args = _args(event)
                trace.gpu_ts.append(ts)
                trace.gpu_end.append(ts + dur)
                trace.gpu_kind.append(kind)
                trace.gpu_corr.append(_int(args.get("correlation"), -1))
                ext = _int(args.get("External id"), -1)
                trace.gpu_ext.append(ext)
                if kind == COMMUNICATION and ext >= 0:
                    trace.comm_kernels[ext] = (ts, dur)
            elif cat in ("cuda_runtime", "cuda_driver", "hip_runtime"):
                corr = _args(event).get("correlation")
                if corr is not None:
                    trace.launch_corr.append(_int(corr, -1))
                    trace.launch_ts.append(ts)
            elif name in record_names:
                args = _args(event)
                trace.collectives.append(_collective_from_args(name, args, ts, dur, table))
            elif name.startswith(backend_prefixes):
                backend_records.append(_collective_from_backend_op(name, _args(event), ts, dur, table))
            elif cat == "user_annotation":
                match = _STEP.match(name)
                if match:
                    trace.steps.append((as_int(match.group(1), 0), ts, ts + dur))
                else:
                    trace.annotations.append((name, ts, ts + dur))
            elif cat == "cpu_op" and name.startswith("ProfilerStep#"):
                match = _STEP.match(name)
                if match:
                    trace.steps.append((as_int(match.group(1), 0), ts, ts + dur))
    except TraceReadError as err:
        if not trace.events:
            raise
        trace.partial = True
        trace.problems.append(f"{path}: {err}; the {trace.events} events before it were used")
    if trace.bad_times:
        trace.partial = True
        trace.problems.append(
            f"{path}: {trace.bad_times:,} complete events have a time stamp or duration that is not a finite "
            "number (NaN, infinity, text): they were left out, so the figures miss them"
        )
    if not trace.events:
        raise TraceReadError(
            "the trace holds no events (an empty 'traceEvents'): the profiler recorded nothing; "
            "was the profiler stopped before its active steps?"
        )
    return _finish(trace, header.get("dist") or {}, backend_records)


def _finish(trace: RankTrace, dist: dict, backend_records: list[CollectiveRecord]) -> RankTrace:
    """After the events: the rank and group from distributedInfo, the order of ranges, each collective's kernel."""
    named = rank_from_name(trace.path, SourceKind.PROFILER_TRACE)
    trace.rank = as_int(dist["rank"], -1, 0, limits.active().rank) if "rank" in dist else named
    if trace.rank == -1:
        trace.problems.append(f"{trace.path}: its distributedInfo rank {describe(dist['rank'])} is not a rank; ignored")
        trace.rank = named
    trace.world_size = as_int(dist.get("world_size"), 0, 0, limits.active().rank + 1) or None
    trace.backend = as_text(dist.get("backend")) or None
    trace.pg_config = dist.get("pg_config") if isinstance(dist.get("pg_config"), list) else []
    if not trace.collectives and backend_records:
        trace.collectives = backend_records
        trace.problems.append(
            f"{trace.path}: no record_param_comms: collectives taken from the backend's own ranges "
            f"({backend_records[0].name}, ...), without process-group names"
        )
    trace.steps.sort(key=lambda s: s[1])
    trace.annotations.sort(key=lambda a: a[1])
    trace.collectives.sort(key=lambda c: c.ts)
    for record in trace.collectives:
        kernel = trace.comm_kernels.get(record.external_id) if record.external_id is not None else None
        if kernel:
            record.gpu_ts, record.gpu_dur = kernel
    return trace
