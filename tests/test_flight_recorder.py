"""`torchtriage fr`: real recordings (2xH200 NCCL, our gloo jobs), synthetic edge cases, hostile and broken input."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import signal
from pathlib import Path

import pytest

from conftest import FIXTURES, H200, run_cli
from torchtriage import exit_codes
from torchtriage.analysis.flight_recorder import build_verdict
from torchtriage.model import SourceKind
from torchtriage.sources.flight_recorder import load_dumps
from torchtriage.sources.registry import rank_from_name
from torchtriage.sources.safe_pickle import PickleCorrupt, PickleRefused, safe_loads

FR = FIXTURES / "fr"
H200X1 = FIXTURES / "h200x1"


def fr_json(*paths) -> tuple[int, dict]:
    done = run_cli("fr", "--json", *paths)
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    return done.returncode, json.loads(done.stdout)


def lead(verdict: dict) -> dict:
    return next(f for f in verdict["findings"] if f["role"] == "primary")


# ------------------------------------------------------------------------------------------- real recordings


def test_h200_skip_rank_never_enqueued_seq_4():
    code, verdict = fr_json(H200 / "skip")
    assert code == exit_codes.PROBLEM_FOUND
    assert verdict["category"] == "hang"
    assert verdict["culprit_ranks"] == [1]
    finding = lead(verdict)
    assert finding["kind"] == "fr.not_joined" and finding["ranks"] == [1]
    assert (verdict["facts"]["seq"], verdict["facts"]["pg_desc"]) == (4, "default_pg")
    assert verdict["facts"]["last_enqueued_seq"] == {"3": "rank 1", "4": "rank 0"}
    # Evidence names the file, the entry index and the rank.
    ev = {e["rank"]: e for e in finding["evidence"]}
    assert ev[0]["file"].endswith("skip/nccl_trace_rank_0") and ev[0]["line"] == 3
    assert ev[1]["file"].endswith("skip/nccl_trace_rank_1")


def test_h200_size_mismatch_at_seq_4_decided_by_call_site_history():
    code, verdict = fr_json(H200 / "size")
    assert code == exit_codes.PROBLEM_FOUND
    assert verdict["culprit_ranks"] == [1]
    finding = lead(verdict)
    assert finding["kind"] == "fr.size_mismatch"
    assert "[[8192]]" in finding["message"] and "[[4096]]" in finding["message"]
    assert verdict["facts"]["seq"] == 4
    assert verdict["facts"]["decided_by"] == "call-site history"
    assert verdict["facts"]["user_frame"]["line"] == 19  # rank 1's departing call site
    assert verdict["actions"][0]["rule"] == "fr.size_mismatch" and "nccl_case.py:19" in verdict["actions"][0]["title"]


def test_h200_op_mismatch_all_gather_vs_all_reduce_decided_by_call_site_history():
    code, verdict = fr_json(H200 / "op")
    assert verdict["culprit_ranks"] == [1]
    finding = lead(verdict)
    assert finding["kind"] == "fr.op_mismatch"
    assert "all_gather" in finding["message"] and "all_reduce" in finding["message"]
    assert verdict["facts"]["seq"] == 4 and verdict["facts"]["decided_by"] == "call-site history"
    assert verdict["facts"]["call_sites"]["1"].endswith(":21 in train_step")
    assert verdict["facts"]["call_sites"]["0"].endswith(":22 in train_step")


@pytest.mark.parametrize(
    "case, culprit, kind, seq, decided_by",
    [
        ("op_2r", [1], "fr.op_mismatch", 4, "call-site history"),
        ("op_rank0_2r", [0], "fr.op_mismatch", 4, "call-site history"),
        ("skip_rank0_4r", [0], "fr.not_joined", 4, "majority"),
        ("size_json_4r", [2], "fr.size_mismatch", 4, "majority"),
        ("dtype_json_4r", [1], "fr.dtype_mismatch", 4, "majority"),
        ("subgroup_4r", [3], "fr.deadlock", 4, "its peers' program order and its own"),
    ],
)
def test_gloo_recordings(case, culprit, kind, seq, decided_by):
    code, verdict = fr_json(FR / case)
    assert code == exit_codes.PROBLEM_FOUND
    assert verdict["culprit_ranks"] == culprit
    assert lead(verdict)["kind"] == kind
    assert verdict["facts"]["seq"] == seq
    assert verdict["facts"]["decided_by"] == decided_by
    assert verdict["facts"]["backend"] == "gloo"


def test_gloo_two_ranks_one_idle_are_candidates_its_dump_cannot_tell_a_skip_from_a_recv():
    # Rank 1 skipped seq 4; rank 0 waits in it. gloo records no send or recv: rank 1 could as well wait in a recv
    # from rank 0 that rank 0 skipped on its way into the all_reduce, and one rank against one decides nothing.
    code, verdict = fr_json(FR / "skip_2r")
    assert code == exit_codes.PROBLEM_FOUND
    assert verdict["culprit_ranks"] == [] and verdict["confidence"] == "low"
    assert verdict["facts"]["candidates"] == [0, 1]
    assert verdict["facts"]["decided_by"] == "stopped issuing"  # the lean is said, not asserted
    assert verdict["facts"]["may_wait_unrecorded"] == {"1": ["a send or recv, which gloo does not record"]}
    assert any(f["kind"] == "fr.unrecorded_p2p" for f in verdict["findings"])


def test_gloo_subgroup_skip_blames_the_member_not_the_ranks_blocked_in_the_subgroup():
    # Rank 3 skipped the subgroup's seq 3 and went on to the world's seq 4: ranks 1-2 wait for it in the
    # subgroup, it waits for them in the world, rank 0 waits in the world behind them.
    _, verdict = fr_json(FR / "subgroup_4r")
    assert verdict["facts"]["cycle"] == [1, 2, 3]
    assert verdict["facts"]["peers_wait_in"] == {"pg": "1", "group": "pg 1", "seq": 3, "op": "all_reduce"}
    assert verdict["facts"]["pg"] == "0" and verdict["facts"]["pg_size"] == 4
    assert verdict["facts"]["waits_for"]["0"] == "ranks 1-2"
    world = [f for f in verdict["findings"] if f["role"] == "collateral" and "seq 4 of default_pg" in f["message"]]
    assert world and "ranks 1-2: never enqueued it" in world[0]["message"]  # stuck in the subgroup
    assert "departed" not in world[0]["message"]


def test_text_report_names_culprit_and_line():
    done = run_cli("fr", H200 / "op")
    out = done.stdout.decode()
    assert done.returncode == exit_codes.PROBLEM_FOUND
    assert "culprit   1" in out and "nccl_case.py:21" in out


# --------------------------------------------------------------------------------------- synthetic dumps


def entry(seq, op="all_reduce", size=4096, pg="0", desc="default_pg", line=22, state="completed", record=None, **kw):
    data = {
        "frames": [
            {"name": op, "filename": "/x/site-packages/torch/distributed/distributed_c10d.py", "line": 3000},
            {"name": "step", "filename": "/job/train.py", "line": line},
        ],
        "record_id": seq - 1 if record is None else record,
        "pg_id": int(pg) if pg.isdigit() else 0,
        "process_group": (pg, desc),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": f"nccl:{op}",
        "time_created_ns": 1000 + seq,
        "input_sizes": [[size]],
        "input_dtypes": ["Float"],
        "output_sizes": [[size]],
        "output_dtypes": ["Float"],
        "state": state,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": True,
        "timeout_ms": 600000,
        "is_p2p": False,
    }
    data.update(kw)
    return data


def write(folder: Path, rank: int, entries, world=2, version="2.10", extra_pgs=None, status=None, name=None):
    pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
    pg_config.update(extra_pgs or {})
    dump = {"version": version, "pg_config": pg_config, "pg_status": status or {}, "entries": entries}
    path = folder / (name or f"nccl_trace_rank_{rank}")
    path.write_bytes(pickle.dumps(dump, protocol=2))
    return path


def verdict_of(folder: Path):
    return build_verdict(load_dumps([str(folder)], jobs=1))


def test_agreeing_dumps_exit_zero(tmp_path):
    for rank in range(3):
        write(tmp_path, rank, [entry(s) for s in range(1, 6)], world=3)
    code, verdict = fr_json(tmp_path)
    assert code == exit_codes.OK
    assert verdict["culprit_ranks"] == [] and verdict["findings"] == []


def test_rank0_is_the_culprit_by_majority(tmp_path):
    for rank in range(4):
        write(tmp_path, rank, [entry(s, size=8192 if (rank == 0 and s == 3) else 4096) for s in range(1, 5)], world=4)
    verdict = verdict_of(tmp_path)
    assert verdict.culprit_ranks == [0]
    assert verdict.findings[0].kind == "fr.size_mismatch"


def test_two_rank_split_without_history_blames_nobody(tmp_path):
    # The mismatch is at the first recorded seq: no earlier call sites, no way to tell who departed.
    write(tmp_path, 0, [entry(1, op="all_reduce")])
    write(tmp_path, 1, [entry(1, op="broadcast", line=30)])
    verdict = verdict_of(tmp_path)
    assert verdict.culprit_ranks == []
    assert verdict.findings[0].kind == "fr.op_mismatch" and "cannot decide" in verdict.findings[0].message


def _inside(frames_above: list[tuple[str, str]], seq: int, world: int):
    """An all_gather issued inside library calls (innermost first) made from the user's line 40."""
    frames = [{"name": "all_gather", "filename": "/x/site-packages/torch/distributed/distributed_c10d.py", "line": 1}]
    frames += [{"name": name, "filename": f"/x/site-packages/{file}", "line": 2} for file, name in frames_above]
    frames += [{"name": "step", "filename": "/job/train.py", "line": 40}]
    return entry(seq, op="all_gather", frames=frames, input_sizes=[[4]], output_sizes=[[4 * world]])


