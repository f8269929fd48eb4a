"""Dumps that repeat a checked dump byte for byte, but for what each rank writes of its own: read unopened.

The ranks of one SPMD job that share a role record the same program (fr_template.py), so the pickler writes
the same opcodes with the same arguments for each of them. What differs is each rank's own: the time stamps
of its ops, its thread's id and name, whether its watchdog has retired an entry yet, its rank. In the
pickle these are the data bytes of fixed-width opcodes: the 8 bytes of a LONG1 or a BINFLOAT, the 1 to 4 of
a BININT, the one byte that is NEWTRUE or NEWFALSE, the UTF-8 of a string of the same length.

Once a role has repeated, one of its checked dumps is walked opcode by opcode and kept as a byte template:
the spans of those data bytes (its own spans) and every other byte. A later file of the same length whose
other bytes are all equal is read without unpickling it. Its opcodes have the same boundaries, so it decodes
to the template's value but for the own spans; its records are the template's, with what depends on those
spans read from its own bytes: the creation times of its pending ops and its latest time stamp (which tell
an op past its timeout), its rank. Anything else (a byte that differs outside an own span, a string that is
not UTF-8) sends the file down the reader's ordinary path.

A span is own only where every use of its value is under one of those keys: a value that the pickle's memo
shares with any other field stays compared. Before a template is kept, the walk's reading of every own span
is checked against what the unpickler made of the same bytes.
"""

from __future__ import annotations

import pickletools
import struct
from operator import itemgetter
from typing import Any, NamedTuple

# The keys of an entry whose values are each rank's own; "stamp"s are read back, the others are never read.
OWN_IN_ENTRY = {
    "time_created_ns": "stamp",
    "time_discovered_started_ns": "stamp",
    "time_discovered_completed_ns": "stamp",
    "duration_ms": "unread",
    "thread_id": "unread",
    "thread_name": "unread",
    "retired": "unread",
}
_KINDS = {"stamp": {"int", "float"}, "unread": {"int", "float", "str", "bool"}, "rank": {"int"}}
_BOOLS = {0x88, 0x89}  # NEWTRUE, NEWFALSE
_KEPT = 16  # byte templates per process: a job has a handful of roles

