"""Triage on real recordings: 2xH200 NCCL runs and our own torchrun + gloo jobs.

Each case states what a correct diagnosis must say; the ground truth is in the fixtures' READMEs.
"""

from pathlib import Path

import pytest

from conftest import FIXTURES, H200, triage_json
from torchtriage import exit_codes

LOGS = FIXTURES / "logs"
DEMO_JOB = "src/torchtriage/demo/skip_collective.py"


def test_nccl_watchdog_names_the_rank_with_nothing_in_flight():
    code, verdict = triage_json(H200 / "skip" / "run.log")
    assert code == exit_codes.PROBLEM_FOUND
    assert verdict["category"] == "nccl_timeout"
    assert verdict["culprit_ranks"] == [1]
    assert verdict["confidence"] == "high"
    facts = verdict["facts"]
    assert (facts["seq"], facts["op"], facts["timeout_ms"], facts["pg_name"]) == (
        "4",
        "ALLREDUCE",
        "25000",
        "default_pg",
    )
    assert facts["last_enqueued_by_rank"] == {"0": 4, "1": 3}
    idle = [f for f in verdict["findings"] if f["kind"] == "logs.idle_rank"]
    assert idle and idle[0]["ranks"] == [1]
    actions = " ".join(a["title"] + a["detail"] + str(a["env"]) for a in verdict["actions"])
    assert "TORCH_FR_BUFFER_SIZE" in actions


def test_two_ranks_waiting_in_different_collectives_are_not_guessed_between():
    # Size mismatch: NCCL let rank 0 finish seq 4 and wait in seq 5; rank 1 waits in seq 4. From the
    # counters alone, one side skipped a collective or the other issued an extra one.
    code, verdict = triage_json(H200 / "size" / "run.log")
    assert verdict["category"] == "nccl_timeout"
    assert verdict["culprit_ranks"] == []
    assert verdict["facts"]["last_enqueued_by_rank"] == {"0": 5, "1": 4}
    different = [f for f in verdict["findings"] if f["kind"] == "logs.lagging_rank"]
    assert different and "torchtriage fr" in different[0]["message"]


def test_nccl_op_mismatch_at_the_same_seq_is_reported_and_a_two_rank_tie_is_not_guessed():
    code, verdict = triage_json(H200 / "op" / "run.log")
    assert verdict["category"] == "nccl_timeout"
    mismatch = [f for f in verdict["findings"] if f["kind"] == "logs.op_mismatch"]
    assert mismatch, verdict["findings"]
    assert mismatch[0]["ranks"] == [0, 1]
    assert "ALLGATHER" in mismatch[0]["message"] and "ALLREDUCE" in mismatch[0]["message"]
    # Two ranks, two ops: the logs cannot tell who departed, so no rank is blamed.
    assert verdict["culprit_ranks"] == []
    assert "torchtriage fr" in mismatch[0]["message"]


def test_an_exabyte_allocation_in_a_skipped_checkpoint_is_not_called_an_out_of_memory():
    # NCCL, 2 ranks: rank 1 skips DCP's save; rank 0's gather of the pickled plan sizes pairs with rank 1's next
    # gradient all-reduce, reads its floats as sizes and asks the allocator for more than an exabyte. No GPU
    # ran out: the ranks' collectives went out of step, and the rank that raised it is not the culprit.
    code, verdict = triage_json(LOGS / "nccl_dcp_save_skip" / "run.log")
    assert code == exit_codes.PROBLEM_FOUND
    assert verdict["category"] == "hang" and verdict["culprit_ranks"] == [] and verdict["confidence"] == "low"
    assert verdict["findings"][0]["kind"] == "oom.impossible_size"
    assert not [f for f in verdict["findings"] if f["category"] == "oom"]
    assert verdict["actions"][0]["title"] == "Find the rank that was in another collective"
    assert verdict["facts"]["reporting_rank_frame"]["function"] == "dcp_save_skip"


def test_cuda_oom_with_memory_facts():
    code, verdict = triage_json(H200 / "oom.log")
    assert (code, verdict["category"]) == (exit_codes.PROBLEM_FOUND, "oom")
    memory = verdict["facts"]["memory_bytes"]
    assert memory["alloc"] == 16 << 30
    assert memory["allocated"] == 128 << 30
    assert memory["reserved_unallocated"] == 0
    # 0 bytes reserved-but-unallocated: not fragmentation, so no expandable-segments advice first.
    assert not any(f["kind"] == "logs.oom_fragmentation" for f in verdict["findings"])
    titles = " ".join(a["title"].lower() for a in verdict["actions"])
    assert "snapshot" in titles or "memory" in titles


