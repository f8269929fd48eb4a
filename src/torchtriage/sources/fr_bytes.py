"""Dumps whose entries repeat a checked dump's byte for byte, but for what each rank writes of its own.

The ranks of one SPMD job record the same program, so the pickler writes the same opcodes with the same
arguments for their entries. What differs is each rank's own: the time stamps of its ops, its thread's id
and name, whether its watchdog has retired an entry yet (the data bytes of fixed-width opcodes: the 8 bytes
of a LONG1, the one byte that is NEWTRUE or NEWFALSE, the UTF-8 of a string of the same length: its "own
spans"), and its header: which groups it belongs to, their members, its counters. torch's pickler writes
each distinct string once and refers to it after (its memo goes by value), so a group's name and
description are written in the header's `pg_config` and the entries refer to them: the entries of two ranks
of different tensor-parallel groups are the same bytes, their headers are not.

So once a role has repeated, one of its checked dumps is walked opcode by opcode and kept as a byte
template: its entries' bytes with the own spans left open, and which of the header's strings they refer to.
A later file that ends with the same bytes but in its own spans is read without unpickling its entries: its
header alone is unpickled (the entries' place taken by a token, which must land as `entries`), and its
records are the template's, with its groups named as its header names them and what depends on its own
spans read from its bytes (the creation times of its pending ops and its latest time stamp, which tell an op
past its timeout). The entries decode to the template's but for those values, since the opcodes keep their
boundaries and every memo slot they read from the header either holds an equal value or a group's name or
description, used by the entries as nothing else. Anything else sends the file down the ordinary path.

The walk's reading of every span and slot is checked against what the unpickler made of the same bytes
before a template is kept.
"""

from __future__ import annotations

import os
import pickletools
import struct
from operator import itemgetter
from typing import Any, NamedTuple

from torchtriage.sources.safe_pickle import PickleError, unpickle_with_memo

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
_KINDS = {"stamp": {"int", "float"}, "unread": {"int", "float", "str", "bool"}}
_BOOLS = {0x88, 0x89}  # NEWTRUE, NEWFALSE
_KEPT = 16  # byte templates per process: a job has a handful of roles
_MAX_NAME = 4096  # as fr_checks: a group's name or description

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
    """A scalar the stream pushed: its opcode, value, the span of its data bytes, and where it was put."""

    __slots__ = ("op", "value", "start", "end", "placed")

    def __init__(self, op: str, value: Any, start: int = 0, end: int = 0) -> None:
        self.op, self.value, self.start, self.end = op, value, start, end
        self.placed: list[tuple[_Node, Any]] = []  # (container, key text or index; "key" for a dict's key)

    @property
    def kind(self) -> str:
        return _SCALARS.get(self.op, "other")


class _Node:
    """A container the stream built at `pos`: a dict's (key, value) pairs, or a list's or tuple's items."""

    __slots__ = ("kind", "items", "pos", "placed")

    def __init__(self, kind: str, pos: int, items: list | None = None) -> None:
        self.kind, self.pos, self.items = kind, pos, items if items is not None else []
        self.placed: list[tuple[_Node, Any]] = []


class _Walk(NamedTuple):
    root: _Node
    reads: list[tuple[int, int, Any]]  # (position, memo slot, what it held) of each memo read
    writes: list[tuple[int, int]]  # (position, memo slot) of each memo write
    last: list[tuple[str, int]]  # (opcode, position) of the last few opcodes, STOP last


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


def _put(parent: _Node, items: list, slots: list) -> None:
    for item, slot in zip(items, slots, strict=True):
        item.placed.append((parent, slot))


def _set_pairs(parent: _Node, flat: list) -> None:
    if parent.kind != "dict" or len(flat) % 2:
        raise ValueError("not a dict's pairs")
    for key, value in zip(flat[::2], flat[1::2], strict=True):
        key.placed.append((parent, "key"))
        value.placed.append((parent, key.value if isinstance(key, _Leaf) and key.kind == "str" else None))
        parent.items.append((key, value))


def _extend(parent: _Node, items: list) -> None:
    if parent.kind != "list":
        raise ValueError("not a list")
    _put(parent, items, list(range(len(parent.items), len(parent.items) + len(items))))
    parent.items.extend(items)


