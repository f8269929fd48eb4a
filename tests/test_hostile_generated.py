"""Hostile pickles from the grammar of tests/hostile_pickles.py, read by the real readers in their bounded
children: every case ends in records or one clear refusal from the pre-scan or the readers' checks, never
in the child's last defence (a signal, its memory or its time), and this process lives.

TORCHTRIAGE_HOSTILE_CASES seeds (default 500, on every core: tests/parallel.py), then every seed in
hostile_regressions.txt. The long run: `python tests/hostile_pickles.py --count 100000`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hostile_pickles import FAMILIES, read_seed
from parallel import map_seeds

CASES = int(os.environ.get("TORCHTRIAGE_HOSTILE_CASES", "500"))
REGRESSIONS = [
    int(line.split("#")[0])
    for line in (Path(__file__).parent / "hostile_regressions.txt").read_text().splitlines()
    if line.split("#")[0].strip()
]


@pytest.fixture(scope="module")
def results() -> list[tuple]:
    return map_seeds(read_seed, list(range(CASES)) + REGRESSIONS)


def test_every_generated_case_is_read_or_refused_by_a_check(results):
    wrong = [f"{c.seed}  # {c.target} {c.family} {c.detail}: {said}" for c, right, said in results if not right]
    assert not wrong, "\n".join(wrong)


def test_the_sample_covers_every_family_on_both_readers(results):
    seen = {(c.target, c.family) for c, _, _ in results}
    assert seen == {(target, family) for target in ("fr", "snapshot") for family in FAMILIES}


HASHABLE = ("tuple", "frozenset", "key", "set_additems", "wrapped")  # built of what a hash walks


def test_the_attacks_are_refused_not_read(results):
    """Nesting and shared references past the bounds are refused, never read: anywhere in a dump (the pre-scan
    sees the whole file); in a streamed snapshot where they are hashable (the reader bounds each tuple as it
    makes it; nested lists in a field it does not read cost nothing)."""
    for case, _, said in results:
        if case.family in ("deep", "laughs") and (case.target == "fr" or case.detail.startswith(HASHABLE)):
            assert "deep" in said or "expands" in said, f"{case.seed} {case.target} {case.detail}: {said}"
        if case.family == "cycle" and case.target == "fr":
            assert "holds itself" in said, f"{case.seed} {case.detail}: {said}"
