"""One linear pass over a pickle's opcodes before any C unpickler sees it: what the data would be, bounded.

The C unpickler is fast and cannot run code (`safe_pickle` refuses every global), but it trusts the data's
shape: it hashes a dict key as it stores it, recursively in C, so a key nested a million deep (built with
`TUPLE1`, no MARK needed) overflows the stack; a key built from shared references (each tuple holding the
previous one twice: 40 opcodes) is hashed as a tree of 2^40 nodes; memo indices and integer lengths are
taken as given. This pass reads the opcode stream the way the unpickler would, building only a graph of the
containers it would make (which holds which, shared references as edges), then bounds, over every container:

- its nesting depth (the policy's `depth`: genuine dumps and snapshots nest fewer than 10 deep),
- its size as a tree, each shared reference counted by what it refers to (`expansion`): what a walk, a
  hash or a comparison of it would cost,
- cycles (a container that holds itself, which no genuine artifact does),

and, as it goes, memo indices (at most one slot per byte of the file) and integers (at most 64 KiB).
A pickle past a bound is refused with what was exceeded and the flag that raises it; a malformed one is
left to the unpickler, which says what is wrong. The pass costs a few tenths of a microsecond per opcode (a
2,000-entry dump: tens of milliseconds); flight-recorder dumps that repeat a checked dump's bytes (`fr_bytes`)
pass only their header through it, and a role's template is made after its second dump.
"""

from __future__ import annotations

import struct

from torchtriage.sources import limits
from torchtriage.sources.limits import LimitExceeded
from torchtriage.sources.pickle_errors import PickleCorrupt

__all__ = ["scan", "check_key"]

_LEAF = -1
# Integers past this many bytes are refused here; the column checks say more of smaller ones (digits, range).
_MAX_INT_BYTES = 1 << 16

# Opcodes followed by a fixed number of argument bytes that push one scalar.
_FIXED_SCALAR = {
    0x4B: 1,  # BININT1
    0x4D: 2,  # BININT2
    0x4A: 4,  # BININT
    0x47: 8,  # BINFLOAT
}
# Opcodes followed by a little-endian length of this width, then that many bytes, pushing one scalar.
_SIZED_SCALAR = {
    0x8C: 1,  # SHORT_BINUNICODE
    0x58: 4,  # BINUNICODE
    0x8D: 8,  # BINUNICODE8
    0x43: 1,  # SHORT_BINBYTES
    0x42: 4,  # BINBYTES
    0x8E: 8,  # BINBYTES8
    0x55: 1,  # SHORT_BINSTRING
    0x54: 4,  # BINSTRING
    0x96: 8,  # BYTEARRAY8
}
_LONGS = {0x8A: 1, 0x8B: 4}  # LONG1, LONG4
_NO_ARG_SCALAR = {0x4E, 0x88, 0x89}  # NONE, NEWTRUE, NEWFALSE
_LINE_SCALAR = {0x49, 0x4C, 0x46, 0x53, 0x56}  # INT, LONG, FLOAT, STRING, UNICODE (protocol 0)
_EMPTY = {0x5D, 0x7D, 0x29, 0x8F}  # EMPTY_LIST, EMPTY_DICT, EMPTY_TUPLE, EMPTY_SET
_FROM_MARK = {0x6C, 0x64, 0x74, 0x91}  # LIST, DICT, TUPLE, FROZENSET
_INTO_TARGET = {0x65, 0x75, 0x90}  # APPENDS, SETITEMS, ADDITEMS
_TUPLE_N = {0x85: 1, 0x86: 2, 0x87: 3}
_GETS = {0x68: 1, 0x6A: 4}  # BINGET, LONG_BINGET
_PUTS = {0x71: 1, 0x72: 4}  # BINPUT, LONG_BINPUT