def walk(raw: bytes) -> _Walk | None:
    """What a pickle of plain containers builds, its scalars as leaves with their spans, and its memo's reads
    and writes; None for anything else (an opcode plain data does not need, a memo slot given by count, a
    malformed stream)."""
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}
    reads: list[tuple[int, int, Any]] = []
    writes: list[tuple[int, int]] = []
    last: list[tuple[str, int]] = []

    def since_mark() -> list:
        start = marks.pop()
        items = stack[start:]
        del stack[start:]
        return items

    try:
        for opcode, arg, pos in pickletools.genops(raw):
            op = opcode.name
            last.append((op, pos))
            if len(last) > 8:
                del last[:4]
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
                stack.append(_Node(_EMPTY[op], pos))
            elif op == "MARK":
                marks.append(len(stack))
            elif op in _FROM_MARK:
                node = _Node(_FROM_MARK[op], pos)
                items = since_mark()
                if op == "DICT":
                    _set_pairs(node, items)
                else:
                    _put(node, items, list(range(len(items))))
                    node.items = items
                stack.append(node)
            elif op in ("TUPLE1", "TUPLE2", "TUPLE3"):
                count = int(op[-1])
                node = _Node("tuple", pos, stack[-count:])
                del stack[-count:]
                _put(node, node.items, list(range(count)))
                stack.append(node)
            elif op == "APPEND":
                item = stack.pop()
                _extend(stack[-1], [item])
            elif op == "APPENDS":
                items = since_mark()
                _extend(stack[-1], items)
            elif op == "SETITEM":
                pair = stack[-2:]
                del stack[-2:]
                _set_pairs(stack[-1], pair)
            elif op == "SETITEMS":
                items = since_mark()
                _set_pairs(stack[-1], items)
            elif op in ("BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
                writes.append((pos, arg))
            elif op in ("BINGET", "LONG_BINGET"):
                stack.append(memo[arg])
                reads.append((pos, arg, memo[arg]))
            elif op == "STOP":
                if len(stack) != 1 or not isinstance(stack[0], _Node) or marks:
                    return None
                return _Walk(stack[0], reads, writes, last)
            elif op not in ("PROTO", "FRAME"):
                return None  # MEMOIZE among them: a slot given by count would move with the header's
    except (ValueError, KeyError, IndexError, AttributeError, TypeError, UnicodeError, struct.error):
        return None
    return None


def _by_key(node: Any) -> dict[str, Any] | None:
    """A dict node's values by their text keys (a key given twice keeps its last value, as the dict does)."""
    if not isinstance(node, _Node) or node.kind != "dict":
        return None
    return {key.value: value for key, value in node.items if isinstance(key, _Leaf) and key.kind == "str"}


class OwnSpan(NamedTuple):
    start: int  # from the start of the entries' bytes
    end: int
    op: str  # the opcode, which says how its bytes read
    role: str  # "stamp" | "unread"
    places: tuple[tuple[int, str], ...]  # (entry index, key) of each use
    value: Any  # the template's, as the walk read it


class GroupSource(NamedTuple):
    """Where the entries take a group's name and description from: a memo slot the header fills (renamed with
    it), or None (written in the entries themselves). `id_is_name`: its entries have no pg_id (it is the name)."""

    name_slot: int | None
    desc_slot: int | None
    id_is_name: bool


class Repeat(NamedTuple):
    """What a file that repeats a byte template holds of its own."""

    header: dict  # its top-level fields; `entries` holds the token
    names: dict[str, str]  # the template's group name -> this file's
    descs: dict[str, str]  # the template's group name -> this file's description, where it is another
    created: tuple[Any, ...]  # `time_created_ns` of each of the template's pending ops
    latest_ns: int  # the latest integer time stamp of any entry (0 if none)


class ByteTemplate:
    """A checked dump's entries with their own spans left open; `read` compares a file against it.

    `records` is what the reader made of the dump, for the reader alone."""

    def __init__(self, raw: bytes, data: dict, pending_at: list[int], records: Any, limits: Any) -> None:
        self.records, self.limits = records, limits
        made = _analyse(raw, data, pending_at)
        if made is None:
            raise ValueError("its bytes make no byte template")
        entries_at, spans = made.entries_at, made.spans
        self.renamable, self.groups, self._created = made.renamable, made.groups, made.created
        self._values = made.values  # each memo slot the entries read from the header -> the template's value
        self._same_names = {group: group for group in self.groups}
        self._defined = made.defined
        self._length = len(raw) - entries_at  # the entries' bytes and the tail
        self._tail = raw[made.tail_at :]
        cuts = [0, *(edge for span in spans for edge in (span.start, span.end)), made.tail_at - entries_at]
        fixed = [(a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=True) if b > a]
        # Every byte outside the own spans, taken by one struct in one C call, then compared as a tuple.
        after = [0, *(b for _, b in fixed[:-1])]  # where the span before each fixed run ends
        self._fixed = struct.Struct("".join(f"{a - gap}x{b - a}s" for (a, b), gap in zip(fixed, after, strict=True)))
        self._bytes = tuple(raw[entries_at + a : entries_at + b] for a, b in fixed)
        self._texts = [(s.start, s.end) for s in spans if _SCALARS[s.op] == "str"]
        self._flags = [s.start for s in spans if _SCALARS[s.op] == "bool"]
        self._flag_getters: dict[int, itemgetter] = {}  # by where the entries start in a file
        stamps = [s for s in spans if s.role == "stamp" and _SCALARS[s.op] == "int"]
        self._stamps = [(s.start, s.end, s.op) for s in stamps]
        self._stamp_struct = _struct_of(stamps)
        self._latest_fixed = made.latest_fixed
        self._token = os.urandom(12).hex()  # stands for the entries: a header cannot know it
        self._token_op = b"X" + len(self._token).to_bytes(4, "little") + self._token.encode()

    def read(self, raw: bytes) -> Repeat | None:
        """What `raw` holds of its own, when its entries repeat the template's; else None."""
        base = len(raw) - self._length
        if base <= 0 or not raw.endswith(self._tail):
            return None
        if self._fixed.unpack_from(raw, base) != self._bytes:
            return None
        if self._flags and not _BOOLS.issuperset(self._flag_getter(base)(raw)):
            return None
        try:
            for a, b in self._texts:
                raw[base + a : base + b].decode("utf-8", "surrogatepass")
        except UnicodeError:
            return None
        header, memo = self._header(raw[:base])
        if header is None or not self._slots_agree(memo):
            return None
        names, descs = self._same_names, {}
        if any(memo[slot] != self._values[slot] for slot in self.renamable):  # another group of the same role
            names = {}
            for group, source in self.groups.items():
                names[group] = memo[source.name_slot] if source.name_slot is not None else group
                if source.desc_slot is not None and memo[source.desc_slot] != self._values[source.desc_slot]:
                    descs[group] = memo[source.desc_slot]
            if len(set(names.values())) != len(names):
                return None  # two groups under one name: the ordinary path merges them
        latest = self._latest_fixed
        if self._stamps:
            if self._stamp_struct is not None:
                stamps: Any = self._stamp_struct.unpack_from(raw, base)
            else:
                stamps = [_decode(op, raw[base + a : base + b]) for a, b, op in self._stamps]
            latest = max(latest, *stamps)
        created = tuple(
            _decode(c.op, raw[base + c.start : base + c.end]) if isinstance(c, OwnSpan) else c for c in self._created
        )
        return Repeat(header, names, descs, created, latest)

    def _flag_getter(self, base: int) -> itemgetter:
        getter = self._flag_getters.get(base)
        if getter is None:
            if len(self._flag_getters) > 64:
                self._flag_getters.clear()
            at = [base + flag for flag in self._flags]
            getter = self._flag_getters[base] = itemgetter(*at, *at[:1])  # twice the first: always a tuple
        return getter

    def _header(self, head: bytes) -> tuple[dict | None, dict]:
        """The file's header unpickled on its own, the token in the entries' place, and the memo it filled."""
        try:
            header, memo = unpickle_with_memo(head + self._token_op + self._tail)
        except PickleError:
            return None, {}
        if type(header) is not dict or header.get("entries") != self._token:
            return None, {}
        return header, memo

    def _slots_agree(self, memo: dict) -> bool:
        """Every slot the entries read holds what the template's did, or a group's name or description (short
        text); and none the entries write is one the header filled (the entries would overwrite it)."""
        if not self._defined.isdisjoint(memo):
            return False
        try:
            for slot in self._values:
                if slot not in memo:
                    return False
                value = memo[slot]
                if slot in self.renamable:
                    if type(value) is not str or len(value) > _MAX_NAME:
                        return False
                elif type(value) is not type(self._values[slot]) or value != self._values[slot]:
                    return False
        except RecursionError:
            return False
        return True


def _struct_of(stamps: list[OwnSpan]) -> struct.Struct | None:
    """One struct that reads every integer stamp at its place from the entries' start, skipping the bytes
    between (one C call); None when a stamp has a width no struct code has (a LONG1 time stamp takes 8)."""
    codes, at = ["<"], 0
    for span in stamps:
        code = _STRUCT.get(span.op) or ("q" if span.end - span.start == 8 else None)
        if code is None:
            return None
        codes.append(f"{span.start - at}x{code}" if span.start > at else code)
        at = span.end
    return struct.Struct("".join(codes))


class _Analysis(NamedTuple):
    entries_at: int  # where the entries' bytes start
    tail_at: int  # where they end: the root's last SETITEMS, perhaps its memo write, STOP
    spans: list[OwnSpan]
    renamable: set[int]  # the memo slots the entries read from the header that hold a group's name or description
    groups: dict[str, GroupSource]
    created: list[Any]  # each pending op's creation time: its OwnSpan, or its value
    latest_fixed: int  # the latest integer stamp outside the own spans
    values: dict[int, Any]  # the template's value of each memo slot the entries read from the header
    defined: set[int]  # the memo slots the entries write


def _analyse(raw: bytes, data: dict, pending_at: list[int]) -> _Analysis | None:
    """What a byte template needs of a checked dump (its bytes and what the unpickler made of them), or None."""
    walked = walk(raw)
    top = _by_key(walked.root) if walked is not None else None
    listed = top.get("entries") if top is not None else None
    entries = data.get("entries")
    if walked is None or not isinstance(listed, _Node) or listed.kind != "list" or listed.pos == 0:
        return None
    if walked.root.items[-1][1] is not listed or not isinstance(entries, list) or len(entries) != len(listed.items):
        return None  # `entries` must be the root's last value, written last
    tail = _tail(walked.last)
    if tail is None:
        return None
    at = listed.pos
    nodes = listed.items
    if any(_by_key(node) is None for node in nodes) or set(map(type, entries)) - {dict}:
        return None
    spans = _own_spans(nodes, at)
    if spans is None or not _read_as_unpickled(spans, entries):
        return None
    slots = _slots_read(walked, at)
    renamable = {slot for slot, held in slots.items() if _group_part(held, at) is not None}
    groups = _sources(nodes, entries, slots, renamable)
    if groups is None:
        return None
    header = _header_values(raw[:at] + b"N" + raw[tail:])
    if header is None or any(slot not in header for slot in slots):
        return None
    for slot, held in slots.items():  # the walk's reading of each slot, against the unpickler's
        if isinstance(held, _Leaf) and (type(header[slot]) is not type(held.value) or header[slot] != held.value):
            return None
    by_place = {place: span for span in spans for place in span.places}
    created = [by_place.get((i, "time_created_ns"), entries[i].get("time_created_ns")) for i in pending_at]
    own_stamps = {place for span in spans if span.role == "stamp" for place in span.places}
    latest = max(
        (
            value
            for i, entry in enumerate(entries)
            for key, role in OWN_IN_ENTRY.items()
            if role == "stamp" and (i, key) not in own_stamps and isinstance(value := entry.get(key), int)
        ),
        default=0,
    )
    values = {slot: header[slot] for slot in slots}
    defined = {slot for pos, slot in walked.writes if at <= pos < tail}
    return _Analysis(at, tail, spans, renamable, groups, created, latest, values, defined)


def _own_spans(nodes: list[_Node], at: int) -> list[OwnSpan] | None:
    """The spans of the entries' own values: leaves put only under own keys of entries, of a kind the key has."""
    entry_ids = {id(node) for node in nodes}
    index_of = {id(node): i for i, node in enumerate(nodes)}
    if len(index_of) != len(nodes):
        return None  # one entry dict written twice
    spans = []
    seen: set[int] = set()
    for node in nodes:
        for _, leaf in node.items:
            if not isinstance(leaf, _Leaf) or id(leaf) in seen or leaf.end <= leaf.start or leaf.start < at:
                continue
            seen.add(id(leaf))
            roles = {OWN_IN_ENTRY.get(slot) if id(parent) in entry_ids else None for parent, slot in leaf.placed}
            if len(roles) != 1 or None in roles:
                continue  # shared with another field (or a key, or an item): compared, not own
            role = roles.pop()
            if leaf.kind not in _KINDS[role]:
                continue
            places = tuple((index_of[id(parent)], slot) for parent, slot in leaf.placed)
            spans.append(OwnSpan(leaf.start - at, leaf.end - at, leaf.op, role, places, leaf.value))
    return sorted(spans)


def _read_as_unpickled(spans: list[OwnSpan], entries: list) -> bool:
    """Does every own span's place hold, as the unpickler read it, the value the walk read?"""
    for span in spans:
        for index, key in span.places:
            value = entries[index].get(key)
            if type(value) is not type(span.value) or value != span.value:
                return False
    return True


def _slots_read(walked: _Walk, at: int) -> dict[int, Any]:
    """The memo slots the entries read that were last written before them, and what each held."""
    written_before: dict[int, int] = {}
    reads: dict[int, Any] = {}
    writes = iter(walked.writes)
    pending = next(writes, None)
    for pos, slot, held in walked.reads:
        while pending is not None and pending[0] < pos:
            written_before[pending[1]] = pending[0]
            pending = next(writes, None)
        if pos >= at and written_before.get(slot, at) < at:
            reads[slot] = held
    return reads


def _group_part(held: Any, at: int) -> int | None:
    """0 or 1 when a slot's string is used by the entries only as the name (0) or description (1) of
    `process_group` tuples that are themselves used only as entries' `process_group`; else None."""
    if not isinstance(held, _Leaf) or held.kind != "str":
        return None
    parts = set()
    for parent, slot in held.placed:
        if parent.pos < at:
            continue  # a use in the header, which each file has of its own
        if parent.kind != "tuple" or slot not in (0, 1):
            return None
        if any(owner.kind != "dict" or key != "process_group" for owner, key in parent.placed):
            return None
        parts.add(slot)
    return parts.pop() if len(parts) == 1 else None


def _sources(nodes: list[_Node], entries: list, slots: dict[int, Any], renamable: set[int]) -> dict | None:
    """Each group's source (GroupSource), by its name in the template; None when one group's entries take
    its name from different places (renamed, they would split)."""
    slot_of = {id(held): slot for slot, held in slots.items() if slot in renamable}
    found: dict[str, GroupSource] = {}
    for node, entry in zip(nodes, entries, strict=True):
        group = _by_key(node).get("process_group")  # type: ignore[union-attr]
        if not isinstance(group, _Node) or group.kind not in ("tuple", "list") or not group.items:
            return None
        name = entry["process_group"][0]
        name_slot = slot_of.get(id(group.items[0]))
        desc_slot = slot_of.get(id(group.items[1])) if len(group.items) > 1 else None
        source = GroupSource(name_slot, desc_slot, "pg_id" not in entry)
        known = found.setdefault(str(name), source)
        if known.name_slot != name_slot or (name_slot is not None and type(name) is not str):
            return None
    return found


def _tail(last: list[tuple[str, int]]) -> int | None:
    """Where the root's last SETITEMS (or SETITEM) is, when only its memo write and STOP follow it."""
    ops = list(last)
    if len(ops) >= 3 and ops[-2][0] in ("BINPUT", "LONG_BINPUT"):
        del ops[-2]
    if len(ops) >= 2 and ops[-1][0] == "STOP" and ops[-2][0] in ("SETITEMS", "SETITEM"):
        return ops[-2][1]
    return None


def _header_values(stripped: bytes) -> dict | None:
    """The memo of the template's header, unpickled as a file's header is (the entries left out)."""
    try:
        _, memo = unpickle_with_memo(stripped)
    except PickleError:
        return None
    return memo


class ByteTemplates:
    """The byte templates of this process."""

    def __init__(self) -> None:
        self._kept: list[ByteTemplate] = []

    def add(self, template: ByteTemplate) -> None:
        if len(self._kept) >= _KEPT:
            self._kept.clear()
        self._kept.append(template)

    def find(self, raw: bytes, limits: Any) -> tuple[ByteTemplate, Repeat] | None:
        """The template whose entries `raw` repeats (checked under the same limits), and what it holds."""
        for template in self._kept:
            if template.limits == limits and (repeat := template.read(raw)) is not None:
                return template, repeat
        return None

    def clear(self) -> None:
        self._kept.clear()
