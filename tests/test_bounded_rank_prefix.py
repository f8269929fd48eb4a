"""A launcher's rank prefix gives all its digits or no rank: `[rank9999999]:` is never role `rank999` and rank
9999, and a rank past the policy's `rank` limit is no rank, so no census lists a million ranks that never
printed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torchtriage.sources.limits import Limits, using
from torchtriage.sources.lines import normalise

LARGEST = Limits().rank  # 1,048,575


@pytest.mark.parametrize(
    "raw",
    [
        "[rank9999999]: step 3",
        "[default12345678]: step 3",
        "[worker99999999]: step 3",
        f"[rank{LARGEST + 1}]: step 3",
        f"[Rank {LARGEST + 1}] step 3",
        f"[1,{LARGEST + 1}]<stderr>: step 3",
        f"{LARGEST + 1}: step 3",
        "[rank" + "9" * 5_000 + "]: step 3",
    ],
)
def test_a_number_past_the_largest_rank_is_no_rank_and_no_digit_is_split_off(raw):
    line = normalise(raw)
    assert line.rank is None
    assert line.text == raw  # not a rank prefix: the line is left as it was printed


@pytest.mark.parametrize(
    "raw, rank",
    [
        (f"[rank{LARGEST}]: step 3", LARGEST),
        ("[default3]:[rank35]: step 3", 35),
        ("[gpu0worker3]: step 3", 3),
        ("[trainer-7]: step 3", 7),
        ("[1,1000000]<stdout>: step 3", 1_000_000),
        ("1000000: step 3", 1_000_000),
    ],
)
def test_ranks_up_to_the_largest_are_read_whole(raw, rank):
    line = normalise(raw)
    assert (line.rank, line.text) == (rank, "step 3")


def test_a_raised_rank_limit_reads_larger_ranks():
    with using(Limits(rank=4_194_303)):
        assert normalise("[rank2000000]: step 3").rank == 2_000_000
    assert normalise("[rank2000000]: step 3").rank is None


PEER_LOST = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.4]:4723"
)


def test_a_bogus_prefix_does_not_make_a_million_silent_ranks(tmp_path):
    """Ranks 0 and 2 lose their peer; a third line claims rank 9999999. The one silent rank is 1."""
    log = tmp_path / "job.log"
    log.write_text(f"[rank0]:{PEER_LOST}\n[rank2]:{PEER_LOST}\n[rank9999999]:{PEER_LOST}\n")
    done = subprocess.run(
        [sys.executable, "-m", "torchtriage", "triage", "--json", str(log)], capture_output=True, text=True
    )
    verdict = json.loads(done.stdout)
    assert verdict["culprit_ranks"] == [1], verdict["summary"]
    assert verdict["facts"]["silent_ranks"] == [1]
    assert verdict["facts"]["ranks_seen"] == [0, 2]


def test_logs_of_a_few_ranks_of_a_huge_job_name_no_million_candidates(tmp_path):
    """Ranks 0 and 1048575 (within the rank limit) lose their peer: the logs are a sample of a large job, not its
    census. A million silent ranks are counted, not listed as candidates, and the verdict is not sure."""
    log = tmp_path / "job.log"
    log.write_text(f"[rank0]:{PEER_LOST}\n[rank1048575]:{PEER_LOST}\n")
    done = subprocess.run(
        [sys.executable, "-m", "torchtriage", "triage", "--json", str(log)], capture_output=True, text=True
    )
    verdict = json.loads(done.stdout)
    assert verdict["culprit_ranks"] == []
    assert "silent_ranks" not in verdict["facts"]
    assert verdict["facts"]["silent_ranks_count"] == 1048574
    assert verdict["confidence"] != "high"
    assert len(done.stdout) < 100_000  # no list of a million ranks anywhere in the JSON