class _Graph:
    """The containers the unpickler would build: for each, the containers it holds and its count of scalars."""

    __slots__ = ("kids", "leaves", "depth")

    def __init__(self) -> None:
        self.kids: list[list[int]] = []
        self.leaves: list[int] = []
        # Depth at creation: exact for what is built whole (TUPLE1 ...), a lower bound for what grows later,
        # so that a chain a million deep is refused as it passes the limit, not after.
        self.depth: list[int] = []

    def new(self, items: list[int]) -> int:
        kids = [i for i in items if i != _LEAF]
        self.kids.append(kids)
        self.leaves.append(len(items) - len(kids))
        depth = self.depth
        depth.append(1 + max([depth[k] for k in kids], default=0))
        return len(self.leaves) - 1

    def add(self, target: int, items: list[int]) -> None:
        if target == _LEAF:
            return  # appending to a scalar: the unpickler says it is corrupt
        kids = [i for i in items if i != _LEAF]
        self.kids[target] += kids
        self.leaves[target] += len(items) - len(kids)


def scan(raw: bytes, what: str = "it") -> None:
    """Raise LimitExceeded if unpickling `raw` would build data past the policy's bounds, PickleCorrupt if it
    would build what no pickler writes (see the module docstring). Returns quietly for other malformed data:
    the unpickler then says what is wrong with it."""
    policy = limits.active()
    graph = _read_graph(bytes(raw), what)
    if graph is not None:
        _bound(graph, policy, what)


def _kinds() -> list[int]:
    """Opcode -> what the scan does with it (the codes below), one list lookup per opcode."""
    kinds = [_OTHER] * 256
    for table, kind in (
        (_GETS, _K_GET), (_PUTS, _K_PUT), (_SIZED_SCALAR, _K_SIZED), (_FIXED_SCALAR, _K_FIXED),
        (_INTO_TARGET, _K_INTO), (_EMPTY, _K_EMPTY), (_NO_ARG_SCALAR, _K_SCALAR), (_LONGS, _K_LONG),
        (_TUPLE_N, _K_TUPLE_N), (_FROM_MARK, _K_FROM_MARK), (_LINE_SCALAR, _K_LINE),
    ):  # fmt: skip
        for op in table:
            kinds[op] = kind
    for op, kind in ((0x94, _K_MEMOIZE), (0x28, _K_MARK), (0x73, _K_SETITEM), (0x61, _K_APPEND),
                     (0x30, _K_POP), (0x31, _K_POP_MARK), (0x32, _K_DUP), (0x95, _K_FRAME), (0x80, _K_PROTO),
                     (0x2E, _K_STOP), (0x70, _K_TEXT_PUT), (0x67, _K_TEXT_GET)):  # fmt: skip
        kinds[op] = kind
    return kinds


(_K_GET, _K_SIZED, _K_PUT, _K_MEMOIZE, _K_MARK, _K_INTO, _K_EMPTY, _K_FIXED, _K_SETITEM, _K_APPEND, _K_SCALAR,
 _K_LONG, _K_TUPLE_N, _K_FROM_MARK, _K_POP, _K_POP_MARK, _K_DUP, _K_FRAME, _K_PROTO, _K_STOP, _K_LINE,
 _K_TEXT_PUT, _K_TEXT_GET, _OTHER) = range(24)  # fmt: skip
_KIND = _kinds()
_WIDTH = {**_GETS, **_PUTS, **_SIZED_SCALAR, **_FIXED_SCALAR, **_LONGS, **_TUPLE_N}
_WIDTHS = [_WIDTH.get(op, 0) for op in range(256)]
_UNSIGNED = {1: struct.Struct("<B").unpack_from, 4: struct.Struct("<I").unpack_from, 8: struct.Struct("<Q").unpack_from}


