"""Hostile JSON generated from a grammar: genuine recorded JSON with one value replaced by an attack.

A case is drawn from a seed: a genuine artifact (a profiler trace, a py-spy JSON dump, an NVML dump, a JSON
flight-recorder dump, all recorded from real jobs, or a parallel layout's config), one of its values (any path
in its tree) and a fragment of JSON text in its place:

- deep:      arrays or objects nested up to a million deep;
- numbers:   integers of thousands to a million digits, 1e999, NaN, Infinity, -0, 2^64;
- text:      strings of megabytes, lone surrogates, control and bidi characters, invalid UTF-8 bytes;
- confusion: a value of another kind (an object where a number belongs, null, a list);
- duplicate: an object that repeats a key;
- truncation: the text cut at a random byte.

Every case must end, through the real reader, in records or the reader's own error (an InputError or
ValueError that says what is wrong), never another exception, within the time bound. Run on demand:
`python tests/hostile_json.py --count 20000`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
SOURCES = {
    "trace": HERE / "fixtures/traces/gloo_cpu/trace_rank0.json.gz",
    "pyspy": HERE / "fixtures/stacks/barrier/rank00.json",
    "nvml": HERE / "fixtures/nvlink/h200x2_live/nvlink.json",
    "fr_json": HERE / "fixtures/fr/size_json_4r/fr_dump_json_rank_0",
    "layout": HERE / "fixtures/layouts/moe_megatron.json",  # a parallel layout as `check-layout --config` reads
}
MARK = "\u0000hostile-value\u0000"
FAMILIES = ("deep", "numbers", "text", "confusion", "duplicate", "truncation")
TIME_BOUND_S = 20.0


@dataclass(frozen=True)
class Case:
    seed: int
    target: str
    family: str
    detail: str
    data: bytes


def _genuine(target: str):
    raw = SOURCES[target].read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _paths(tree, limit: int = 3000) -> list[tuple]:
    found, todo = [], [((), tree)]
    while todo and len(found) < limit:
        path, node = todo.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node[:30]) if isinstance(node, list) else ()
        for key, value in items:
            found.append(path + (key,))
            todo.append((path + (key,), value))
    return found


def _fragment(rng: random.Random, family: str) -> tuple[str, str]:
    if family == "deep":
        n = rng.choice((2_000, 100_000, 1_000_000))
        if rng.random() < 0.5:
            return f"arrays x{n}", "[" * n + "]" * n
        return f"objects x{n}", '{"a":' * n + "1" + "}" * n
    if family == "numbers":
        choice = rng.choice(("digits", "1e999", "NaN", "Infinity", "-Infinity", "-0", "2^64", "float_digits"))
        if choice == "digits":
            n = rng.choice((5_000, 100_000, 1_000_000))
            return f"an integer of {n} digits", "9" * n
        if choice == "float_digits":
            return "a float of 100000 digits", "0." + "1" * 100_000
        return choice, {"2^64": str(1 << 64)}.get(choice, choice)
    if family == "text":
        choice = rng.choice(("long", "surrogate", "control", "bidi"))
        text = {
            "long": "x" * rng.choice((1 << 20, 16 << 20)),
            "surrogate": "\ud800 lone",
            "control": "\x1b]0;title\x07\x1b[2J",
            "bidi": "\u202eevil\u202c",
        }[choice]
        return choice, json.dumps(text)
    if family == "duplicate":
        return "a repeated key", '{"name": "a", "name": "b", "ts": 1, "ts": [2]}'
    value = rng.choice((None, {"a": 1}, [1, [2]], "text", True, 1.5, -1, ""))
    return type(value).__name__, json.dumps(value)


def make(seed: int, target: str | None = None) -> Case:
    rng = random.Random(seed)
    target = target or rng.choice(sorted(SOURCES))
    family = rng.choice(FAMILIES)
    tree = _genuine(target)
    if family == "truncation":
        text = json.dumps(tree).encode()
        cut = rng.randrange(1, len(text))
        return Case(seed, target, family, f"cut at {cut} of {len(text)}", text[:cut])
    path = rng.choice(_paths(tree))
    node = tree
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = MARK
    detail, fragment = _fragment(rng, family)
    text = json.dumps(tree).replace(json.dumps(MARK), fragment, 1)
    if family == "text" and detail == "surrogate" and rng.random() < 0.5:
        data = text.encode("utf-8", "surrogatepass").replace(b"\xed\xa0\x80", b"\xff\xfe")  # invalid UTF-8
        return Case(seed, target, family, "invalid UTF-8", data)
    shown = "/".join(map(str, path))[:100]
    return Case(seed, target, family, f"{detail} at {shown}", text.encode("utf-8", "surrogatepass"))


def outcome(case: Case, folder: Path) -> tuple[bool, str]:
    """(right, what happened) for one case read by its real reader."""
    from torchtriage.errors import TriageError

    names = {
        "trace": "trace_rank0.json",
        "pyspy": "rank00.json",
        "nvml": "nvlink.json",
        "fr_json": "fr_dump_json_rank_0",
        "layout": "layout.json",
    }
    path = folder / names[case.target]
    path.write_bytes(case.data)
    start = time.monotonic()
    try:
        said = _read(case.target, path)
    except (TriageError, ValueError) as err:  # the readers' own errors, with their messages
        said = f"refused: {err}"[:300]
    except Exception as err:  # noqa: BLE001 - anything else is what the generator looks for
        return False, f"{type(err).__name__}: {err}"[:300]
    took = time.monotonic() - start
    return took <= TIME_BOUND_S, said if took <= TIME_BOUND_S else f"{took:.0f} s: {said}"


def _read(target: str, path: Path) -> str:
    if target == "trace":
        from torchtriage.sources.profiler_trace import read_trace

        trace = read_trace(str(path))
        return f"read ({len(trace.problems)} problems)"
    if target == "pyspy":
        from torchtriage.sources.pyspy import read_rank_dump

        read_rank_dump(path)
        return "read"
    if target == "nvml":
        from torchtriage.sources.nvlink import load_nvml_json, parse_nvml_dump

        parse_nvml_dump(load_nvml_json(path.read_text(errors="surrogateescape"), str(path)))
        return "read"
    if target == "layout":
        from torchtriage.analysis.layout import Layout, check_layout, layout_fields_from_config, parse_config_text
        from torchtriage.sources.streams import read_text

        fields = layout_fields_from_config(parse_config_text(read_text(str(path), "the config"), str(path)), "x")
        if {"world_size", "gpus_per_node"} <= set(fields):
            return "accepted" if check_layout(Layout(**fields)).accepted else "rejected"
        return "read (not a whole layout)"
    from torchtriage.sources.flight_recorder import load_dump_files

    loaded = load_dump_files([str(path)], jobs=1, isolate=False)  # JSON: no C unpickler to isolate
    return loaded.problems[0].message if loaded.problems else "read"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--target", choices=sorted(SOURCES))
    parser.add_argument("--out", type=Path, default=Path("/tmp/hostile_json"))
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
