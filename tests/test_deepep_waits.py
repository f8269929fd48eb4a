"""DeepEP's waits name the peer they waited for, never the rank that printed them (it waited).

The intranode barrier (csrc/kernels/utils.cuh barrier_block): each rank adds FINISHED_SUM_TAG (1024) to its own slot
for every NVLink peer and takes it off its peers' slots for itself; past the timeout it prints every slot. A slot
still at 1024 is the peer that never arrived; the ranks that print are those that did. The kernels' timeouts
(intranode.cu, internode_ll.cu) spin on a counter a peer should advance; the low-latency receive lines name it."""

from conftest import triage_json

LINE = "DeepEP timeout check failed: rank = {rank}, thread = {thread}, value = {value})"


def slots(prefix: int, rank: int, missing: int, peers: int = 8) -> list[str]:
    return [
        f"[rank{prefix}]:" + LINE.format(rank=rank, thread=t, value=1024 if t == missing else 0) for t in range(peers)
    ]


def write(tmp_path, lines):
    path = tmp_path / "job.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_peer_whose_slot_is_still_set_is_named_not_the_ranks_that_printed(tmp_path):
    lines = [line for rank in range(8) if rank != 5 for line in slots(rank, rank, missing=5)]
    code, verdict = triage_json(write(tmp_path, lines))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("deepep", [5]), verdict["summary"]


def test_one_ranks_view_names_its_peer_in_the_jobs_numbering(tmp_path):
    # The second node's NVLink rank 2 is the job's rank 10: its peer 6 is rank 14.
    code, verdict = triage_json(write(tmp_path, slots(10, 2, missing=6)))
    assert verdict["culprit_ranks"] == [14], verdict["summary"]


def test_without_the_printers_job_rank_its_peer_is_said_as_a_local_rank_of_some_node(tmp_path):
    # NVLink ranks number one node's GPUs: "rank = 3, thread = 1" printed bare, in a job of many nodes, is node N's
    # local rank 1, not the job's rank 1.
    bare = [LINE.format(rank=3, thread=t, value=1024 if t == 1 else 0) for t in range(8)]
    code, verdict = triage_json(write(tmp_path, bare))
    assert (verdict["category"], verdict["culprit_ranks"]) == ("deepep", []), verdict["summary"]
    assert verdict["facts"]["local_ranks"] == [1] and "local rank 1 of a node" in verdict["summary"]


def test_under_torchruns_local_prefix_the_peer_is_a_local_rank_until_the_agents_account_places_it(tmp_path):
    # "[default3]:" is local rank 3 (torchrun --tee), numbered as DeepEP's NVLink rank: its peer 1 is local rank 1;
    # node 1's agent account (local_ranks 0-7 are global_ranks 8-15) makes it rank 9, not the job's rank 1.
    lines = [f"[default3]:{LINE.format(rank=3, thread=t, value=1024 if t == 1 else 0)}" for t in range(8)]
    code, verdict = triage_json(write(tmp_path, lines))
    assert (verdict["culprit_ranks"], verdict["facts"].get("local_ranks")) == ([], [1]), verdict["summary"]
    account = ["  group_world_size=2", f"  local_ranks={list(range(8))}", f"  global_ranks={list(range(8, 16))}"]
    code, verdict = triage_json(write(tmp_path, [*account, *lines]))
    assert verdict["culprit_ranks"] == [9], verdict["summary"]
    # A line in another numbering than its node's (the low-latency receive's buffer rank 47 under "[default7]:")
    # names its source in its own numbering, as without a prefix.
    receive = "[default7]:Warning: DeepEP timeout for combine receive, rank 47, local_expert_idx 2, src_rank 172"
    assert triage_json(write(tmp_path, [receive]))[1]["culprit_ranks"] == [172]
    # even where the two numberings agree by chance (buffer rank 4 is node 0's local rank 4)
    receive = "[default4]:Warning: DeepEP timeout for combine receive, rank 4, local_expert_idx 2, src_rank 11"
    assert triage_json(write(tmp_path, [receive]))[1]["culprit_ranks"] == [11]


def test_slots_all_cleared_name_nobody(tmp_path):
    # Older releases print no value: the printers wait, and the line does not say for whom.
    lines = [f"[rank{r}]:DeepEP timeout check failed: rank = {r}, thread = 0)" for r in (0, 2, 3, 7)]
    code, verdict = triage_json(write(tmp_path, lines))
    assert verdict["category"] == "deepep" and verdict["culprit_ranks"] == [], verdict["summary"]


def test_a_kernel_timeout_names_no_printer_and_the_low_latency_receive_names_its_source(tmp_path):
    senders = "[rank4]:DeepEP timeout for dispatch senders, rank 4, responsible_channel = 2"
    assert triage_json(write(tmp_path, [senders]))[1]["culprit_ranks"] == []
    receive = "[rank6]:Warning: DeepEP timeout for combine receive, rank 6, local_expert_idx 2, src_rank 1"
    assert triage_json(write(tmp_path, [receive]))[1]["culprit_ranks"] == [1]


def test_a_notify_timeout_leads_the_nccl_timeouts_of_the_peers_it_left_waiting(tmp_path):
    # The notify reduction's printf ("DeepEP notify (GPU reduction) timeout, rank: %d/%d, thread: %d, status: %d | %d,
    # expected: %d") then trap(); the other ranks wait in their next NCCL collective until the watchdog ends it.
    notify = [
        f"[rank{r}]:DeepEP notify (GPU reduction) timeout, rank: {r}/8, thread: {t}, status: 7 | 0, expected: 8"
        for r in (2, 3)
        for t in (0, 4)
    ]
    watchdog = [
        f"[rank{r}]:[E1106 10:24:03.902117365 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=4410, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
        "for 600012 milliseconds before timing out."
        for r in (0, 1, 4, 5, 6, 7)
    ]
    code, verdict = triage_json(write(tmp_path, notify + watchdog))
    assert verdict["category"] == "deepep", verdict["summary"]
    assert verdict["culprit_ranks"] == [], verdict["summary"]  # the printers waited for a peer the line does not name
