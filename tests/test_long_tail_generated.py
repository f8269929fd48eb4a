"""Triage on the long tail's logs, generated from the libraries' real format strings (tests/long_tail_logs.py):
a library's error followed by the generic CUDA error it causes, non-finite values no message names, kills other
launchers report, NCCL's connection lines where a log ends, rendezvous beyond TCPStore, tracebacks known by their
frames. Each log is also read cut at its start, hard-wrapped, under a launcher's prefixes, interleaved with another
rank's output, under pdsh's host prefix, with the generic CUDA cascade after a library's own error, and in colour.

What a user relies on: the verdict names the failure's category (or one of the answers the case accepts); a
wrong verdict never says confidence high; and none of those transforms, which change how a log was captured and
not what failed, turns a right verdict wrong; a rank the verdict names is the failure's, or a peer its lines name;
under pdsh's prefix the verdict names the host that printed the lines and no other.

TORCHTRIAGE_LONG_TAIL_CASES seeds (default 300, seconds on one core), then every seed in
long_tail_regressions.txt. The long run: `python tests/long_tail_logs.py --count 5000`.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from long_tail_logs import CLASSES, TRANSFORMS, Outcome, apply, make, outcome, regression_seeds
from torchtriage.analysis.pipeline import triage_text

CASES = int(os.environ.get("TORCHTRIAGE_LONG_TAIL_CASES", "300"))
REGRESSIONS = regression_seeds(Path(__file__).parent / "long_tail_regressions.txt")
# Values no message names are read from the tail the scan keeps; where a log was hard-wrapped, the tail is rejoined
# as the scan rejoins a message, or a tensor or a loss-scale series cut by the wrap would no longer be read.
_TAIL_VALUES = ("tensor at stop", "dllogger loss scale halving", "megatron loss scale halving")


@pytest.fixture(scope="module")
def results() -> list[Outcome]:
    return [outcome(make(seed)) for seed in sorted(set(range(CASES)) | set(REGRESSIONS))]


def test_the_sample_covers_every_class_and_every_transform(results):
    assert {r.case.family for r in results} == set(CLASSES)
    applied = {name for r in results for variant in r.verdicts for name in variant.split("+")}
    assert applied == {"base", *TRANSFORMS}


def test_every_log_as_written_gets_its_category(results):
    wrong = [r.describe("base") for r in results if not r.right("base")]
    assert not wrong, "\n".join(wrong)


def test_no_verdict_is_wrong_with_high_confidence(results):
    wrong = [r.describe(variant) for r in results for variant in r.wrong_at_high()]
    assert not wrong, "\n".join(wrong)


def test_a_rank_the_verdict_names_is_the_failures_or_a_peer_its_lines_name(results):
    # The failure is one rank's (its printer's); DeepEP's waits name the peers they waited for. Under torchrun's
    # "[defaultN]:" prefix a rank is said as a local rank (facts.local_ranks) unless something places its node.
    another = [
        f"{r.describe(v)}: names {sorted(r.ranks[v][0])}, local {sorted(r.ranks[v][1])} (printer {r.case.rank})"
        for r in results
        for v in r.verdicts
        if r.names_another_rank(v)
    ]
    assert not another, "\n".join(another)


def test_no_transform_turns_a_right_verdict_wrong(results):
    turned = [r.describe(variant) for r in results for variant in r.turned_wrong()]
    assert not turned, "\n".join(turned)


def test_a_host_the_verdict_names_is_the_one_that_printed_the_lines(results):
    # Under pdsh's prefix (every line behind "<host>: "), the verdict places the failure on that host: its culprit's
    # machine, or the host that printed the failure's line where no rank is named. Never on another host.
    pdsh = [(r, variant) for r in results for variant in r.verdicts if "pdsh" in variant.split("+")]
    elsewhere = [f"{r.describe(v)} names {sorted(r.hosts[v])}" for r, v in pdsh if r.hosts[v] - {r.case.process[0]}]
    assert not elsewhere, "\n".join(elsewhere)
    placed = [1 for r, v in pdsh if r.hosts[v] == {r.case.process[0]}]
    assert len(placed) >= len(pdsh) / 2, f"{len(placed)} of {len(pdsh)} variants under pdsh name their host"


def test_a_line_that_starts_as_a_cut_record_did_is_a_record_of_its_own():
    # Seed 528: c10's watchdog timeout and the CUDA error after it, each line behind pdsh's host, hard-wrapped. The
    # line after a piece cut at the width started like the record's first line ("node-07: [E0520 ..."), not like
    # the piece, and was read as its rest: the timeout and the error one message, a GPU fault at high. 40 draws of
    # the wrap's width and the cascade's values; 9 were wrong before.
    case = make(528)
    for draw in range(40):
        verdict = triage_text(apply(case, ("cascade", "pdsh", "wrap"), random.Random(draw)))
        assert str(verdict.category) in case.accept, f"draw {draw}: {verdict.category} ({verdict.confidence})"


def test_values_read_from_the_tail_survive_a_hard_wrap(results):
    wrapped = [
        (r, variant)
        for r in results
        for variant in r.verdicts
        if r.case.shape in _TAIL_VALUES and "wrap" in variant.split("+")
    ]
    assert wrapped, "the sample holds no wrapped log of values read from the tail"
    wrong = [r.describe(variant) for r, variant in wrapped if not r.right(variant)]
    assert not wrong, "\n".join(wrong)
