"""Real hangs written with the frameworks' own APIs (tests/jobs/api_hangs.py: DDP, FSDP2, DTensor meshes,
pipelining, object collectives, DCP, ZeRO, the store, sockets, threads, new_group), recorded bare (what
`diagnose --pid` captured) and armed (what `torchtriage run`'s watchdog left), on gloo and on NCCL (four or
two ranks sharing one H200). See tests/fixtures/api_hangs/README.md.

What a user relies on: the rank named is the one that departed; where the evidence cannot decide, it names
candidates that hold it; a verdict at high confidence is never wrong; the culprit's line is where it left.
"""

import shutil
from pathlib import Path

import pytest

from conftest import FIXTURES
from torchtriage.analysis.postmortem import diagnose_paths

RECORDED = FIXTURES / "api_hangs"
# case -> the rank that departed (tests/jobs/api_hangs.py's docstrings)
CULPRIT = {
    "ddp_skip_backward": 1,
    "ddp_uneven_inputs": 1,
    "rank0_barrier": 0,
    "fsdp2_skip_block": 1,
    "pipeline_skip_send": 1,
    "dtensor_mesh_skip": 1,
    "all_gather_object_skip": 1,
    "dcp_save_skip": 1,
    "socket_recv": 1,
    "store_get": 0,
    "checkpoint_thread_deadlock": 1,
    "dataloader_fork_lock": 1,
    "new_group_skip": 1,
    "zero_consolidate": 1,
    "gpu_wedged": 1,
    # The same jobs run with TORCH_NCCL_ENABLE_TIMING=1 (NCCL, armed): the recorder also says which ops a device
    # began, which must name the rank whose GPU never began one and mislead nowhere else.
    "gpu_wedged_timing": 1,
    "ddp_skip_backward_timing": 1,
    "fsdp2_skip_block_timing": 1,
    "dtensor_mesh_skip_timing": 1,
    "store_get_timing": 0,
}
# Every rank's host waits for its GPU alike; only the flight recorder's `started` (TORCH_NCCL_ENABLE_TIMING=1,
# the `_timing` recording) tells the rank whose device never began the all-reduce. Without it: candidates.
DEVICE_ONLY = ("gpu_wedged",)
# Two ranks: rank 1 in `store.get`, rank 0 in the next collective. Rank 0 went on without setting the key, or rank 1
# skipped that collective and went on to the store: both stories leave these stacks and records (the simulator
# draws both, tests/test_sim_hangs.py). Both are the candidates; no rank is named.
STORE_PAIR = ("store_get", "store_get_timing")


def recordings() -> list[tuple[str, str, str]]:
    found = []
    for folder in sorted(RECORDED.glob("*/*/*")):
        backend, case, mode = folder.parts[-3:]
        if folder.is_dir() and case in CULPRIT:
            found.append((backend, case, mode))
    return found


def verdict_of(backend: str, case: str, mode: str):
    return diagnose_paths([str(RECORDED / backend / case / mode)])


@pytest.mark.parametrize(("backend", "case", "mode"), recordings())
def test_the_rank_named_departed_or_the_candidates_hold_it(backend, case, mode):
    verdict = verdict_of(backend, case, mode)
    culprit = CULPRIT[case]
    named = verdict.culprit_ranks
    if named:
        assert named == [culprit], verdict.summary
    else:
        assert culprit in verdict.facts.get("candidates", []), verdict.summary


@pytest.mark.parametrize(
    ("backend", "case"),
    sorted({(b, c) for b, c, m in recordings() if m == "armed" and c not in DEVICE_ONLY + STORE_PAIR}),
)
def test_armed_names_the_culprit(backend, case):
    verdict = verdict_of(backend, case, "armed")
    assert verdict.culprit_ranks == [CULPRIT[case]], verdict.summary


@pytest.mark.parametrize(("backend", "case", "mode"), [r for r in recordings() if r[1] in STORE_PAIR])
def test_one_rank_in_the_store_against_one_in_a_collective_names_both_as_candidates(backend, case, mode):
    verdict = verdict_of(backend, case, mode)
    assert (verdict.culprit_ranks, verdict.confidence) == ([], "low"), verdict.summary
    assert verdict.facts["candidates"] == [0, 1]
    assert "one rank against one, the stacks cannot tell which" in verdict.summary


