"""Hostile pickles generated from a grammar: genuine dumps and snapshots with one field replaced by an attack.

A case is drawn from a seed: a genuine artifact (a flight-recorder dump or a memory snapshot recorded from a
real job), one of its fields (any path in its tree, keys included), and a fragment of opcodes that pushes one
value in that field's place. Fragments come from the opcode families a pickle can build with:

- deep:    nesting by every family that builds a container, with or without MARK (TUPLE1/2/3, TUPLE, LIST,
           FROZENSET from MARK; EMPTY_LIST + APPEND; EMPTY_DICT + SETITEM; EMPTY_SET + ADDITEMS), used as a
           value or as a dict key;
- laughs:  memo fan-out, each level a container holding the level below k times (tuples, lists, dicts,
           frozensets), as a value or a key ("billion laughs");
- ladder:  one large shared string or list referred to from many places;
- numbers: huge LONG4 integers, lengths past the end, memo slots far past the file, GETs of slots never put;
- cycles:  a list or dict that holds itself;
- confusion: a genuine value of another kind (a dict where text belongs, NaN, a huge int);
- truncation: the file cut at a random byte.

The fragment's memo slots follow the genuine pickle's, so what it builds is what the grammar says. Every case
must end, through the real reader, in records or one clear refusal, never a crash, a hang or a limit of the
bounded child (the child is the last defence; the pre-scan and the readers must come first). Run on demand:
`python tests/hostile_pickles.py --count 20000` (prints the seeds that fail; keep them in hostile_regressions.txt).
"""

from __future__ import annotations

import argparse
import gzip
import math
import pickle
import random
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
FR_SOURCE = HERE / "fixtures/fr_cross_group/subgroup_barrier_c1_4r/fr/nccl_trace_rank_1"
SNAPSHOT_SOURCE = HERE / "fixtures/h200x2_runtime/memory/train_snapshot.pickle.gz"
SENTINEL = "\x00hostile-field\x00"
FAMILIES = ("deep", "laughs", "ladder", "numbers", "cycle", "confusion", "truncation")


@dataclass(frozen=True)
class Case:
    seed: int
    target: str  # "fr" or "snapshot"
    family: str
    detail: str
    data: bytes


def _genuine(target: str):
    raw = FR_SOURCE.read_bytes() if target == "fr" else gzip.decompress(SNAPSHOT_SOURCE.read_bytes())
    return pickle.loads(raw)  # our own recorded fixture


def _paths(tree, limit: int = 3000) -> list[tuple]:
    """Paths to every value of the tree (dict keys marked ("key", k) as places of their own)."""
    found, todo = [], [((), tree)]
    while todo and len(found) < limit:
        path, node = todo.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                found += [path + (key,), path + (("key", key),)]
                todo.append((path + (key,), value))
        elif isinstance(node, list):
            for index, value in enumerate(node[:20]):
                found.append(path + (index,))
                todo.append((path + (index,), value))
    return found


def _place(tree, path: tuple, value):
    *parents, last = path
    node = tree
    for step in parents:
        node = node[step]
    if isinstance(last, tuple) and last[:1] == ("key",):
        node[value] = node.pop(last[1])  # the attack as the key itself
    else:
        node[last] = value


# -- fragments: opcodes that push exactly one value, using memo slots from `base` on --------------------


def _put(slot: int) -> bytes:
    return b"r" + struct.pack("<I", slot)


def _get(slot: int) -> bytes:
    return b"j" + struct.pack("<I", slot)


