"""A restricted pickle reader that streams: for plain-data pickles too large to hold as Python objects.

`safe_pickle` hands the whole file to the C unpickler, which is fast but builds every object: a CUDA
memory snapshot of 1 GB becomes about 5 GB of dicts, one per history event.
This reader runs the pickle machine itself, over a file read in chunks, and lets its caller replace
chosen lists by *sinks*: a sink receives its items as they are appended and keeps what it wants
(a few numbers per event), so the history never exists as a whole.

Safety is that of `safe_pickle`: only the opcodes that build plain data (containers, strings, bytes,
numbers, booleans, None) are executed; any opcode that would name a global, call a callable or reach
outside the data is refused, so nothing in the file can run code.

Memory: the memo (what later opcodes may refer back to) keeps everything except the items of sinks
(those are handed over, never referred to again): a slot of 8 bytes for each, and the strings, frame
dicts and stacks that later items do refer to. Torch shares each frame dict among all the stacks that
hold it, and a stack between the events of one block, so these are few.

Speed: a Python loop costs about a microsecond per opcode, and a snapshot has a few opcodes per byte.
Inside sinks the common item, a dict of scalars and short strings ending with a list (an allocation
event and its stack, a list of references to frame dicts), is recognised by regular expressions instead;
a stack recurs with identical bytes, so each distinct one is decoded once and shared through a small
cache. Anything the patterns do not cover (a frame seen for the first time, another protocol) goes
through the opcode loop, which handles every case.
"""

from __future__ import annotations

import codecs
import re
import struct
from collections.abc import Callable
from typing import Any, BinaryIO

from torchtriage.sources import limits
from torchtriage.sources.limits import LimitExceeded
from torchtriage.sources.pickle_scan import check_key
from torchtriage.sources.safe_pickle import TRUNCATED, PickleCorrupt, PickleError, PickleRefused, collector_paused

__all__ = ["Sink", "FlatList", "StreamingUnpickler", "SharedContainer"]

_CHUNK = 1 << 20
# Bytes kept ahead of the cursor before an item is matched as a whole: an item larger than this (a stack
# of thousands of frames) is simply read by the opcode loop.
_LOOKAHEAD = 256 << 10
_SPAN_CACHE_LIMIT = 50_000
# How far to look for where a stack ends before matching it instead (a 30-frame stack is ~100-600 bytes).
_CANDIDATE_WINDOW = 16 << 10

_REFUSED = {
    b"c"[0]: "GLOBAL",
    b"\x93"[0]: "STACK_GLOBAL",
    b"R"[0]: "REDUCE",
    b"b"[0]: "BUILD",
    b"i"[0]: "INST",
    b"o"[0]: "OBJ",
    b"\x81"[0]: "NEWOBJ",
    b"\x92"[0]: "NEWOBJ_EX",
    b"\x82"[0]: "EXT1",
    b"\x83"[0]: "EXT2",
    b"\x84"[0]: "EXT4",
    b"P"[0]: "PERSID",
    b"Q"[0]: "BINPERSID",
    b"\x97"[0]: "NEXT_BUFFER",
    b"\x98"[0]: "READONLY_BUFFER",
}

