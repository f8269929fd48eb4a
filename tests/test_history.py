"""Attempts of a job, kept apart and compared: does the failure follow a machine or the program?

Real torchrun + gloo jobs under `torchtriage run` (tests/jobs/faulty_machine.py: one rank stops while its peers
all_reduce, and the watchdog writes its verdict). Two torchrun agents on this machine act as two nodes: each is
given a host name of its own through TORCHTRIAGE_TEST_HOSTNAME (test-only), and both write into one run folder, as
the nodes of a cluster share one. A job is started again on the same folder with its nodes in the other order (a
requeue onto the nodes in another order), so that each rank runs on the other machine; the judgement of the pure
analysis on data is in tests of its own below.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import run_cli
from hung_job import TORCHRUN, clean_environment, ready_lines
from torchtriage.analysis.history import AttemptResult, judge
from torchtriage.model import Machine, Verdict
from torchtriage.protocol import TEST_HOSTNAME_ENV, attempt_dir, host_name, recorded_attempts

JOB = Path(__file__).resolve().parent / "jobs" / "faulty_machine.py"
real_jobs = pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed")


class Launch:
    """`torchtriage run --out OUT -- torchrun ...` started in a session of its own; its READY lines read."""

    def __init__(self, out: Path, torchrun_args: list[str], env: dict[str, str]) -> None:
        run = [sys.executable, "-m", "torchtriage", "run", "--out", str(out), "--stall-seconds", "3", "--"]
        # torchrun shares its rendezvous store with the workers, and a restart's workers then read the addresses
        # the previous attempt's ranks left there and wait on them (pytorch/pytorch#135712): this job restarts, so
        # its store is not shared.
        self.proc = subprocess.Popen(
            [*run, str(TORCHRUN), *torchrun_args, str(JOB)],
            env=clean_environment(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.ready: list[dict[int, int]] = [{}]  # rank -> pid, per start of the workers
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)
            for rank, pid in ready_lines(line).items():
                if rank in self.ready[-1]:
                    self.ready.append({})  # the launcher started the workers again
                self.ready[-1][rank] = pid

    def kill(self) -> None:
        for pid in [pid for start in self.ready for pid in start.values()] + [self.proc.pid]:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _judged(out: Path) -> dict[int, Path]:
    """Attempt -> folder, of the attempts whose watchdog wrote a verdict."""
    return {n: f for n, f in recorded_attempts(out).items() if (f / "hang" / "verdict.json").exists()}


# A start whose ranks are not all READY this long after they began is stuck in gloo's full-mesh connect (a start
# takes a second or two; a loaded machine now and then leaves both ends of a pair waiting, until the group's timeout).
_STUCK_START_S = 60.0


def _end_a_stuck_start(out: Path, launches: list[Launch], ended: set[int]) -> None:
    """Kill the workers of the latest attempt when it is stuck before READY, as a scheduler's health check would:
    its launcher then starts the workers again (or the start ends, and the caller starts another)."""
    attempts = recorded_attempts(out)
    if not attempts or max(attempts) in ended:
        return
    latest = max(attempts)
    records = list((attempts[latest] / "identity").glob("rank*.json"))
    if not records or time.time() - min(r.stat().st_mtime for r in records) < _STUCK_START_S:
        return
    pids = [json.loads(r.read_text())["pid"] for r in records]
    ready = {pid for launch in launches for start in launch.ready for pid in start.values()}
    if all(pid in ready for pid in pids):
        return
    ended.add(latest)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait_for_verdict(out: Path, after: int, launches: list[Launch], seconds: float = 180) -> int | None:
    """The first attempt past `after` with a verdict; None when every launch ended without one. Gloo's full-mesh
    connect now and then fails on a loaded machine ("Connection refused"), ending a start before it could hang, or
    never returns: such a start is ended."""
    deadline, ended = time.monotonic() + seconds, set()
    while time.monotonic() < deadline:
        later = [n for n in _judged(out) if n > after]
        if later:
            return min(later)
        if all(launch.proc.poll() is not None for launch in launches):
            return None
        _end_a_stuck_start(out, launches, ended)
        time.sleep(0.5)
    tails = "".join(line for launch in launches for line in launch.output[-20:])
    raise AssertionError(f"no verdict in an attempt of {out} after {after}:\n{tails}")


def _two_nodes(out: Path, fault: str, order: tuple[str, str]) -> int:
    """The job started on two nodes (`order[i]`: the host of node rank i) until the watchdog's verdict; the attempt
    it is. A start that failed to connect is started again, as its scheduler would (another attempt's folder)."""
    for _ in range(3):
        port, launches, before = _free_port(), [], max(recorded_attempts(out), default=-1)
        try:
            for node_rank, host in enumerate(order):
                args = ["--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(node_rank)]
                args += ["--master_addr", "127.0.0.1", "--master_port", str(port)]
                launches.append(Launch(out, args, {"FAULT": fault, TEST_HOSTNAME_ENV: host}))
            attempt = _wait_for_verdict(out, before, launches)
        finally:
            for launch in launches:
                launch.kill()
        if attempt is not None:
            return attempt
    raise AssertionError("three starts of the job failed before it could hang")


def _line_of(text: str) -> int:
    return next(n for n, line in enumerate(JOB.read_text().splitlines(), 1) if text in line)


def _history(out: Path) -> dict:
    done = run_cli("history", out, "--json")
    assert done.returncode == 1, done.stderr.decode()
    return json.loads(done.stdout)


def _blamed(history: dict) -> list[tuple[list[int], str]]:
    return [(a["culprit_ranks"], a["culprit_machines"][0]["host"]) for a in history["attempts"] if a["culprit_ranks"]]


@pytest.mark.slow
@real_jobs
@pytest.mark.parametrize(
    "fault, pattern, blamed",
    [
        # node-b's hardware fails whichever rank runs there: rank 1 first, rank 0 once the nodes are swapped.
        ("host:node-b", "machine", [([1], "node-b"), ([0], "node-b")]),
        # Rank 1's code stops at one line: on node-b first, on node-a once the nodes are swapped.
        ("rank:1", "program", [([1], "node-b"), ([1], "node-a")]),
    ],
)
def test_history_tells_a_failing_machine_from_a_failing_program(tmp_path, fault, pattern, blamed):
    out = tmp_path / "run"
    first = _two_nodes(out, fault, ("node-a", "node-b"))
    verdict = (attempt_dir(out, first) / "hang" / "verdict.json").read_bytes()
    second = _two_nodes(out, fault, ("node-b", "node-a"))  # requeued: `run` writes into a later attempt's folder
    assert second > first and (attempt_dir(out, first) / "hang" / "verdict.json").read_bytes() == verdict
    history = _history(out)
    assert _blamed(history) == blamed
    assert history["pattern"] == pattern
    commands = [action["command"] for action in history["actions"]]
    if pattern == "machine":
        assert "the machine node-b" in history["summary"] and "nvidia-smi -q -d ECC" in commands
        assert "sudo dmesg -T | grep -i xid" in commands and "torchtriage nvlink" in commands
    else:
        site = next(a["site"] for a in history["attempts"] if a["culprit_ranks"])
        assert site == f"{JOB}:{_line_of('time.sleep(FOREVER_S)')}"
        assert history["actions"][0]["title"].startswith(f"Fix the code at {site}")
        assert not any("nvidia-smi" in (command or "") for command in commands)
    text = run_cli("history", out).stdout.decode()
    assert f"pattern   {pattern}" in text and f"attempt {second}: hang, rank" in text


@pytest.mark.slow
@real_jobs
def test_each_restart_of_the_workers_writes_a_folder_of_its_own(tmp_path):
    out = tmp_path / "run"
    launch = Launch(out, ["--standalone", "--nproc_per_node", "2", "--max-restarts", "4"], {"FAULT": "rank:1"})
    try:
        first = _wait_for_verdict(out, -1, [launch])
        os.kill(launch.ready[-1][1], signal.SIGKILL)  # as NCCL's watchdog ends a stuck rank: torchrun restarts
        # A restart may lose gloo's connect on a loaded machine and restart again: room for a few attempts.
        second = _wait_for_verdict(out, first, [launch], seconds=420)
        assert second is not None, "every restart ended before it could hang:\n" + "".join(launch.output[-30:])
        os.kill(launch.proc.pid, signal.SIGTERM)  # the scheduler ends the job: run passes it on
        launch.proc.wait(timeout=120)
    finally:
        launch.kill()
    assert first is not None and second is not None
    before = json.loads((attempt_dir(out, first) / "identity" / "rank1.json").read_text())
    after = json.loads((attempt_dir(out, second) / "identity" / "rank1.json").read_text())
    assert (before["attempt"], after["attempt"]) == (first, second) and before["pid"] != after["pid"]
    assert json.loads((attempt_dir(out, first) / "hang" / "verdict.json").read_text())["culprit_ranks"] == [1]
    said = "".join(launch.output)
    assert "each attempt's files in a folder of its own" in said and str(attempt_dir(out, second)) in said
    history = _history(out)
    assert _blamed(history) == [([1], host_name()), ([1], host_name())]
    assert history["pattern"] == "undecided"  # one machine: the same rank failed there each time
    assert history["actions"][0]["title"].startswith("Place rank 1 on another machine")


def _attempt(number: int, rank: int, host: str | None, site: str, gpu: str | None = None) -> AttemptResult:
    verdict = Verdict("hang", [rank], "stalled", findings=[object()], facts={"user_frame": {"file": site, "line": 7}})
    verdict.culprit_machines = [Machine(rank, host=host, gpu_uuid=gpu)]
    return AttemptResult(number, f"run/.attempt-{number}", verdict)


def test_the_same_gpu_under_two_ranks_is_named_and_checked_by_its_uuid():
    judgement = judge([_attempt(0, 3, "a17", "train.py", "GPU-9f"), _attempt(1, 5, "a17", "train.py", "GPU-9f")])
    assert judgement.pattern == "machine" and "GPU GPU-9f of a17" in judgement.summary
    assert "nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER -i GPU-9f" in [a.command for a in judgement.actions]


def test_a_line_that_fails_under_other_ranks_on_other_machines_follows_the_program():
    judgement = judge([_attempt(0, 3, "a17", "loader.py"), _attempt(1, 6, "b02", "loader.py")])
    assert judgement.pattern == "program" and "the line loader.py:7" in judgement.summary


def test_attempts_whose_machines_were_not_recorded_are_not_called_a_pattern():
    judgement = judge([_attempt(0, 3, None, "a.py"), _attempt(1, 5, None, "b.py")])
    assert judgement.pattern == "no_repeat" and "not recorded" in judgement.summary
    assert judge([_attempt(0, 3, "a17", "a.py")]).pattern == "too_few"


def test_history_of_a_folder_with_nothing_to_judge_says_so(tmp_path):
    done = run_cli("history", tmp_path)
    assert done.returncode == 3 and b"Traceback" not in done.stderr
    assert done.stderr.decode().startswith("torchtriage history: no attempt left anything to judge")
