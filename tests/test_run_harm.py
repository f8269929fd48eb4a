"""`torchtriage run` never misleads or harms the job it arms: real torchrun + gloo jobs (tests/jobs/harm_job.py).

A healthy job, busy or idle, gets no stall verdict however long it runs; each stall gets a verdict of its own,
never hidden by an earlier stall or by a live diagnose; the job's ranks stepping unevenly and its own
faulthandler timer stand; children that inherit a rank's variables are not armed.
"""

import json
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parent))

from hung_job import clean_environment, torchrun_command  # noqa: E402
from live_job import Job, leftovers, torchtriage  # noqa: E402

JOB = Path(__file__).parent / "jobs" / "harm_job.py"
pytestmark = pytest.mark.slow


def _start(tmp_path: Path, stall: float, env: dict[str, str], *extra: str) -> Job:
    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "torchtriage", "run", "--out", str(out), "--stall-seconds", str(stall), *extra, "--",
        *torchrun_command(2, JOB),
    ]  # fmt: skip
    return Job(command, clean_environment(**env), ranks=2, log=tmp_path / "console.log")


def _finish(job: Job, timeout: float) -> tuple[int | None, str]:
    """The job's exit code (None: it did not end in time, and was killed) and its console."""
    try:
        code = job.proc.wait(timeout=timeout)
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
        code = None
    job.kill()
    return code, "".join(job.lines)


def _evidence(out: Path) -> list[str]:
    """What the watchdogs wrote into the hang folder besides their faulthandler backstops."""
    hang = out / "hang"
    if not hang.exists():
        return []
    return sorted(p.name for p in hang.iterdir() if not p.name.startswith(("faulthandler-", ".")))


def _wait_for_verdict(path: Path, accept, timeout: float, job: Job) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.proc.poll() is None:
        try:
            verdict = json.loads(path.read_text())
        except (OSError, ValueError):
            verdict = None  # not there yet, or being replaced
        if verdict is not None and accept(verdict):
            return verdict
        time.sleep(0.5)
    found = path.read_text()[:2000] if path.exists() else "no verdict"
    raise AssertionError(f"no such verdict in {path}: {found}\n{''.join(job.lines)[-2000:]}")


def _episode(number: int):
    return lambda verdict: verdict["facts"].get("watchdog", {}).get("episode") == number


@pytest.mark.parametrize("mode", ["busy", "idle"])
def test_a_healthy_job_gets_no_stall_verdict_however_its_time_is_spent(tmp_path, mode):
    # A busy loop spends its time in backward() with the GIL released, where the watchdog mostly looks: one
    # position, sample after sample. An idle one waits in the gradient all_reduce for a slow rank 0 each step.
    # Four stall windows pass in each: the steps and the collectives move, nothing is a stall.
    job = _start(tmp_path, 2, {"HARM_MODE": mode, "HARM_SECONDS": "10", "HARM_PAUSE": "0.5"})
    code, output = _finish(job, 240)
    assert code == 0, output[-3000:]
    assert output.count("DONE rank=") == 2, output[-3000:]
    assert _evidence(tmp_path / "run") == [], f"{_evidence(tmp_path / 'run')}\n{output[-2000:]}"
    assert "a stall was diagnosed" not in output


def test_a_healthy_gloo_job_that_leaves_its_group_to_the_exit_ends_0_every_time(tmp_path):
    # torch 2.13 aborts a gloo rank at interpreter exit now and then when the flight recorder (which `run` arms)
    # is on and the group is still alive ("terminate called without an active exception", -6): 8 of 12 such
    # runs under `run` before the armed rank paused for gloo's workers at exit (docs/runtime.md). Each exits 0.
    for attempt in range(4):
        (tmp_path / str(attempt)).mkdir()
        job = _start(tmp_path / str(attempt), 60, {"HARM_MODE": "leave_groups", "HARM_SECONDS": "1"})
        code, output = _finish(job, 240)
        assert code == 0, f"attempt {attempt}: {output[-3000:]}"
        assert output.count("DONE rank=") == 2, output[-3000:]


