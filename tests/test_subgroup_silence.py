"""Reading 4 within one process group: ProcessGroupNCCL's status lines number their printer in the group
("[PG ID 2 PG GUID 11(TENSOR_MODEL_PARALLEL_GROUP) Rank 1] Timeout at NCCL work: ..."), its launcher's prefix in
the job. Logs written from ProcessGroupNCCL.cpp's format strings (torch 2.3-2.5)."""

from conftest import triage_json


def timeout(job_rank, group_rank, pg="PG ID 2 PG GUID 11(TENSOR_MODEL_PARALLEL_GROUP)"):
    return [
        f"[rank{job_rank}]:[E0601 12:10:01.230173987 ProcessGroupNCCL.cpp:616] [Rank {group_rank}] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=880, OpType=_ALLGATHER_BASE, NumelIn=2097152, "
        "NumelOut=2097152, Timeout(ms)=600000) ran for 600024 milliseconds before timing out.",
        f"[rank{job_rank}]:[E0601 12:10:01.230519961 ProcessGroupNCCL.cpp:1834] [{pg} Rank {group_rank}] Timeout at "
        "NCCL work: 880, last enqueued NCCL work: 880, last completed NCCL work: 879.",
    ]


def dump_signal(job_rank):
    # every rank of the job, the silent one of the subgroup too, prints the default group's dump line
    return (
        f"[rank{job_rank}]:[E0601 12:10:01.733979701 ProcessGroupNCCL.cpp:1914] [PG ID 0 PG GUID 0(default_pg) Rank "
        f"{job_rank}] Received a dump signal due to a collective timeout from  rank 5 and we will try our best to "
        "dump the debug info. Last enqueued NCCL work: 120, last completed NCCL work: 120."
    )


def verdict_of(tmp_path, pairs, everyone=8):
    lines = [line for job, group in pairs for line in timeout(job, group)]
    path = tmp_path / "job.log"
    path.write_text("\n".join([*lines, *(dump_signal(r) for r in range(everyone))]) + "\n")
    return triage_json(path)[1]


def test_the_group_rank_that_printed_no_timeout_is_placed_in_the_job_by_the_groups_spacing(tmp_path):
    # A TP group of job ranks 4-7: its ranks 0, 1 and 3 timed out; its rank 2 (job rank 6) never reached the
    # collective, though it printed the default group's lines like every rank.
    verdict = verdict_of(tmp_path, [(4, 0), (5, 1), (7, 3)])
    assert (verdict["culprit_ranks"], verdict["confidence"]) == ([6], "medium"), verdict["summary"]
    # A data-parallel group of job ranks 1, 3, 5, 7 (a stride of 2): its rank 1 is job rank 3.
    assert verdict_of(tmp_path, [(1, 0), (5, 2), (7, 3)])["culprit_ranks"] == [3]


def test_numberings_that_prove_no_spacing_place_nobody(tmp_path):
    # Two members fit any spacing; three that fit none are a group of another shape (new_group([4, 5, 9, ...])).
    assert verdict_of(tmp_path, [(4, 0), (7, 3)])["culprit_ranks"] == []
    assert verdict_of(tmp_path, [(4, 0), (5, 1), (9, 3)], everyone=10)["culprit_ranks"] == []