def _read_graph(raw: bytes, what: str) -> _Graph | None:  # noqa: C901 - one dispatch on the opcode
    # The kinds are compared as literal numbers (the order of `_kinds`' codes): a name would cost a lookup
    # per opcode, a third of the time.
    graph = _Graph()
    stack: list[int] = []
    marks: list[int] = []
    memo: dict[int, int] = {}
    depth = graph.depth
    end = len(raw)
    deepest = limits.active().depth
    pos = 0
    kind_of, widths, unsigned = _KIND, _WIDTHS, _UNSIGNED
    push = stack.append
    try:
        while pos < end:
            op = raw[pos]
            pos += 1
            # The opcodes torch's pickler writes most, first and without a table (a third of the time).
            if op == 0x68:  # BINGET
                push(memo[raw[pos]])
                pos += 1
                continue
            if op == 0x72:  # LONG_BINPUT
                index = unsigned[4](raw, pos)[0]
                if index > end:
                    raise _far_slot(index)
                memo[index] = stack[-1]
                pos += 4
                continue
            if op == 0x5D:  # EMPTY_LIST
                push(graph.new([]))
                continue
            if op == 0x61:  # APPEND
                item = stack.pop()
                if item != -1:
                    graph.add(stack[-1], [item])
                elif stack[-1] != -1:
                    graph.leaves[stack[-1]] += 1
                continue
            if op == 0x4D:  # BININT2
                push(-1)
                pos += 2
                continue
            if op == 0x4B:  # BININT1
                push(-1)
                pos += 1
                continue
            kind = kind_of[op]
            if kind == 0:  # GET
                width = widths[op]
                push(memo[unsigned[width](raw, pos)[0]])
                pos += width
            elif kind == 1:  # SIZED scalar
                width = widths[op]
                pos += width + unsigned[width](raw, pos)[0]
                push(_LEAF)
            elif kind == 2:  # PUT
                width = widths[op]
                index = unsigned[width](raw, pos)[0]
                if index > end:
                    raise _far_slot(index)
                memo[index] = stack[-1]
                pos += width
            elif kind == 3:  # MEMOIZE
                memo[len(memo)] = stack[-1]
            elif kind == 4:  # MARK
                marks.append(len(stack))
            elif kind == 5:  # APPENDS, SETITEMS, ADDITEMS
                at = marks.pop()
                graph.add(stack[at - 1], stack[at:])
                del stack[at:]
            elif kind == 6:  # EMPTY_*
                push(graph.new([]))
            elif kind == 7:  # FIXED-width scalar
                pos += widths[op]
                push(_LEAF)
            elif kind == 8:  # SETITEM
                graph.add(stack[-3], stack[-2:])
                del stack[-2:]
            elif kind == 9:  # APPEND
                graph.add(stack[-2], [stack.pop()])
            elif kind == 10:  # NONE, NEWTRUE, NEWFALSE
                push(_LEAF)
            elif kind == 11:  # LONG1, LONG4
                width = widths[op]
                size = unsigned[width](raw, pos)[0]
                if size > _MAX_INT_BYTES:
                    raise PickleCorrupt(f"refused: it holds an integer of {size:,} bytes (genuine ones fit in 8)")
                pos += width + size
                push(_LEAF)
            elif kind == 12 or kind == 13:  # TUPLE1-3 / from a mark: LIST, DICT, TUPLE, FROZENSET
                if kind == 12:
                    at = len(stack) - widths[op]
                    if at < 0:
                        return graph
                else:
                    at = marks.pop()
                node = graph.new(stack[at:])
                del stack[at:]
                push(node)
                if depth[node] > deepest:  # nested at least this deep already
                    raise LimitExceeded(f"{what} nests containers more than {deepest:,} deep", "depth")
            elif kind == 14:  # of the topmost mark, when nothing is above it
                if marks and marks[-1] == len(stack):
                    marks.pop()
                else:
                    stack.pop()
            elif kind == 15:  # POP_MARK
                del stack[marks.pop() :]
            elif kind == 16:  # DUP
                push(stack[-1])
            elif kind == 17:  # FRAME
                pos += 8
            elif kind == 18:  # PROTO
                pos += 1
            elif kind == 19:  # STOP
                return graph
            elif kind == 20:  # protocol 0 scalar
                pos = _line_end(raw, pos)
                push(_LEAF)
            elif kind == 21 or kind == 22:  # protocol 0: a decimal index on its line
                stop = _line_end(raw, pos)
                index = int(raw[pos : stop - 1])
                if kind == 22:
                    push(memo[index])
                elif index > end:
                    raise _far_slot(index)
                else:
                    memo[index] = stack[-1]
                pos = stop
            else:
                return graph  # an opcode plain data never uses (a global, a call): the unpickler refuses it
    except (PickleCorrupt, LimitExceeded):
        raise
    except (IndexError, KeyError, ValueError, struct.error):
        return graph  # malformed: the unpickler says how; what was built so far is still bounded
    return graph