def test_each_stall_gets_its_own_verdict_and_the_earlier_one_is_kept(tmp_path):
    # Rank 0 pauses 8 s once (stall 1: rank 0), the job moves again for 6 s, then rank 1 hangs for good (stall 2:
    # rank 1). hang/ holds the second stall's verdict, named so; the first's files are kept aside, whole.
    job = _start(tmp_path, 3, {"HARM_MODE": "stall_then_hang", "HARM_SECONDS": "6", "HARM_PAUSE": "8"})
    verdict_file = tmp_path / "run" / "hang" / "verdict.json"
    try:
        first = _wait_for_verdict(verdict_file, _episode(1), 120, job)
        second = _wait_for_verdict(verdict_file, _episode(2), 120, job)
    finally:
        job.kill()
    assert first["culprit_ranks"] == [0], first["summary"]
    assert second["culprit_ranks"] == [1], second["summary"]
    assert "stall 2 of this job" in verdict_file.with_suffix(".txt").read_text()
    (earlier,) = (tmp_path / "run" / "hang" / ".earlier").iterdir()
    assert json.loads((earlier / "verdict.json").read_text())["culprit_ranks"] == [0]
    assert {"rank00.txt", "rank01.txt"} <= {p.name for p in earlier.iterdir()}


def test_a_live_diagnose_of_a_healthy_job_leaves_the_watchdog_armed(tmp_path):
    # diagnose --pid while the job is healthy asks the watchdogs for fresh dumps; a real hang afterwards is
    # still noticed, and its verdict is made of its own dumps, not of the diagnose's.
    go = tmp_path / "go"
    job = _start(tmp_path, 3, {"HARM_MODE": "hang_on_go", "HARM_GO": str(go)})
    try:
        assert job.wait_ready(180), "".join(job.lines)[-3000:]
        pids = [str(pid) for pid in job.ready.values()]
        code, _, err = torchtriage("diagnose", "--pid", pids[0], "--pid", pids[1], "--out", str(tmp_path / "cap"))
        assert code in (0, 1, 3), err[-2000:]
        assert not (tmp_path / "run" / "hang" / "REQUEST").exists()  # withdrawn once answered
        go.write_text("")
        verdict = _wait_for_verdict(tmp_path / "run" / "hang" / "verdict.json", _episode(1), 120, job)
    finally:
        job.kill()
    assert verdict["culprit_ranks"] == [1], verdict["summary"]


def test_a_monitor_never_hangs_a_job_whose_ranks_step_unevenly(tmp_path):
    # Only rank 0 takes optimizer steps while rank 1 waits in a barrier. The monitor's group is made beside the
    # job's own, by both ranks at once, never lazily at a window's end that only rank 0 reaches.
    job = _start(tmp_path, 60, {"HARM_MODE": "rank0_steps", "HARM_STEPS": "40"}, "--monitor", "--monitor-window", "5")
    code, output = _finish(job, 180)
    assert code == 0, output[-3000:]
    assert output.count("DONE rank=") == 2


def test_the_jobs_own_faulthandler_timer_still_ends_it(tmp_path):
    # The program arms faulthandler.dump_traceback_later(4, exit=True): its timer, not the watchdog's backstop,
    # holds faulthandler's one slot, and it ends the job.
    job = _start(tmp_path, 2, {"HARM_MODE": "own_timer", "HARM_PAUSE": "4"})
    code, output = _finish(job, 120)
    assert code is not None and code != 0, output[-3000:]
    assert "Timeout (0:00:04)!" in output, output[-3000:]


def test_a_child_that_inherits_a_ranks_variables_is_not_armed(tmp_path):
    # Each rank starts a child Python that outlives the job by 8 s, holding RANK and the run's variables: it
    # arms no watchdog, so it writes no stacks and no verdict after the job is gone.
    job = _start(tmp_path, 2, {"HARM_MODE": "child", "HARM_PAUSE": "8"})
    code, output = _finish(job, 120)
    assert code == 0, output[-3000:]
    deadline = time.monotonic() + 30
    while leftovers("time.sleep(8)") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _evidence(tmp_path / "run") == [], _evidence(tmp_path / "run")
