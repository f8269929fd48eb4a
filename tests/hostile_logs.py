"""Hostile logs generated from the knowledge base: lines built from the rules' own anchors and patterns to make
the matcher work, and files built to break the reader.

A case is drawn from a seed: a family and a log of that family, made of the rules' anchors, phrases, example
lines and patterns (each pattern's regex parsed and written out as text it nearly matches):

- anchors:    lines of many rules' anchors and phrases run together, with separators of every kind;
- fragments:  rule examples cut at random places, spliced into one another, their numbers thousands of
              digits long;
- near:       text each pattern nearly matches (its repeats drawn long, then one character changed near
              the end), the lines a backtracking engine spends longest on;
- repeated:   one anchor repeated to a 16 KB line, with the rest of its message missing;
- long:       16 KB lines and lines of hundreds of KB without a newline, anchors at both ends;
- traceback:  tracebacks never closed, thousands of frames, headers among them, many ranks interleaved;
- ranks:      thousands of distinct rank prefixes, prefixes nested hundreds deep, rank numbers of
              thousands of digits;
- binary:     random bytes, invalid UTF-8 and unterminated terminal sequences around anchors;
- cr:         records ended by CR alone (one line of the whole log for a reader of LF), or by LF CR;
- nul:        NUL bytes inside lines and runs of them between lines (a log whose tail was never written).

Every case, read in this process by the real reader (`assess_paths`) and fused into a verdict that both
renderers print, must end in that verdict or a refusal that says what is wrong, never another exception. Its
work is held to bounds that are counts, not times: the characters the matcher's searches read in a line are at
most its length times the passes its candidates allow (one for the anchors, and per rule whose anchor it holds:
its set, each pattern, each `unless` pattern), however often the line repeats an anchor (a path that searched
once per anchor found, or per position, fails); and the reader hands the matcher no more text than the file
holds.

Run on demand: `python tests/hostile_logs.py --count 5000 [--seed N] [--out DIR]` writes the cases to DIR and
prints the seeds that fail (keep them in hostile_log_regressions.txt).
"""

from __future__ import annotations

import argparse
import io
import random
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from torchtriage.knowledge.matcher import Matcher
from torchtriage.knowledge.rules import default_rules

FAMILIES = ("anchors", "fragments", "near", "repeated", "long", "traceback", "ranks", "binary", "cr", "nul")
LINE = 16_384  # the reader cuts a hit line to this many characters before matching


@dataclass(frozen=True)
class Case:
    seed: int
    family: str
    detail: str
    data: bytes


# --- The material: what the knowledge base says lines look like --------------------------------------------


class _Material:
    def __init__(self) -> None:
        rules = [rule for rule in default_rules() if rule.patterns]
        self.rules = rules
        self.anchors = sorted({anchor for rule in rules for anchor in (*rule.anchors, *rule.phrases)})
        self.examples = [example for rule in rules for example in rule.examples if "\n" not in example]
        self.patterns = [pattern.pattern for rule in rules for pattern in rule.patterns]


_MATERIAL: _Material | None = None


def material() -> _Material:
    global _MATERIAL
    if _MATERIAL is None:
        _MATERIAL = _Material()
    return _MATERIAL


_SEPARATORS = (" ", "", ": ", "(", ")", "[", "]", ", ", "\t", "=", "/", ".", "|", '"', "\\", " -> ")


def _anchors_line(rng: random.Random, m: _Material, count: int) -> str:
    return "".join(rng.choice(m.anchors) + rng.choice(_SEPARATORS) for _ in range(count))


