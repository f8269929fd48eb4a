"""Hangs that cross process groups: the wait-for graph names the rank that departed, never its victims.

The recordings are real torchrun + gloo jobs (tests/jobs/cross_group.py) run under `torchtriage run`,
whose watchdog wrote every rank's stack and flight-recorder dump while the job hung
(tests/fixtures/fr_cross_group/README.md). Each folder's name gives the case and the culprit.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from conftest import FIXTURES, run_cli
from hung_job import stop_agents
from test_flight_recorder import entry, verdict_of, write
from torchtriage import exit_codes

CROSS = FIXTURES / "fr_cross_group"
CASES = sorted(p.name for p in CROSS.iterdir() if p.is_dir())
# The function each case's culprit departs in (tests/jobs/cross_group.py).
BUG = {
    "world_for_subgroup": "all_reduce_on_the_world_instead",
    "opposite_order": "sync_world",
    "subgroup_barrier": "wait_for_subgroup",
    "early_exit": "end_of_training",
    "skip_send": "sync_world",  # where it went instead of sending: the sends themselves are not recorded
    "recv_before_send": None,  # both stages wait in a recv: nothing tells which departed
    "batch_missing_op": "sync_world",
}

UNDECIDABLE = ("recv_before_send",)


def truth(case: str) -> tuple[str, int, int]:
    kind, culprit, ranks = re.fullmatch(r"(\w+?)_c(\d+)_(\d+)r(?:_g\d+)?", case).groups()
    return kind, int(culprit), int(ranks)


def verdict(verb: str, path) -> dict:
    done = run_cli(verb, "--json", path)
    assert done.returncode == exit_codes.PROBLEM_FOUND, done.stderr.decode()
    return json.loads(done.stdout)


def test_the_recordings_cover_every_case_rank_0_and_both_halves():
    seen = [truth(case) for case in CASES]
    assert len(CASES) == 19
    assert {kind for kind, _, _ in seen} == set(BUG)
    assert any(culprit == 0 for _, culprit, _ in seen)
    assert any(culprit >= ranks // 2 for _, culprit, ranks in seen)  # a culprit in the second half


@pytest.mark.parametrize("case", CASES)
def test_post_mortem_names_the_rank_that_departed(case):
    kind, culprit, ranks = truth(case)
    found = verdict("diagnose", CROSS / case)
    assert {"flight_recorder", "stacks"} <= set(found["facts"]["sources_used"])
    if kind in UNDECIDABLE:
        # Both stages of its pair wait in a recv from the other: the pair are the candidates, no one else.
        pair = sorted({culprit, culprit ^ 1})
        assert found["culprit_ranks"] == [] and found["confidence"] == "low"
        assert found["facts"]["candidates"] == pair
        return
    assert found["culprit_ranks"] == [culprit]
    assert found["confidence"] == "high"


@pytest.mark.parametrize("case", [c for c in CASES if truth(c)[0] not in UNDECIDABLE])
def test_the_flight_recorder_alone_names_it_and_the_line(case):
    kind, culprit, ranks = truth(case)
    found = verdict("fr", CROSS / case / "fr")
    assert found["culprit_ranks"] == [culprit]
    lead = found["findings"][0]
    assert lead["ranks"] == [culprit] and lead["blames"]
    # Whatever decided, the line of the culprit's departing call (or its last call before it) is given.
    text = json.dumps(found["findings"][0]) + json.dumps(found["actions"])
    assert BUG[kind] in text or "last_call_site" in found["facts"], text[:400]


NCCL_CROSS = FIXTURES / "fr_cross_group_nccl"
NCCL_CASES = sorted(p.name for p in NCCL_CROSS.iterdir() if p.is_dir() and not p.name.startswith("split_mismatch"))
# Where the NCCL culprit departs: NCCL records every send and recv, so a recv posted first is told too.
NCCL_BUG = BUG | {"recv_before_send": "receive_first"}


def test_the_nccl_recordings_cover_every_family():
    assert {truth(case)[0] for case in NCCL_CASES} == set(BUG)
    assert any(truth(case)[1] == 0 for case in NCCL_CASES)


def test_a_real_nccl_all_to_all_whose_splits_disagree_names_the_rank_whose_totals_alone_differ():
    # Rank 2 sends one row more to rank 3 than rank 3 expects: NCCL hangs in the all_to_all (gloo refuses it).
    for verb, path in (
        ("fr", NCCL_CROSS / "split_mismatch_c2_4r" / "fr"),
        ("diagnose", NCCL_CROSS / "split_mismatch_c2_4r"),
    ):
        found = verdict(verb, path)
        assert found["culprit_ranks"] == [2] and found["confidence"] == "medium"
        lead = next(f for f in found["findings"] if f["kind"] == "fr.size_mismatch")
        assert "rank 2 sends 20 and receives 16 where every other rank sends 16 and receives 16" in lead["message"]
        assert lead["evidence"][0]["text"].startswith("entries[9]: all_to_all (its own: 20 elements sent, 16 received)")
        assert found["actions"][0]["title"].endswith("cross_group.py:141 in exchange_tokens")


@pytest.mark.parametrize("case", NCCL_CASES)
def test_real_nccl_hangs_across_groups_name_the_rank_that_departed_and_its_line(case):
    # On NCCL every rank issues its ops past the one it waits in (they return at once and queue on the device
    # behind it): a rank that issued the op its peer waits in is not in it while it waits in an earlier one.
    kind, culprit, _ = truth(case)
    for verb, path in (("diagnose", NCCL_CROSS / case), ("fr", NCCL_CROSS / case / "fr")):
        found = verdict(verb, path)
        facts = found["facts"].get("flight_recorder", found["facts"])
        assert found["culprit_ranks"] == [culprit] and found["confidence"] == "high", found["summary"]
        assert facts["decided_by"].startswith("its own program order")
        assert facts["cycle"] == sorted({culprit, culprit ^ 1})  # the culprit and its subgroup or stage peer
        assert facts["user_frame"]["function"] == NCCL_BUG[kind]
        assert "fr.deadlock" in [f["kind"] for f in found["findings"]]


@pytest.mark.parametrize("case", ["early_exit_c1_4r", "skip_send_c1_4r"])
def test_a_real_nccl_hang_with_one_waiting_ranks_dump_lost_does_not_blame_that_rank(tmp_path, case):
    # The waits end in the rank whose dump is missing, as in a rank that died; its stack shows it alive and
    # waiting for the GPU as the others do, so its dump was lost, not the rank: candidates, never it.
    _, culprit, _ = truth(case)
    for lost in sorted({0, 1, 2, 3} - {culprit}):
        folder = tmp_path / f"lost{lost}"
        shutil.copytree(NCCL_CROSS / case, folder)
        (folder / "fr" / f"nccl_trace_rank_{lost}").unlink()
        found = verdict("diagnose", folder)
        assert lost not in found["culprit_ranks"], (lost, found["summary"])
        assert found["culprit_ranks"] in ([], [culprit]), (lost, found["summary"])
        if not found["culprit_ranks"]:
            assert culprit in found["facts"]["candidates"] and found["confidence"] == "low"


def test_a_real_nccl_recv_posted_before_its_send_is_told_by_the_order_nccl_records():
    found = verdict("fr", NCCL_CROSS / "recv_before_send_c0_4r" / "fr")
    assert found["summary"].startswith(
        "deadlock across process groups: rank 0 waits in recv from its rank 1 of default_pg (pg 0) (p2p seq 7) "
        "for rank 1; rank 1 waits in recv from its rank 0 of default_pg (pg 0) (p2p seq 7) for rank 0"
    )
    assert found["facts"]["seq_kind"] == "p2p_seq_id" and found["facts"]["waits_for"]["2"] == "ranks 0-1"
    assert found["facts"]["position_by_rank"]["1"].startswith("waits in recv, called from backward_stage")


def test_the_ops_of_a_nccl_batch_take_the_state_of_its_marker():
    from torchtriage.sources.flight_recorder import load_dumps

    # NCCL never marks a batch's sends and recvs completed: the `coalesced` entry after them says it.
    loaded = load_dumps([str(NCCL_CROSS / "batch_missing_op_c1_4r" / "fr")], jobs=1)
    last = {d.rank: [(op.kind, op.state, op.batch >= 0) for op in d.p2p["0"] if op.seq == 4] for d in loaded.dumps}
    assert last[0] == [("send", "scheduled", True), ("recv", "scheduled", True)]  # rank 1 never sent
    assert last[1] == [("recv", "completed", True)]  # the batch that lacks the send
    assert last[2] == [("send", "completed", True), ("recv", "completed", True)]


def test_ranks_that_issued_ahead_on_nccl_in_the_same_order_are_not_a_deadlock(tmp_path):
    # Every rank has issued the world's all_reduce and its half's, both pending: an ordinary moment on NCCL.
    halves = {
        "1": {"name": "1", "desc": "half", "ranks": "[0, 1]"},
        "2": {"name": "2", "desc": "half", "ranks": "[2, 3]"},
    }
    for rank in range(4):
        sub = str(1 + rank // 2)
        ops = [
            entry(1),
            entry(1, pg=sub, desc="half"),
            entry(2, state="scheduled"),
            entry(2, pg=sub, desc="half", state="scheduled"),
        ]
        write(tmp_path, rank, ops, world=4, extra_pgs={sub: halves[sub]})
    found = verdict_of(tmp_path)
    assert found.culprit_ranks == [] and not any(f.kind == "fr.deadlock" for f in found.findings)


def test_a_deadlock_says_who_waits_for_whom_and_which_rule_decided():
    found = verdict("fr", CROSS / "world_for_subgroup_c2_8r" / "fr")
    assert found["summary"].startswith(
        "deadlock across process groups: ranks 0-1, 3 wait in all_reduce seq 4 of pg 1 for rank 2;"
    )
    lead = found["findings"][0]
    assert lead["kind"] == "fr.deadlock"
    assert found["facts"]["decided_by"] == "its peers' program order and its own"
    assert found["facts"]["cycle"] == [0, 1, 2, 3]
    assert found["facts"]["waits_for"]["2"] == "ranks 0-1, 3"
    assert found["facts"]["waits_for"]["5"] == "ranks 0-1, 3"  # the other half waits on the cycle
    assert found["facts"]["user_frame"]["function"] == "all_reduce_on_the_world_instead"
    # The majority of the world group (ranks 2, 4-7 against 0-1, 3) is superseded, not repeated.
    collateral = [f for f in found["findings"] if f["role"] == "collateral"]
    assert collateral and all("departed" not in f["message"] for f in collateral)


def test_two_ranks_each_waiting_for_the_other_in_a_first_step_are_candidates(tmp_path):
    # Rank 0 calls the pair group's all_reduce, rank 1 the world's, in their very first step: no history,
    # no majority. Ranks 2-3 wait in the world for rank 0. Nothing decides between 0 and 1.
    pair = {"1": {"name": "1", "desc": "pair", "ranks": "[0, 1]"}}
    write(tmp_path, 0, [entry(1, pg="1", desc="pair", state="scheduled", line=10)], world=4, extra_pgs=pair)
    write(tmp_path, 1, [entry(1, state="scheduled", line=11)], world=4, extra_pgs=pair)
    for rank in (2, 3):
        write(tmp_path, rank, [entry(1, state="scheduled", line=11)], world=4, extra_pgs=pair)
    found = verdict_of(tmp_path)
    assert found.culprit_ranks == []
    assert found.confidence == "low"
    assert found.facts["candidates"] == [0, 1]
    assert "candidates" in found.summary


def test_a_rank_that_skipped_a_checkpoint_its_pair_entered_is_named_across_groups(tmp_path):
    # Each step: a world all_reduce, then one on the rank's pair. After step 3 every rank saves a checkpoint of
    # its pair (DCP's save, on the pair's group) but rank 1, which goes on to step 4's world all_reduce: rank 0
    # waits inside the save for rank 1, rank 1 in the world for rank 0 (a cycle of two: no majority), ranks 2-3
    # saved and wait in the world for rank 0. Rank 0's save is a call it never made before; but every rank must
    # make it: rank 1 skipped it.
    from test_flight_recorder import DCP_SAVE, _inside

    pairs = {
        "1": {"name": "1", "desc": "pair", "ranks": "[0, 1]"},
        "2": {"name": "2", "desc": "pair", "ranks": "[2, 3]"},
    }
    for rank in range(4):
        pg = "1" if rank < 2 else "2"
        ops = []
        for step in range(1, 4):
            ops += [entry(step, record=len(ops)), entry(step, pg=pg, desc="pair", record=len(ops) + 1, line=30)]
        if rank == 1:
            ops.append(entry(4, state="scheduled", record=len(ops)))
        else:
            save = _inside(DCP_SAVE, 4, 2) | {"process_group": (pg, "pair"), "pg_id": int(pg), "record_id": len(ops)}
            ops.append(save | ({"state": "scheduled"} if rank == 0 else {}))
            if rank > 1:
                ops.append(entry(4, state="scheduled", record=len(ops)))
        write(tmp_path, rank, ops, world=4, extra_pgs=pairs)
    found = verdict_of(tmp_path)
    assert (found.culprit_ranks, found.confidence) == ([1], "medium"), found.summary
    assert found.facts["decided_by"] == "a call every rank must make"


def test_a_rank_in_no_collective_that_others_wait_for_across_groups_is_the_sink(tmp_path):
    # Rank 1 finished its pair all_reduce and stopped; rank 0 waits in the world for it, ranks 2-3 too.
    pair = {"1": {"name": "1", "desc": "pair", "ranks": "[0, 1]"}}
    steps = [entry(1, pg="1", desc="pair", record=0), entry(1, record=1)]
    write(
        tmp_path,
        0,
        [*steps, entry(2, pg="1", desc="pair", record=2), entry(2, state="scheduled", record=3)],
        world=4,
        extra_pgs=pair,
    )
    write(tmp_path, 1, [*steps, entry(2, pg="1", desc="pair", record=2)], world=4, extra_pgs=pair)
    for rank in (2, 3):
        write(tmp_path, rank, [entry(1, record=0), entry(2, state="scheduled", record=1)], world=4, extra_pgs=pair)
    found = verdict_of(tmp_path)
    assert found.culprit_ranks == [1]
    assert found.findings[0].kind == "fr.not_joined"


def test_one_rank_alone_in_an_op_the_idle_rest_of_its_group_never_issued_makes_them_all_candidates(tmp_path):
    # Rank 2 made one all_reduce more, from the line of every earlier step (so no call site shows it), or ranks 0, 1
    # and 3 are held where no dump records (a new group's communicator, a store wait): one rank departed either way,
    # and the three idle ranks are never the culprits together (simulator seeds 7341, 9507, 12316).
    steps = [entry(seq, record=seq - 1) for seq in range(1, 5)]
    for rank in (0, 1, 3):
        write(tmp_path, rank, steps, world=4)
    write(tmp_path, 2, [*steps, entry(5, state="scheduled", record=4)], world=4)
    found = verdict_of(tmp_path)
    assert (found.culprit_ranks, str(found.confidence)) == ([], "low"), found.summary
    assert found.facts["candidates"] == [0, 1, 2, 3]
    assert "rank 2 alone waits" in found.findings[0].message


def test_a_pipeline_ranks_p2p_counter_does_not_hide_the_all_reduce_it_never_enqueued(tmp_path):
    # The NCCL layout: a batch_isend_irecv's entries carry the collective seq before them, then a
    # `coalesced` marker with is_p2p False; pg_status.last_enqueued_collective holds the p2p seq (here 9).
    def batch(seq, p2p, record, peer):
        return [
            entry(seq, op=f"send {1 - peer}->{peer}", record=record, is_p2p=True, p2p_seq_id=p2p),
            entry(seq, op=f"recv {1 - peer}<-{peer}", record=record + 1, is_p2p=True, p2p_seq_id=p2p),
            entry(seq, op="coalesced", record=record + 2, input_sizes=[], output_sizes=[], p2p_seq_id=p2p),
        ]

    for rank in (0, 1):
        entries, record = [], 0
        for seq in range(1, 4):
            entries.append(entry(seq, record=record))
            entries += batch(seq, seq * 3, record + 1, 1 - rank)
            record += 4
        if rank == 0:
            entries.append(entry(4, state="scheduled", record=record))
        status = {"0": {"last_enqueued_collective": 9 if rank == 1 else 4, "last_completed_collective": 3}}
        write(tmp_path, rank, entries, status=status)
    found = verdict_of(tmp_path)
    assert found.culprit_ranks == [1]
    assert found.findings[0].kind == "fr.not_joined" and found.findings[0].facts["seq"] == 4


def test_a_batch_one_rank_ran_is_not_an_op_mismatch_of_the_collective_before_it(tmp_path):
    marker = entry(3, op="coalesced", record=5, input_sizes=[], output_sizes=[])
    sends = [
        entry(3, op="send 0->1", record=3, is_p2p=True, p2p_seq_id=1),
        entry(3, op="recv 0<-1", record=4, is_p2p=True, p2p_seq_id=1),
    ]
    write(tmp_path, 0, [entry(1, record=0), entry(2, record=1), entry(3, record=2), *sends, marker])
    write(tmp_path, 1, [entry(1, record=0), entry(2, record=1), entry(3, record=2)])
    found = verdict_of(tmp_path)
    assert not [f for f in found.findings if f.kind == "fr.op_mismatch"]


def test_a_stage_that_skipped_its_send_is_found_by_the_ops_gloo_counts_but_does_not_record():
    found = verdict("fr", CROSS / "skip_send_c3_4r" / "fr")
    assert found["culprit_ranks"] == [3]
    assert found["findings"][0]["kind"] == "fr.p2p_skipped"
    assert "it issued 1 send/recv op(s)" in found["summary"] and "earlier steps issued 2" in found["summary"]


def test_the_stacks_of_a_pipeline_name_the_pair_never_the_stage_by_number(tmp_path):
    import shutil

    for stack in (CROSS / "skip_send_c1_4r").glob("rank*.txt"):
        shutil.copy(stack, tmp_path)
    found = verdict("diagnose", tmp_path)
    # Rank 0 waits in its recv from rank 1 (the watchdog writes recv's src); ranks 1-3 in the all_reduce.
    assert found["culprit_ranks"] == [] and found["confidence"] == "low"
    assert found["facts"]["candidates"] == [0, 1]


def test_a_stage_blocked_in_the_wait_of_its_batch_is_waiting_not_idle(tmp_path):
    # The watchdog names the C method a frame is calling on a c10d Work (`work.wait()` of batch_isend_irecv),
    # which a Python stack cannot show: the stage is waiting, not idle in its own code.
    import shutil

    stacks = CROSS / "batch_missing_op_c1_4r"
    assert "c10d::Work::wait" in (stacks / "rank00.txt").read_text()
    for stack in stacks.glob("rank*.txt"):
        shutil.copy(stack, tmp_path)
    found = verdict("diagnose", tmp_path)
    assert found["culprit_ranks"] == [] and found["confidence"] == "low"  # never rank 0 by number
    assert 0 in found["facts"]["candidates"]


# ------------------------------------------------------------------------------------------- live jobs


def _wait_for_verdict(folder, procs, timeout=150) -> dict:
    import time

    path = folder / "hang" / "verdict.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not path.exists():
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.5)
    time.sleep(1)  # the reporter writes the JSON, then the text
    assert path.exists(), f"no verdict in {folder}"
    return json.loads(path.read_text())


@pytest.mark.slow
def test_run_names_rank_0_when_it_all_reduces_on_the_world_instead_of_its_subgroup(tmp_path):
    import subprocess
    import sys

    from hung_job import TORCHRUN, clean_environment

    job = FIXTURES.parent / "jobs" / "cross_group.py"
    env = clean_environment(CASE="world_for_subgroup", CULPRIT="0")
    command = [sys.executable, "-m", "torchtriage", "run", "--out", str(tmp_path), "--stall-seconds", "3", "--"]
    command += [str(TORCHRUN), "--standalone", "--nproc_per_node", "4", str(job)]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        found = _wait_for_verdict(tmp_path, [proc])
    finally:
        stop_agents([proc])
    assert (found["culprit_ranks"], found["confidence"]) == ([0], "high"), found["summary"]
    assert found["facts"]["user_frame"]["function"] == "all_reduce_on_the_world_instead"


def _two_agents(tmp_path, case: str, culprit: int, per_node: int, stall_seconds: int = 4) -> dict:
    """Two torchrun agents on one host, each under `torchtriage run` writing one folder, meeting through c10d's
    rendezvous as two nodes would."""
    import socket
    import subprocess
    import sys

    from hung_job import TORCHRUN, clean_environment

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    job = FIXTURES.parent / "jobs" / "cross_group.py"
    env = clean_environment(CASE=case, CULPRIT=str(culprit))
    procs = []
    for node in (0, 1):
        command = [sys.executable, "-m", "torchtriage", "run", "--out", str(tmp_path)]
        command += ["--stall-seconds", str(stall_seconds), "--"]
        command += [str(TORCHRUN), "--nnodes", "2", "--nproc_per_node", str(per_node), "--node_rank", str(node)]
        command += ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "cross", str(job)]
        procs.append(
            subprocess.Popen(
                command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
            )
        )
    try:
        found = _wait_for_verdict(tmp_path, procs, timeout=240)
    finally:
        stop_agents(procs)
    found["dumps"] = sorted(p.name for p in (tmp_path / "hang" / "fr").iterdir())
    return found


@pytest.mark.slow
def test_sixteen_ranks_on_two_agents_acting_as_two_nodes_name_the_one_culprit(tmp_path):
    # Rank 11 (the second node) departs; its subgroup is ranks 8-15.
    # Sixteen ranks importing torch at once on a small machine can sit in one import for seconds: a stall
    # window that short would fire before the job has started.
    found = _two_agents(tmp_path, "world_for_subgroup", 11, per_node=8, stall_seconds=12)
    assert (found["culprit_ranks"], found["confidence"]) == ([11], "high"), (found["summary"], found["dumps"])
    assert found["facts"]["flight_recorder"]["cycle"] == list(range(8, 16))
    assert len(found["dumps"]) == 16


@pytest.mark.slow
@pytest.mark.parametrize(("case", "culprit"), [("opposite_order", 5), ("early_exit", 2), ("skip_send", 5)])
def test_the_other_families_on_two_agents_name_the_same_culprit(tmp_path, case, culprit):
    found = _two_agents(tmp_path, case, culprit, per_node=4)
    assert (found["culprit_ranks"], found["confidence"]) == ([culprit], "high"), (found["summary"], found["dumps"])
    assert len(found["dumps"]) == 8


# ------------------------------------------------------------------------------- pipelines (p2p), NCCL layout


def p2p(seq_after, kind, src, dst, record, p2p_seq, state="completed", size=256):
    arrow = "->" if kind == "send" else "<-"
    me, peer = (src, dst) if kind == "send" else (dst, src)
    return entry(
        seq_after,
        op=f"{kind} {me}{arrow}{peer}",
        record=record,
        is_p2p=True,
        p2p_seq_id=p2p_seq,
        state=state,
        size=size,
    )


def pipeline_step(rank, step, record, skip_send=False):
    """Stage 0 sends activations to stage 1 and receives gradients back; then both all_reduce (seq step)."""
    ops = []
    if rank == 0:
        ops += [p2p(step - 1, "send", 0, 1, record, 2 * step - 1), p2p(step - 1, "recv", 1, 0, record + 1, 2 * step)]
    else:
        ops.append(p2p(step - 1, "recv", 0, 1, record, 2 * step - 1))
        if not skip_send:
            ops.append(p2p(step - 1, "send", 1, 0, record + 1, 2 * step))
    ops.append(entry(step, record=record + 2))
    return ops


def test_a_stage_that_never_posted_its_send_and_has_no_p2p_entry_left_is_named(tmp_path):
    # Rank 1's buffer holds no p2p entry at all (it never got to post any): its missing send is still seen.
    write(tmp_path, 0, [p2p(0, "send", 0, 1, 0, 1), p2p(0, "recv", 1, 0, 1, 2, state="scheduled")])
    write(
        tmp_path,
        1,
        [entry(1, op="broadcast", record=0, state="completed", pg="1", desc="other")],
        extra_pgs={"1": {"name": "1", "desc": "other", "ranks": "[1]"}},
    )
    found = verdict_of(tmp_path)
    assert found.culprit_ranks == [1]
    assert "rank 1 never posted the recv" in found.findings[0].message


def test_p2p_ops_are_aligned_after_each_collective_when_the_ring_buffers_wrapped(tmp_path):
    # Ten steps; the buffers kept only the last records, starting at different ops. At step 10 stage 1
    # receives the activations but never sends the gradients back: stage 0 waits in its recv.
    for rank in (0, 1):
        entries, record = [], 0
        for step in range(1, 11):
            entries += pipeline_step(rank, step, record, skip_send=(rank == 1 and step == 10))
            record += 3
        if rank == 0:
            entries[-2]["state"] = "scheduled"  # its last recv never completes
            entries = entries[:-1]  # and it never reached the all_reduce
        else:
            entries = entries[:-1]
        keep = 13 if rank == 0 else 11  # different windows, neither from the start
        write(tmp_path, rank, entries[-keep:])
    found = verdict_of(tmp_path)
    assert found.culprit_ranks == [1]
    lead = found.findings[0]
    assert "rank 1 never posted the send matching recv" in lead.message and "after collective 9" in lead.message


@pytest.mark.parametrize(
    ("op", "inputs", "outputs"),
    [
        ("all_reduce", [[1024]], [[512]]),  # an all_reduce's output is its input
        ("all_gather", [[256]], [[256], [256], [256]]),  # a list all_gather of 3 tensors in a group of 4
    ],
)
def test_other_ops_whose_sizes_no_group_can_run_are_not_agreement(tmp_path, op, inputs, outputs):
    for rank in range(4):
        entries = [entry(1, record=0), entry(2, op=op, record=1, input_sizes=inputs, output_sizes=outputs)]
        write(tmp_path, rank, entries, world=4)
    found = verdict_of(tmp_path)
    assert found.findings[0].kind == "fr.size_mismatch" and "every rank alike" in found.findings[0].message


def test_an_all_gather_whose_output_is_wrong_on_every_rank_alike_is_not_agreement(tmp_path):
    for rank in range(4):
        entries = [entry(1, record=0), entry(2, op="_all_gather_base", record=1, size=1024, output_sizes=[[2048]])]
        write(tmp_path, rank, entries, world=4)
    found = verdict_of(tmp_path)
    assert found.findings and found.findings[0].kind == "fr.size_mismatch"
    assert "every rank alike" in found.findings[0].message
    assert fr_exit_code(tmp_path) == exit_codes.PROBLEM_FOUND  # never "the dumps agree"


def fr_exit_code(folder) -> int:
    return run_cli("fr", folder).returncode


# ------------------------------------------------------------------------------------ stacks alone (py-spy)


def spy_dump(
    pid: int, function: str, line: int, kwargs: str, args: str = "(<Tensor at 0x7f00>)", op="all_reduce"
) -> str:
    """py-spy's `dump --locals` text (src/dump.rs): c10d_logger's wrapper shows what the caller passed."""
    return f"""Process {pid}: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread {pid} (idle): "MainThread"
    {op} (torch/distributed/distributed_c10d.py:3252)
        Arguments:
            tensor: <Tensor at 0x7f00>
            group: <torch._C._distributed_c10d.ProcessGroup at 0x7f10>
    _exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)
        Locals:
            args: {args}
            kwargs: {kwargs}
    {function} (train.py:{line})
    main (train.py:111)