def test_fragmented_oom_routes_to_expandable_segments(tmp_path):
    log = tmp_path / "rank3.log"
    log.write_text(
        "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
        "capacity of 79.19 GiB of which 1.50 GiB is free. Including non-PyTorch memory, this process has 77.67 GiB "
        "memory in use. Of the allocated memory 60.10 GiB is allocated by PyTorch, and 16.90 GiB is reserved by "
        "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n"
    )
    code, verdict = triage_json(log)
    assert verdict["category"] == "oom" and verdict["culprit_ranks"] == [3]
    assert verdict["facts"]["reserved_unallocated_share"] == pytest.approx(16.90 / 77.0, abs=0.01)
    assert any(f["kind"] == "logs.oom_fragmentation" for f in verdict["findings"])
    envs = [a["env"] for a in verdict["actions"]]
    assert {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} in envs


def test_diverging_bf16_run_is_nan_inf():
    code, verdict = triage_json(H200 / "nan" / "run.log")
    assert verdict["category"] == "nan_inf"


def test_a_healthy_nccl_run_is_not_a_failure():
    code, verdict = triage_json(H200 / "init_info" / "run.log")
    assert code == exit_codes.OK
    assert verdict["findings"] == [] and verdict["culprit_ranks"] == []


@pytest.mark.parametrize(
    "path, culprit, waiting",
    [
        ("gloo_skip_allreduce/run.log", 1, [0]),
        ("gloo_skip_allreduce_tee/run.log", 1, [0]),
        ("gloo_skip_allreduce_rank0/run.log", 0, [1]),
        ("gloo_skip_4ranks/run.log", 2, [0, 1, 3]),
        ("per_rank_files", 1, [0]),
    ],
)
def test_a_skipped_collective_names_the_rank_that_was_elsewhere(path, culprit, waiting):
    code, verdict = triage_json(LOGS / path)
    assert code == exit_codes.PROBLEM_FOUND
    assert verdict["culprit_ranks"] == [culprit]
    assert verdict["confidence"] == "high"
    frame = verdict["facts"]["user_frame"]
    assert frame["file"].endswith(DEMO_JOB) and frame["line"] == 109 and frame["rank"] == culprit
    by_rank = verdict["facts"]["collective_by_rank"]
    assert by_rank[str(culprit)] == "barrier"
    assert all(by_rank[str(r)] == "all_reduce" for r in waiting)
    # The gloo "connection closed" the culprit saw is reported as collateral, not as the cause.
    roles = {f["kind"]: f["role"] for f in verdict["findings"]}
    assert roles.get("gloo.peer_connection_closed") == "collateral"
    # torchrun's "Root Cause" is only the first child that exited; it is kept as a fact.
    assert "culprit rank" not in verdict["summary"]
    # The first thing to do is to look at the culprit's own line.
    first = verdict["actions"][0]
    assert first["rule"] == "logs.collective_mismatch"
    assert f"rank {culprit}" in first["title"] and ":109" in first["title"]


@pytest.mark.parametrize("path", ["raise_in_rank/run.log", "raise_in_rank_filtered"])
def test_an_exception_on_one_rank_is_the_cause_and_its_peers_errors_collateral(path):
    code, verdict = triage_json(LOGS / path)
    assert verdict["culprit_ranks"] == [1]
    frame = verdict["facts"]["user_frame"]
    job = Path(__file__).parent / "jobs" / "raise_in_rank.py"
    raise_line = next(n for n, text in enumerate(job.read_text().splitlines(), 1) if "raise ValueError" in text)
    assert frame["file"].endswith("tests/jobs/raise_in_rank.py")
    assert (frame["line"], frame["function"]) == (raise_line, "check_features")
    assert "ValueError" in verdict["summary"]
    assert verdict["findings"][0]["role"] == "primary"


def test_a_sigkilled_rank_is_host_oom_with_its_exit_code():
    code, verdict = triage_json(LOGS / "sigkill_rank" / "run.log")
    assert verdict["category"] == "host_oom"
    assert verdict["culprit_ranks"] == [1]
    assert verdict["facts"]["exit_codes"]["1"] == -9