DCP_SAVE = [
    ("torch/distributed/checkpoint/utils.py", "gather_object"),
    ("torch/distributed/checkpoint/state_dict_saver.py", "_save_state_dict"),
    ("torch/distributed/checkpoint/state_dict_saver.py", "save"),
    ("torch/distributed/checkpoint/logger.py", "wrapper"),
]


@pytest.mark.parametrize("world", [2, 4])
def test_an_even_split_where_one_side_waits_inside_a_call_every_rank_must_make(tmp_path, world):
    # Half the ranks wait in the first collective of a checkpoint's save, a call they never made before; the other
    # half issued the next step's all_reduce. By call order the new call is the extra one; but DCP's save is made
    # by every rank: the other half skipped it.
    half = world // 2
    for rank in range(world):
        step = [entry(s) for s in range(1, 5)]
        last = _inside(DCP_SAVE, 5, world) if rank < half else entry(5)
        write(tmp_path, rank, [*step, last], world=world)
    verdict = verdict_of(tmp_path)
    assert verdict.culprit_ranks == list(range(half, world)) and verdict.confidence == "medium"
    assert "its peers wait inside torch.distributed.checkpoint.save, which every rank must call" in verdict.summary
    # The same new call made from the user's own code (no call every rank must make above it): the extra call.
    for rank in range(half):
        write(tmp_path, rank, [*[entry(s) for s in range(1, 5)], _inside([], 5, world)], world=world)
    verdict = verdict_of(tmp_path)
    assert verdict.culprit_ranks == list(range(half)) and verdict.facts["decided_by"] == "call-site history"


ZERO_CONSOLIDATE = [
    ("torch/distributed/optim/zero_redundancy_optimizer.py", "_broadcast_object"),
    ("torch/distributed/optim/zero_redundancy_optimizer.py", "consolidate_state_dict"),
]


@pytest.mark.parametrize(
    ("inside", "named", "decided_by"),
    [
        # `if rank == 0: opt.consolidate_state_dict()`: the many skipped a call every rank must make.
        ({0}, [1, 2, 3], "a call every rank must make"),
        # Three consolidated, one skipped: the count and the call agree.
        ({0, 1, 2}, [3], "majority"),
    ],
)
def test_the_side_inside_a_call_every_rank_must_make_is_the_program_whatever_the_count(
    tmp_path, inside, named, decided_by
):
    for rank in range(4):
        last = _inside(ZERO_CONSOLIDATE, 5, 4) if rank in inside else entry(5)
        write(tmp_path, rank, [*[entry(s) for s in range(1, 5)], last], world=4)
    verdict = verdict_of(tmp_path)
    assert (verdict.culprit_ranks, verdict.facts["decided_by"]) == (named, decided_by), verdict.summary
    assert verdict.confidence != "high"


def test_ring_buffer_windows_that_start_at_different_records(tmp_path):
    # Rank 0's buffer holds seqs 1-10, rank 1's only 6-10 (it wrapped); rank 2 disagrees at seq 8.
    write(tmp_path, 0, [entry(s) for s in range(1, 11)], world=3)
    write(tmp_path, 1, [entry(s, record=s + 40) for s in range(6, 11)], world=3)
    write(tmp_path, 2, [entry(s, op="all_gather" if s == 8 else "all_reduce") for s in range(3, 11)], world=3)
    verdict = verdict_of(tmp_path)
    assert verdict.culprit_ranks == [2]
    assert verdict.facts["seq"] == 8 and verdict.findings[0].kind == "fr.op_mismatch"