"""


def stacks_verdict_of(tmp_path, dumps: dict[int, str]) -> dict:
    for rank, text in dumps.items():
        (tmp_path / f"rank{rank:02d}.txt").write_text(text)
    done = run_cli("diagnose", "--json", tmp_path)
    return json.loads(done.stdout)


SUBGROUP = '{"group": <torch._C._distributed_c10d.ProcessGroup at 0x7f20>}'


def test_stacks_alone_exclude_the_ranks_blocked_in_their_subgroup_and_name_the_one_apart(tmp_path):
    # Rank 0 waits in its subgroup; rank 1 all_reduces on the world from another line; ranks 2-3 wait in
    # the world all_reduce at the usual line. By numbers alone ranks 0 and 1 would both be the minority.
    found = stacks_verdict_of(
        tmp_path,
        {
            0: spy_dump(100, "sync_subgroup", 54, SUBGROUP),
            1: spy_dump(101, "all_reduce_on_the_world_instead", 62, "{}"),
            2: spy_dump(102, "sync_world", 58, "{}"),
            3: spy_dump(103, "sync_world", 58, "{}"),
        },
    )
    assert found["culprit_ranks"] == [1] and found["confidence"] == "medium"
    assert "on a group its caller passed" in found["summary"]


def test_stacks_alone_name_candidates_when_every_rank_on_the_world_waits_alike(tmp_path):
    found = stacks_verdict_of(
        tmp_path,
        {
            0: spy_dump(100, "sync_subgroup", 54, SUBGROUP),
            1: spy_dump(101, "sync_world", 58, "{}"),
            2: spy_dump(102, "sync_world", 58, "{}"),
            3: spy_dump(103, "sync_world", 58, "{}"),
        },
    )
    assert found["culprit_ranks"] == [] and found["confidence"] == "low"
    assert found["facts"]["candidates"] == [0, 1, 2, 3]


def test_a_group_passed_by_position_is_not_read_as_the_default():
    from torchtriage.analysis.positions import group_given
    from torchtriage.sources.pyspy import parse_text

    def frames(text):
        (process,) = parse_text(text, "rank0.txt")
        return process.threads[0].frames

    assert group_given(frames(spy_dump(1, "f", 1, "{}"))) is False
    assert group_given(frames(spy_dump(1, "f", 1, SUBGROUP))) is True
    assert group_given(frames(spy_dump(1, "f", 1, '{"group": None}'))) is False  # group=None: the default
    positional = spy_dump(1, "f", 1, "{}", args="(<Tensor at 0x7f00>, <RedOpType at 0x7f01>, <ProcessGroup at 0x7f20>)")
    assert group_given(frames(positional)) is None
    assert (
        group_given(frames(spy_dump(1, "f", 1, "{}").split("        Arguments:")[0] + "    main (train.py:111)\n"))
        is None
    )


@pytest.mark.slow
@pytest.mark.parametrize(("case", "culprit", "named"), [("world_for_subgroup", 1, [1]), ("opposite_order", 1, [])])
def test_live_stacks_with_locals_never_blame_the_blocked_subgroup(case, culprit, named):
    pytest.importorskip("torch")
    from hung_job import HungJob

    job_file = FIXTURES.parent / "jobs" / "cross_group.py"
    with HungJob(culprit=culprit, ranks=4, env={"CASE": case, "CULPRIT": str(culprit)}, script=job_file) as job:
        done = run_cli("diagnose", "--pid", job.proc.pid, "--json", timeout=180)
    found = json.loads(done.stdout)
    assert found["culprit_ranks"] == named
    # Rank 0 waits in its subgroup for rank 1, whatever rank 1 did: it is never the culprit.
    assert 0 not in found["culprit_ranks"]
    if not named:
        assert found["confidence"] == "low" and culprit in found["facts"]["candidates"]


# --------------------------------------------------------------- what NCCL's buffer cannot show (lazy init)


def _three_wait_for_rank_1(folder, eager: bool, backend: str = "nccl", gloo_recorder: bool = True):
    """Ranks 0, 2, 3 wait in the world's all_reduce seq 3; rank 1 completed seq 2 and recorded nothing since.
    NCCL lists a group in `pg_config` once its communicator exists: created eagerly, every rank's dump lists
    the group `tp` of ranks 0-1 it never used; lazily, none does."""
    folder.mkdir(exist_ok=True)
    tp = {"1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"}} if eager else {}
    for rank in range(4):
        entries = [entry(1, record=0), entry(2, record=1)]
        if rank != 1:
            entries.append(entry(3, state="scheduled", record=len(entries)))
        status = None
        for e in entries:
            e["profiling_name"] = e["profiling_name"].replace("nccl:", f"{backend}:")
        if backend == "gloo" and gloo_recorder:  # it marks no op completed: its counters say what is in flight
            for e in entries:
                e["state"] = "scheduled"
            status = {"0": {"last_enqueued_collective": len(entries), "last_completed_collective": 2}}
        write(folder, rank, entries, world=4, extra_pgs=tp, status=status)
    return verdict_of(folder)


def test_a_rank_in_no_recorded_op_on_nccl_may_be_creating_a_communicator_and_the_verdict_says_so(tmp_path):
    found = _three_wait_for_rank_1(tmp_path, eager=False)
    assert found.culprit_ranks == [1]  # three wait for it: the likeliest, not a certainty
    note = next(f for f in found.findings if f.kind == "fr.unrecorded_init")
    assert note.ranks == [1] and "the first collective of a group it has not used before" in note.message
    assert "device_id" in note.message  # what makes such ops visible
    assert found.confidence == "medium"  # the buffer cannot tell idle from blocked in creation
    assert found.facts["may_wait_unrecorded"] == {"1": ["the first collective of a group it has not used before"]}


def test_no_such_doubt_where_the_job_created_its_communicators_eagerly(tmp_path):
    eager = _three_wait_for_rank_1(tmp_path / "eager", eager=True)
    assert eager.culprit_ranks == [1] and eager.confidence == "high"
    assert not any(f.kind.startswith("fr.unrecorded") for f in eager.findings)


def test_on_gloo_a_rank_in_no_recorded_op_may_wait_in_a_send_or_recv(tmp_path):
    gloo = _three_wait_for_rank_1(tmp_path / "gloo", eager=False, backend="gloo")
    assert gloo.culprit_ranks == [1] and gloo.confidence == "medium"
    note = next(f for f in gloo.findings if f.kind == "fr.unrecorded_p2p")
    assert note.ranks == [1] and "send or recv" in note.message


def test_a_recorder_that_marks_gloos_ops_completed_shows_where_the_rank_waits(tmp_path):
    # The backend-agnostic recorder (its hooks record every op, sends and recvs too, with states): a rank with
    # no pending op waits in none, as on NCCL.
    hooked = _three_wait_for_rank_1(tmp_path / "hooked", eager=False, backend="gloo", gloo_recorder=False)
    assert hooked.culprit_ranks == [1] and hooked.confidence == "high"
    assert not any(f.kind.startswith("fr.unrecorded") for f in hooked.findings)
