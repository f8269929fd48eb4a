"""`torchtriage diagnose` (post-mortem and live) and `torchtriage run` with its hang watchdog."""

import json
import os
import shutil
import sys
import time

import pytest

from conftest import FIXTURES, H200, run_cli
from torchtriage import exit_codes

HANGS = FIXTURES / "h200x2_hangs"


def diagnose_json(*args, timeout=180):
    done = run_cli("diagnose", "--json", *args, timeout=timeout)
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    return done.returncode, json.loads(done.stdout)


@pytest.mark.parametrize("case", ["skip", "size", "op"])
def test_post_mortem_fuses_logs_flight_recorder_and_stacks(case):
    code, verdict = diagnose_json(H200 / case)
    assert code == exit_codes.PROBLEM_FOUND
    assert verdict["category"] == "nccl_timeout"
    assert verdict["culprit_ranks"] == [1]
    assert verdict["facts"]["sources_used"] == ["logs", "flight_recorder", "stacks"]
    assert verdict["facts"]["sources_missing"] == {}


def test_post_mortem_sources_that_agree_say_so_and_the_culprit_line_is_given():
    code, verdict = diagnose_json(H200 / "skip")
    assert verdict["findings"][0]["kind"] == "fusion.sources_agree"
    assert verdict["confidence"] == "high"
    assert verdict["facts"]["user_frame"]["line"] == 17  # the sleep in train_step


@pytest.mark.parametrize("case, culprit", [("rank0_skip", 0), ("dataloader", 1)])
def test_post_mortem_on_recorded_nccl_hangs(case, culprit):
    code, verdict = diagnose_json(HANGS / case)
    assert verdict["culprit_ranks"] == [culprit]


def test_post_mortem_names_missing_sources(tmp_path):
    shutil.copy(H200 / "skip" / "pyspy_rank0.txt", tmp_path / "rank0.txt")
    shutil.copy(H200 / "skip" / "pyspy_rank1.txt", tmp_path / "rank1.txt")
    code, verdict = diagnose_json(tmp_path)
    assert verdict["culprit_ranks"] == [1]
    assert set(verdict["facts"]["sources_missing"]) == {"logs", "flight_recorder"}


def test_bad_arguments(tmp_path):
    done = run_cli("diagnose", tmp_path / "nope")
    assert done.returncode == exit_codes.BAD_INPUT and b"no such file" in done.stderr


# --- live ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_live_diagnose_names_the_rank_that_skipped_and_its_line():
    pytest.importorskip("torch")
    from hung_job import HungJob

    with HungJob(mode="skip", culprit=1) as job:
        code, verdict = diagnose_json("--pid", job.proc.pid)
    assert code == exit_codes.PROBLEM_FOUND
    assert verdict["culprit_ranks"] == [1]
    assert "stacks" in verdict["facts"]["sources_used"]
    assert verdict["facts"]["user_frame"]["function"] == "culprit_skip"


def _watchdog_verdict(out, timeout: float = 90) -> dict:
    """The verdict the reporting rank's watchdog writes into OUT/hang, waited for."""
    verdict_file = out / "hang" / "verdict.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not verdict_file.exists():
        time.sleep(0.5)
    assert verdict_file.exists(), f"no verdict in {os.listdir(out / 'hang') if (out / 'hang').exists() else out}"
    time.sleep(0.5)  # the reporter writes the JSON, then the text
    return json.loads(verdict_file.read_text())


@pytest.mark.slow
def test_run_arms_a_watchdog_that_writes_the_verdict_before_the_job_is_killed(tmp_path):
    pytest.importorskip("torch")
    from hung_job import HungJob

    out = tmp_path / "run"
    prefix = (sys.executable, "-m", "torchtriage", "run", "--out", str(out), "--stall-seconds", "4", "--")
    with HungJob(mode="skip", culprit=1, prefix=prefix):
        verdict = _watchdog_verdict(out)
    assert verdict["culprit_ranks"] == [1]
    assert {"stacks", "flight_recorder"} <= set(verdict["facts"]["sources_used"])
    assert (out / "hang" / "rank00.txt").exists() and (out / "hang" / "rank01.txt").exists()
    assert sorted(p.name for p in (out / "hang" / "fr").iterdir()) == ["nccl_trace_rank_0", "nccl_trace_rank_1"]


def test_run_needs_a_launcher():
    done = run_cli("run", "--")
    assert done.returncode == exit_codes.USAGE and b"give the launcher" in done.stderr


def test_run_passes_the_exit_code_and_output_through(tmp_path):
    done = run_cli("run", "--out", tmp_path, "--", sys.executable, "-c", "print('hello'); raise SystemExit(7)")
    assert done.returncode == 7
    assert done.stdout == b"hello\n"


@pytest.mark.slow
def test_live_diagnose_at_eight_ranks_with_rank_0_as_the_culprit():
    pytest.importorskip("torch")
    from hung_job import HungJob

    with HungJob(mode="barrier", culprit=0, ranks=8) as job:
        code, verdict = diagnose_json("--pid", job.proc.pid)
    assert verdict["culprit_ranks"] == [0]
    assert verdict["facts"]["stacks"]["collective_by_rank"]["0"] == "barrier"
    assert all(verdict["facts"]["stacks"]["collective_by_rank"][str(r)] == "all_reduce" for r in range(1, 8))


LIVE = FIXTURES / "h200x2_live"


@pytest.mark.parametrize("case, culprit", [("rank0_skip", 0), ("dataloader", 1), ("barrier", 1)])
def test_recorded_live_nccl_diagnoses_reproduce_post_mortem(case, culprit):
    recorded = json.loads((LIVE / case / "diagnose.json").read_text())
    assert recorded["culprit_ranks"] == [culprit]
    watchdog = json.loads((LIVE / case / "run" / "hang" / "verdict.json").read_text())
    assert watchdog["culprit_ranks"] == [culprit]
    (capture,) = (LIVE / case / "captures").iterdir()
    code, verdict = diagnose_json(capture, LIVE / case / "run" / "hang" / "fr")
    assert verdict["culprit_ranks"] == [culprit]
    assert verdict["facts"]["sources_used"] == ["flight_recorder", "stacks"]


@pytest.mark.slow
def test_a_busy_culprit_that_never_stalls_dumps_when_a_stalled_rank_wakes_it(tmp_path):
    # Rank 1 computes forever (its main thread moves, so its own watchdog never fires); rank 0 waits in the
    # all_reduce and stalls. Rank 0's watchdog sets the wake-up key every rank's listener waits on: rank 1
    # dumps on request, not stalled, and the verdict names it.
    pytest.importorskip("torch")
    from hung_job import HungJob

    out = tmp_path / "run"
    prefix = (sys.executable, "-m", "torchtriage", "run", "--out", str(out), "--stall-seconds", "4", "--")
    with HungJob(mode="busy", culprit=1, prefix=prefix):
        verdict = _watchdog_verdict(out)
    busy = (out / "hang" / "rank01.txt").read_text()
    assert '(active): "MainThread"' in busy and "culprit_busy" in busy  # dumped on request, while moving
    assert '(idle): "MainThread"' in (out / "hang" / "rank00.txt").read_text()  # stalled by itself
    assert verdict["culprit_ranks"] == [1], verdict["summary"]