def test_ops_before_a_ranks_buffer_start_are_not_compared(tmp_path):
    # Seq 2 differs only on rank 0, but rank 1's window starts at seq 4: nothing there can be compared.
    write(tmp_path, 0, [entry(s, size=1 if s == 2 else 4096) for s in range(1, 7)])
    write(tmp_path, 1, [entry(s, record=s + 90) for s in range(4, 7)])
    assert verdict_of(tmp_path).findings == []


def test_missing_dump_named_and_analysis_goes_on(tmp_path):
    write(tmp_path, 0, [entry(s) for s in range(1, 5)], world=4)
    write(tmp_path, 1, [entry(s) for s in range(1, 5)], world=4)
    write(tmp_path, 3, [entry(s) for s in range(1, 4)], world=4)
    verdict = verdict_of(tmp_path)
    assert verdict.culprit_ranks == [3]  # 0 and 1 wait in seq 4; rank 2's side is unknown
    assert any("no dump for rank 2" in p for p in verdict.problems)


def test_missing_dump_is_the_suspect_when_everyone_present_waits(tmp_path):
    for rank in (0, 1, 3):
        write(tmp_path, rank, [entry(s, state="scheduled" if s == 4 else "completed") for s in range(1, 5)], world=4)
    verdict = verdict_of(tmp_path)
    # Every rank that dumped waits for rank 2 in seq 4: the waits end in it, and only its dump is missing. Dumps
    # alone cannot tell a rank that died from a living one whose dump was lost on the way: low. Where the run's
    # identity records say the rank started (its watchdog writes every living rank's dump beside them): medium.
    assert verdict.culprit_ranks == [2] and verdict.confidence == "low"
    assert verdict.findings[0].kind == "fr.missing_dump"
    load = load_dumps([str(tmp_path)], jobs=1)
    load.known_ranks = frozenset(range(4))
    verdict = build_verdict(load)
    assert verdict.culprit_ranks == [2] and verdict.confidence == "medium"


def test_pg_status_counters_count_when_the_entries_are_gone(tmp_path):
    # Rank 1 dumped no entries (onlyActive), but its counter says it enqueued only up to seq 3.
    write(tmp_path, 0, [entry(s) for s in range(1, 5)], status={"0": {"last_enqueued_collective": 4}})
    write(tmp_path, 1, [], status={"0": {"last_enqueued_collective": 3}})
    write(tmp_path, 2, [entry(s) for s in range(1, 5)], status={"0": {"last_enqueued_collective": 4}})
    verdict = verdict_of(tmp_path)
    assert verdict.culprit_ranks == [1] and verdict.findings[0].kind == "fr.not_joined"


def test_coalesced_ops_compare_as_one(tmp_path):
    def coalesced(seq, sizes):
        parts = [entry(seq, size=s) for s in sizes]
        return parts + [entry(seq, op="coalesced", size=0)]

    write(tmp_path, 0, [entry(1), *coalesced(2, [10, 20]), entry(3)], world=3)
    write(tmp_path, 1, [entry(1), *coalesced(2, [10, 20]), entry(3)], world=3)
    write(tmp_path, 2, [entry(1), *coalesced(2, [10, 21]), entry(3)], world=3)
    verdict = verdict_of(tmp_path)
    assert verdict.culprit_ranks == [2]
    assert verdict.facts["seq"] == 2 and verdict.findings[0].kind == "fr.size_mismatch"
    assert "coalesced[all_reduce, all_reduce]" in verdict.findings[0].message


def test_all_gather_output_is_input_times_group_size(tmp_path):
    good = entry(3, op="all_gather", size=4, output_sizes=[[2, 4]])
    bad = entry(3, op="all_gather", size=8, output_sizes=[[2, 4]], frames=[])  # impossible on 2 ranks
    write(tmp_path, 0, [entry(1), entry(2), good])
    write(tmp_path, 1, [entry(1), entry(2), bad])
    verdict = verdict_of(tmp_path)
    assert verdict.culprit_ranks == [1] and verdict.facts["decided_by"] == "sizes"


@pytest.mark.parametrize(
    "sizes, culprit",
    [
        ([(4, 4), (4, 4), (4, 4), (5, 4)], [3]),  # one rank sends one more: its peers' splits balance
        ([(4, 4), (4, 5), (4, 4), (4, 4)], [1]),  # one rank expects one more
        ([(5, 4), (4, 4), (4, 4), (4, 4)], [0]),  # rank 0 too
        ([(3, 4), (5, 4), (4, 4), (4, 5)], []),  # uneven loads, as experts' are: the totals cannot say
        ([(4, 4), (4, 4), (6, 4), (6, 4)], []),  # two ranks alike off the rest: not one rank's alone
    ],
)
def test_all_to_all_totals_name_the_one_rank_whose_splits_alone_differ(tmp_path, sizes, culprit):
    for rank, (sent, received) in enumerate(sizes):
        ops = [entry(1), entry(2, op="all_to_all", size=0, input_sizes=[[sent]], output_sizes=[[received]])]
        write(tmp_path, rank, ops, world=4)
    found = verdict_of(tmp_path)
    assert found.culprit_ranks == culprit
    assert found.findings[0].kind == "fr.size_mismatch" and found.facts["seq"] == 2


def test_all_to_all_totals(tmp_path):
    # Uneven splits are fine; totals that do not add up are not.
    a = entry(1, op="all_to_all", size=0, input_sizes=[[6]], output_sizes=[[4]])
    b = entry(1, op="all_to_all", size=0, input_sizes=[[2]], output_sizes=[[5]])
    write(tmp_path, 0, [a])
    write(tmp_path, 1, [b])
    verdict = verdict_of(tmp_path)
    assert verdict.findings and verdict.findings[0].kind == "fr.size_mismatch"
    assert verdict.facts["total_input_numel"] == 8 and verdict.facts["total_output_numel"] == 9


def test_state_mismatch(tmp_path):
    for rank in range(3):
        write(tmp_path, rank, [entry(1), entry(2, state="scheduled" if rank == 1 else "completed")], world=3)
    verdict = verdict_of(tmp_path)
    # Ranks 0 and 2 completed seq 2, rank 1's dump still lists the same op as pending: its device or its
    # progress thread stopped (the group's state mismatch says where).
    assert [f.kind for f in verdict.findings] == ["fr.progress_stopped", "fr.state_mismatch"]
    assert verdict.culprit_ranks == [1] and verdict.confidence == "medium"


