"""Confidence comes from independent evidence agreeing, never from our own verdict read back.

`torchtriage run` prints its hang watchdog's verdict on the job's console ("torchtriage run: a stall was
diagnosed: hang, culprit rank 1 (medium confidence): ..."). That verdict was made of the stacks and
flight-recorder buffers in the run folder. Given the folder and the console together, `diagnose` shows the
console's line beside the stacks and dumps, but does not count it as the logs agreeing with them: the
confidence is what the folder alone deserves. Read alone, the line is no surer than the verdict it restates.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli, triage_json
from torchtriage.cli.run_end import stall_line

sys.path.insert(0, str(Path(__file__).parent))

from hung_job import clean_environment  # noqa: E402
from live_job import Job  # noqa: E402
from test_run_exit import JOBS, armed  # noqa: E402

# Real NCCL hangs on two H200s, each left to the watchdog: its stacks, dumps and verdict in run/hang/.
RECORDED = Path(__file__).parent / "fixtures" / "h200x2_live"
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the jobs need torch")


def diagnose_json(*paths) -> dict:
    done = run_cli("diagnose", "--json", *paths)
    assert b"Traceback" not in done.stderr and done.returncode in (0, 1), done.stderr.decode()
    return json.loads(done.stdout)


def agreeing(verdict: dict) -> list[str]:
    return [f["message"] for f in verdict["findings"] if f["kind"] == "fusion.sources_agree"]


def console_of(run_dir: Path, path: Path) -> Path:
    """The job's console as `torchtriage run` leaves it once its watchdog diagnosed a stall: its verdict's line."""
    path.write_text(f"{stall_line(run_dir)}\n")
    return path


def test_the_watchdogs_verdict_on_the_console_does_not_raise_the_confidence_of_its_own_evidence(tmp_path):
    # rank 1 called barrier while rank 0 waited in all_reduce: the folder names rank 1 with medium confidence (the
    # stacks give candidates, the flight recorder the culprit); so did the watchdog, from the same files.
    run_dir = RECORDED / "barrier" / "run"
    console = console_of(run_dir, tmp_path / "console.log")
    alone = diagnose_json(run_dir)
    both = diagnose_json(run_dir, console)
    assert (alone["culprit_ranks"], alone["confidence"]) == ([1], "medium"), alone["summary"]
    assert (both["culprit_ranks"], both["confidence"]) == ([1], "medium"), agreeing(both)
    assert agreeing(both) == []
    shown = {f["kind"] for f in both["findings"]}
    assert {"hang.watchdog_verdict", "fr.op_mismatch"} <= shown  # the restated verdict, beside its evidence


def test_independent_sources_that_agree_still_raise_it_and_only_they_are_named(tmp_path):
    # rank 1 stuck in its dataset: the flight recorder and the stacks each name it.
    run_dir = RECORDED / "dataloader" / "run"
    both = diagnose_json(run_dir, console_of(run_dir, tmp_path / "console.log"))
    assert (both["culprit_ranks"], both["confidence"]) == ([1], "high"), both["summary"]
    assert agreeing(both) == ["the flight recorder and the stacks agree: the culprit is rank 1"]


@pytest.mark.parametrize("confidence", ["low", "medium"])
def test_the_watchdogs_line_read_alone_is_no_surer_than_its_verdict(tmp_path, confidence):
    # The line's form: cli/run_end.py stall_line.
    console = tmp_path / "console.log"
    console.write_text(
        f"torchtriage run: a stall was diagnosed: hang, culprit not identified ({confidence} confidence): every rank "
        f"waits in all_reduce on the default group; the verdict and its evidence: {tmp_path}/run/hang/verdict.txt\n"
    )
    code, verdict = triage_json(console)
    assert (code, verdict["category"], verdict["confidence"]) == (1, "hang", confidence), verdict["summary"]


@pytest.mark.slow
@needs_torch
def test_a_real_stall_diagnosed_from_its_folder_and_its_console_is_as_sure_as_from_its_folder(tmp_path):
    # Rank 1 sleeps while rank 0 waits in an all_reduce; the watchdog writes its verdict (rank 1); the job is then
    # ended from outside, and `run` prints the verdict's line on the console.
    go = tmp_path / "go"
    go.write_text("")
    run_dir, console = tmp_path / "run", tmp_path / "console.log"
    env = clean_environment(HARM_MODE="hang_on_go", HARM_GO=str(go))
    job = Job(armed(run_dir, JOBS / "harm_job.py", stall=3), env, ranks=2, log=console)
    try:
        verdict_file = run_dir / "hang" / "verdict.json"
        deadline = time.monotonic() + 150
        while not verdict_file.exists() and time.monotonic() < deadline and job.proc.poll() is None:
            time.sleep(0.5)
        assert verdict_file.exists(), "".join(job.lines)[-3000:]
        os.kill(job.proc.pid, signal.SIGTERM)
        job.proc.wait(timeout=60)
    finally:
        job.kill()
    assert "torchtriage run: a stall was diagnosed: hang, culprit rank 1 " in console.read_text()
    alone, both = diagnose_json(run_dir), diagnose_json(run_dir, console)
    assert alone["culprit_ranks"] == both["culprit_ranks"] == [1], (alone["summary"], both["summary"])
    assert alone["confidence"] != "high"  # the stacks alone name rank 1: nothing independent agrees with them
    assert both["confidence"] == alone["confidence"], agreeing(both)
    assert "hang.watchdog_verdict" in {f["kind"] for f in both["findings"]}