def test_gloo_size_check_abort_is_a_collective_mismatch():
    code, verdict = triage_json(LOGS / "size_mismatch" / "run.log")
    assert code == exit_codes.PROBLEM_FOUND
    assert verdict["category"] == "hang"
    assert verdict["findings"][0]["kind"] == "gloo.size_mismatch"
    assert (verdict["facts"]["received_bytes"], verdict["facts"]["expected_bytes"]) == ("36", "20")
    # Only the launcher ties the abort to a rank: exit code -6 (SIGABRT) on rank 0.
    assert verdict["facts"]["exit_codes"]["0"] == -6


def test_loss_going_non_finite_reports_the_first_bad_step():
    code, verdict = triage_json(LOGS / "nonfinite" / "run.log")
    assert verdict["category"] == "nan_inf"
    first = verdict["findings"][0]["evidence"][0]
    assert "step 16" in first["text"]


HANGS = FIXTURES / "h200x2_hangs"


@pytest.mark.parametrize("case, culprit", [("rank0_skip", 0), ("dataloader", 1)])
def test_nccl_hang_recordings_name_the_rank_that_never_joined(case, culprit):
    code, verdict = triage_json(HANGS / case / "run.log")
    assert (verdict["category"], verdict["culprit_ranks"]) == ("nccl_timeout", [culprit])
    assert verdict["findings"][0]["kind"] == "logs.idle_rank"


def test_nccl_barrier_against_all_reduce_is_reported_as_different_collectives():
    code, verdict = triage_json(HANGS / "barrier" / "run.log")
    assert verdict["culprit_ranks"] == []
    assert verdict["facts"]["last_enqueued_by_rank"] == {"0": 4, "1": 5}
    assert any(f["kind"] == "logs.lagging_rank" and "cannot tell" in f["message"] for f in verdict["findings"])


def test_nccl_oom_on_one_rank_is_the_cause_and_the_sigterm_of_its_peer_collateral():
    code, verdict = triage_json(HANGS / "oom" / "run.log")
    assert (verdict["category"], verdict["culprit_ranks"]) == ("oom", [1])
    assert verdict["facts"]["user_frame"]["line"] == 58
    assert verdict["facts"]["exit_codes"] == {"0": -15, "1": 1}


def test_a_rank_that_exits_without_an_error_is_named_from_its_silence():
    # Rank 1 returned from the job (exit 0): ranks 0, 2 and 3 lose their connection to it in their all_reduce.
    code, verdict = triage_json(LOGS / "gloo_exit_rank1_4ranks" / "run.log")
    assert code == exit_codes.PROBLEM_FOUND
    assert verdict["culprit_ranks"] == [1] and verdict["confidence"] == "medium"
    assert verdict["facts"]["silent_ranks"] == [1]
    assert any(f["kind"] == "logs.silent_rank" and f["blames"] for f in verdict["findings"])


def test_the_highest_rank_exiting_leaves_no_trace_and_no_rank_is_named():
    # Rank 3 of 4 exits: nothing in the logs says the world had a fourth rank.
    code, verdict = triage_json(LOGS / "gloo_exit_rank3_4ranks" / "run.log")
    assert verdict["culprit_ranks"] == [] and verdict["confidence"] == "low"


def test_where_the_survivors_of_a_peer_that_left_were_blames_none_of_them():
    # A generated program (tests/jobs/sim_program.py, seed 3): rank 0 exits; rank 1 is in its own group's
    # all_gather, ranks 2-3 in backward. All lost a peer; none timed out: where they were is not a departure.
    code, verdict = triage_json(LOGS / "gloo_exit_other_groups" / "run.log")
    assert verdict["culprit_ranks"] == [0] and verdict["confidence"] == "medium"
    assert not any(f["kind"] == "logs.collective_mismatch" for f in verdict["findings"])


def test_a_survivor_that_aborts_at_exit_after_losing_its_peer_is_not_the_culprit():
    # The same program and departure; rank 2, having lost its peer, aborts as its interpreter exits (a C++ thread
    # still joinable): torchrun's root cause is rank 2's SIGABRT. Its own error came first: the abort is its end.
    code, verdict = triage_json(LOGS / "gloo_exit_abort_at_exit" / "run.log")
    assert verdict["facts"]["launcher_root_cause_rank"] == 2
    assert verdict["culprit_ranks"] == [0] and verdict["confidence"] == "medium"
    signal = next(f for f in verdict["findings"] if f["kind"] == "logs.fatal_signal")
    assert signal["role"] == "collateral" and signal["ranks"] == [2]
