"""Hostile JSON from the grammar of tests/hostile_json.py, read by the real readers (profiler traces, py-spy
JSON dumps, NVML dumps, JSON flight-recorder dumps, layout configs): every case ends in records or the reader's
own error that says what is wrong, never another exception, within the time bound.

TORCHTRIAGE_HOSTILE_JSON_CASES seeds (default 2000, under a minute); the long run:
`python tests/hostile_json.py --count 100000`.
"""

from __future__ import annotations

import os

import pytest

from hostile_json import FAMILIES, SOURCES, make, outcome

CASES = int(os.environ.get("TORCHTRIAGE_HOSTILE_JSON_CASES", "2000"))


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[tuple]:
    folder = tmp_path_factory.mktemp("hostile_json")
    return [(case, *outcome(case, folder)) for case in map(make, range(CASES))]


def test_every_generated_case_is_read_or_refused_with_a_message(results):
    wrong = [f"{c.seed}  # {c.target} {c.family} {c.detail}: {said}" for c, right, said in results if not right]
    assert not wrong, "\n".join(wrong)


def test_the_sample_covers_every_family_on_every_reader(results):
    assert {(c.target, c.family) for c, _, _ in results} == {(t, f) for t in SOURCES for f in FAMILIES}


def test_values_no_parser_should_take_are_refused_where_they_are_read(results):
    """Strict JSON: NaN and Infinity are not JSON; the NVML reader (on `fields.strict_json`) refuses them
    anywhere; the others take them only in fields they never read (the property above checks the rest)."""
    for case, _, said in results:
        strict = case.target == "nvml"
        if strict and case.family == "numbers" and case.detail.split()[0] in ("NaN", "Infinity", "-Infinity"):
            assert said.startswith("refused"), f"{case.seed} {case.target} {case.detail}: {said}"
