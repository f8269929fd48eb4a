"""What a log line costs by what it holds: ordinary lines, lines that hold a rule's anchor but match no rule,
and lines that match a rule; this tree's `triage` against another commit's.

Usage: python benchmarks/matcher_cost.py [--base REF] [--base-src DIR] [--size-mb 8] [--runs 3]

Writes one log of each kind (`--size-mb` each, behind torchrun's rank prefix): ordinary step lines, which the
prefilter skips; lines that hold an anchor of a rule (each anchor of the knowledge base in turn) in text that
is not the rule's message, so that every one reaches the matcher and matches nothing (a few hold a marker the
reader follows, "Error" or torchrun's report fields, and are read in full); those of them the gate turns away
("turned away": what an anchor in chatter costs, to compare with an ordinary line); and the rules' own
example lines, every one a match. Checks REF (default: the commit before the matcher's sets) out into a
temporary worktree (or takes its src folder from `--base-src`), then runs `python -m torchtriage triage LOG
--json` from each tree in turn (A B A B ...) and prints, per log, each tree's median MB/s over the whole
process and after its start-up (the median time of an empty log, subtracted), and the ratio of the whole
times this/REF with its min and max over the pairs.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from base_tree import base_src  # benchmarks/base_tree.py: run as scripts, this folder is on sys.path

from torchtriage.analysis.pipeline import matcher_for
from torchtriage.sources.lines import normalise

ROOT = Path(__file__).resolve().parents[1]


def _ordinary() -> Iterable[str]:
    for i in itertools.count():
        yield f"[titan] step {i:>6}  loss: 2.{i % 1000:03d}  grad_norm: 1.{i % 10000:04d}  tps: 31,{i % 1000:03d}"


def _anchors_matching_nothing() -> list[str]:
    """For each anchor, a line that holds it and matches no rule (anchors that are a message alone are left out)."""
    matcher = matcher_for()
    lines = [f"[titan] the text {anchor} zz 12" for rule in matcher.rules for anchor in rule.anchors]
    return [line for line in lines if not matcher.match(normalise(line).text)]


def _turned_away() -> list[str]:
    """Of those lines, the ones the gate turns away: no marker the reader follows in them either."""
    matcher = matcher_for()
    return [line for line in _anchors_matching_nothing() if not matcher.could_match(line.encode())]


def _matching() -> list[str]:
    matcher = matcher_for()
    examples = [example for rule in matcher.rules for example in rule.examples if "\n" not in example]
    return [example for example in examples if matcher.match(normalise(example).text)]


def _write(path: Path, size: int, lines: Iterable[str]) -> None:
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        for i, line in enumerate(lines):
            text = f"[rank{i % 8}]:{line}\n"
            out.write(text)
            written += len(text.encode())
            if written >= size:
                break


def _logs(where: Path, size: int) -> dict[str, Path]:
    kinds = {
        "start-up": (),
        "ordinary": _ordinary(),
        "anchor, no match": itertools.cycle(_anchors_matching_nothing()),
        "turned away": itertools.cycle(_turned_away()),
        "matching": itertools.cycle(_matching()),
    }
    paths = {}
    for index, (name, lines) in enumerate(kinds.items()):
        paths[name] = where / f"kind{index}.log"
        _write(paths[name], size, lines)
    return paths


def _timed(src: Path, log: Path) -> float:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(src), os.environ.get("PYTHONPATH"))))}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torchtriage", "triage", str(log), "--json"], env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)  # fmt: skip
    return time.perf_counter() - start


def _rates(megabytes: float, seconds: float, start_up: float) -> str:
    return f"{megabytes / seconds:6.1f} MB/s ({megabytes / max(seconds - start_up, 1e-3):6.1f} after start-up)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="3ac590f")  # the commit before the matcher's sets
    parser.add_argument("--size-mb", type=float, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--base-src", type=Path, help="REF's src folder, already checked out (no worktree is made)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, base_src(args.base, Path(tmp), args.base_src) as base:
        trees = {"this": ROOT / "src", args.base: base}
        start_up = {}
        for name, log in _logs(Path(tmp), int(args.size_mb * (1 << 20))).items():
            megabytes = log.stat().st_size / (1 << 20)
            [_timed(src, log) for src in trees.values()]  # warm the caches
            pairs = [tuple(_timed(src, log) for src in trees.values()) for _ in range(args.runs)]
            medians = [statistics.median(times) for times in zip(*pairs, strict=True)]
            ratios = [this / other for this, other in pairs]
            if not megabytes:
                start_up = dict(zip(trees, medians, strict=True))
                print(f"{name:>16}: " + ", ".join(f"{tree} {t:.3f} s" for tree, t in start_up.items()))
                continue
            rates = ", ".join(
                f"{tree} {_rates(megabytes, t, start_up[tree])}" for tree, t in zip(trees, medians, strict=True)
            )
            print(f"{name:>16}: {rates}; time ratio {statistics.median(ratios):.2f} "
                  f"(min {min(ratios):.2f}, max {max(ratios):.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