def _timed(seq, state, **kw):
    """An entry as NCCL records it with TORCH_NCCL_ENABLE_TIMING=1 (a start event: `started` can be seen)."""
    started = 2000 + seq if state != "scheduled" else None
    return entry(seq, state=state, time_discovered_started_ns=started, **kw)


def test_a_device_that_never_began_the_op_its_peers_began_is_named(tmp_path):
    # Every rank enqueued seq 3 and none completed it; ranks 0, 2, 3 began it, rank 1's GPU never did.
    for rank in range(4):
        write(
            tmp_path,
            rank,
            [_timed(1, "completed"), _timed(2, "completed"), _timed(3, "scheduled" if rank == 1 else "started")],
            world=4,
        )
    verdict = verdict_of(tmp_path)
    assert verdict.culprit_ranks == [1] and verdict.confidence == "medium"
    assert verdict.findings[0].kind == "fr.not_started"
    assert "the GPU of rank 1 never began the all_reduce" in verdict.summary


def _status(enqueued, started, completed):
    """NCCL's `pg_status` of the default group; `started` stays -1 without TORCH_NCCL_ENABLE_TIMING=1."""
    names = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")
    return {"0": dict(zip(names, (enqueued, started, completed), strict=True))}


def test_a_device_that_never_began_the_op_is_named_though_another_member_left_no_dump(tmp_path):
    # Rank 0 began seq 3 and waits in it; rank 1's device never did (timing on, inside no op); rank 2 wrote no
    # dump. Rank 1 waits for its own device, not for rank 2: the waits do not end in the missing rank.
    ops = [_timed(1, "completed"), _timed(2, "completed")]
    write(tmp_path, 0, [*ops, _timed(3, "started")], world=3, status=_status(3, 3, 2))
    write(tmp_path, 1, [*ops, _timed(3, "scheduled")], world=3, status=_status(3, 2, 2))
    verdict = verdict_of(tmp_path)
    assert verdict.culprit_ranks == [1] and verdict.confidence == "medium"
    assert verdict.findings[0].kind == "fr.not_started"
    assert any("no dump for rank 2" in problem for problem in verdict.problems)


def test_a_lone_dump_whose_device_never_began_the_op_names_it_and_the_missing_peer_candidates(tmp_path):
    # Only rank 1 dumped: its device never began seq 3 (timing on: seq 2's start was seen). Whether rank 0's
    # began it, or rank 1's held kernel waits for rank 0, no dump read can tell: both are candidates, never
    # rank 0 alone as the rank "the waits end in".
    write(
        tmp_path, 1, [_timed(1, "completed"), _timed(2, "completed"), _timed(3, "scheduled")], status=_status(3, 2, 2)
    )
    verdict = verdict_of(tmp_path)
    assert (verdict.culprit_ranks, verdict.confidence) == ([], "low")
    assert verdict.facts["candidates"] == [0, 1]
    assert verdict.findings[0].kind == "fr.not_started"
    # Timing was on: asking for it again would send the user in a circle; finding rank 0's side is the step.
    assert not any(a.env.get("TORCH_NCCL_ENABLE_TIMING") for a in verdict.actions)
    assert verdict.actions[0].title == "Find out whether rank 0's GPU began it"
    # Without timing (no start ever recorded), `scheduled` says nothing: the waits end in the missing rank.
    write(tmp_path, 1, [entry(1), entry(2), entry(3, state="scheduled")], status=_status(3, -1, 2))
    verdict = verdict_of(tmp_path)
    assert verdict.culprit_ranks == [0] and verdict.findings[0].kind == "fr.missing_dump"


def test_dumps_that_agree_while_every_rank_waits_name_every_rank_a_candidate(tmp_path):
    # Every rank issued seq 1-3 alike and waits in seq 3: the op order cannot tell who is behind.
    for rank in range(3):
        write(tmp_path, rank, [entry(1), entry(2), entry(3, state="scheduled")], world=3)
    verdict = verdict_of(tmp_path)
    assert (verdict.category, verdict.confidence, verdict.culprit_ranks) == ("hang", "low", [])
    assert verdict.facts["candidates"] == [0, 1, 2]
    # NCCL without timing: the action says what would tell (a device that never began the op).
    assert any(a.env.get("TORCH_NCCL_ENABLE_TIMING") == "1" for a in verdict.actions)
    # With timing, every device began it: the action is not offered again.
    for rank in range(3):
        write(tmp_path, rank, [_timed(1, "completed"), _timed(2, "completed"), _timed(3, "started")], world=3)
    verdict = verdict_of(tmp_path)
    assert verdict.facts["candidates"] == [0, 1, 2]
    assert not any(a.env.get("TORCH_NCCL_ENABLE_TIMING") for a in verdict.actions)


@pytest.mark.parametrize(
    "states, why",
    [
        ({0: "scheduled", 1: "scheduled"}, "no device began it: the states tell nothing (no timing, or all behind)"),
        ({0: "started", 1: "started"}, "every device began it: they wait in it for each other"),
    ],
)
def test_op_states_that_do_not_tell_a_device_behind_name_nobody(tmp_path, states, why):
    for rank, state in states.items():
        write(tmp_path, rank, [_timed(1, "completed"), _timed(2, state)])
    verdict = verdict_of(tmp_path)
    assert verdict.culprit_ranks == [], why
    assert not any(f.kind == "fr.not_started" for f in verdict.findings), why


def test_a_device_inside_another_groups_op_is_not_named_behind(tmp_path):
    # Rank 1 never began seq 2 of the world group, but its device is inside an op of its subgroup (started):
    # it waits for that op's peers, not for a kernel of its own.
    sub = {"1": {"name": "1", "desc": "tp", "ranks": "[1, 2]"}}
    inside = _timed(1, "started", pg="1", desc="tp", record=5)
    write(tmp_path, 0, [_timed(1, "completed"), _timed(2, "started")], world=3, extra_pgs=sub)
    write(tmp_path, 1, [_timed(1, "completed"), _timed(2, "scheduled"), inside], world=3, extra_pgs=sub)
    write(tmp_path, 2, [_timed(1, "completed"), _timed(2, "started")], world=3, extra_pgs=sub)
    verdict = verdict_of(tmp_path)
    assert not any(f.kind == "fr.not_started" for f in verdict.findings)
    # The same from the counters alone, where the ring buffer dropped the started entry.
    status = {"1": {"last_enqueued_collective": 4, "last_started_collective": 4, "last_completed_collective": 3}}
    write(tmp_path, 1, [_timed(1, "completed"), _timed(2, "scheduled")], world=3, extra_pgs=sub, status=status)
    verdict = verdict_of(tmp_path)
    assert not any(f.kind == "fr.not_started" for f in verdict.findings)


