"""Structure-aware mutations of real artifacts, for the fuzz suite: deterministic for a given seed.

Each mutator takes the bytes of a genuine file and a `random.Random`, and returns broken bytes of the same
kind: cut, flipped, duplicated, nested, inflated, given the wrong types. Pickles and JSON are mutated as
trees (a field replaced by a billion-laughs ladder of shared lists, an integer of thousands of digits, NaN,
a buffer, text full of terminal escapes) and written back; text is mutated line by line.
"""

from __future__ import annotations

import gzip
import json
import pickle
import random

from torchtriage.sources.safe_pickle import safe_loads

ESCAPES = "\x1b]52;c;aGk=\x07\x1b[2J\x1bP+q\x1b\\\x9b31m\u202e\r"


HUGE_JSON_INT = "<an integer of 5000 digits>"  # json.dumps cannot write one: spliced into the text


def ladder(depth: int = 40) -> list:
    """A list that expands to 2**depth leaves, though only `depth` lists exist: the billion laughs."""
    value: list = [0]
    for _ in range(depth):
        value = [value, value]
    return value


def deep_pickle(depth: int = 200_000) -> bytes:
    """A pickle of lists nested `depth` deep, built from opcodes (pickle.dumps would recurse)."""
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


def _replacements(rng: random.Random, for_json: bool) -> list:
    values = [
        HUGE_JSON_INT if for_json else 10**5000,
        -(2**70),
        2**64,
        -1,
        float("nan"),
        float("inf"),
        "",
        "x" * 200_000,
        ESCAPES * 10,
        None,
        True,
        {"": {"": {}}},
        [],
        [[[[[[]]]]]],
        3.5,
    ]
    if not for_json:
        values += [ladder(), bytearray(b"buffer"), (1, 2), frozenset({1}), b"\xff\x00"]
    return values


def _paths(tree, limit: int = 4000) -> list[tuple]:
    """Paths to the nodes of a tree (a bounded walk: by identity, each container once)."""
    out: list[tuple] = []
    seen: set[int] = set()
    stack: list[tuple[tuple, object]] = [((), tree)]
    while stack and len(out) < limit:
        path, node = stack.pop()
        out.append(path)
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, dict):
            stack.extend((path + (k,), v) for k, v in list(node.items())[:200])
        elif isinstance(node, list):
            stack.extend((path + (i,), v) for i, v in enumerate(node[:200]))
    return out


def _set(tree, path: tuple, value):
    if not path:
        return value
    node = tree
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return tree


def mutate_tree(tree, rng: random.Random, for_json: bool, changes: int = 3):
    for _ in range(changes):
        paths = _paths(tree)
        path = rng.choice(paths)
        kind = rng.random()
        if kind < 0.15 and path:  # duplicate a sibling many times over (a list grown, a dict's value shared)
            parent_path = path[:-1]
            parent = tree
            for key in parent_path:
                parent = parent[key]
            if isinstance(parent, list):
                parent.extend([parent[path[-1]]] * 1000)
                continue
        tree = _set(tree, path, rng.choice(_replacements(rng, for_json)))
    return tree


def _as_lists(value):
    """Tuples become lists, so every container can be mutated in place."""
    if isinstance(value, tuple):
        return [_as_lists(v) for v in value]
    if isinstance(value, list):
        return [_as_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_lists(v) for k, v in value.items()}
    return value


def bytes_mutation(data: bytes, rng: random.Random) -> bytes:
    kind = rng.randrange(5)
    if kind == 0 and len(data) > 2:  # cut
        return data[: rng.randrange(1, len(data))]
    if kind == 1:  # flip bytes
        out = bytearray(data)
        for _ in range(rng.randint(1, 16)):
            out[rng.randrange(len(out))] = rng.randrange(256)
        return bytes(out)
    if kind == 2 and len(data) > 8:  # duplicate a chunk in place
        a = rng.randrange(len(data) - 4)
        b = rng.randrange(a + 1, min(len(data), a + 4096))
        return data[:b] + data[a:b] * rng.randint(2, 200) + data[b:]
    if kind == 3:  # insert noise
        at = rng.randrange(len(data) + 1)
        return data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))) + data[at:]
    return data + data  # two documents back to back


def mutate_pickle(data: bytes, rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.25:
        return bytes_mutation(data, rng)
    if roll < 0.3:
        return deep_pickle()
    if roll < 0.35:
        return gzip.compress(data)[: rng.randrange(10, 200)]  # a cut gzip
    tree = _as_lists(safe_loads(data))
    tree = mutate_tree(tree, rng, for_json=False)
    try:
        return pickle.dumps(tree, protocol=rng.choice([2, 4, 5]))
    except (RecursionError, ValueError, OverflowError):
        return bytes_mutation(data, rng)


def _json_text(tree, rng: random.Random) -> str:
    text = json.dumps(tree, allow_nan=True).replace(json.dumps(HUGE_JSON_INT), "7" * 5000)
    if rng.random() < 0.2:  # nesting past any parser's recursion limit, spliced in for one value
        text = text.replace("null", "[" * 100_000 + "]" * 100_000, 1)
    return text


def mutate_json(data: bytes, rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.25:
        return bytes_mutation(data, rng)
    raw = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    tree = json.loads(raw)
    tree = mutate_tree(tree, rng, for_json=True)
    out = _json_text(tree, rng).encode()
    return gzip.compress(out, 1) if data[:2] == b"\x1f\x8b" else out


def mutate_text(data: bytes, rng: random.Random) -> bytes:
    if rng.random() < 0.2:
        return bytes_mutation(data, rng)
    lines = data.split(b"\n")
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(lines))
        kind = rng.randrange(7)
        if kind == 0:
            lines[i] = lines[i] * rng.randint(50, 2000)  # a line of 10s of KB, its anchors repeated
        elif kind == 1:
            lines[i:i] = [lines[i]] * rng.randint(100, 5000)
        elif kind == 2:
            lines[i] = lines[i] + ESCAPES.encode()
        elif kind == 3:
            lines[i] = bytes(b if not (48 <= b <= 57) else 57 for b in lines[i]) + b"9" * 5000  # huge numbers
        elif kind == 4:
            lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)] + b"\xff\xfe\x00"
        elif kind == 5:
            del lines[i]
            if not lines:
                lines = [b""]
        else:
            lines[i] = b" " * 20_000 + lines[i] + b"\t" * 20_000
    return b"\n".join(lines)
