"""A run's end is recorded: `torchtriage run` says how its launcher ended and keeps it in the run folder, and triage
reads it. Real torchrun + gloo jobs (tests/jobs/train_to_end.py, harm_job.py, raise_in_rank.py).

A finished job whose logs only stop is not a hang; a job the watchdog found stalled, then ended from outside, is
the watchdog's hang with its culprit, not the signal that ended it; a failed job's end agrees with its failure.
"""

import importlib.util
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import triage_json

sys.path.insert(0, str(Path(__file__).parent))

from hung_job import TORCHRUN, clean_environment  # noqa: E402
from live_job import Job  # noqa: E402

JOBS = Path(__file__).parent / "jobs"
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the jobs need torch")


def armed(run_dir: Path, script: Path, *, stall: float = 60, ranks_to: Path | None = None) -> list[str]:
    """`torchtriage run` of a 2-rank torchrun job; with `ranks_to`, torchrun also writes each rank's output there
    (--log-dir, its own layout), as a job that keeps its ranks' logs in the run folder does."""
    logs = ["--log-dir", str(ranks_to), "--redirects", "3", "--tee", "3"] if ranks_to else []
    return [
        sys.executable, "-m", "torchtriage", "run", "--out", str(run_dir), "--stall-seconds", str(stall), "--",
        str(TORCHRUN), "--standalone", "--nproc_per_node", "2", *logs, str(script),
    ]  # fmt: skip


def run_to_end(command: list[str], console: Path, **env: str) -> int:
    """Run the job to its end, its console (stdout and stderr as they came) kept in `console`."""
    with console.open("w") as out:
        done = subprocess.run(command, env=clean_environment(**env), stdout=out, stderr=subprocess.STDOUT, timeout=300)
    return done.returncode


def exit_record(run_dir: Path) -> dict:
    path = run_dir / "run-exit.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # private, like the stacks beside it
    (line,) = path.read_text().splitlines()  # one record, on one line
    return json.loads(line)


def kinds(verdict: dict) -> dict[str, str]:
    return {f["kind"]: f["role"] for f in verdict["findings"]}


@pytest.mark.slow
@needs_torch
def test_a_finished_job_whose_logs_only_stop_is_not_a_hang(tmp_path):
    # The ranks' logs end with a step line, as a stuck job's would: only the launcher's exit says it finished.
    run_dir, console = tmp_path / "run", tmp_path / "console.log"
    code = run_to_end(armed(run_dir, JOBS / "train_to_end.py", ranks_to=run_dir / "ranks"), console)
    assert code == 0, console.read_text()[-3000:]
    for given in (run_dir, console):  # the run folder (the ranks' logs and the record), and the console
        code, verdict = triage_json(given)
        assert (code, verdict["category"]) == (0, "ok"), (given, verdict["summary"])
        assert [f["kind"] for f in verdict["findings"]] == ["logs.job_finished"], verdict["findings"]
        assert "the job finished" in verdict["summary"].lower(), verdict["summary"]
    record = exit_record(run_dir)
    assert record["schema"] == "torchtriage.run_exit/1"
    assert (record["exit_code"], record["signal"], record["launcher"]) == (0, None, "torchrun")
    assert record["started_at"] <= record["ended_at"] and record["seconds"] >= 0


