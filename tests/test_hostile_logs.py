"""Hostile logs from the generator of tests/hostile_logs.py, read in this process by the real reader: every
case ends in a verdict or a refusal that says what is wrong, never another exception, and its work stays
within bounds that are counts (the characters the matcher's regex searches read, the text the reader hands
the matcher), so a path that turns quadratic fails here whatever the machine's speed.

TORCHTRIAGE_HOSTILE_LOG_CASES seeds (default 100, about 10 s), then every seed in
hostile_log_regressions.txt. The long run: `python tests/hostile_logs.py --count 5000`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hostile_logs import FAMILIES, metered_matcher, read_seed
from parallel import map_seeds
from torchtriage.sources.lines import normalise

CASES = int(os.environ.get("TORCHTRIAGE_HOSTILE_LOG_CASES", "100"))
REGRESSIONS = [
    int(line.split("#")[0])
    for line in (Path(__file__).parent / "hostile_log_regressions.txt").read_text().splitlines()
    if line.split("#")[0].strip()
]


@pytest.fixture(scope="module")
def results() -> list[tuple]:
    return map_seeds(read_seed, [*range(CASES), *REGRESSIONS])


def test_every_generated_log_ends_in_a_verdict_or_a_refusal_within_its_work_bounds(results):
    wrong = [f"{c.seed}  # {c.family} {c.detail}: {said}" for c, right, said, _ in results if not right]
    assert not wrong, "\n".join(wrong)


def test_the_sample_covers_every_family_and_reaches_the_matcher(results):
    assert {case.family for case, *_ in results} == set(FAMILIES)
    matched = {case.family for case, _, _, work in results if work.lines}
    assert matched == set(FAMILIES), "every family must put lines before the matcher"


def test_a_line_that_repeats_an_anchor_costs_the_searches_of_one():
    """The issue's case: a line that holds an anchor and matches nothing. Held 200 times in one line,
    its anchor brings the same candidates, whose patterns are searched as often as in a line of the same length
    that holds it once: once, not once a copy."""
    matcher = metered_matcher()
    checked = 0
    for anchor in sorted(matcher._rules_by_anchor):
        many = normalise("info 3: " + f"{anchor} zz 12 " * 200).text
        once = normalise(f"info 3: {anchor} zz 12 ").text
        once += "q" * (len(many) - len(once))
        if matcher.match(once) or matcher.match(many):
            continue  # the anchor alone is a message
        searches = []
        for text in (once, many):
            before = matcher.counter.searches
            matcher.match(text)
            searches.append(matcher.counter.searches - before)
        assert searches[0] == searches[1], (anchor, searches)
        checked += 1
    assert checked > 300
