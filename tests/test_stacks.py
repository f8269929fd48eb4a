"""Reading every rank's stack: states, groups, the culprit and its frame; plus one live hung job."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import FIXTURES, H200
from torchtriage.analysis import stacks as S
from torchtriage.analysis.stacks import (
    analyze_positions,
    analyze_stacks,
    assess_stacks,
    classify_thread,
    stacks_verdict,
)
from torchtriage.knowledge.frames import is_library_file
from torchtriage.model import Frame, Local, SourceKind
from torchtriage.sources.pyspy import ProcessStack, ThreadStack, parse_dump
from torchtriage.sources.stacks import load_rank_stacks

STACKS = FIXTURES / "stacks"
HANG_JOB = Path(__file__).parent / "jobs" / "hang.py"
FORMS = {"text": "rank??.txt", "json": "rank??.json", "native": "rank??.native.txt"}


def load(case: str, form: str) -> dict[int, ProcessStack]:
    return load_rank_stacks(sorted((STACKS / case).glob(FORMS[form])))


# case -> (culprit ranks, (function, line) of the culprit's user frame) per tests/fixtures/stacks/README.md
DECIDED = {
    "skip": ([1], ("culprit_skip", 67)),
    "skip_rank0": ([0], ("culprit_skip", 67)),
    "skip_4ranks": ([2], ("culprit_skip", 67)),
    "dataloader": ([1], ("culprit_dataloader", 97)),
    "lock": ([1], ("Counter.log", 112)),
}
# Ranks in different collectives (or call sites) whose groups the stacks do not show (these dumps hold no
# locals): the stacks alone must not pick one. Two ranks cannot be told apart; of four, the one apart may be on
# a subgroup whose other member went on to the majority's collective.
UNDECIDED = {
    "op": ("all_reduce", "broadcast"),
    "barrier": ("all_reduce", "barrier"),
    "subgroup": ("all_reduce",),
    "barrier_4ranks": ("all_reduce", "barrier"),
    "subgroup_4ranks": ("all_reduce",),
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", DECIDED)
def test_recorded_hangs_name_the_culprit_and_its_line(case, form):
    culprits, (function, line) = DECIDED[case]
    analysis = analyze_stacks(load(case, form))
    verdict = stacks_verdict(analysis)
    assert verdict.category == "hang"
    assert verdict.culprit_ranks == culprits
    frame = verdict.facts["user_frame"]
    assert (frame["function"], frame["line"], frame["rank"]) == (function, line, culprits[0])
    assert frame["file"].endswith("hang.py")
    if case.startswith("subgroup"):
        # One collective from two lines may be two process groups: the majority could be waiting for the
        # minority's peers in another group, so the stacks alone only guess.
        assert verdict.confidence == "low"
    else:
        assert verdict.confidence == ("high" if len(analysis.positions) == 4 else "medium")
    # Every healthy rank waits in the peers' all_reduce at hang.py:63.
    for rank, position in analysis.positions.items():
        if rank not in culprits:
            assert (position.state, position.op, position.user_frame.line) == (S.COLLECTIVE, "all_reduce", 63)
    primary = [f for f in verdict.findings if f.role == "primary"]
    assert primary and primary[0].ranks == culprits
    assert any(e.rank == culprits[0] and e.text == f"{function} (hang.py:{line})" for e in primary[0].evidence)
    assert f":{line}" in verdict.actions[0].title and f"rank {culprits[0]}" in verdict.actions[0].title
    json.dumps(verdict.to_json())


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", UNDECIDED)
def test_ranks_in_collectives_of_unseen_groups_are_described_not_judged(case, form):
    analysis = analyze_stacks(load(case, form))
    assert analysis.culprit_ranks == [] and analysis.confidence == "low"
    assert {p.op for p in analysis.positions.values()} == set(UNDECIDED[case])
    assert all(p.state == S.COLLECTIVE for p in analysis.positions.values())
    finding = next(f for f in analysis.findings if f.kind == "stacks.different_collective")
    ranks = sorted(analysis.positions)
    assert finding.ranks == ranks and finding.role == "symptom"
    assert assess_stacks(analysis).facts["candidates"] == ranks
    assert "rank 0 waits in" in finding.message or "ranks 0" in finding.message
    assert stacks_verdict(analysis).culprit_ranks == []


def test_rank_0_as_the_barrier_culprit_is_not_blamed_for_being_rank_0_either_way():
    for case in ("barrier", "barrier_rank0"):
        assert analyze_stacks(load(case, "text")).culprit_ranks == []


@pytest.mark.parametrize(
    "case, form, state, op",
    [
        ("skip", "text", S.SLEEPING, None),  # idle in user code: time.sleep has no Python frame
        ("skip", "native", S.SLEEPING, "sleep"),  # clock_nanosleep / time_sleep
        ("dataloader", "text", S.DATALOADER, "waiting for a worker's batch"),
        ("lock", "text", S.SLEEPING, None),  # Lock.acquire is C: invisible without --native
        ("lock", "native", S.LOCK, "Lock.acquire"),
    ],
)
def test_the_culprit_state_follows_what_the_dump_can_show(case, form, state, op):
    culprit = DECIDED[case][0][0]
    position = analyze_stacks(load(case, form)).positions[culprit]
    assert (position.state, position.op) == (state, op)


def test_native_peer_stacks_show_work_wait_under_the_collective():
    position = analyze_stacks(load("skip", "native")).positions[0]
    assert (position.state, position.op, position.where.function) == (S.COLLECTIVE, "all_reduce", "all_reduce")


# --- the NCCL recordings from two H200s ------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["pyspy_rank", "pyspy_native_rank"])
def test_h200_skip_culprit_sleeps_while_rank_0_waits_for_the_gpu(prefix):
    dumps = load_rank_stacks([H200 / "skip" / f"{prefix}{r}.txt" for r in (0, 1)])
    analysis = analyze_stacks(dumps)
    assert analysis.culprit_ranks == [1]
    waiting, culprit = analysis.positions[0], analysis.positions[1]
    assert (waiting.state, waiting.user_frame.line) == (S.GPU_WAIT, 23)
    assert waiting.op in ("torch.cuda.synchronize", "cuCtxSynchronize_v2", "cudaDeviceSynchronize")
    assert (culprit.state, culprit.user_frame.function, culprit.user_frame.line) == (S.SLEEPING, "train_step", 17)
    assert stacks_verdict(analysis).facts["user_frame"] == {
        "file": "nccl_case.py",
        "line": 17,
        "function": "train_step",
        "rank": 1,
    }


@pytest.mark.parametrize("case, culprit_line", [("size", 19), ("op", 21)])
def test_h200_size_and_op_both_wait_for_the_gpu_at_different_lines_and_stay_undecided(case, culprit_line):
    dumps = load_rank_stacks([H200 / case / f"pyspy_rank{r}.txt" for r in (0, 1)])
    analysis = analyze_stacks(dumps)
    assert analysis.culprit_ranks == []
    assert [p.user_frame.line for p in analysis.positions.values()] == [23, culprit_line]
    assert {p.state for p in analysis.positions.values()} == {S.GPU_WAIT}
    assert any(f.kind == "stacks.different_collective" for f in analysis.findings)


# --- stacks built here -----------------------------------------------------------------------------


def frame(text: str) -> Frame:
    """'func (file:line)' or 'func (lib.so)' -> a frame, parsed the way a dump line is."""
    (process,) = parse_dump(f'Process 1: p\nPython v3.11.0 (/p)\n\nThread 1 (idle): "MainThread"\n    {text}\n')
    return process.threads[0].frames[0]


def thread(*frames: str, active: bool = False, name: str = "MainThread") -> ThreadStack:
    return ThreadStack(1, name, active, False, tuple(frame(f) for f in frames))


def process(*frames: str, active: bool = False) -> ProcessStack:
    return ProcessStack(pid=1, source="dump.txt", threads=(thread(*frames, active=active),))


C10D = "torch/distributed/distributed_c10d.py"
ALL_REDUCE = (f"all_reduce ({C10D}:3252)", "wrapper (torch/distributed/c10d_logger.py:83)", "step (train.py:40)")
IN_LOADER = (
    "Queue.get (multiprocessing/queues.py:113)",
    "_MultiProcessingDataLoaderIter._next_data (torch/utils/data/dataloader.py:1505)",
    "load_batch (data.py:88)",
)


def test_eight_ranks_one_in_the_data_loader():
    dumps = {r: process(*(IN_LOADER if r == 5 else ALL_REDUCE)) for r in range(8)}
    verdict = stacks_verdict(analyze_stacks(dumps))
    assert (verdict.culprit_ranks, verdict.confidence) == ([5], "high")
    assert "rank 5" in verdict.summary and "load_batch at data.py:88" in verdict.summary
    assert "ranks 0-4, 6-7 wait in all_reduce" in verdict.summary


def test_rank_0_is_blamed_only_when_it_is_the_one_elsewhere():
    healthy_rank0 = {0: process(*ALL_REDUCE), 1: process(*ALL_REDUCE), 2: process("step (train.py:12)", active=True)}
    assert analyze_stacks(healthy_rank0).culprit_ranks == [2]
    culprit_rank0 = {0: process("step (train.py:12)", active=True), 1: process(*ALL_REDUCE), 2: process(*ALL_REDUCE)}
    assert analyze_stacks(culprit_rank0).culprit_ranks == [0]


def test_all_ranks_in_the_same_collective_give_no_culprit_and_point_to_the_flight_recorder():
    analysis = analyze_stacks({r: process(*ALL_REDUCE) for r in range(4)})
    assert analysis.culprit_ranks == [] and len(analysis.groups) == 1
    (finding,) = analysis.findings
    assert finding.kind == "stacks.stack_groups" and "flight recorder" in finding.message


def test_most_ranks_running_is_not_a_hang_verdict():
    dumps = {0: process(*ALL_REDUCE)} | {r: process("step (train.py:12)", active=True) for r in (1, 2, 3)}
    analysis = analyze_stacks(dumps)
    assert analysis.culprit_ranks == []
    assert "may still be running" in analysis.findings[-1].message


def on_default_group(stack: ProcessStack) -> ProcessStack:
    """The stack as `py-spy dump --locals` shows it when the collective was called without a group."""
    (main,) = stack.threads
    # dist.barrier() passes nothing (a tensor as its one argument would be read as its group); an all_reduce its tensor.
    args = "()" if main.frames[0].function == "barrier" else "(<torch.Tensor at 0x7f>,)"
    frames = tuple(
        replace(f, locals=(Local("args", args, True), Local("kwargs", "{}", True)))
        if f.file.endswith("c10d_logger.py")
        else f
        for f in main.frames
    )
    return replace(stack, threads=(replace(main, frames=frames),))


def test_a_minority_in_another_collective_is_blamed_only_on_one_group():
    barrier = (f"barrier ({C10D}:5356)", "wrapper (torch/distributed/c10d_logger.py:83)", "sync (train.py:50)")
    split = {r: on_default_group(process(*(barrier if r in (1, 3) else ALL_REDUCE))) for r in range(4)}
    assert analyze_stacks(split).culprit_ranks == []
    one_off = {r: on_default_group(process(*(barrier if r == 3 else ALL_REDUCE))) for r in range(4)}
    assert analyze_stacks(one_off).culprit_ranks == [3]
    # Without locals the groups are unseen: rank 3's barrier may be on a subgroup whose other member went on to
    # the all_reduce (that member departed, not rank 3). Every waiting rank is a candidate.
    unseen = analyze_stacks({r: process(*(barrier if r == 3 else ALL_REDUCE)) for r in range(4)})
    assert unseen.culprit_ranks == []
    assert assess_stacks(unseen).facts["candidates"] == [0, 1, 2, 3]


IN_DCP_SAVE = (
    f"all_gather ({C10D}:4280)",
    f"gather_object ({C10D}:3631)",
    "gather_object (torch/distributed/checkpoint/utils.py:135)",
    "_save_state_dict (torch/distributed/checkpoint/state_dict_saver.py:487)",
    "save (torch/distributed/checkpoint/state_dict_saver.py:196)",
    "wrapper (torch/distributed/checkpoint/logger.py:90)",
    "checkpoint (train.py:60)",
)


@pytest.mark.parametrize("inside", [{0}, {0, 1, 2}, {1, 3}])
def test_ranks_that_never_entered_a_call_every_rank_must_make_are_named(inside):
    # Some ranks wait inside a checkpoint's save (every rank must call it), the rest in the next step's
    # all_reduce: those skipped the save, however many they are, since the savers wait for a member that never
    # came and every other rank is at the one other place.
    analysis = analyze_stacks({r: process(*(IN_DCP_SAVE if r in inside else ALL_REDUCE)) for r in range(4)})
    skipped = sorted(set(range(4)) - inside)
    assert (analysis.culprit_ranks, analysis.confidence) == (skipped, "medium")
    assert analysis.findings[0].kind == "stacks.skipped_all_rank_call"
    assert "inside torch.distributed.checkpoint.save, which every rank must call" in analysis.findings[0].message
    # The same collective called from the user's own code decides nothing of the kind.
    own = (f"all_gather ({C10D}:4280)", "wrapper (torch/distributed/c10d_logger.py:83)", "checkpoint (train.py:60)")
    analysis = analyze_stacks({r: process(*(own if r in inside else ALL_REDUCE)) for r in range(4)})
    assert not any(f.kind == "stacks.skipped_all_rank_call" for f in analysis.findings)


def test_several_ranks_elsewhere_are_all_culprits_when_the_waiting_ranks_are_not_fewer():
    dumps = {0: process(*ALL_REDUCE), 1: process(*IN_LOADER), 2: process(*ALL_REDUCE), 3: process("f (t.py:1)")}
    analysis = analyze_stacks(dumps)
    assert analysis.culprit_ranks == [1, 3]
    assert analysis.findings[0].kind == "stacks.not_in_collective"


@pytest.mark.parametrize(
    "frames, active, state, op",
    [
        ((f"_all_gather_base ({C10D}:10)", "g (t.py:1)"), False, S.COLLECTIVE, "all_gather_into_tensor"),
        (
            (f"all_gather ({C10D}:3000)", f"all_gather_object ({C10D}:3100)", "g (t.py:1)"),
            False,
            S.COLLECTIVE,
            "all_gather_object",  # the outermost c10d function: what the user called
        ),
        ((f"batch_isend_irecv ({C10D}:10)", "pp (t.py:1)"), False, S.COLLECTIVE, "batch_isend_irecv"),
        (("c10d::Work::wait (libtorch_cpu.so)", "step (t.py:1)"), False, S.COLLECTIVE, "Work.wait"),
        (
            ("Event.synchronize (torch/cuda/streams.py:220)", "step (t.py:1)"),
            True,
            S.GPU_WAIT,
            "Stream/Event.synchronize",
        ),
        (
            ("cudaStreamSynchronize (libcudart.so.12)", "step (t.py:9)"),  # .item() with --native
            True,
            S.GPU_WAIT,
            "cudaStreamSynchronize",
        ),
        (("Condition.wait (threading.py:327)", "Queue.get (queue.py:171)", "w (t.py:1)"), False, S.LOCK, None),
        (("Thread.join (threading.py:1112)", "w (t.py:1)"), False, S.LOCK, "Thread.join"),
        (("recv_into (libc.so.6)", "read (t.py:4)"), False, S.BLOCKED, "recv_into"),
        (("SSLSocket.recv (ssl.py:1200)", "read (t.py:4)"), False, S.BLOCKED, None),
        (("forward (model.py:20)",), True, S.COMPUTING, None),
        (("__getitem__ (data.py:5)", "fetch (torch/utils/data/_utils/fetch.py:52)"), True, S.DATALOADER, None),
    ],
)
def test_classify_thread(frames, active, state, op):
    got_state, got_op, _ = classify_thread(thread(*frames, active=active))
    assert got_state == state
    if op is not None:
        assert got_op == op


def test_no_python_frames_is_its_own_state():
    assert classify_thread(thread("0x7f00 (libc.so.6)"))[0] == S.NO_STACK
    assert classify_thread(None)[0] == S.NO_STACK


@pytest.mark.parametrize(
    "path, library",
    [
        ("torch/distributed/distributed_c10d.py", True),
        ("threading.py", True),
        ("multiprocessing/connection.py", True),
        ("transformers/trainer.py", True),
        ("train.py", False),
        ("myproject/model.py", False),
        ("<frozen importlib._bootstrap>", True),
        ("/opt/venv/lib/python3.11/site-packages/mylib/x.py", True),
        ("/usr/lib/python3.11/threading.py", True),
        ("/workspace/project/tests/jobs/hang.py", False),
        ("/opt/pytorch/torch/nn/modules/module.py", True),
    ],
)
def test_library_or_user_file(path, library):
    assert is_library_file(path) == library


def test_positions_can_be_analysed_without_dumps():
    rank0 = S.RankPosition(0, S.COLLECTIVE, "all_reduce", None, frame("step (t.py:3)"), SourceKind.PYSPY, "a")
    rank1 = S.RankPosition(1, S.COMPUTING, None, None, frame("step (t.py:9)"), SourceKind.PYSPY, "b")
    analysis = analyze_positions({1: rank1, 0: rank0})
    assert analysis.culprit_ranks == [1] and list(analysis.positions) == [0, 1]


def test_ranks_in_one_broadcast_line_with_different_sources_are_candidates_never_culprits():
    # A rooted collective's source is in its frame's locals (py-spy --locals). Ranks at one broadcast line with
    # different sources may be at different calls of a loop over sources (gloo's tree broadcast lets a member go
    # on to the next call): a majority decides nothing. The simulator's ZeRO-style loops (tests/sim) had the
    # majority at the next call and a victim alone at the earlier one.
    def waiting(rank: int, root: int) -> S.RankPosition:
        return S.RankPosition(
            rank, S.COLLECTIVE, "broadcast", None, frame("sync (t.py:7)"), SourceKind.PYSPY, "a", root=root
        )

    for roots in ({0: 2, 1: 1, 2: 2, 3: 2}, {0: 0, 1: 0, 2: 0, 3: 3}, {0: 0, 1: 1}):
        analysis = analyze_positions({r: waiting(r, root) for r, root in roots.items()})
        assert analysis.culprit_ranks == [] and analysis.confidence == "low"
        assert analysis.findings[0].kind == "stacks.root_mismatch"
        assert analysis.findings[0].facts["candidates"] == sorted(roots)
    same = analyze_positions({r: waiting(r, 0) for r in range(3)})
    assert not any(f.kind == "stacks.root_mismatch" for f in same.findings)


# --- one real hung job -----------------------------------------------------------------------------


def _venv_tool(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _kill_job(job: subprocess.Popen) -> None:
    """torchrun starts every worker in its own session: kill the workers' groups, then the agent's."""
    workers = []
    for task in Path(f"/proc/{job.pid}/task").glob("*"):
        try:
            workers += [int(pid) for pid in (task / "children").read_text().split()]
        except OSError:
            pass
    for group in [*workers, job.pid]:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    job.wait(timeout=30)


@pytest.mark.slow
def test_a_live_hung_job_is_diagnosed_from_real_py_spy_dumps(tmp_path):
    py_spy = _venv_tool("py-spy")
    if not os.path.exists(py_spy):
        pytest.skip("py-spy is not installed next to this Python")
    env = os.environ | {"HANG_MODE": "skip", "HANG_CULPRIT": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [_venv_tool("torchrun"), "--standalone", "--nproc_per_node=2", str(HANG_JOB)]
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    ready: dict[int, int] = {}
    output: list[str] = []
    all_ready = threading.Event()

    def read() -> None:
        for raw in job.stdout:
            output.append(line := raw.decode(errors="replace"))
            if m := re.match(r"READY rank=(\d+) pid=(\d+)", line):
                ready[int(m[1])] = int(m[2])
                if len(ready) == 2:
                    all_ready.set()
        all_ready.set()

    try:
        threading.Thread(target=read, daemon=True).start()
        assert all_ready.wait(120) and len(ready) == 2, "".join(output[-30:])
        time.sleep(2)  # READY is printed just before the hang point: let both ranks block
        for rank, pid in ready.items():
            for suffix, flags in ((".txt", []), (".json", ["--json"])):
                done = subprocess.run([py_spy, "dump", "--pid", str(pid), *flags], capture_output=True, timeout=60)
                assert done.returncode == 0, done.stderr.decode()
                (tmp_path / f"rank{rank:02d}{suffix}").write_bytes(done.stdout)
    finally:
        _kill_job(job)
    for pattern in ("rank??.txt", "rank??.json"):
        verdict = stacks_verdict(analyze_stacks(load_rank_stacks(sorted(tmp_path.glob(pattern)))))
        assert verdict.culprit_ranks == [1]
        assert verdict.facts["user_frame"]["function"] == "culprit_skip"
        assert verdict.facts["state_by_rank"] == {"0": S.COLLECTIVE, "1": S.SLEEPING}


def test_text_and_json_dumps_of_different_ranks_still_group_together():
    mixed = {0: load("skip_4ranks", "json")[0], 1: load("skip_4ranks", "text")[1]}
    mixed |= {2: load("skip_4ranks", "json")[2], 3: load("skip_4ranks", "text")[3]}
    analysis = analyze_stacks(mixed)
    assert analysis.culprit_ranks == [2] and analysis.groups[0].ranks == (0, 1, 3)


# --- waits outside torch.distributed's collectives (tests/fixtures/stacks/outside_waits, recorded) -------------


def _threads_of(name: str) -> dict[str, tuple]:
    (process,) = parse_dump((STACKS / "outside_waits" / name).read_text(), name)
    return {t.name: classify_thread(t)[:2] for t in process.threads}


def test_native_frames_tell_a_store_wait_a_socket_a_sleep_and_a_lock_apart():
    states = _threads_of("rank00.native.txt")
    assert states["MainThread"] == (S.STORE, "store get")
    assert states["socket-recv"] == (S.BLOCKED, "socket recv")
    assert states["sleeper"] == (S.SLEEPING, "sleep")
    assert states["locked"][0] == S.LOCK and states["queue"][0] == S.LOCK


def test_without_native_frames_a_wait_in_the_jobs_own_line_is_not_read_as_a_store_wait():
    plain = _threads_of("rank00.txt")
    assert plain["MainThread"][0] == S.SLEEPING  # idle in waits.py's main: which C call, only --native says
    assert plain["queue"][0] == S.LOCK  # Queue.get's Python frames say it


def test_a_rank_at_the_same_place_as_one_with_native_frames_takes_their_reading():
    native = parse_dump((STACKS / "outside_waits" / "rank00.native.txt").read_text(), "rank00.native.txt")[0]
    plain = parse_dump((STACKS / "outside_waits" / "rank00.txt").read_text(), "rank01.txt")[0]
    found = S.positions({0: native, 1: plain})
    assert found[1].state == S.STORE and found[1].alike == 0
    assert "rank 0's --native dump" in S.describe(found[1])


def test_ranks_in_the_store_wait_for_the_one_rank_outside_it():
    waiting = {r: process("c10d::TCPStore::get (libtorch_cpu.so)", "share_config (train.py:54)") for r in (1, 2, 3)}
    analysis = analyze_stacks(waiting | {0: process(*ALL_REDUCE)})
    assert analysis.culprit_ranks == [0] and analysis.confidence == "medium"
    assert any(f.kind == "stacks.store_wait" and f.blames for f in analysis.findings)


def test_a_rank_of_the_node_with_no_process_is_the_culprit_its_peers_wait_for():
    dumps = {r: process(*ALL_REDUCE) for r in (0, 1, 3)}
    analysis = analyze_stacks(dumps, gone={2: "no process on node-a, which runs ranks 0-3"})
    assert analysis.culprit_ranks == [2] and analysis.confidence == "high"
    assert analysis.findings[0].kind == "stacks.rank_gone" and "no process on node-a" in analysis.findings[0].message


def test_idle_inside_backward_waits_in_the_gradient_collectives_and_running_it_computes():
    frames = ("_engine_run_backward (torch/autograd/graph.py:829)", "backward (torch/_tensor.py:648)", "step (t.py:9)")
    assert classify_thread(thread(*frames))[:2] == (S.COLLECTIVE, S.BACKWARD_OP)
    assert classify_thread(thread(*frames, active=True))[0] == S.COMPUTING


SETUP_STUCK = FIXTURES / "stacks" / "restart_stuck_in_setup"


def _setup_verdict(tmp_path: Path, **process_fields) -> object:
    """The recording, its capture summary's processes changed as given."""
    from torchtriage.analysis.postmortem import diagnose_paths

    folder = tmp_path / "capture"
    shutil.copytree(SETUP_STUCK, folder)
    summary = json.loads((folder / "summary.json").read_text())
    for process in summary["processes"]:
        process.update(process_fields)
    (folder / "summary.json").write_text(json.dumps(summary))
    return diagnose_paths([str(folder)])