def _line_end(raw: bytes, pos: int) -> int:
    found = raw.find(b"\n", pos)
    if found < 0:
        raise ValueError("no end of line")
    return found + 1


def _far_slot(index: int) -> PickleCorrupt:
    return PickleCorrupt(f"refused: it stores memo slot {index:,}, past one slot per byte of the file")


def _bound(graph: _Graph, policy: limits.Limits, what: str) -> None:
    """Depth and tree size of every container, in one iterative walk over the graph; cycles refused."""
    kids, leaves = graph.kids, graph.leaves
    size = [1 + n if not k else 0 for k, n in zip(kids, leaves, strict=True)]  # 0: not yet known
    depth = [1] * len(leaves)
    most, deepest = policy.expansion, policy.depth
    if max(size, default=0) > most:
        raise _too_large(what, most)
    on_path = bytearray(len(leaves))
    for root, known in enumerate(size):
        if known:
            continue
        path = [(root, 0)]
        on_path[root] = 1
        while path:
            node, next_kid = path[-1]
            children = kids[node]
            if next_kid < len(children):
                path[-1] = (node, next_kid + 1)
                child = children[next_kid]
                if on_path[child]:
                    raise PickleCorrupt("refused: it holds a container that holds itself (a cycle), as no dump does")
                if not size[child]:
                    on_path[child] = 1
                    path.append((child, 0))
                continue
            path.pop()
            on_path[node] = 0
            total, level = 1 + leaves[node], 0
            for child in children:
                total += size[child]
                if depth[child] > level:
                    level = depth[child]
            if level >= deepest:
                raise LimitExceeded(f"{what} nests containers more than {deepest:,} deep", "depth")
            if total > most:
                raise _too_large(what, most)
            size[node], depth[node] = total, level + 1


def _too_large(what: str, most: int) -> LimitExceeded:
    return LimitExceeded(f"{what} expands to more than {most:,} values once its shared references are followed",
                         "expansion")  # fmt: skip


def check_key(key: object, what: str = "it") -> None:
    """For readers that build the data themselves (the streaming unpickler): a dict key or set item that is
    a tuple or frozenset is bounded by depth and expansion before anything hashes it. Shared parts are
    measured once (by identity), so the check costs the distinct objects, not the tree."""
    policy = limits.active()
    measured: dict[int, tuple[int, int]] = {}  # id -> (tree size, depth)
    path = [(key, iter(key))] if type(key) in (tuple, frozenset) else []
    while path:
        node, items = path[-1]
        for item in items:
            if type(item) in (tuple, frozenset) and id(item) not in measured:
                if len(path) >= policy.depth:
                    raise LimitExceeded(f"{what} nests containers more than {policy.depth:,} deep", "depth")
                path.append((item, iter(item)))
                break
        else:
            path.pop()
            total, level = 1, 0
            for item in node:
                size, depth = measured.get(id(item), (1, 0)) if type(item) in (tuple, frozenset) else (1, 0)
                total, level = total + size, max(level, depth)
            if total > policy.expansion:
                raise _too_large(what, policy.expansion)
            measured[id(node)] = (total, level + 1)