def _long_digits(rng: random.Random, text: str) -> str:
    """Every number of `text` made thousands of digits long (a regex's \\d+ reads them all)."""
    width = rng.choice((40, 900, 9_000))
    return re.sub(r"\d+", lambda found: found.group(0) * (width // max(len(found.group(0)), 1)), text)


def _fragment(rng: random.Random, m: _Material) -> str:
    example = rng.choice(m.examples)
    cut = sorted(rng.randrange(len(example) + 1) for _ in range(2))
    return example[cut[0] : cut[1]] if rng.random() < 0.5 else example[: cut[1]]


# --- Text a pattern nearly matches --------------------------------------------------------------------------


def _parser():
    return re._parser if hasattr(re, "_parser") else __import__("sre_parse")  # Python 3.10 names it so


_CATEGORY_TEXT = {
    "CATEGORY_DIGIT": "0123456789",
    "CATEGORY_NOT_DIGIT": "ab :x_-",
    "CATEGORY_SPACE": " \t",
    "CATEGORY_NOT_SPACE": "aZ09_:.(",
    "CATEGORY_WORD": "abcXYZ019_",
    "CATEGORY_NOT_WORD": " .:-(/",
}


def _written(rng: random.Random, parsed, long_repeats: bool, room: int = LINE, depth: int = 0) -> str:
    """Text the parsed regex matches (its first `room` characters), its repeats drawn long where `long_repeats`."""
    out: list[str] = []
    size = 0
    for op, arg in parsed:
        if size >= room:
            break
        name = str(op)
        if name == "LITERAL":
            piece = chr(arg)
        elif name == "NOT_LITERAL":
            piece = "x" if chr(arg) != "x" else "y"
        elif name == "ANY":
            piece = rng.choice("a 0:.")
        elif name == "IN":
            piece = _in_class(rng, arg)
        elif name in ("MAX_REPEAT", "MIN_REPEAT"):
            low, high, inner = arg
            high = min(high, 4_000 if long_repeats else 3)  # an unbounded repeat's high is MAXREPEAT
            pieces = []
            for _ in range(rng.randint(low, max(low, high)) if depth < 4 else low):
                pieces.append(_written(rng, inner, long_repeats, room - size, depth + 1))
                size += len(pieces[-1])
                if size >= room:
                    break
            out.extend(pieces)
            continue
        elif name == "SUBPATTERN":
            piece = _written(rng, arg[-1], long_repeats, room - size, depth + 1)
        elif name == "BRANCH":
            piece = _written(rng, rng.choice(arg[1]), long_repeats, room - size, depth + 1)
        elif name == "CATEGORY":
            piece = rng.choice(_CATEGORY_TEXT.get(str(arg), "a"))
        else:
            continue  # AT (anchors, word boundaries) writes nothing
        out.append(piece)
        size += len(piece)
    return "".join(out)[:room]


def _in_class(rng: random.Random, items) -> str:
    negated = any(str(op) == "NEGATE" for op, _ in items)
    if negated:
        excluded = {chr(arg) for op, arg in items if str(op) == "LITERAL"}
        return next(c for c in "xq7 :" if c not in excluded)
    op, arg = rng.choice([item for item in items if str(item[0]) != "NEGATE"])
    name = str(op)
    if name == "LITERAL":
        return chr(arg)
    if name == "RANGE":
        return chr(rng.randint(*arg))
    if name == "CATEGORY":
        return rng.choice(_CATEGORY_TEXT.get(str(arg), "a"))
    return "a"


def _near(rng: random.Random, m: _Material) -> tuple[str, str]:
    """(the pattern, text it nearly matches): written from its regex, then one character near the end changed."""
    pattern = rng.choice(m.patterns)
    try:
        text = _written(rng, _parser().parse(pattern), long_repeats=rng.random() < 0.7)
    except (RecursionError, ValueError, re.error):
        text = pattern
    text = text[:LINE]
    if text and rng.random() < 0.8:
        at = max(0, len(text) - 1 - rng.randrange(min(len(text), 8)))
        text = text[:at] + rng.choice("\x00 #Z9(") + text[at + 1 :]
    return pattern[:60], text


# --- The families ---------------------------------------------------------------------------------------------


def _lines(family: str, rng: random.Random, m: _Material) -> tuple[str, list[str] | bytes]:
    if family == "anchors":
        n = rng.choice((1, 20, 300))
        return f"{n} lines of anchors", [_anchors_line(rng, m, rng.randint(1, 40)) for _ in range(n)]
    if family == "fragments":
        n = rng.choice((5, 20, 60))
        lines = ["".join(_fragment(rng, m) for _ in range(rng.randint(1, 6))) for _ in range(n)]
        if rng.random() < 0.5:
            lines = [_long_digits(rng, line) for line in lines]
        return f"{n} spliced examples", lines
    if family == "near":
        picked = [_near(rng, m) for _ in range(rng.choice((1, 10, 60)))]
        return f"near {picked[0][0]!r} and {len(picked) - 1} more", [text for _, text in picked]
    if family == "repeated":
        anchor = rng.choice(m.anchors)
        tail = rng.choice(("", " zz", _fragment(rng, m)))
        line = (anchor + rng.choice(("", " ", ": "))) * (LINE // (len(anchor) + 1)) + tail
        return f"{anchor!r} repeated", [line] * rng.choice((1, 4, 30))
    if family == "long":
        size = rng.choice((LINE - 1, LINE, LINE + 1, 300_000))
        head, tail = rng.choice(m.examples), rng.choice(m.anchors)
        filler = rng.choice(("a", "x ", "0", "=", rng.choice(m.anchors)))
        line = head + filler * ((size - len(head) - len(tail)) // len(filler) + 1)
        return f"one line of {size} bytes", [line[: size - len(tail)] + tail] * rng.choice((1, 3))
    if family == "traceback":
        return _traceback(rng, m)
    if family == "ranks":
        return _ranks(rng, m)
    if family == "binary":
        return _binary(rng, m)
    if family == "cr":
        lines = [rng.choice(m.examples) if rng.random() < 0.4 else _anchors_line(rng, m, 2) for _ in range(300)]
        ending = rng.choice((b"\r", b"\n\r", b"\r\r\n"))
        return f"records ended by {ending!r}", ending.join(line.encode() for line in lines) + ending
    return _nul(rng, m)


def _nul(rng: random.Random, m: _Material) -> tuple[str, bytes]:
    lines = [rng.choice(m.examples) for _ in range(rng.choice((3, 50)))]
    lines = [line[: len(line) // 2] + "\x00" * rng.choice((1, 7)) + line[len(line) // 2 :] for line in lines]
    data = "\n".join(lines).encode()
    if rng.random() < 0.5:
        data += b"\x00" * rng.choice((4096, 1 << 20)) + b"\n" + rng.choice(m.examples).encode()
    head, shown = _text_head(rng)
    return f"NUL bytes in lines and after them{shown}", head + data


def _traceback(rng: random.Random, m: _Material) -> tuple[str, list[str]]:
    frames = rng.choice((10, 500, 3_000))
    prefix = rng.choice(("", "[rank{r}]:", "[default{r}]:[rank{r}]:"))
    ranks = rng.choice((1, 64))
    lines = []
    for i in range(frames):
        p = prefix.format(r=i % ranks)
        if i % 500 == 0 or rng.random() < 0.01:
            lines.append(p + "Traceback (most recent call last):")
        lines.append(p + f'  File "/w/{"x" * (i % 50)}.py", line {i}, in f{i}')
        if rng.random() < 0.2:
            lines.append(p + "    " + rng.choice(m.examples))
    return f"{frames} frames, never closed", lines


def _ranks(rng: random.Random, m: _Material) -> tuple[str, list[str]]:
    shape = rng.choice(("many", "nested", "huge"))
    if shape == "many":
        n = rng.choice((200, 3_000))
        return f"{n} ranks", [f"[rank{rng.randrange(10**6)}]:" + rng.choice(m.examples) for _ in range(n)]
    if shape == "nested":
        depth = rng.choice((10, 300))
        return f"prefixes {depth} deep", ["".join(f"[rank{i}]:" for i in range(depth)) + rng.choice(m.examples)] * 50
    digits = rng.choice((7, 100, 5_000))
    return f"rank numbers of {digits} digits", [f"[rank{'9' * digits}]:" + rng.choice(m.examples)] * 20


def _binary(rng: random.Random, m: _Material) -> tuple[str, bytes]:
    parts = []
    for _ in range(rng.choice((10, 200))):
        parts.append(rng.randbytes(rng.randrange(300)))
        parts.append(rng.choice(m.anchors + m.examples).encode())
        parts.append(rng.choice((b"\xff\xfe", b"\xed\xa0\x80", b"\x1b[", b"\x1b]0;", b"\x1bP", b"\xc2\x9b", b"\n")))
    head, shown = _text_head(rng)
    return f"random bytes around anchors{shown}", head + b"".join(parts)


def _text_head(rng: random.Random) -> tuple[bytes, str]:
    """Mostly a text head longer than the part of a file its kind is told by (a NUL there says binary data):
    the bytes after it reach the log reader."""
    if rng.random() < 0.2:
        return b"", ""
    return b"".join(b"[rank0]:step %d loss 2.%03d\n" % (i, i % 1000) for i in range(600)), ", after a text head"


def make(seed: int) -> Case:
    rng = random.Random(seed)
    family = FAMILIES[seed % len(FAMILIES)] if seed < 1000 else rng.choice(FAMILIES)
    detail, lines = _lines(family, rng, material())
    data = lines if isinstance(lines, bytes) else ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    return Case(seed, family, detail, data)


# --- Reading a case, its work metered -------------------------------------------------------------------------


@dataclass
class Work:
    lines: int = 0  # texts the reader handed the matcher
    characters: int = 0  # their characters in all
    worst: float = 0.0  # the largest share of its bound a line's matching used
    worst_line: str = ""
    over: list[str] = field(default_factory=list)


class MeteredMatcher(Matcher):
    """The knowledge base's matcher, each line's work (the characters its regex searches read, counted by the
    matcher) held to the line's bound: its length times one pass per candidate rule (its set), per pattern
    and per `unless` pattern, plus one for the anchors. The candidates are the rules whose anchors or phrases
    the line holds, however often: a line that repeats one anchor a thousand times costs what it costs once,
    per character."""

    def __init__(self) -> None:
        super().__init__(default_rules())
        self.work = Work()
        self._costs = [
            ((*rule.anchors, *self.phrases[rule.id]), 1 + len(rule.patterns) + len(rule.unless)) for rule in self.rules
        ]

    def bound(self, text: str) -> int:
        passes = 1 + sum(cost for anchors, cost in self._costs if any(anchor in text for anchor in anchors))
        return passes * len(text)

    def match(self, text: str):
        before = self.counter.characters
        found = super().match(text)
        spent, bound = self.counter.characters - before, self.bound(text)
        work = self.work
        work.lines += 1
        work.characters += len(text)
        if spent and spent / max(bound, 1) > work.worst:
            work.worst, work.worst_line = spent / max(bound, 1), text[:80]
        if spent > bound:
            work.over.append(f"a line of {len(text)} characters cost {spent} (bound {bound}): {text[:80]!r}")
        return found


_MATCHER: MeteredMatcher | None = None


def metered_matcher() -> MeteredMatcher:
    global _MATCHER
    if _MATCHER is None:
        _MATCHER = MeteredMatcher()
    _MATCHER.work = Work()
    return _MATCHER


def read_seed(seed: int) -> tuple[Case, bool, str, Work]:
    """The seed's case, read in a folder of its own: (case, right, what happened, the work)."""
    case = make(seed)
    with tempfile.TemporaryDirectory() as folder:
        return (case, *outcome(case, Path(folder)))


def outcome(case: Case, folder: Path) -> tuple[bool, str, Work]:
    """(right, what happened, the work) for one case read by the real reader and rendered."""
    from torchtriage.analysis.fusion import verdict_of
    from torchtriage.analysis.pipeline import assess_paths
    from torchtriage.errors import TriageError
    from torchtriage.report.json_report import render_json
    from torchtriage.report.text import render_text

    path = folder / f"case{case.seed}.log"
    path.write_bytes(case.data)
    matcher = metered_matcher()
    try:
        verdict = verdict_of(assess_paths([str(path)], matcher), rules=matcher.rules_by_id)
        render_text(verdict, stream=io.StringIO())
        render_json(verdict)
        said = f"{verdict.category}: {verdict.summary[:100]}"
    except TriageError as err:  # a refusal that says what is wrong
        said = f"refused: {err}"[:300]
    except Exception as err:  # noqa: BLE001 - anything else is what the generator looks for
        return False, f"{type(err).__name__}: {err}"[:300], matcher.work
    finally:
        path.unlink()
    work = matcher.work
    # Each text the matcher saw is a message of the file, decoded (a byte at most one character), stripped,
    # rejoined with a space for a newline, cut; NCCL's untagged header gains its 5-character tag.
    if work.characters > len(case.data) + 5 * work.lines:
        return False, f"the matcher read {work.characters} characters of a {len(case.data)}-byte file", work
    if work.over:
        return False, work.over[0], work
    return True, said, work


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "hostile_logs", help="where to write")
    parser.add_argument("--write-only", action="store_true", help="write the cases, do not read them")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for seed in range(args.seed, args.seed + args.count):
        case = make(seed)
        (args.out / f"{seed}_{case.family}.log").write_bytes(case.data)
        if args.write_only:
            continue
        right, said, _ = outcome(case, args.out)
        if not right:
            failed += 1
            print(f"{seed}  # {case.family} {case.detail}: {said}", flush=True)
    if not args.write_only:
        print(f"{args.count - failed} of {args.count} right")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