def test_a_restart_whose_ranks_all_wait_in_init_process_group_is_a_rendezvous_not_a_departure(tmp_path):
    """Recorded live: torchrun restarted the workers (restart 3), and both ranks wait in init_process_group, in gloo's
    full-mesh connect, on the addresses the previous attempt left in the store torchrun shares. No rank departed."""
    verdict = _setup_verdict(tmp_path)
    assert verdict.category == "rendezvous" and verdict.culprit_ranks == [] and verdict.confidence == "medium"
    assert "candidates" not in verdict.facts
    lead = next(f for f in verdict.findings if f.kind == "stacks.setup_stuck")
    assert "every rank of the job (2) arrived" in lead.message
    assert verdict.actions[0].env == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def test_ranks_in_init_process_group_without_a_restart_get_no_restart_advice(tmp_path):
    verdict = _setup_verdict(tmp_path, restart_count=0)
    assert verdict.category == "rendezvous" and verdict.confidence == "medium"
    assert not any("TORCH_DISABLE_SHARE_RDZV_TCP_STORE" in a.env for a in verdict.actions)


def test_ranks_in_init_process_group_that_are_not_the_whole_job_may_wait_for_one_not_seen(tmp_path):
    # The job had 4 ranks and this node's capture holds 2: the others may never have arrived.
    verdict = _setup_verdict(tmp_path, world_size=4)
    assert verdict.culprit_ranks == [] and verdict.confidence == "low"
    assert "other ranks were not sampled" in next(f for f in verdict.findings if f.kind == "stacks.setup_stuck").message