# -- the patterns of a plain item: a dict of scalars and short strings, ending with one list --
_GET = rb"(?:h.|j....)"
_LONG1 = rb"\x8a(?:\x00|\x01.|\x02..|\x03...|\x04....|\x05.{5}|\x06.{6}|\x07.{7}|\x08.{8}|\x09.{9})"
_SCALAR = rb"(?:" + _GET + rb"|K.|M..|J....|" + _LONG1 + rb"|N|\x88|\x89|G.{8})"
# A short string seen for the first time (torch writes "N/A" afresh in every event), and memoized.
_SHORT_STR = rb"\x8c(?:" + rb"|".join(re.escape(bytes([n])) + rb".{%d}" % n for n in range(32)) + rb")\x94"
_KEY = rb"(?:" + _GET + rb"|" + _SHORT_STR + rb")"
_VALUE = rb"(?:" + _SCALAR + rb"|" + _SHORT_STR + rb")"
_PAIR = _GET + _SCALAR  # inside the dicts of a list: references and numbers only
_FLAT_DICT_PATTERN = rb"\}\x94(?:\(((?:" + _PAIR + rb")+)u|(" + _PAIR + rb")s)?"
_ENTRY = rb"(?:" + _FLAT_DICT_PATTERN + rb"|" + _GET + rb")"  # a new dict, or a reference to an earlier one
_LIST = re.compile(rb"\]\x94(?:(?:\((?:" + _ENTRY + rb")+e)+|" + _ENTRY + rb"a)?", re.DOTALL)
_FLAT_DICT = re.compile(_FLAT_DICT_PATTERN, re.DOTALL)
_DICT3 = re.compile(rb"\}\x94\(" + (rb"(" + _GET + rb")(" + _SCALAR + rb")") * 3 + rb"u", re.DOTALL)
_ITEM_HEAD = re.compile(rb"\}\x94\(((?:" + _KEY + _VALUE + rb")*)", re.DOTALL)
_ITEM_PAIR = re.compile(rb"(" + _KEY + rb")(" + _VALUE + rb")", re.DOTALL)
_LIST_KEY = re.compile(_KEY + rb"(?=\]\x94)", re.DOTALL)
_PAIR_TOKENS = re.compile(rb"(" + _GET + rb")(" + _SCALAR + rb")", re.DOTALL)
# Tokens whose value depends only on their bytes and which recur: memo references, BININT1, BININT2, constants.
_CACHEABLE = frozenset(b"hjKMN\x88\x89")
_NOT_KEPT = object()  # the memo slot of a sink's item: handed over, not kept
_MAX_MEMO_GAP = 1 << 20
_UNPACK_BINFLOAT = struct.Struct(">d").unpack


class SharedContainer(PickleError):
    """The pickle refers back to a container a sink already consumed; read it whole instead."""


class Sink(list):
    """A list the reader never fills: `take` receives the items appended to it, in order."""

    __slots__ = ()

    def take(self, items: list) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class FlatList:
    """A list read as one span (a stack: new frame dicts and references to earlier ones), shared by every
    identical span.

    Only items of sinks come this way (and only once a sink exists). A consumer that needs a summary of
    the items, not the items, calls `summary`: it is computed once per distinct span, and the items are
    dropped, so a cache of many distinct stacks holds their summaries only.
    """

    __slots__ = ("items", "new_dicts", "_summary")

    def __init__(self, items: list, new_dicts: list) -> None:
        self.items: list | None = items
        self.new_dicts = new_dicts  # the dicts first written in this span, in memo order
        self._summary: Any = None

    def summary(self, summarise: Callable[[list], Any]) -> Any:
        if self.items is not None:
            self._summary = summarise(self.items)
            self.items = None
        return self._summary


