"""Hang verdicts on generated programs, at length: the confusion per family and backend, and how often each
confidence level is right.

Usage: python benchmarks/sim_hangs.py [--cases 10000] [--start 0] [--jobs N] [--markdown] [--kinds K,K]

Each seed is one case of tests/sim (a random mesh and step program, one rank departing, gloo's or NCCL's
semantics played until the job deadlocks, the artifacts a real job leaves), diagnosed as a user's folder by
`torchtriage diagnose`'s own code path. CI runs the first 1000 (tests/test_sim_hangs.py); this runs as many as
asked, on every core. With --kinds, every case departs in one of those kinds, among them the kinds drawn only on
request (`wrong_root`, `wrong_peer`: tests/sim/departures.py), seeds whose program offers none skipped. Outcomes:

    right       the culprit named alone
    candidates  no culprit, candidates that hold it (what an undecidable case should get)
    imprecise   the culprit named among other ranks
    wrong       culprits named, none of them the culprit
    miss        neither
    line        of the right verdicts with a line to check, the share whose line is the culprit's departure

"decidable" is the simulator's reading: whether anything the layout writes shows the culprit leaving its
program (its own records, its stack outside any collective, its absence from a known world, its recorder's
states); where nothing does, candidates are the right answer.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from sim.case import scored  # noqa: E402  (tests/sim, put on the path above)

OUTCOMES = ("right", "candidates", "imprecise", "wrong", "miss")


def one(seed: int, kinds: tuple[str, ...] = ()) -> tuple | None:
    found = scored(seed, kinds)
    if found is None:
        return None
    case, result = found
    layout = case.layout.name.split("+native")[0]
    return (seed, case.departure.kind, case.backend, layout, case.truth.decidable, result.outcome,
            result.confidence, result.line)  # fmt: skip


def run(seeds: list[int], jobs: int, kinds: tuple[str, ...] = ()) -> list[tuple]:
    each = partial(one, kinds=kinds)
    if jobs <= 1:
        return [r for r in map(each, seeds) if r is not None]
    with ProcessPoolExecutor(jobs) as pool:
        return [r for r in pool.map(each, seeds, chunksize=64) if r is not None]


def table(rows: list[tuple], key, title: str, markdown: bool) -> list[str]:
    counts: dict[str, Counter] = defaultdict(Counter)
    for row in rows:
        counts[key(row)][row[5]] += 1
    head = [title, *OUTCOMES, "cases"]
    lines = [_row(head, markdown)]
    if markdown:
        lines.append("|" + "---|" * len(head))
    for name in sorted(counts):
        c = counts[name]
        lines.append(_row([name, *(str(c[o]) for o in OUTCOMES), str(sum(c.values()))], markdown))
    return lines


def calibration(rows: list[tuple], markdown: bool) -> list[str]:
    """Of the verdicts that name a culprit at each confidence level, the share that name the culprit alone."""
    head = ["confidence", "named", "right", "share right", "candidates given"]
    lines = [_row(head, markdown)] + (["|" + "---|" * len(head)] if markdown else [])
    for level in ("high", "medium", "low"):
        at = [r for r in rows if r[6] == level]
        named = [r for r in at if r[5] in ("right", "imprecise", "wrong")]
        right = sum(r[5] == "right" for r in named)
        share = f"{100 * right / len(named):.1f}%" if named else "-"
        given = sum(r[5] in ("candidates", "miss") for r in at)
        lines.append(_row([level, str(len(named)), str(right), share, str(given)], markdown))
    return lines


def _row(cells: list[str], markdown: bool) -> str:
    return "| " + " | ".join(cells) + " |" if markdown else "  ".join(f"{c:>18}" for c in cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--kinds", default="", help="departure kinds, comma-separated (default: every usual kind)")
    args = parser.parse_args()
    kinds = tuple(k for k in args.kinds.split(",") if k)
    started = time.perf_counter()
    rows = run(list(range(args.start, args.start + args.cases)), args.jobs, kinds)
    took = time.perf_counter() - started
    md = args.markdown
    print(f"{len(rows)} hangs of {args.cases} seeds ({args.cases - len(rows)} did not hang), {took:.0f} s\n")
    for line in table(rows, lambda r: f"{r[1]} / {r[2]}", "family / backend", md):
        print(line)
    print()
    for line in table(rows, lambda r: r[3], "layout", md):
        print(line)
    print()
    for line in table(rows, lambda r: "decidable" if r[4] else "undecidable", "truth", md):
        print(line)
    print()
    for line in calibration(rows, md):
        print(line)
    lines = [r for r in rows if r[7] is not None]
    if lines:
        share = sum(bool(r[7]) for r in lines) / len(lines)
        print(f"\nthe culprit's line, where a right verdict has one to check: {100 * share:.1f}% of {len(lines)}")
    bad = [r for r in rows if r[5] in ("wrong", "imprecise") and r[6] in ("high", "medium")]
    if bad:
        print("\nnamed wrongly at high or medium confidence (seed, family, backend, layout, outcome, confidence):")
        for r in bad[:40]:
            print(f"  {r[0]} {r[1]} {r[2]} {r[3]} {r[5]} {r[6]}")


if __name__ == "__main__":
    main()