def test_p2p_send_without_matching_recv(tmp_path):
    def p2p(kind, peers, seq):
        return entry(0, op=f"{kind} {peers}", is_p2p=True, p2p_seq_id=seq, collective_seq_id=0, record=seq - 1)

    write(tmp_path, 0, [p2p("send", "0->1", 1), p2p("send", "0->1", 2)])
    write(tmp_path, 1, [p2p("recv", "1<-0", 1)])
    verdict = verdict_of(tmp_path)
    assert verdict.culprit_ranks == [1]
    assert verdict.findings[0].kind == "fr.not_joined" and "recv" in verdict.findings[0].message


def test_subgroup_disagreement_in_split_groups_with_one_name(tmp_path):
    # Two groups share the name "5" (split_group): {0, 1} agree, {2, 3} disagree at their seq 2.
    for rank in range(4):
        members = [0, 1] if rank < 2 else [2, 3]
        sub = {"5": {"name": "5", "desc": "tp", "ranks": str(members)}}
        size = 99 if rank == 3 else 7
        ops = [entry(1), entry(1, pg="5", desc="tp", size=7)]
        ops.append(entry(2, pg="5", desc="tp", size=size, line=40 if rank == 3 else 22))
        ops[-1]["frames"][1]["line"] = 40 if rank == 3 else 22
        write(tmp_path, rank, ops, world=4, extra_pgs=sub)
    verdict = verdict_of(tmp_path)
    assert verdict.culprit_ranks == [3]
    assert verdict.facts["pg"] == "5" and verdict.facts["pg_size"] == 2


def test_json_form_and_rank_from_content(tmp_path):
    dump = {
        "version": "2.10",
        "rank": 7,
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[6, 7]"}},
        "pg_status": {"0": {"last_enqueued_collective": "2"}},
        "entries": [dict(entry(s), process_group=["0", "default_pg"], frames=None) for s in (1, 2)],
    }
    (tmp_path / "whatever.json").write_text(json.dumps(dump))
    load = load_dumps([str(tmp_path)], jobs=1)
    assert [d.rank for d in load.dumps] == [7] and load.dumps[0].rank_from == "content"


@pytest.mark.parametrize(
    "name, rank",
    [
        ("nccl_trace_rank_12", 12),
        ("comm_lib_trace_rank_3", 3),
        ("node-a17.cluster_trace_rank_5.pkl", 5),
        ("host12-dump-7", 7),
        ("myprefix42", 42),
        ("notes.txt", None),
    ],
)
def test_rank_from_file_names(name, rank):
    assert rank_from_name(name, SourceKind.FLIGHT_RECORDER) == rank


def test_version_mismatch_is_a_clear_message_and_other_files_still_count(tmp_path):
    write(tmp_path, 0, [entry(s) for s in range(1, 4)], world=3)
    write(tmp_path, 1, [entry(s) for s in range(1, 4)], world=3)
    write(tmp_path, 2, [entry(s) for s in range(1, 4)], world=3, version="3.0")
    code, verdict = fr_json(tmp_path)
    assert verdict["facts"]["ranks_loaded"] == 2
    assert any("nccl_trace_rank_2" in p and "format version is 3.0" in p for p in verdict["problems"])


# -------------------------------------------------------------------------------------------- bad input


class _CreatesFile:
    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_hostile_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"version": "2.10", "entries": [_CreatesFile(marker)]}, protocol=2)
    with pytest.raises(PickleRefused, match="builtins.open|io.open"):
        safe_loads(payload)
    hostile = tmp_path / "dumps" / "nccl_trace_rank_0"
    hostile.parent.mkdir()
    hostile.write_bytes(payload)
    done = run_cli("fr", hostile.parent)
    assert done.returncode == exit_codes.BAD_INPUT
    assert b"refused" in done.stderr and b"Traceback" not in done.stderr
    assert not marker.exists()


