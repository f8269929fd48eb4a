"""PyTorch profiler (Kineto) Chrome traces, streamed: one event object decoded at a time.

A trace of gigabytes never sits in memory as Python objects. The top-level object is scanned by hand;
the `traceEvents` array is decoded one element at a time with `json.JSONDecoder.raw_decode` over a
buffer refilled in chunks (gzip or plain), and each event is reduced at once to the few numbers the
analysis needs (GPU intervals as floats in arrays, step and annotation ranges, collective records).

Classification of GPU activities (compute, communication, memory) is data: `knowledge/kernels.toml`.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import re
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torchtriage.knowledge.kernels import COMMUNICATION, KernelTable, kernel_table
from torchtriage.model import SourceKind
from torchtriage.sources.registry import rank_from_name

_CHUNK = 1 << 20
_MAX_EVENT_CHARS = 64 << 20  # one event bigger than this is not truncation but garbage
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


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

    def _fill(self) -> bool:
        if self.eof:
            return False
        try:
            data = self.stream.read1(_CHUNK)
            chunk = self.decoder.decode(data, final=not data)
        except (EOFError, gzip.BadGzipFile, zlib.error) as err:
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
            return False
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next non-blank character ('' at the end), without consuming it."""
        while True:
            buf, pos, n = self.buf, self.pos, len(self.buf)
            while pos < n and buf[pos] in " \t\r\n":
                pos += 1
            self.pos = pos
            if pos < n:
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
                if len(self.buf) - self.pos < _MAX_EVENT_CHARS and self._fill():
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
            # A number or literal that ends exactly at the buffer's end may continue in the next chunk.
            if end == len(self.buf) and not self.eof and not isinstance(value, (dict, list, str)):
                if self._fill():
                    continue
            self.pos = end
            return value


def _open_binary(path: str) -> io.BufferedIOBase:
    raw = open(path, "rb")  # noqa: SIM115 - closed by stream_trace
    if raw.peek(2)[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # closing it leaves `raw` open: stream_trace closes both
    return raw


def stream_trace(path: str, on_header: Callable[[str, Any], None]) -> Iterator[dict]:
    """Yield the events of `traceEvents` one by one; every other top-level key goes to `on_header`."""
    try:
        stream = _open_binary(path)
    except IsADirectoryError:
        raise TraceReadError("a folder, not a trace file") from None
    except OSError as err:
        raise TraceReadError(f"cannot open it ({err.strerror or err})") from None
    with stream, getattr(stream, "fileobj", None) or stream:
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
    problems: list = field(default_factory=list)
    partial: bool = False

    @property
    def has_gpu(self) -> bool:
        return len(self.gpu_ts) > 0


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _collective_from_args(name: str, args: dict, ts: float, dur: float, table: KernelTable) -> CollectiveRecord:
    coll = str(args.get("Collective name") or name)
    seq = args.get("Seq") if "Seq" in args else args.get("seq")
    return CollectiveRecord(
        name=coll,
        kind=table.collective_kind(coll),
        pg_name=str(args.get("Process Group Name", "")),
        pg_desc=str(args.get("Process Group Description", "")),
        pg_ranks=str(args.get("Process Group Ranks", "")),
        group_size=_int(args.get("Group size"), 0),
        in_nelems=_int(args.get("In msg nelems")),
        out_nelems=_int(args.get("Out msg nelems")),
        dtype=str(args.get("dtype", "")),
        ts=ts,
        dur=dur,
        external_id=_int(args.get("External id"), -1) if "External id" in args else None,
        seq=_int(seq, -1) if seq is not None else None,
    )


def _collective_from_backend_op(name: str, args: dict, ts: float, dur: float, table: KernelTable) -> CollectiveRecord:
    nelems = 0
    for dims in args.get("Input Dims") or ():
        if isinstance(dims, list) and dims and all(isinstance(d, int) for d in dims):
            count = 1
            for d in dims:
                count *= d
            nelems += count
    types = [t for t in args.get("Input type") or () if t]
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
        dtype=str(types[0]) if types else "",
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
            if not isinstance(name, str):
                continue
            try:
                ts = float(event["ts"])
                dur = float(event.get("dur", 0.0))
            except (KeyError, TypeError, ValueError):
                continue
            if cat in gpu_categories:
                kind = classify(cat, name)
                if kind is None:
                    continue
                args = event.get("args") or {}
                trace.gpu_ts.append(ts)
                trace.gpu_end.append(ts + dur)
                trace.gpu_kind.append(kind)
                trace.gpu_corr.append(_int(args.get("correlation"), -1))
                ext = _int(args.get("External id"), -1)
                trace.gpu_ext.append(ext)
                if kind == COMMUNICATION and ext >= 0:
                    trace.comm_kernels[ext] = (ts, dur)
            elif cat in ("cuda_runtime", "cuda_driver", "hip_runtime"):
                corr = (event.get("args") or {}).get("correlation")
                if corr is not None:
                    trace.launch_corr.append(_int(corr, -1))
                    trace.launch_ts.append(ts)
            elif name in record_names:
                args = event.get("args") or {}
                trace.collectives.append(_collective_from_args(name, args, ts, dur, table))
            elif name.startswith(backend_prefixes):
                backend_records.append(_collective_from_backend_op(name, event.get("args") or {}, ts, dur, table))
            elif cat == "user_annotation":
                match = _STEP.match(name)
                if match:
                    trace.steps.append((int(match.group(1)), ts, ts + dur))
                else:
                    trace.annotations.append((name, ts, ts + dur))
            elif cat == "cpu_op" and name.startswith("ProfilerStep#"):
                match = _STEP.match(name)
                if match:
                    trace.steps.append((int(match.group(1)), ts, ts + dur))
    except TraceReadError as err:
        if not trace.events:
            raise
        trace.partial = True
        trace.problems.append(f"{path}: {err}; the {trace.events} events before it were used")
    if not trace.events:
        raise TraceReadError(
            "the trace holds no events (an empty 'traceEvents'): the profiler recorded nothing; "
            "was the profiler stopped before its active steps?"
        )
    return _finish(trace, header.get("dist") or {}, backend_records)


def _finish(trace: RankTrace, dist: dict, backend_records: list[CollectiveRecord]) -> RankTrace:
    """After the events: the rank and group from distributedInfo, the order of ranges, each collective's kernel."""
    trace.rank = _int(dist["rank"]) if "rank" in dist else rank_from_name(trace.path, SourceKind.PROFILER_TRACE)
    trace.world_size = _int(dist.get("world_size"), 0) or None
    trace.backend = dist.get("backend")
    trace.pg_config = dist.get("pg_config") or []
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