_SCALARS = {
    "BININT1": "int",
    "BININT2": "int",
    "BININT": "int",
    "LONG1": "int",
    "LONG4": "int",
    "BINFLOAT": "float",
    "NEWTRUE": "bool",
    "NEWFALSE": "bool",
    "SHORT_BINUNICODE": "str",
    "BINUNICODE": "str",
    "BINUNICODE8": "str",
}
_FIXED_WIDTH = {"BININT1": 1, "BININT2": 2, "BININT": 4, "BINFLOAT": 8}
_LENGTH_WIDTH = {"LONG1": 1, "SHORT_BINUNICODE": 1, "LONG4": 4, "BINUNICODE": 4, "BINUNICODE8": 8}
_OTHER_VALUES = {"NONE", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8"}  # values with no span of their own
_EMPTY = {"EMPTY_DICT": "dict", "EMPTY_LIST": "list", "EMPTY_TUPLE": "tuple"}
_FROM_MARK = {"DICT": "dict", "LIST": "list", "TUPLE": "tuple"}
_STRUCT = {"BININT1": "B", "BININT2": "H", "BININT": "i"}  # LONG1 of 8 bytes: "q"


class _Leaf:
    """A scalar the stream pushed: its opcode, value, the span of its data bytes, how many places hold it."""

    __slots__ = ("op", "value", "start", "end", "placed")

    def __init__(self, op: str, value: Any, start: int = 0, end: int = 0) -> None:
        self.op, self.value, self.start, self.end, self.placed = op, value, start, end, 0

    @property
    def kind(self) -> str:
        return _SCALARS.get(self.op, "other")


class _Node:
    """A container the stream built: a dict's (key, value) pairs, or a list's or tuple's items."""

    __slots__ = ("kind", "items")

    def __init__(self, kind: str, items: list | None = None) -> None:
        self.kind, self.items = kind, items if items is not None else []


def _span(op: str, raw: bytes, pos: int) -> tuple[int, int]:
    """Where a scalar opcode's data bytes lie: after the opcode and its length, if it has one."""
    if op in _FIXED_WIDTH:
        return pos + 1, pos + 1 + _FIXED_WIDTH[op]
    if op in ("NEWTRUE", "NEWFALSE"):
        return pos, pos + 1  # the opcode itself, one of two that take no argument
    width = _LENGTH_WIDTH[op]
    length = int.from_bytes(raw[pos + 1 : pos + 1 + width], "little", signed=op == "LONG4")
    return pos + 1 + width, pos + 1 + width + length


def _decode(op: str, data: bytes) -> Any:
    """A scalar's value from its data bytes, as the unpickler reads them."""
    kind = _SCALARS[op]
    if kind == "int":
        return int.from_bytes(data, "little", signed=op in ("BININT", "LONG1", "LONG4"))
    if kind == "float":
        return struct.unpack(">d", data)[0]
    if kind == "bool":
        return data[0] == 0x88
    return data.decode("utf-8", "surrogatepass")


def _placed(value: Any) -> Any:
    if isinstance(value, _Leaf):
        value.placed += 1
    return value


def _pairs(items: list) -> list:
    placed = [_placed(item) for item in items]
    return list(zip(placed[::2], placed[1::2], strict=True))


def walk(raw: bytes) -> _Node | None:
    """The value a pickle of plain containers builds, its scalars as leaves with their spans; None for anything
    else (an opcode that plain data does not need, a malformed stream)."""
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}

    def since_mark() -> list:
        start = marks.pop()
        items = stack[start:]
        del stack[start:]
        return items

    try:
        for opcode, arg, pos in pickletools.genops(raw):
            op = opcode.name
            if op in _SCALARS:
                if op in ("NEWTRUE", "NEWFALSE"):
                    arg = op == "NEWTRUE"
                start, end = _span(op, raw, pos)
                if _decode(op, raw[start:end]) != arg:  # the span, read back, gives the value
                    return None
                stack.append(_Leaf(op, arg, start, end))
            elif op in _OTHER_VALUES:
                stack.append(_Leaf(op, arg))
            elif op in _EMPTY:
                stack.append(_Node(_EMPTY[op]))
            elif op == "MARK":
                marks.append(len(stack))
            elif op in _FROM_MARK:
                items = since_mark()
                stack.append(_Node(_FROM_MARK[op], _pairs(items) if op == "DICT" else list(map(_placed, items))))
            elif op in ("TUPLE1", "TUPLE2", "TUPLE3"):
                count = int(op[-1])
                items = list(map(_placed, stack[-count:]))
                del stack[-count:]
                stack.append(_Node("tuple", items))
            elif op == "APPEND":
                item = _placed(stack.pop())
                stack[-1].items.append(item)
            elif op == "APPENDS":
                items = list(map(_placed, since_mark()))
                stack[-1].items.extend(items)
            elif op in ("SETITEM", "SETITEMS"):
                items = stack[-2:] if op == "SETITEM" else since_mark()
                if op == "SETITEM":
                    del stack[-2:]
                stack[-1].items.extend(_pairs(items))
            elif op in ("BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif op == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif op in ("BINGET", "LONG_BINGET"):
                stack.append(memo[arg])
            elif op == "STOP":
                return stack[0] if len(stack) == 1 and isinstance(stack[0], _Node) else None
            elif op not in ("PROTO", "FRAME"):
                return None
    except (ValueError, KeyError, IndexError, AttributeError, TypeError, UnicodeError, struct.error):
        return None
    return None


def _by_key(node: Any) -> dict[str, Any] | None:
    """A dict node's values by their text keys (a key given twice keeps its last value, as the dict does)."""
    if not isinstance(node, _Node) or node.kind != "dict":
        return None
    return {key.value: value for key, value in node.items if isinstance(key, _Leaf) and key.kind == "str"}


class OwnSpan(NamedTuple):
    start: int
    end: int
    op: str  # the opcode, which says how its bytes read
    role: str  # "stamp" | "unread" | "rank"
    places: tuple[tuple[int, str], ...]  # (entry index, key) of each use; (-1, "rank") for the dump's rank


def own_spans(raw: bytes, data: dict) -> list[OwnSpan] | None:
    """The own spans of a dump, each checked against `data`, what the unpickler made of `raw`; None when the
    dump is not plain containers with a list of entry dicts."""
    root = walk(raw)
    top = _by_key(root)
    entries = data.get("entries")
    listed = top.get("entries") if top is not None else None
    if not isinstance(listed, _Node) or listed.kind != "list" or not isinstance(entries, list):
        return None
    if len(entries) != len(listed.items) or set(map(type, entries)) - {dict}:
        return None
    uses: dict[int, tuple[_Leaf, set[str], list[tuple[int, str]]]] = {}
    for index, node in enumerate(listed.items):
        if _by_key(node) is None:
            return None
        for key, value in node.items:
            role = OWN_IN_ENTRY.get(key.value) if isinstance(key, _Leaf) and key.kind == "str" else None
            if role is not None and isinstance(value, _Leaf):
                uses.setdefault(id(value), (value, set(), []))[1].add(role)
                uses[id(value)][2].append((index, key.value))
    for key, value in root.items:  # type: ignore[union-attr]
        if isinstance(key, _Leaf) and key.value == "rank" and key.kind == "str" and isinstance(value, _Leaf):
            uses.setdefault(id(value), (value, set(), []))[1].add("rank")
            uses[id(value)][2].append((-1, "rank"))
    spans = []
    for leaf, roles, places in uses.values():
        role = next(iter(roles))
        if len(roles) != 1 or len(places) != leaf.placed or leaf.kind not in _KINDS[role] or leaf.end <= leaf.start:
            continue  # shared with another field, or of a kind this field never has: compared, not own
        for index, key in places:  # the walk's reading of the span, against the unpickler's
            actual = data.get(key) if index < 0 else entries[index].get(key)
            if type(actual) is not type(leaf.value) or actual != leaf.value:
                return None
        spans.append(OwnSpan(leaf.start, leaf.end, leaf.op, role, tuple(places)))
    return sorted(spans)


class Own(NamedTuple):
    """What a byte template reads from a file that repeats it."""

    rank: int | None  # the dump's `rank`, where it has one of its own
    created: tuple[Any, ...]  # `time_created_ns` of each of the template's pending ops
    latest_ns: int  # the latest integer time stamp of any entry (0 if none)


class ByteTemplate:
    """A checked dump's bytes with its own spans left open, and what its reader made of it (`records`)."""

    def __init__(self, raw: bytes, data: dict, spans: list[OwnSpan], pending_at: list[int], records: Any, limits: Any):
        self.records = records
        self.limits = limits  # the limits the dump was checked under
        self.size = len(raw)
        cuts = [0, *(edge for span in spans for edge in (span.start, span.end)), len(raw)]
        fixed = [(a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=True) if b > a]
        self._starts = [a for a, _ in fixed]
        self._bytes = [raw[a:b] for a, b in fixed]
        self._texts = [slice(s.start, s.end) for s in spans if _SCALARS[s.op] == "str"]
        flags = [s.start for s in spans if _SCALARS[s.op] == "bool"]
        self._flags = itemgetter(*flags, *flags[:1]) if flags else None  # twice the first: always a tuple
        stamps = [s for s in spans if s.role == "stamp" and _SCALARS[s.op] == "int"]
        self._stamps = [slice(s.start, s.end) for s in stamps]
        self._stamp_ops = [s.op for s in stamps]
        self._stamp_struct = _struct_of(stamps)
        at = {place: span for span in spans for place in span.places}
        entries = data["entries"]
        self._created = [at.get((i, "time_created_ns"), entries[i].get("time_created_ns")) for i in pending_at]
        self._rank = at.get((-1, "rank"))
        own_stamps = {place for span in stamps for place in span.places}
        self._latest_fixed = max(
            (
                value
                for i, entry in enumerate(entries)
                for key, role in OWN_IN_ENTRY.items()
                if role == "stamp" and (i, key) not in own_stamps and isinstance(value := entry.get(key), int)
            ),
            default=0,
        )

    def read(self, raw: bytes) -> Own | None:
        """What `raw` holds of its own, when it repeats the template everywhere else; else None."""
        if len(raw) != self.size or not all(map(raw.startswith, self._bytes, self._starts)):
            return None  # compared in place: no copy of the file's bytes
        if self._flags is not None and not _BOOLS.issuperset(self._flags(raw)):
            return None
        try:
            for text in self._texts:
                raw[text].decode("utf-8", "surrogatepass")
        except UnicodeError:
            return None
        latest = self._latest_fixed
        if self._stamps:
            if self._stamp_struct is not None:
                stamps: Any = self._stamp_struct.unpack_from(raw)
            else:
                stamps = [_decode(op, raw[part]) for op, part in zip(self._stamp_ops, self._stamps, strict=True)]
            latest = max(latest, *stamps)
        created = tuple(_decode(c.op, raw[c.start : c.end]) if isinstance(c, OwnSpan) else c for c in self._created)
        rank = _decode(self._rank.op, raw[self._rank.start : self._rank.end]) if self._rank is not None else None
        return Own(rank, created, latest)


def _struct_of(stamps: list[OwnSpan]) -> struct.Struct | None:
    """One struct that reads every integer stamp at its place, skipping the bytes between (one C call); None when a
    stamp has a width no struct code has (none in genuine dumps: a LONG1 time stamp takes 8 bytes)."""
    codes, at = ["<"], 0
    for span in stamps:
        code = _STRUCT.get(span.op) or ("q" if span.end - span.start == 8 else None)
        if code is None:
            return None
        codes.append(f"{span.start - at}x{code}" if span.start > at else code)
        at = span.end
    return struct.Struct("".join(codes))


class ByteTemplates:
    """The byte templates of this process, by size."""

    def __init__(self) -> None:
        self._by_size: dict[int, list[ByteTemplate]] = {}
        self._count = 0

    def add(self, template: ByteTemplate) -> None:
        if self._count >= _KEPT:
            self.clear()
        self._by_size.setdefault(template.size, []).append(template)
        self._count += 1

    def find(self, raw: bytes, limits: Any) -> tuple[ByteTemplate, Own] | None:
        """The template `raw` repeats (checked under the same limits), and what it holds of its own."""
        for template in self._by_size.get(len(raw), ()):
            if template.limits == limits and (own := template.read(raw)) is not None:
                return template, own
        return None

    def clear(self) -> None:
        self._by_size.clear()
        self._count = 0