@pytest.mark.slow
@needs_torch
def test_the_watchdogs_verdict_leads_the_triage_of_the_console_not_the_signal_that_ended_the_job(tmp_path):
    # Rank 1 hangs; the watchdog writes its verdict (rank 1); then the job is ended from outside, as a scheduler
    # ends a container: SIGTERM to `run`, which passes it to torchrun, whose SignalException follows.
    go = tmp_path / "go"
    go.write_text("")
    run_dir = tmp_path / "run"
    env = clean_environment(HARM_MODE="hang_on_go", HARM_GO=str(go))
    job = Job(armed(run_dir, JOBS / "harm_job.py", stall=3), env, ranks=2, log=tmp_path / "console.log")
    try:
        verdict_file = run_dir / "hang" / "verdict.json"
        deadline = time.monotonic() + 150
        while not verdict_file.exists() and time.monotonic() < deadline and job.proc.poll() is None:
            time.sleep(0.5)
        assert verdict_file.exists(), "".join(job.lines)[-3000:]
        assert json.loads(verdict_file.read_text())["culprit_ranks"] == [1]
        os.kill(job.proc.pid, signal.SIGTERM)
        code = job.proc.wait(timeout=60)
    finally:
        job.kill()
    output = "".join(job.lines)
    assert "got signal: 15" in output, output[-3000:]  # torchrun's report of the signal is in the console
    triaged, verdict = triage_json(tmp_path / "console.log")
    assert triaged == 1 and verdict["category"] == "hang" and verdict["culprit_ranks"] == [1], verdict["summary"]
    assert verdict["findings"][0]["kind"] == "hang.watchdog_verdict"
    found = kinds(verdict)
    # the signal, and the launcher's end it caused, are the stall's consequences
    assert found["logs.agent_death_signal"] == "collateral" and found["logs.launcher_ended"] == "collateral"
    record = exit_record(run_dir)
    assert record["exit_code"] == code != 0 and record["forwarded_signals"] == ["SIGTERM"]


@pytest.mark.slow
@needs_torch
def test_a_failed_jobs_end_agrees_with_its_failure(tmp_path):
    # Rank 1 raises at step 3; the launcher exits 1. Triage of the run folder names rank 1's error, and lists the
    # launcher's end beside it, never in its place.
    run_dir, console = tmp_path / "run", tmp_path / "console.log"
    code = run_to_end(armed(run_dir, JOBS / "raise_in_rank.py", ranks_to=run_dir / "ranks"), console, CULPRIT="1")
    assert code == 1, console.read_text()[-3000:]
    code, verdict = triage_json(run_dir)
    assert code == 1 and verdict["culprit_ranks"] == [1], verdict["summary"]
    assert "ValueError" in verdict["summary"] and verdict["findings"][0]["kind"] != "logs.launcher_ended"
    assert kinds(verdict).get("logs.launcher_ended") == "collateral"
    record = exit_record(run_dir)
    assert (record["exit_code"], record["signal"]) == (1, None)


def test_a_launcher_killed_by_a_signal_is_recorded_with_it(tmp_path):
    # The launcher dies of SIGKILL (the kernel's OOM killer, a scheduler): `run` returns 128 + 9, as a shell says it,
    # and the run folder says which signal ended the job.
    run_dir, console = tmp_path / "run", tmp_path / "console.log"
    launcher = "import os, signal; print('step 1', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    code = run_to_end([sys.executable, "-m", "torchtriage", "run", "--out", str(run_dir), "--", sys.executable, "-c",
                       launcher], console)  # fmt: skip
    assert code == 128 + signal.SIGKILL
    code, verdict = triage_json(run_dir)
    assert code == 1 and kinds(verdict) == {"logs.launcher_ended": "collateral"}, verdict["summary"]
    assert "died of SIGKILL" in json.dumps(verdict["findings"])
    record = exit_record(run_dir)
    assert (record["exit_code"], record["signal"]) == (137, "SIGKILL")


def test_a_folder_used_again_does_not_say_the_earlier_run_finished_while_the_next_one_runs(tmp_path):
    # A hung job's logs only stop: the record of an earlier run that finished in the same folder must not be there
    # to explain them away while the next job runs.
    run_dir, console = tmp_path / "run", tmp_path / "console.log"
    first = [sys.executable, "-m", "torchtriage", "run", "--out", str(run_dir), "--", sys.executable, "-c", "pass"]
    assert run_to_end(first, console) == 0 and exit_record(run_dir)["exit_code"] == 0
    looks = "import os, sys; print('record there while running:', os.path.exists(sys.argv[1]))"
    second = [*first[:-2], "-c", looks, str(run_dir / "run-exit.json")]
    assert run_to_end(second, console) == 0
    assert "record there while running: False" in console.read_text()
    assert exit_record(run_dir)["exit_code"] == 0  # the second run's own