def deep(rng: random.Random, base: int) -> tuple[str, bytes]:
    n = rng.choice((250, 3_000, 100_000, 1_000_000))
    shape = rng.choice(("tuple1", "tuple2", "tuple3", "tuple_mark", "list_mark", "frozenset", "list_append",
                        "dict_setitem", "set_additems", "key"))  # fmt: skip
    leaf = b"K\x00"
    if shape == "tuple1":
        body = leaf + b"\x85" * n
    elif shape == "tuple2":
        body = leaf + (leaf + b"\x86") * n
    elif shape == "tuple3":
        body = leaf + (leaf + leaf + b"\x87") * n
    elif shape in ("tuple_mark", "list_mark", "frozenset"):
        closer = {"tuple_mark": b"t", "list_mark": b"l", "frozenset": b"\x91"}[shape]
        body = b"(" * n + leaf + closer * n
    elif shape == "list_append":
        body = b"]" * n + b"a" * (n - 1)
    elif shape == "dict_setitem":
        body = b"}" + (leaf + b"}") * (n - 1) + b"s" * (n - 1)
    elif shape == "set_additems":
        body = b"\x8f(" + b"(" * n + leaf + b"\x91" * n + b"\x90"
    else:  # a dict whose key is a deep tuple: hashed as the dict is built
        body = b"}" + leaf + b"\x85" * n + b"K\x01s"
    return f"{shape} x{n}", body


def laughs(rng: random.Random, base: int) -> tuple[str, bytes]:
    kind = rng.choice(("tuple", "list", "dict", "wrapped", "tuple_key"))
    fan = rng.randint(2, 12)
    levels = math.ceil(9 / math.log10(fan)) + rng.randint(0, 10)  # at least 10^9 as a tree
    out = b"K\x00" + _put(base) + b"0"
    for level in range(1, levels + 1):
        below = _get(base + level - 1)
        if kind in ("tuple", "tuple_key"):
            out += b"(" + below * fan + b"t"
        elif kind == "list":
            out += b"(" + below * fan + b"l"
        elif kind == "wrapped":  # each level inside a tuple of one (TUPLE1 after TUPLE)
            out += b"(" + below * fan + b"t\x85"
        else:
            out += b"(" + b"".join(b"K" + bytes([i]) + below for i in range(fan)) + b"d"
        out += _put(base + level) + b"0"
    top = _get(base + levels)
    if kind == "tuple_key":
        return f"{kind} {fan}^{levels}", out + b"}" + top + b"K\x01s"
    return f"{kind} {fan}^{levels}", out + top


def ladder(rng: random.Random, base: int) -> tuple[str, bytes]:
    if rng.random() < 0.5:
        size, refs = rng.choice(((1 << 20, 2000), (1 << 16, 50_000)))
        text = b"X" + struct.pack("<I", size) + b"a" * size + _put(base)
        return f"string {size}x{refs}", text + b"(" + _get(base) * refs + b"l"
    rungs = rng.randint(3, 6)
    out = b"(" + b"K\x01" * 1000 + b"l" + _put(base) + b"0"
    for rung in range(1, rungs + 1):
        out += b"(" + _get(base + rung - 1) * 1000 + b"l" + _put(base + rung) + b"0"
    return f"list ladder 1000^{rungs}", out + _get(base + rungs)


def numbers(rng: random.Random, base: int) -> tuple[str, bytes]:
    shape = rng.choice(("long4", "long4_claim", "unicode8_claim", "far_put", "missing_get", "binbytes_claim"))
    if shape == "long4":
        n = rng.choice((1 << 10, 1 << 17, 1 << 21))
        return f"{shape} {n}", b"\x8b" + struct.pack("<i", n) + b"\x7f" * n
    if shape == "long4_claim":
        return shape, b"\x8b" + struct.pack("<i", 0x7FFFFFF0) + b"\x01\x02"
    if shape == "unicode8_claim":
        return shape, b"\x8d" + struct.pack("<Q", 1 << 62) + b"abc"
    if shape == "binbytes_claim":
        return shape, b"B" + struct.pack("<I", 0xFFFFFFF0) + b"abc"
    if shape == "far_put":
        return shape, b"K\x01" + _put(rng.choice((0xFFFFFFF0, 1 << 28, 10**8)))
    return shape, _get(base + 10**6)


def cycle(rng: random.Random, base: int) -> tuple[str, bytes]:
    if rng.random() < 0.5:
        return "list", b"]" + _put(base) + _get(base) + b"a"
    return "dict", b"}" + _put(base) + b"K\x00" + _get(base) + b"s"


