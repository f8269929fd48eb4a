"""A rank of an armed run that left no stack: named from the identity record it wrote as it started.

`torchtriage run` has each rank record itself as it starts (`DIR/identity/rank<N>.json`), and its hang watchdog
asks every living rank for its stack (`DIR/hang/rankNN.txt`). A rank with a record and no stack died or exited,
or hangs where its watchdog cannot run: named at medium at most, since a watchdog that could not run leaves no
stack either. Written by the simulator (tests/sim): seed 147 is eight gloo ranks under `run`, rank 7 exited.
"""

import shutil

import pytest

from sim.case import make
from torchtriage.analysis.postmortem import analyse_run, gather


@pytest.fixture(scope="module")
def case():
    found = make(147)
    assert found.layout.stacks == "watchdog" and found.backend == "gloo" and found.departure.kind == "exit"
    assert found.truth.culprit == 7
    return found


def _verdict(*paths) -> dict:
    return analyse_run(gather([str(p) for p in paths])).verdict.to_json()


def test_the_rank_with_a_record_and_no_stack_is_named_with_its_pid(case, tmp_path):
    case.write(tmp_path)
    verdict = _verdict(tmp_path)
    assert (verdict["culprit_ranks"], verdict["confidence"]) == ([7], "medium"), verdict["summary"]
    assert "rank 7 left no stack" in verdict["summary"] and "pid 4107" in verdict["summary"]


def test_its_missing_dump_is_the_same_absence_not_a_second_witness(tmp_path):
    """NCCL's dumps list every group's ranks, so they name the rank that left none too; but `run`'s watchdog
    writes both the stack and the dump: one absence, medium (seed 13: eight NCCL ranks, rank 7 exited)."""
    found = make(13)
    assert found.layout.stacks == "watchdog" and found.backend == "nccl" and found.departure.kind == "exit"
    found.write(tmp_path)
    verdict = _verdict(tmp_path)
    assert (verdict["culprit_ranks"], verdict["confidence"]) == ([found.truth.culprit], "medium"), verdict["summary"]


def test_a_record_from_another_run_folder_names_no_one(case, tmp_path):
    """Records read from elsewhere than beside the stacks' folder (another node's run folder, whose stacks are
    not here) say nothing of a missing stack."""
    case.write(tmp_path / "run")
    shutil.move(tmp_path / "run" / "identity", tmp_path / "other")
    verdict = _verdict(tmp_path / "run", tmp_path / "other")
    assert 7 not in verdict["culprit_ranks"] and "left no stack" not in verdict["summary"]


def test_a_watchdog_the_program_started_keeps_the_records_in_its_own_dot_folder(case, tmp_path):
    """Without `run`, HangWatchdog(out_dir=...) writes the stacks into out_dir and the records into out_dir/.run."""
    case.write(tmp_path / "run")
    out = tmp_path / "hang"
    shutil.move(tmp_path / "run" / "hang", out)
    shutil.move(tmp_path / "run" / "identity", out / ".run" / "identity")
    verdict = _verdict(out, out / ".run" / "identity")
    assert (verdict["culprit_ranks"], verdict["confidence"]) == ([7], "medium"), verdict["summary"]
