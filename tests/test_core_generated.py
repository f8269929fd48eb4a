"""Triage on logs of the core categories, generated from the programs' real format strings (tests/core_logs.py):
CUDA out of memory in each torch release's wording, NCCL, cuBLAS and XLA running out, the kernel's OOM killer,
Slurm's and Kubernetes' OOM reports, Xid faults, device-side asserts, NaN checks and loss scalers that run out,
watchdog timeouts, NCCL's IB and socket errors, TCPStore and its barriers, set-up errors, program bugs, hangs and
DeepEP's kernel timeouts, each inside one made-up job's output (its ranks, its launcher's prefixes and report, its
peers' collateral timeouts and transport errors).

What a user relies on: the verdict names the failure's category (or one of the answers the case accepts), and names
no rank the case's truth does not (where the writer's lines put the failure on one rank: `Case.culprits`); a wrong
verdict, of the category or of the rank, never says confidence high, nor medium. Where triage does not yet read a
shape (core_logs.KNOWN_GAPS: cuDNN's "Unable to find a valid cuDNN algorithm"), the verdict may be `unknown`, never
another category.

TORCHTRIAGE_CORE_CASES seeds (default 300, a few seconds on one core), then every seed in core_regressions.txt.
The long run: `python tests/core_logs.py --count 5000`.
"""

from __future__ import annotations

import os

import pytest

from core_logs import CATEGORIES, KNOWN_GAPS, REGRESSIONS, WRITERS, Outcome, make, outcome
from long_tail_logs import regression_seeds

CASES = int(os.environ.get("TORCHTRIAGE_CORE_CASES", "300"))


@pytest.fixture(scope="module")
def results() -> list[Outcome]:
    return [outcome(make(seed)) for seed in sorted(set(range(CASES)) | set(regression_seeds(REGRESSIONS)))]


def test_the_sample_covers_every_writer_and_category(results):
    assert len({r.case.seed % len(WRITERS) for r in results}) == len(WRITERS)
    assert {r.case.category for r in results} >= set(CATEGORIES) - {"mixed"}


def test_no_verdict_is_wrong_with_high_confidence(results):
    wrong = [r.describe() for r in results if r.wrong_at == "high"]
    assert not wrong, "\n".join(wrong)


def test_no_verdict_is_wrong_with_medium_confidence(results):
    wrong = [r.describe() for r in results if r.wrong_at == "medium"]
    assert not wrong, "\n".join(wrong)


def test_every_log_gets_its_category(results):
    wrong = [r.describe() for r in results if not r.tolerated]
    assert not wrong, "\n".join(wrong)


def test_the_known_gaps_are_in_the_sample(results):
    """A gap no case reaches would tolerate `unknown` unseen: each shape KNOWN_GAPS names is drawn."""
    assert set(KNOWN_GAPS) <= {r.case.shape for r in results}