@pytest.mark.parametrize(
    ("case", "call"),
    [
        ("dcp_save_skip", "torch.distributed.checkpoint.save"),
        ("zero_consolidate", "ZeroRedundancyOptimizer.consolidate_state_dict"),
    ],
)
def test_a_rank_that_skipped_a_call_every_rank_must_make_is_named(case, call):
    """Two ranks: rank 0 waits in the first collective of a checkpoint's save (or a state-dict consolidation), a
    call it never made before; rank 1 went on to the next step. By call order alone, rank 0 made an extra call;
    but every rank must make this one (its documentation says so): rank 1 skipped it. The flight recorder's
    frames show it (armed), and so do the stacks alone (bare)."""
    armed = verdict_of("gloo", case, "armed")
    assert (armed.culprit_ranks, armed.confidence) == ([1], "medium"), armed.summary
    assert f"its peers wait inside {call}, which every rank must call" in armed.summary
    bare = verdict_of("gloo", case, "bare")
    assert (bare.culprit_ranks, bare.confidence) == ([1], "medium"), bare.summary
    assert f"inside {call}, which every rank must call; rank 1 never entered it" in bare.summary
    assert bare.actions[0].title == f"Make every rank call {call}"


def test_fsdp2_on_nccl_names_the_forward_the_culprit_left():
    """FSDP2's backward collectives come from autograd's thread (no Python frames on NCCL) and all-gathers of
    one size complete whichever block they are for: the op mismatch shows seqs after the departure. The line
    is where the culprit's program first left its peers': the forward's block loop its peers were in."""
    verdict = verdict_of("nccl", "fsdp2_skip_block", "armed")
    assert verdict.culprit_ranks == [1] and verdict.confidence == "high"
    frame = verdict.facts["user_frame"]
    assert (Path(frame["file"]).name, frame["function"]) == ("api_hangs.py", "forward")
    assert "from a thread with no Python frames" in verdict.summary


def test_a_gpu_that_never_began_the_all_reduce_is_named_from_the_recorder_states():
    """DDP on NCCL, rank 1's stream stuck in a kernel before the backward: both ranks' Python waits in the loss
    read back; with TORCH_NCCL_ENABLE_TIMING=1 rank 0's all-reduce is `started`, rank 1's `scheduled`."""
    verdict = verdict_of("nccl", "gpu_wedged_timing", "armed")
    assert verdict.culprit_ranks == [1] and verdict.confidence == "medium"
    assert verdict.findings[0].kind == "fr.not_started"
    # Its line is where it waits (the read back), never an earlier collective's call site.
    frame = verdict.facts["user_frame"]
    assert (Path(frame["file"]).name, frame["function"], frame["rank"]) == ("api_hangs.py", "read_back", 1)
    action = verdict.actions[0]
    assert action.rule == "fr.not_started" and action.title.startswith("Look at rank 1's GPU")


def test_the_wedged_gpus_own_dump_alone_names_no_rank_for_sure(tmp_path):
    """Rank 1's dump alone (rank 0's lost): its device never began the all-reduce and timing was on, so it does
    not wait for rank 0; whether rank 0's GPU began it is unknown. Both ranks are candidates, never rank 0
    "where the waits end"."""
    shutil.copytree(RECORDED / "nccl" / "gpu_wedged_timing" / "armed", tmp_path / "armed")
    (tmp_path / "armed" / "fr" / "nccl_trace_rank_0").unlink()
    verdict = diagnose_paths([str(tmp_path / "armed")])
    assert (verdict.culprit_ranks, verdict.confidence, verdict.facts["candidates"]) == ([], "low", [0, 1])
    assert "the GPU of rank 1 never began the all_reduce it waits in" in verdict.summary
    assert not any(action.env.get("TORCH_NCCL_ENABLE_TIMING") for action in verdict.actions)


@pytest.mark.parametrize("mode", ["bare", "armed"])
def test_a_wedged_gpu_without_timing_leaves_candidates_and_says_what_would_tell(mode):
    verdict = verdict_of("nccl", "gpu_wedged", mode)
    assert verdict.culprit_ranks == [] and verdict.confidence == "low"
    assert verdict.facts["candidates"] == [0, 1]
    assert any(action.env.get("TORCH_NCCL_ENABLE_TIMING") == "1" for action in verdict.actions)