CONFUSIONS = (None, {"a": 1}, [1, [2, [3]]], "x" * 5000, float("nan"), float("inf"), -(10**30), 10**4000, b"\xff",
              True, (1, 2), 1.5, "")  # fmt: skip


def _spliced(tree, path: tuple, fragment: bytes) -> bytes | None:
    """The tree pickled with `fragment` where `path`'s value is, its memo slots after the tree's."""
    _place(tree, path, SENTINEL)
    raw = pickle.dumps(tree, protocol=2)
    marker = SENTINEL.encode()
    token = b"X" + struct.pack("<I", len(marker)) + marker
    at = raw.find(token)
    if at < 0:
        return None
    return raw[:at] + fragment + raw[at + len(token) :]


def _memo_slots(raw: bytes) -> int:
    import pickletools

    return 1 + max((arg for op, arg, _ in pickletools.genops(raw) if "PUT" in op.name), default=0)


def make(seed: int, target: str | None = None) -> Case:
    rng = random.Random(seed)
    target = target or rng.choice(("fr", "snapshot"))
    family = rng.choice(FAMILIES)
    tree = _genuine(target)
    if family == "truncation":
        raw = pickle.dumps(tree, protocol=rng.choice((2, 4)))
        cut = rng.randrange(1, len(raw))
        return Case(seed, target, family, f"cut at {cut} of {len(raw)}", raw[:cut])
    path = rng.choice(_paths(tree))
    if family == "confusion":
        value = rng.choice(CONFUSIONS)
        try:
            _place(tree, path, value)
        except TypeError:  # an unhashable value as a key: it goes in as a value instead
            _place(tree, path[:-1] + (path[-1][1],) if isinstance(path[-1], tuple) else path, value)
        return Case(seed, target, family, f"{type(value).__name__} at {_shown(path)}", pickle.dumps(tree, protocol=2))
    base = _memo_slots(pickle.dumps(tree, protocol=2)) + 8
    detail, fragment = {"deep": deep, "laughs": laughs, "ladder": ladder, "numbers": numbers, "cycle": cycle}[family](
        rng, base
    )
    data = _spliced(tree, path, fragment)
    if data is None:
        return make(seed + 10_000_019, target)
    return Case(seed, target, family, f"{detail} at {_shown(path)}", data)


def _shown(path: tuple) -> str:
    return "/".join(f"<key {p[1]}>" if isinstance(p, tuple) else str(p) for p in path)[:120]


# -- what each case must end in ---------------------------------------------------------------------------


def outcome(case: Case, folder: Path) -> tuple[bool, str]:
    """Read the case through the real reader (in its bounded child); (right, what happened). Right: records,
    or a refusal that is not the child's last defence (killed, out of memory, out of time)."""
    from torchtriage.errors import InputError

    path = folder / ("nccl_trace_rank_1" if case.target == "fr" else "snapshot.pickle")
    path.write_bytes(case.data)
    if case.target == "fr":
        from torchtriage.sources.flight_recorder import load_dump_files

        loaded = load_dump_files([str(path)], jobs=1)
        said = loaded.problems[0].message if loaded.problems else "read"
    else:
        from torchtriage.analysis.memory import read_snapshot

        try:
            read_snapshot(str(path))
            said = "read"
        except InputError as err:
            said = str(err)
    return "the reader stopped" not in said and "could not be sent back" not in said, said


def read_seed(seed: int) -> tuple[Case, bool, str]:
    """The seed's case, read in a folder of its own: (case, right, what happened)."""
    case = make(seed)
    with tempfile.TemporaryDirectory() as folder:
        right, said = outcome(case, Path(folder))
    return case, right, said


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--target", choices=("fr", "snapshot"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/hostile_pickles"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for seed in range(args.start, args.start + args.count):
        case = make(seed, args.target)
        right, said = outcome(case, args.out)
        if not right:
            failed += 1
            print(f"{seed}  # {case.target} {case.family} {case.detail}: {said}", flush=True)
    print(f"{args.count - failed} of {args.count} right")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