def test_truncated_and_empty_files(tmp_path):
    good = write(tmp_path, 0, [entry(s) for s in range(1, 4)])
    raw = good.read_bytes()
    (tmp_path / "nccl_trace_rank_1").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "nccl_trace_rank_2").write_bytes(b"")
    with pytest.raises(PickleCorrupt, match="truncated"):
        safe_loads(raw[: len(raw) // 2])
    code, verdict = fr_json(tmp_path)
    problems = " ".join(verdict["problems"])
    assert "nccl_trace_rank_1: the pickle is truncated" in problems
    assert "nccl_trace_rank_2: the file is empty" in problems
    assert verdict["facts"]["ranks_loaded"] == 1


def test_nothing_usable_exits_3_with_one_line_per_file(tmp_path):
    (tmp_path / "nccl_trace_rank_0").write_bytes(b"")
    (tmp_path / "nccl_trace_rank_1").write_bytes(pickle.dumps({"version": "1.0", "entries": []}, protocol=2))
    done = run_cli("fr", tmp_path)
    assert done.returncode == exit_codes.BAD_INPUT
    err = done.stderr.decode()
    assert "nccl_trace_rank_0: the file is empty" in err and "format version is 1.0" in err


def test_usage_errors(tmp_path):
    assert run_cli("fr").returncode == exit_codes.USAGE
    assert run_cli("fr", "--jobs", "0", tmp_path).returncode == exit_codes.USAGE
    assert run_cli("fr", tmp_path / "nope").returncode == exit_codes.BAD_INPUT


def test_worker_pool_gives_the_same_verdict(tmp_path):
    for rank in range(64):
        ops = [entry(s, size=1 if (rank == 41 and s == 5) else 4096) for s in range(1, 8)]
        write(tmp_path, rank, ops, world=64)
    pooled = build_verdict(load_dumps([str(tmp_path)], jobs=2))
    single = build_verdict(load_dumps([str(tmp_path)], jobs=1))
    assert pooled.culprit_ranks == single.culprit_ranks == [41]
    assert pooled.findings[0].message == single.findings[0].message


@pytest.mark.parametrize(
    "case, culprit, kind, decided_by",
    [
        ("rank0_skip", [0], "fr.not_joined", "stopped issuing"),
        # The waiting rank's first training step is called from a new line: that must not blame it.
        ("dataloader", [1], "fr.not_joined", "stopped issuing"),
        # Both call sites are new; rank 1's op (a barrier) is one it never issued before: the larger departure.
        ("barrier", [1], "fr.op_mismatch", "call-site history"),
    ],
)
def test_h200_hang_recordings(case, culprit, kind, decided_by):
    _, verdict = fr_json(FIXTURES / "h200x2_hangs" / case)
    assert verdict["culprit_ranks"] == culprit
    assert lead(verdict)["kind"] == kind and verdict["facts"]["decided_by"] == decided_by


def _mixed_entries():
    """Every layout the column path must read as the per-entry path does: groups, p2p, coalesced, odd seqs."""
    ops = [entry(s, line=22 + s % 3) for s in range(1, 6)]
    ops += [entry(s, pg="1", desc="tp", size=8) for s in range(1, 4)]
    ops += [entry(6, profiling_name="nccl:send 0->1", is_p2p=True, p2p_seq_id=1)]
    ops += [entry(7, profiling_name="gloo:recv 1<-0", is_p2p=None, p2p_seq_id=1)]
    ops += [entry(8), entry(8, op="all_gather"), entry(9, op="all_to_all", frames=[])]
    ops += [entry(10, collective_seq_id="10", state="timed_out"), entry(11, state="scheduled", time_created_ns=1)]
    ops += [entry(12, state="started", time_discovered_started_ns=10**12, timeout_ms=1)]
    return ops


def test_column_path_reads_like_the_per_entry_path():
    from torchtriage.sources import flight_recorder as fr

    mixed_data = {"version": "2.10", "entries": _mixed_entries()}
    dumps = [(mixed_data, len(pickle.dumps(mixed_data)))]
    for path in sorted(FR.rglob("*")) + sorted(H200.rglob("*")):
        if path.is_file():
            raw = path.read_bytes()
            raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
            try:
                dumps.append((fr.decode(raw), len(raw)))
            except ValueError:
                continue
    fast_used = 0
    for data, size in dumps:
        if not isinstance(data, dict) or "entries" not in data:
            continue
        fast_used += fr._extract_columns(data["entries"], fr._fetch_columns(data["entries"])) is not None
        fast = fr.parse_dump("x", data, 3, size)
        original, find = fr._extract_columns, fr._templates.find
        try:
            fr._extract_columns = lambda entries, fetched: None
            fr._templates.find = lambda columns: None
            slow = fr.parse_dump("x", data, 3, size)
        finally:
            fr._extract_columns, fr._templates.find = original, find
        assert fast == slow
    assert fast_used >= 10
    assert fr._extract_columns(dumps[0][0]["entries"], fr._fetch_columns(dumps[0][0]["entries"])) is not None
    mixed = fr.parse_dump("x", *dumps[0][:1], 0, dumps[0][1])
    assert list(mixed.tracks) == ["0", "1"] and list(mixed.p2p) == ["0"]
    assert ("0", 10) in mixed.timed_out and ("0", 12) in mixed.timed_out


def test_forked_loading_matches_serial_and_a_crashed_reader_costs_its_file_only(tmp_path, monkeypatch):
    from torchtriage.sources import flight_recorder as fr

    for rank in range(60):
        write(tmp_path, rank, [entry(s, size=1 if (rank == 7 and s == 3) else 4096) for s in range(1, 6)], world=60)
    (tmp_path / "nccl_trace_rank_60").write_bytes(b"\x80\x02garbage")
    single = load_dumps([str(tmp_path)], jobs=1)
    forked = load_dumps([str(tmp_path)], jobs=3)
    assert forked == single and len(forked.dumps) == 60 and len(forked.problems) == 1
    load_one = fr.load_one

    def crashes_on_rank_7(path):
        if path.endswith("_7"):
            os.kill(os.getpid(), signal.SIGSEGV)  # what a crafted file did to the C unpickler
        return load_one(path)

    monkeypatch.setattr(fr, "load_one", crashes_on_rank_7)
    crashed = load_dumps([str(tmp_path)], jobs=3)
    assert [d.rank for d in crashed.dumps] == [r for r in range(60) if r != 7]
    said = {Path(p.path).name: p.message for p in crashed.problems}
    assert "the reader stopped (SIGSEGV)" in said["nccl_trace_rank_7"]
    assert crashed.dumps == [d for d in single.dumps if d.rank != 7]


def _spmd_job(folder: Path, world: int = 40) -> None:
    """Two groups used in turn, the last world collective pending; ranks differ where a job's ranks do:
    the creation time of the pending op (some past their timeout), one rank's call site, one rank's size."""
    half = world // 2
    halves = {
        str(1 + h): {"name": str(1 + h), "desc": f"half{1 + h}", "ranks": str(list(range(h * half, (h + 1) * half)))}
        for h in (0, 1)
    }
    for rank in range(world):
        sub = str(1 + rank // half)
        ops = []
        for step in range(1, 6):
            ops.append(entry(step, pg=sub, desc=f"half{sub}", line=30, op_id=2 * step - 1, size=64))
            last = step == 5
            state = "scheduled" if last else "completed"
            created = 10**12 - (rank % 2) * 7 * 10**11 if last else 1000 + step  # odd ranks: past the timeout
            ops.append(
                entry(step, line=31 if rank != 13 else 44, op_id=2 * step, state=state, time_created_ns=created,
                      size=8 if (rank == 29 and step == 3) else 4096, time_discovered_completed_ns=10**12)
            )  # fmt: skip
        write(folder, rank, ops, world=world, extra_pgs={sub: halves[sub]})


def test_repeated_dumps_are_read_from_the_template_exactly_as_the_first(tmp_path, monkeypatch):
    from torchtriage.sources import flight_recorder as fr

    _spmd_job(tmp_path)
    fr._templates.clear()
    monkeypatch.setattr(fr._byte_templates, "find", lambda raw, limits: None)  # the column templates alone
    find, hits = fr._templates.find, []
    monkeypatch.setattr(fr._templates, "find", lambda columns: hits.append(found := find(columns)) or found)
    with_templates = load_dumps([str(tmp_path)], jobs=1, isolate=False)
    assert sum(found is not None for found in hits) >= 30  # each half's ranks repeat the half's first dump
    monkeypatch.setattr(fr._templates, "find", lambda columns: None)
    assert with_templates == load_dumps([str(tmp_path)], jobs=1, isolate=False)
    dumps = {d.rank: d for d in with_templates.dumps}
    assert dumps[13].tracks["0"].sites[0].line == 44 and dumps[12].tracks["0"].sites[0].line == 31
    assert ("0", 5) in dumps[1].timed_out and ("0", 5) not in dumps[0].timed_out
    verdict = build_verdict(with_templates)
    assert verdict.culprit_ranks == [29]


def test_a_template_vouches_for_no_dump_of_its_own_frames_or_group_ids(tmp_path):
    from torchtriage.sources import flight_recorder as fr

    fr._templates.clear()
    ops = [entry(s) for s in range(1, 4)]
    write(tmp_path, 0, ops)
    hostile = [entry(s) for s in range(1, 4)]
    hostile[1]["frames"] = [{"name": "x" * (1 << 17), "filename": "/job/train.py", "line": 1}]
    write(tmp_path, 1, hostile)
    other_id = [entry(s, pg_id=7) for s in range(1, 4)]
    write(tmp_path, 2, other_id)
    loaded = load_dumps([str(tmp_path)], jobs=1)
    assert [d.rank for d in loaded.dumps] == [0, 2]
    assert "frames[].name" in loaded.problems[0].message
    assert loaded.dumps[1].pg_ids == {"0": "7"} and loaded.dumps[0].pg_ids == {"0": "0"}


def test_each_ranks_position_in_the_shared_vocabulary():
    from torchtriage.analysis.flight_recorder import rank_positions
    from torchtriage.model import RankState, SourceKind

    positions = rank_positions(load_dumps([str(FIXTURES / "fr" / "subgroup_4r")], jobs=1))
    where = {rank: (p.state, p.op, p.process_group, p.seq) for rank, p in positions.items()}
    # Ranks 1 and 2 wait in the subgroup's all_reduce (pg 1, seq 3); ranks 0 and 3 went on to the world's.
    assert where == {
        0: (RankState.COLLECTIVE, "all_reduce", "0", 4),
        1: (RankState.COLLECTIVE, "all_reduce", "1", 3),
        2: (RankState.COLLECTIVE, "all_reduce", "1", 3),
        3: (RankState.COLLECTIVE, "all_reduce", "0", 4),
    }
    assert {p.source for p in positions.values()} == {SourceKind.FLIGHT_RECORDER}
    assert positions[1].user_frame.line == 63  # the subgroup all_reduce's call site


def test_a_dump_with_op_ids_that_are_not_integers_is_never_a_template(tmp_path):
    from torchtriage.sources import flight_recorder as fr

    fr._templates.clear()
    nested: list = []
    for _ in range(50):
        nested = [nested]
    write(tmp_path, 0, [entry(s, op_id=nested) for s in range(1, 4)])
    loaded = load_dumps([str(tmp_path)], jobs=1)
    assert [d.rank for d in loaded.dumps] == [0] and loaded.dumps[0].tracks["0"].op_ids == [-1, -1, -1]
    assert not fr._templates._by_pick  # the unchecked column is no template for later dumps


# ----------------------------------------------------------------------------------------- byte templates


def _twins(folder: Path, world: int = 12, pending_from: int = 5, share_state_with_thread: bool = False) -> None:
    """A job whose ranks write the same dump but for what a rank writes of its own: time stamps (each rank's
    pending op created at its own moment, odd ranks past the timeout), its thread's id, the retired flags."""
    for rank in range(world):
        thread = f"1405763593{rank:05d}"
        ops = []
        for seq in range(1, 7):
            created = 1_796_000_000_000_000_000 + seq * 10**6 + rank * 10**3
            if seq >= pending_from:
                created -= (rank % 2) * 700 * 10**9  # odd ranks: created 700 s ago, past the 600 s timeout
            state = "scheduled" if seq >= pending_from else "completed"
            op = entry(seq, state=state, time_created_ns=created, thread_id=thread, thread_name="pt_main_thread")
            op["time_discovered_completed_ns"] = None if seq >= pending_from else created + 5 * 10**5
            op["retired"] = seq < pending_from - 1 - rank % 2
            if share_state_with_thread:
                op["thread_id"] = op["state"]  # one object: the pickle writes it once, then refers to it
            ops.append(op)
        write(folder, rank, ops, world=world)


def _byte_hits(monkeypatch) -> list:
    """Clear both kinds of template, make one after two repeats, and record each file the byte templates read."""
    from torchtriage.sources import flight_recorder as fr

    fr._templates.clear()
    fr._byte_templates.clear()
    monkeypatch.setattr(fr._byte_roles, "EVERY", 2)
    fr._byte_roles.clear()
    find, hits = fr._byte_templates.find, []
    monkeypatch.setattr(fr._byte_templates, "find", lambda raw, lim: hits.append(found := find(raw, lim)) or found)
    return hits


def _ordinary(folder: Path, monkeypatch):
    """The dumps as the reader reads them with no template of either kind."""
    from torchtriage.sources import flight_recorder as fr

    with monkeypatch.context() as patched:
        patched.setattr(fr._byte_templates, "find", lambda raw, lim: None)
        patched.setattr(fr._templates, "find", lambda columns: None)
        return load_dumps([str(folder)], jobs=1)


def test_dumps_that_repeat_a_byte_template_read_exactly_as_the_ordinary_path_reads_them(tmp_path, monkeypatch):
    _twins(tmp_path)
    hits = _byte_hits(monkeypatch)
    fast = load_dumps([str(tmp_path)], jobs=1, isolate=False)
    assert sum(found is not None for found in hits) >= 6  # each size's ranks after the template's source
    assert fast == _ordinary(tmp_path, monkeypatch)
    dumps = {d.rank: d for d in fast.dumps}
    assert ("0", 5) in dumps[7].timed_out and ("0", 5) not in dumps[8].timed_out  # each rank's own stamps


def test_the_spmd_job_reads_the_same_through_byte_templates(tmp_path, monkeypatch):
    _spmd_job(tmp_path)
    hits = _byte_hits(monkeypatch)
    fast = load_dumps([str(tmp_path)], jobs=1, isolate=False)
    assert sum(found is not None for found in hits) >= 20
    assert fast == _ordinary(tmp_path, monkeypatch)
    assert build_verdict(fast).culprit_ranks == [29]
    assert {d.rank: d for d in fast.dumps}[13].tracks["0"].sites[0].line == 44  # its own call site, compared


def _variant(path: Path, old: bytes, new: bytes, occurrence: int = 0) -> None:
    raw = path.read_bytes()
    at = -1
    for _ in range(occurrence + 1):
        at = raw.index(old, at + 1)
    path.write_bytes(raw[:at] + new + raw[at + len(old) :])


@pytest.mark.parametrize(
    "old, new, occurrence, what",
    [
        (pickle.dumps(22)[2:-1], pickle.dumps(37)[2:-1], 2, "a call site's line: compared, read as the file has it"),
        (b"completed", b"scheduled", 0, "a state of the same length: compared"),
        (b"1405763593", b"\xff\xfe05763593", 0, "a thread id that is not UTF-8: the unpickler refuses the file"),
        (b"\x88", b"K", 0, "a retired flag turned into an opcode with an argument: the stream reads otherwise"),
        (b"pt_main_thread", b"pt_side_thread", 0, "a thread's name: its own, read from the template"),
    ],
)
def test_a_file_that_departs_from_its_byte_template_reads_as_the_ordinary_path_reads_it(
    tmp_path, monkeypatch, old, new, occurrence, what
):
    _twins(tmp_path)
    _variant(tmp_path / "nccl_trace_rank_10", old, new, occurrence)
    hits = _byte_hits(monkeypatch)
    fast = load_dumps([str(tmp_path)], jobs=1, isolate=False)
    assert fast == _ordinary(tmp_path, monkeypatch), what
    assert sum(found is not None for found in hits) >= 5
    if old == b"completed":
        assert {d.rank: d for d in fast.dumps}[10].tracks["0"].states[0] == "scheduled"


def test_a_value_shared_with_a_compared_field_is_compared(tmp_path, monkeypatch):
    # Each entry's thread_id is its state, one object: a file whose thread_id bytes differ has other states.
    _twins(tmp_path, share_state_with_thread=True)
    _variant(tmp_path / "nccl_trace_rank_10", b"completed", b"scheduled")
    _byte_hits(monkeypatch)
    fast = load_dumps([str(tmp_path)], jobs=1)
    assert fast == _ordinary(tmp_path, monkeypatch)
    assert {d.rank: d for d in fast.dumps}[10].tracks["0"].states[:4] == ["scheduled"] * 4


def test_a_byte_template_serves_only_the_limits_it_was_checked_under(tmp_path, monkeypatch):
    from torchtriage.sources import limits

    _twins(tmp_path)
    _byte_hits(monkeypatch)
    load_dumps([str(tmp_path)], jobs=1, isolate=False)  # byte templates made under the default limits
    with limits.using(limits.Limits(rank=7)):
        strict = load_dumps([str(tmp_path)], jobs=1, isolate=False)
        assert strict == _ordinary(tmp_path, monkeypatch)
    assert [d.rank for d in strict.dumps] == list(range(8)) and len(strict.problems) == 4


def test_forked_loading_through_byte_templates_matches_serial(tmp_path, monkeypatch):
    _twins(tmp_path, world=200)
    _byte_hits(monkeypatch)
    assert load_dumps([str(tmp_path)], jobs=3) == _ordinary(tmp_path, monkeypatch)


def _renamed(raw: bytes, old: str, new: str) -> bytes:
    """A real dump with a group's name as its header first writes it changed (same length)."""
    text = b"X" + len(old).to_bytes(4, "little")
    at = raw.index(text + old.encode())
    return raw[:at] + text + new.encode() + raw[at + len(text) + len(old) :]


def test_a_real_nccl_dumps_entries_repeat_under_another_groups_name():
    from torchtriage.sources.fr_bytes import ByteTemplate

    raw = (H200X1 / "nccl_ws1" / "nccl_trace_rank_0").read_bytes()
    data = safe_loads(raw)
    template = ByteTemplate(raw, data, [0], records=None, limits=None)
    # torch's pickler writes each string once: the entries name their groups by referring to the header's.
    assert set(template.groups) == {"0", "1"} and all(g.name_slot is not None for g in template.groups.values())
    stamps = [e[k] for e in data["entries"] for k in ("time_created_ns", "time_discovered_completed_ns")]
    same = template.read(raw)
    assert same.names == {"0": "0", "1": "1"} and same.latest_ns == max(s for s in stamps if s)
    assert same.created == (data["entries"][0]["time_created_ns"],)
    later = max(s for s in stamps if s) + 10**9
    at = raw.index(max(s for s in stamps if s).to_bytes(8, "little"))
    assert template.read(raw[:at] + later.to_bytes(8, "little") + raw[at + 8 :]).latest_ns == later
    other = template.read(_renamed(raw, "mysub", "yours"))
    assert other.names == {"0": "0", "1": "1"} and other.descs["1"] == "yours"
    assert template.read(raw[:-6] + b"\x00" + raw[-5:]) is None  # a byte of the entries outside every own span


def test_real_nccl_dumps_of_other_groups_read_as_the_ordinary_path_reads_them(tmp_path, monkeypatch):
    raw = (H200X1 / "nccl_ws1" / "nccl_trace_rank_0").read_bytes()
    stamp = safe_loads(raw)["entries"][0]["time_created_ns"]
    for rank in range(8):  # the subgroup named "1" and described "mysub" on rank 0 is another on each rank
        dump = _renamed(_renamed(raw, "mysub", f"sub{rank:02d}"), "1", str(rank + 1))
        at = dump.index(stamp.to_bytes(8, "little"))
        dump = dump[:at] + (stamp + rank * 10**12).to_bytes(8, "little") + dump[at + 8 :]
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(dump)
    hits = _byte_hits(monkeypatch)
    fast = load_dumps([str(tmp_path)], jobs=1, isolate=False)
    assert sum(found is not None for found in hits) >= 5
    assert fast == _ordinary(tmp_path, monkeypatch)
    dumps = {d.rank: d for d in fast.dumps}
    assert dumps[6].pg_desc["7"] == "sub06" and "1" not in dumps[6].tracks and dumps[6].tracks["7"].seqs == [1]


def test_walk_refuses_what_plain_protocol_2_data_does_not_write():
    from torchtriage.sources.fr_bytes import _analyse, walk

    data = {"version": "2.10", "entries": [entry(1)]}
    assert walk(pickle.dumps(data, protocol=0)) is None  # text opcodes
    assert walk(pickle.dumps({"x": Path("/")}, protocol=2)) is None  # a global
    assert walk(pickle.dumps(data, protocol=4)) is None  # memo slots given by count
    assert walk(pickle.dumps(data, protocol=2)[:-1]) is None  # no STOP
    raw = pickle.dumps(data, protocol=2)
    assert _analyse(raw, data, []) is not None
    assert _analyse(raw, {"version": "2.10", "entries": [entry(1, time_created_ns=5)]}, []) is None  # not its reading
    assert _analyse(pickle.dumps({"entries": [entry(1)], "version": "2.10"}, protocol=2), data, []) is None  # not last


def test_the_limit_a_refusal_suggests_reaches_the_rank_it_refused():
    """A dump of rank 10^9 (a job that large, or a crafted file): the flag the message gives must admit it."""
    from torchtriage.sources import limits
    from torchtriage.sources.fr_checks import ranks_in_text

    with pytest.raises(limits.LimitExceeded) as refused:
        ranks_in_text("[0, 1, 999999999]", "pg_config.ranks")
    suggested = int(refused.value.hint.split("--limit rank=")[1].split()[0])
    assert suggested >= 999_999_999
    with limits.using(limits.Limits(rank=suggested)):
        assert ranks_in_text("[0, 1, 999999999]", "pg_config.ranks") == (0, 1, 999_999_999)