class StreamingUnpickler:
    """Unpickle plain data from `stream`; override `new_list` to put sinks where lists would be."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = _Unframed(stream)
        self._buf = b""
        self._pos = 0
        self._eof = False
        self._safe_end = -1  # below this, at least _LOOKAHEAD bytes (or all that is left) are in the buffer
        self._real_end = 0
        self.stack: list = []
        self.metastack: list = []
        self._memo: list = []
        self._max_depth, self._max_items = limits.active().depth, limits.active().items
        self.streaming = False  # set once a sink exists: from then on its items are not kept in the memo
        self._unkept: Any = None  # the sink item being built by the opcode loop
        self._spans: dict[bytes, FlatList] = {}
        self._strings: dict[bytes, str] = {}
        self._tokens = _Tokens(self._memo)

    # -- to override --
    def new_list(self) -> list:
        """The object an EMPTY_LIST opcode pushes; `self.stack` and `self.metastack` show the context."""
        return []

    # -- the buffer --
    def _refill(self, need: int = _LOOKAHEAD) -> None:
        # Checked here, once per chunk of the file, rather than at each of the ways the memo grows.
        if len(self._memo) > self._max_items:
            raise LimitExceeded(f"it keeps more than {self._max_items:,} values to refer back to", "items")
        parts = [self._buf[self._pos :]]
        have = len(parts[0])
        while have < need + _LOOKAHEAD and not self._eof:
            chunk = self._stream.read(_CHUNK)
            if not chunk:
                self._eof = True
                break
            parts.append(chunk)
            have += len(chunk)
        self._buf = b"".join(parts)
        self._pos = 0
        self._real_end = len(self._buf)
        self._safe_end = -1 if self._eof else self._real_end - _LOOKAHEAD

    def _read(self, n: int) -> bytes:
        if n < 0:
            raise PickleCorrupt("the pickle is corrupt (a negative length)")
        if self._pos + n > self._real_end:
            self._refill(n)
            if n > self._real_end:
                raise _Truncated
        data = self._buf[self._pos : self._pos + n]
        self._pos += n
        return data

    def _readline(self) -> bytes:
        end = self._buf.find(b"\n", self._pos)
        while end < 0:
            if self._eof:
                raise _Truncated
            self._refill(self._real_end - self._pos + _CHUNK)
            end = self._buf.find(b"\n", self._pos)
        line = self._buf[self._pos : end]
        self._pos = end + 1
        return line

    # -- the machine --
    def load(self) -> Any:
        try:
            with collector_paused():
                return self._run()
        except (PickleError, LimitExceeded):
            raise
        except _Truncated:
            raise PickleCorrupt(TRUNCATED) from None
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, struct.error) as err:
            raise PickleCorrupt(f"the pickle is corrupt ({type(err).__name__}: {err})") from None

    def _run(self) -> Any:  # noqa: C901 - one dispatch on the opcode, ordered by frequency
        from_bytes = int.from_bytes
        while True:
            if self._pos >= self._safe_end:
                if self._pos >= self._real_end:
                    if self._eof:
                        raise _Truncated
                    self._refill()
                    if self._pos >= self._real_end:
                        raise _Truncated
                elif not self._eof:
                    self._refill()
            buf = self._buf
            op = buf[self._pos]
            self._pos += 1
            if op == 0x68:  # BINGET
                self.stack.append(self._get(self._read(1)[0]))
            elif op == 0x94:  # MEMOIZE
                self._put(len(self._memo), self.stack[-1])
            elif op == 0x28:  # MARK
                self.metastack.append(self.stack)
                self.stack = []
                if len(self.metastack) > self._max_depth:
                    raise LimitExceeded(f"it nests containers more than {self._max_depth:,} deep", "depth")
            elif op == 0x7D:  # EMPTY_DICT
                if self.streaming:
                    sink_item = self._at_sink_item()
                    if self._match_item(keep=not sink_item):
                        continue
                    if sink_item:
                        self._unkept = {}
                        self.stack.append(self._unkept)
                        continue
                self.stack.append({})
            elif op == 0x5D:  # EMPTY_LIST
                self.stack.append(self.new_list())
            elif op == 0x75:  # SETITEMS
                items = self._pop_mark()
                target = self.stack[-1]
                for i in range(0, len(items) - 1, 2):
                    key = items[i]
                    if type(key) is tuple or type(key) is frozenset:
                        check_key(key)  # hashed recursively in C: bounded first
                    target[key] = items[i + 1]
            elif op == 0x73:  # SETITEM
                value = self.stack.pop()
                key = self.stack.pop()
                if type(key) is tuple or type(key) is frozenset:
                    check_key(key)
                self.stack[-1][key] = value
            elif op == 0x65:  # APPENDS
                items = self._pop_mark()
                self._append(self.stack[-1], items)
            elif op == 0x61:  # APPEND
                value = self.stack.pop()
                self._append(self.stack[-1], [value])
            elif op == 0x4B:  # BININT1
                self.stack.append(self._read(1)[0])
            elif op == 0x4D:  # BININT2
                self.stack.append(from_bytes(self._read(2), "little"))
            elif op == 0x4A:  # BININT
                self.stack.append(from_bytes(self._read(4), "little", signed=True))
            elif op == 0x8A:  # LONG1
                self.stack.append(from_bytes(self._read(self._read(1)[0]), "little", signed=True))
            elif op == 0x8C:  # SHORT_BINUNICODE
                self.stack.append(self._read(self._read(1)[0]).decode("utf-8", "surrogatepass"))
            elif op == 0x58:  # BINUNICODE
                self.stack.append(self._read(from_bytes(self._read(4), "little")).decode("utf-8", "surrogatepass"))
            elif op == 0x8D:  # BINUNICODE8
                self.stack.append(self._read(from_bytes(self._read(8), "little")).decode("utf-8", "surrogatepass"))
            elif op == 0x6A:  # LONG_BINGET
                self.stack.append(self._get(from_bytes(self._read(4), "little")))
            elif op == 0x4E:  # NONE
                self.stack.append(None)
            elif op == 0x88:  # NEWTRUE
                self.stack.append(True)
            elif op == 0x89:  # NEWFALSE
                self.stack.append(False)
            elif op == 0x47:  # BINFLOAT
                self.stack.append(_UNPACK_BINFLOAT(self._read(8))[0])
            elif op == 0x95:  # FRAME: a length prefix for prefetching, nothing to do here
                self._read(8)
            elif op == 0x80:  # PROTO
                if self._read(1)[0] > pickle_highest_protocol():
                    raise PickleCorrupt("the pickle uses a protocol newer than this Python knows")
            elif op == 0x2E:  # STOP
                value = self.stack.pop()
                return value
            else:
                self._rare(op)

    def _rare(self, op: int) -> None:  # noqa: C901 - the opcodes plain data rarely or never uses
        stack = self.stack
        from_bytes = int.from_bytes
        if op in _REFUSED:
            raise PickleRefused(
                f"it uses the {_REFUSED[op]} opcode, which builds objects by calling code; plain data never needs "
                "it; refused without running anything (was the file replaced or tampered with?)"
            )
        if op == 0x29:  # EMPTY_TUPLE
            stack.append(())
        elif op == 0x85:  # TUPLE1
            stack[-1] = _bounded_tuple((stack[-1],))
        elif op == 0x86:  # TUPLE2
            stack[-2:] = [_bounded_tuple((stack[-2], stack[-1]))]
        elif op == 0x87:  # TUPLE3
            stack[-3:] = [_bounded_tuple((stack[-3], stack[-2], stack[-1]))]
        elif op == 0x74:  # TUPLE
            items = self._pop_mark()  # before naming self.stack: popping the mark replaces it
            self.stack.append(_bounded_tuple(tuple(items)))
        elif op == 0x6C:  # LIST
            items = self._pop_mark()
            target = self.new_list()
            self._append(target, items)
            self.stack.append(target)
        elif op == 0x64:  # DICT
            items = self._pop_mark()
            check_key(tuple(items[::2]))
            self.stack.append(dict(zip(items[::2], items[1::2], strict=False)))
        elif op == 0x8F:  # EMPTY_SET
            stack.append(set())
        elif op == 0x90:  # ADDITEMS
            items = self._pop_mark()
            check_key(tuple(items))
            self.stack[-1].update(items)
        elif op == 0x91:  # FROZENSET
            items = self._pop_mark()
            check_key(tuple(items))
            self.stack.append(frozenset(items))
        elif op == 0x30:  # POP
            if stack:
                stack.pop()
            else:
                self._pop_mark()
        elif op == 0x31:  # POP_MARK
            self._pop_mark()
        elif op == 0x32:  # DUP
            stack.append(stack[-1])
        elif op == 0x71:  # BINPUT
            self._put(self._read(1)[0], stack[-1])
        elif op == 0x72:  # LONG_BINPUT
            self._put(from_bytes(self._read(4), "little"), stack[-1])
        elif op == 0x70:  # PUT
            self._put(int(self._readline()), stack[-1])
        elif op == 0x67:  # GET
            stack.append(self._get(int(self._readline())))
        elif op == 0x8B:  # LONG4
            stack.append(
                from_bytes(self._read(from_bytes(self._read(4), "little", signed=True)), "little", signed=True)
            )
        elif op == 0x43:  # SHORT_BINBYTES
            stack.append(self._read(self._read(1)[0]))
        elif op == 0x42:  # BINBYTES
            stack.append(self._read(from_bytes(self._read(4), "little")))
        elif op == 0x8E:  # BINBYTES8
            stack.append(self._read(from_bytes(self._read(8), "little")))
        elif op == 0x96:  # BYTEARRAY8
            stack.append(bytearray(self._read(from_bytes(self._read(8), "little"))))
        elif op == 0x55:  # SHORT_BINSTRING (a Python 2 str): decoded as pickle's default, ASCII
            stack.append(self._read(self._read(1)[0]).decode("ascii"))
        elif op == 0x54:  # BINSTRING
            stack.append(self._read(from_bytes(self._read(4), "little", signed=True)).decode("ascii"))
        elif op == 0x53:  # STRING: a quoted Python 2 literal
            line = self._readline().rstrip(b"\r")
            if len(line) < 2 or line[:1] != line[-1:] or line[:1] not in (b'"', b"'"):
                raise PickleCorrupt("the pickle is corrupt (an unquoted STRING)")
            stack.append(codecs.escape_decode(line[1:-1])[0].decode("ascii"))
        elif op == 0x56:  # UNICODE
            stack.append(self._readline().decode("raw-unicode-escape"))
        elif op == 0x49:  # INT (text); "I01"/"I00" are the booleans of protocol 0
            line = self._readline()
            stack.append(True if line == b"01" else False if line == b"00" else int(line))
        elif op == 0x4C:  # LONG (text)
            stack.append(int(self._readline().rstrip(b"L")))
        elif op == 0x46:  # FLOAT (text)
            stack.append(float(self._readline()))
        else:
            raise PickleCorrupt(f"not a valid pickle (unknown opcode 0x{op:02x} at byte {self._pos - 1})")

    def _pop_mark(self) -> list:
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def _append(self, target: Any, items: list) -> None:
        if type(target) is list:
            target.extend(items)
        elif isinstance(target, Sink):
            target.take(items)
        else:
            raise PickleCorrupt(f"the pickle is corrupt (it appends to a {type(target).__name__})")

    def _put(self, index: int, value: Any) -> None:
        memo = self._memo
        if value is self._unkept and value is not None:
            value = _NOT_KEPT
        if index == len(memo):  # MEMOIZE, and PUT as picklers write it
            memo.append(value)
            return
        if index < len(memo):  # PUT may overwrite: what was looked up by its bytes may have changed
            memo[index] = value
            self._tokens.clear()
            self._spans.clear()
            return
        if index - len(memo) > _MAX_MEMO_GAP:
            raise PickleCorrupt(f"the pickle is corrupt (memo index {index} far beyond the {len(memo)} stored)")
        memo.extend([_NOT_KEPT] * (index - len(memo)))
        memo.append(value)

    def _get(self, index: int) -> Any:
        try:
            value = self._memo[index]
        except IndexError:
            raise self._missing(index) from None
        if value is _NOT_KEPT:
            raise self._missing(index)
        return value

    def _missing(self, index: int) -> PickleError:
        if index < len(self._memo) and self.streaming:
            return SharedContainer("the pickle refers back to an item already handed to a sink")
        return PickleCorrupt(f"the pickle is corrupt (it refers to memo entry {index}, never stored)")

    def _at_sink_item(self) -> bool:
        """Whether a value built now becomes an item of a sink (appended alone, or in a MARK batch)."""
        if self.stack and isinstance(self.stack[-1], Sink):
            return True
        metastack = self.metastack
        return bool(metastack) and bool(metastack[-1]) and isinstance(metastack[-1][-1], Sink)

    # -- the fast path for plain items inside sinks --
    def _match_item(self, keep: bool) -> bool:
        """At an EMPTY_DICT: read the whole dict at once if it is a plain item; False to take the opcode loop.

        A plain item is `{key: scalar or short string, ...}`, optionally ending with one `key: [...]` (the
        stack). The pairs are matched by a pattern; the list is first looked up among the spans seen
        before, which needs only where it ends: at an APPENDS that closes the item (`eu`). A candidate end
        is only a guess, but a span equal to one the full pattern validated is that same list.
        Memo slots are taken in the order of the stream: the dict, its new strings, the list, its new dicts.
        """
        buf = self._buf
        head = _ITEM_HEAD.match(buf, self._pos - 1)
        if head is None:
            return False
        end = head.end()
        list_key = None
        if buf[end : end + 1] != b"u":
            list_key = _LIST_KEY.match(buf, end)
            if list_key is None:
                return False
        memo = self._memo
        taken = len(memo)
        item: dict = {}
        memo.append(item if keep else _NOT_KEPT)
        value, fresh = self._tokens, self._fresh_string
        try:
            for k, v in _ITEM_PAIR.findall(buf, head.start(1), head.end(1)):
                key = fresh(k) if k[0] == 0x8C else value[k]  # first: memo slots follow the stream's order
                item[key] = fresh(v) if v[0] == 0x8C else value[v]
            if list_key is not None:
                token = list_key.group()
                name = fresh(token) if token[0] == 0x8C else value[token]
                flat, seen, end = self._list_at(list_key.end(), first_new=len(memo) + 1)
                if flat is None:
                    del memo[taken:]
                    return False
                memo.append(flat)
                # New dicts are kept the first time their span is read (torch refers back to them); a span
                # read again holds other new dicts that nothing refers to (older snapshots).
                memo.extend([_NOT_KEPT] * len(flat.new_dicts) if seen else flat.new_dicts)
                item[name] = flat
        except _MemoMiss as miss:
            raise self._missing(miss.index) from None
        self.stack.append(item)
        self._pos = end + 1  # past the SETITEMS
        return True

    def _fresh_string(self, token: bytes) -> str:
        """A short string written for the first time: memoized, and one object per distinct text."""
        text = self._strings.get(token)
        if text is None:
            text = token[2:-1].decode("utf-8", "surrogatepass")
            if len(self._strings) < _SPAN_CACHE_LIMIT:
                self._strings[token] = text
        self._memo.append(text)
        return text

    def _list_at(self, start: int, first_new: int) -> tuple[FlatList | None, bool, int]:
        """The list at `start`, whether its span was seen before, and where the item's SETITEMS follows.

        `first_new` is the memo slot its first new dict will take (references inside the span may point
        to the span's own new dicts: a frame that recurs in one stack)."""
        buf, spans = self._buf, self._spans
        if buf[start + 2 : start + 3] == b"u":  # an empty list (a free recorded without a stack)
            return FlatList([], []), False, start + 2
        candidate, window = start, start + _CANDIDATE_WINDOW
        for _ in range(3):
            candidate = buf.find(b"eu", candidate + 1, window)
            if candidate < 0:
                break
            flat = spans.get(buf[start : candidate + 1])
            if flat is not None:
                return flat, True, candidate + 1
        match = _LIST.match(buf, start)
        if match is None or buf[match.end() : match.end() + 1] != b"u":
            return None, False, 0
        span = match.group()
        try:
            flat = _decode_list(span, self._tokens, first_new)
        except _MemoMiss as miss:
            raise self._missing(miss.index) from None
        if len(spans) >= _SPAN_CACHE_LIMIT:
            spans.clear()
        spans[span] = flat
        return flat, False, match.end()


def _bounded_tuple(value: tuple) -> tuple:
    """A tuple is hashable: wherever it goes next (a key, a cache of frames), it may be hashed recursively in
    C. One that holds tuples is bounded as it is made (its shared parts measured once)."""
    for item in value:
        if type(item) is tuple or type(item) is frozenset:
            check_key(value)
            break
    return value


class _Unframed:
    """The pickle's bytes with its FRAME headers taken out.

    From protocol 4 the pickler cuts its output into frames of about 64 KiB, each announced by a FRAME
    opcode and its length, so that a reader can prefetch. They fall between any two objects, so one in
    ten items or so would have a header inside it and miss the fast path; they carry no data, and each
    announces where the next one starts, so they are removed here. A pickle that continues unframed
    (after a large string, written outside any frame) is passed on as it is from there, and the opcode
    loop skips any FRAME it meets.
    """

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._left = -1  # bytes left in the current frame; -1 before the start, None once unframed
        self._pending = b""

    def read(self, size: int) -> bytes:
        if self._left == -1:
            self._start()
        if self._left is None:
            data, self._pending = self._pending + self._raw.read(size), b""
            return data
        parts = [self._pending]
        have = len(self._pending)
        self._pending = b""
        while have < size and self._left is not None:
            if self._left == 0 and not self._next_frame(parts):
                break
            if self._left is None:
                break
            chunk = self._raw.read(min(self._left, size - have))
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
            self._left -= len(chunk)
        if have < size and self._left is None:
            parts.append(self._raw.read(size - have))
        return b"".join(parts)

    def _start(self) -> None:
        head = self._raw.read(2)
        self._pending = head
        self._left = None
        if len(head) == 2 and head[0] == 0x80 and head[1] >= 4:
            self._left = 0

    def _next_frame(self, parts: list) -> bool:
        """At the end of a frame: read the next FRAME header, or note that the rest is unframed."""
        opcode = self._raw.read(1)
        if not opcode:
            return False
        if opcode != b"\x95":
            parts.append(opcode)
            self._left = None
            return True
        length = self._raw.read(8)
        if len(length) < 8:  # truncated inside the header: hand on what there is, the reader will say so
            parts.append(opcode + length)
            self._left = None
            return True
        self._left = int.from_bytes(length, "little")
        return True


class _Tokens(dict):
    """The value of each scalar token, by its bytes; memo references and small ints are kept, as they recur."""

    def __init__(self, memo: list) -> None:
        super().__init__()
        self._memo = memo

    def __missing__(self, token: bytes) -> Any:
        if token[0] == 0x8A:  # LONG1: addresses and times, each seen once; not kept
            return int.from_bytes(token[2:], "little", signed=True)
        value = _decode_scalar(token, self._memo)
        if value is _NOT_KEPT:
            raise _MemoMiss(_get_index(token))
        if token[0] in _CACHEABLE:
            if len(self) >= _SPAN_CACHE_LIMIT:  # references to stacks are many and each used once or twice
                self.clear()
            self[token] = value
        return value


class _Truncated(Exception):
    pass


class _MemoMiss(Exception):
    def __init__(self, index: int) -> None:
        self.index = index


def pickle_highest_protocol() -> int:
    import pickle

    return pickle.HIGHEST_PROTOCOL


def _get_index(token: bytes) -> int:
    return token[1] if token[0] == 0x68 else int.from_bytes(token[1:5], "little")


def _decode_get(token: bytes, memo: list) -> Any:
    index = _get_index(token)
    try:
        return memo[index]
    except IndexError:
        raise _MemoMiss(index) from None


def _decode_scalar(token: bytes, memo: list) -> Any:
    op = token[0]
    if op == 0x68 or op == 0x6A:
        return _decode_get(token, memo)
    if op == 0x4B:
        return token[1]
    if op == 0x4D:
        return int.from_bytes(token[1:3], "little")
    if op == 0x4A:
        return int.from_bytes(token[1:5], "little", signed=True)
    if op == 0x8A:
        return int.from_bytes(token[2:], "little", signed=True)
    if op == 0x4E:
        return None
    if op == 0x88:
        return True
    if op == 0x89:
        return False
    return _UNPACK_BINFLOAT(token[1:9])[0]  # BINFLOAT, the last alternative of the pattern


def _decode_list(span: bytes, value: _Tokens, first_new: int) -> FlatList:
    """The items of a span that matched `_LIST`, entry by entry: a new dict (a stack frame is a dict of
    three pairs) or a reference to an earlier one. Between the entries of a valid span there are only
    batch marks (MARK, APPENDS) and a final APPEND. `first_new` is the memo slot of its first new dict."""
    items: list = []
    new_dicts: list = []
    pos, end = 2, len(span)  # past EMPTY_LIST, MEMOIZE
    while pos < end:
        op = span[pos]
        if op == 0x68 or op == 0x6A:
            size = 2 if op == 0x68 else 5
            token = span[pos : pos + size]
            index = _get_index(token)
            if index < first_new:
                items.append(value[token])
            elif index - first_new < len(new_dicts):
                items.append(new_dicts[index - first_new])
            else:
                raise _MemoMiss(index)
            pos += size
        elif op == 0x7D:
            match = _DICT3.match(span, pos)
            if match is not None:
                k1, v1, k2, v2, k3, v3 = match.groups()
                entry = {value[k1]: value[v1], value[k2]: value[v2], value[k3]: value[v3]}
            else:
                match = _FLAT_DICT.match(span, pos)
                body = match.group(1) or match.group(2)
                entry = {value[k]: value[v] for k, v in _PAIR_TOKENS.findall(body)} if body else {}
            items.append(entry)
            new_dicts.append(entry)
            pos = match.end()
        else:  # MARK, APPENDS or APPEND
            pos += 1
    return FlatList(items, new_dicts)
