"""A rank stopped with SIGSTOP (state T in /proc) is named: a stopped process cannot be sampled, and every rank
that waits for it in a collective waits until it is resumed. torchtriage never resumes it (a debugger may hold it
on purpose): the rank is still stopped after the diagnosis. A real torchrun + gloo job, the real py-spy."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hung_job import TORCHRUN, clean_environment, torchrun_command
from live_job import Job, torchtriage
from torchtriage import exit_codes
from torchtriage.analysis.stacks import analyze_positions
from torchtriage.model import Frame, RankPosition, RankState, SourceKind
from torchtriage.sources.captures import StoppedProcess, read_capture, stopped_ranks

JOBS = Path(__file__).resolve().parent / "jobs"
RANKS, STOPPED = 3, 1
# Every rank warms up with healthy all_reduces, says READY, then rank STOPPED stops itself where the others enter
# the next all_reduce: they wait there for it.
JOB = f"""
import os, signal, sys
from datetime import timedelta
import torch
import torch.distributed as dist
sys.path.insert(0, {str(JOBS)!r})
from _common import exit_when_orphaned

exit_when_orphaned()
dist.init_process_group("gloo", timeout=timedelta(seconds=600))
rank = dist.get_rank()
tensor = torch.ones(8)
for _ in range(3):
    dist.all_reduce(tensor)
print(f"READY rank={{rank}} pid={{os.getpid()}}", flush=True)
if rank == {STOPPED}:
    os.kill(os.getpid(), signal.SIGSTOP)
dist.all_reduce(tensor)
"""


def state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    if not TORCHRUN.exists():
        pytest.skip("torchrun is not installed")
    folder = tmp_path_factory.mktemp("stopped_rank")
    script = folder / "stop_one_rank.py"
    script.write_text(JOB)
    launched = Job(torchrun_command(RANKS, script), clean_environment(), RANKS, folder / "job.log")
    try:
        assert launched.wait_ready(180), "".join(launched.lines[-30:])
        pid = launched.ready[STOPPED]
        deadline = time.monotonic() + 60
        while state(pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert state(pid) == "T", "".join(launched.lines[-30:])
        time.sleep(1)  # READY is printed right before the all_reduce: let the others block in it
        yield launched
    finally:
        # SIGKILL ends a stopped process too; kill() reaches every process the job started, and says which lived on.
        assert launched.kill() == []


def test_diagnose_names_the_stopped_rank_as_the_one_the_others_wait_for(job, tmp_path):
    agent, stopped_pid = job.agent, job.ready[STOPPED]
    code, out, err = torchtriage("diagnose", "--pid", str(agent), "--out", str(tmp_path), "--json", timeout=120)
    assert code == exit_codes.PROBLEM_FOUND, out + err
    verdict = json.loads(out)
    assert verdict["category"] == "hang" and verdict["culprit_ranks"] == [STOPPED], out
    assert verdict["confidence"] == "medium"  # the stacks alone: no other source agrees
    (finding,) = [f for f in verdict["findings"] if f["kind"] == "stacks.rank_stopped"]
    assert finding["ranks"] == [STOPPED] and finding["role"] == "primary"
    assert f"rank {STOPPED} (pid {stopped_pid} on " in finding["message"]
    assert "is stopped (SIGSTOP/SIGTSTP or a debugger: state T in /proc)" in finding["message"]
    assert "a stopped rank stops every rank that waits for it: ranks 0, 2 wait in all_reduce" in finding["message"]
    assert f"kill -CONT {stopped_pid}" in json.dumps(verdict["actions"])
    # No raw ptrace error: the stopped rank was never attached to.
    assert "ptrace" not in out.lower() and "Failed to suspend" not in out
    # Do no harm: it is still stopped, and its peers still wait for it.
    assert state(stopped_pid) == "T"
    assert all(job.ranks_alive().values())


def test_dump_says_which_rank_is_stopped_and_samples_the_others(job, tmp_path):
    stopped_pid = job.ready[STOPPED]
    code, out, err = torchtriage("dump", "--pid", str(job.agent), "--out", str(tmp_path), timeout=120)
    assert code == exit_codes.PROBLEM_FOUND, out + err  # a rank could not be captured
    assert f"rank {STOPPED} (pid {stopped_pid}) is stopped" in out and "Traceback" not in err
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((folder / "summary.json").read_text())
    by_rank = {p["rank"]: p for p in summary["processes"]}
    assert by_rank[STOPPED]["state"] == "T" and by_rank[STOPPED]["files"] == [] and not by_rank[STOPPED]["ok"]
    assert all(by_rank[r]["ok"] and f"rank0{r}.json" in by_rank[r]["files"] for r in range(RANKS) if r != STOPPED)
    assert state(stopped_pid) == "T"
    # Read again later (post-mortem), the folder names the same rank.
    code, out, err = torchtriage("diagnose", str(folder), "--json", timeout=120)
    assert code == exit_codes.PROBLEM_FOUND and json.loads(out)["culprit_ranks"] == [STOPPED], out + err


# ---------------------------------------------------------------------------- the analysis, on records


def waiting_in_all_reduce(rank: int) -> RankPosition:
    call = Frame("train.py", 40, "step")
    where = Frame("torch/distributed/distributed_c10d.py", 3252, "all_reduce")
    return RankPosition(rank, RankState.COLLECTIVE, "all_reduce", where, call, SourceKind.PYSPY, f"rank{rank:02d}.txt")


def sleeping(rank: int) -> RankPosition:
    call = Frame("train.py", 12, "load")
    return RankPosition(rank, RankState.SLEEPING, None, call, call, SourceKind.PYSPY, f"rank{rank:02d}.txt")


def test_a_stopped_rank_the_others_wait_for_is_the_culprit_with_medium_confidence():
    stopped = {2: StoppedProcess(4242, "node-a", "T")}
    analysis = analyze_positions({r: waiting_in_all_reduce(r) for r in (0, 1, 3)}, stopped=stopped)
    assert analysis.culprit_ranks == [2] and analysis.confidence == "medium"
    finding = analysis.findings[0]
    assert finding.kind == "stacks.rank_stopped" and finding.blames and finding.facts["pid"] == 4242
    # The ranks sampled are at one place, but the stopped rank explains it: no "every rank is a candidate".
    groups = next(f for f in analysis.findings if f.kind == "stacks.stack_groups")
    assert not groups.facts.get("undecided") and "not sampled: rank 2" in groups.message


def test_a_stopped_rank_nobody_waits_for_is_said_but_not_blamed():
    analysis = analyze_positions({0: sleeping(0)}, stopped={1: StoppedProcess(77, "node-a", "t")})
    assert analysis.culprit_ranks == []
    (finding,) = [f for f in analysis.findings if f.kind == "stacks.rank_stopped"]
    assert not finding.blames and finding.role == "symptom" and "state t in /proc" in finding.message


def test_a_capture_summary_names_its_stopped_ranks_and_only_real_states(tmp_path):
    processes = [
        {"rank": 0, "local_rank": 0, "pid": 10},
        {"rank": 1, "local_rank": 1, "pid": 11, "state": "T"},
        {"rank": 2, "local_rank": 2, "pid": 12, "state": "t"},
        {"rank": 3, "local_rank": 3, "pid": 13, "state": ["T"]},  # crafted: not a state
    ]
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"schema": "torchtriage.dump", "host": "node-a", "processes": processes}))
    capture = read_capture(str(path))
    assert stopped_ranks([capture]) == {1: StoppedProcess(11, "node-a", "T"), 2: StoppedProcess(12, "node-a", "t")}
