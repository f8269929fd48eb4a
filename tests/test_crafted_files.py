"""Hostile files built by construction (tests/crafted_files.py), read by the real commands: every command ends within
its time bound under a memory bound, with one of its documented exit codes, no traceback and no internal error,
nothing from the files reaching the terminal raw, and nothing from outside the folder given shown.

Every input that ever broke a reader is kept, built exactly, in crafted_files.REGRESSIONS and listed in
crafted_regressions.txt (with what went wrong); beside them run a few drawn cases of each family
(TORCHTRIAGE_CRAFTED_CASES per family, default 1). The long run: `python tests/crafted_files.py --count 300`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crafted_files import FAMILIES, REGRESSIONS, make, outcome, regression

LISTED = Path(__file__).parent / "crafted_regressions.txt"
PER_FAMILY = int(os.environ.get("TORCHTRIAGE_CRAFTED_CASES", "1"))
TIME_BOUND_S = 60


def listed() -> dict[str, str]:
    """name -> what went wrong, of every regression the file lists."""
    found = {}
    for line in LISTED.read_text().splitlines():
        name, _, said = line.partition("#")
        if name.strip():
            found[name.strip()] = said.strip()
    return found


def _param(name: str, said: str):
    if said.startswith("open:"):  # not fixed yet: expected to fail, and to be noticed once it passes
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=said), id=name)
    return pytest.param(name, id=name)


@pytest.mark.parametrize("name", [_param(name, said) for name, said in listed().items()])
def test_an_input_that_once_broke_a_reader_ends_in_a_documented_exit(name, tmp_path):
    failures = outcome(regression(name), tmp_path, bound=TIME_BOUND_S)
    assert not failures, "\n".join(failures)


DRAWN = [(1000 + n, family) for family in FAMILIES for n in range(PER_FAMILY)]


@pytest.mark.parametrize("seed, family", DRAWN, ids=[f"{f}-{s}" for s, f in DRAWN])
def test_a_drawn_crafted_input_ends_in_a_documented_exit(seed, family, tmp_path):
    case = make(seed, family)
    failures = outcome(case, tmp_path, bound=TIME_BOUND_S)
    assert not failures, f"{seed} {family}: {case.detail}\n" + "\n".join(failures)


def test_every_regression_is_listed_with_what_went_wrong():
    assert set(listed()) == set(REGRESSIONS)
    assert all(listed().values())


def test_a_seed_builds_the_same_case_every_time():
    """A drawn case that fails must be built again from its seed to be kept."""
    for seed, family in DRAWN[:4]:
        first, again = make(seed, family), make(seed, family)
        assert (first.detail, first.files, first.specials, first.commands) == (
            again.detail,
            again.files,
            again.specials,
            again.commands,
        )
