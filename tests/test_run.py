"""`torchtriage run` as a job's entrypoint: signals reach the launcher, bad arguments get a clear message."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import run_cli
from torchtriage import exit_codes

# A launcher stand-in: says it is ready, then exits with a code that names the signal it received.
LAUNCHER = """
import signal, sys, time
for number, code in ((signal.SIGTERM, 40), (signal.SIGHUP, 41), (signal.SIGINT, 42), (signal.SIGUSR1, 43)):
    signal.signal(number, lambda sig, frame, code=code: sys.exit(code))
print("ready", flush=True)
time.sleep(60)
sys.exit(1)
"""


def _start(tmp_path) -> subprocess.Popen:
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torchtriage",
            "run",
            "--out",
            str(tmp_path / "run"),
            "--",
            sys.executable,
            "-c",
            LAUNCHER,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # as a container's first process: nobody else signals the launcher
    )
    assert job.stdout.readline() == b"ready\n"
    return job


@pytest.mark.parametrize(
    "sig, code", [(signal.SIGTERM, 40), (signal.SIGHUP, 41), (signal.SIGINT, 42), (signal.SIGUSR1, 43)]
)
def test_a_signal_to_run_reaches_the_launcher_and_its_exit_code_comes_back(tmp_path, sig, code):
    job = _start(tmp_path)
    os.kill(job.pid, sig)  # only run's own pid, as Kubernetes signals a container's first process
    try:
        assert job.wait(timeout=30) == code
    finally:
        job.kill()
    time.sleep(0.2)
    leftovers = subprocess.run(["pgrep", "-f", "time.sleep\\(60\\)"], capture_output=True, text=True).stdout.split()
    assert str(job.pid) not in leftovers and not leftovers  # no launcher left running under pid 1


def test_run_out_naming_a_file_is_a_usage_error(tmp_path):
    target = tmp_path / "taken"
    target.write_text("")
    done = run_cli("run", "--out", target, "--", sys.executable, "-c", "pass")
    assert done.returncode == exit_codes.USAGE
    assert b"a file, not a folder" in done.stderr and b"Traceback" not in done.stderr


def test_a_launcher_that_is_not_executable_says_so(tmp_path):
    script = tmp_path / "launch.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    done = run_cli("run", "--out", tmp_path / "run", "--", script)
    assert done.returncode == exit_codes.ENVIRONMENT
    assert b"not executable" in done.stderr and b"internal error" not in done.stderr


@pytest.mark.parametrize("verb, flag", [("run", "--stall-seconds"), ("dump", "--timeout"), ("record", "--timeout")])
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_a_time_that_is_not_a_number_of_seconds_is_a_usage_error(verb, flag, value):
    done = run_cli(verb, flag, value, *(["--", "true"] if verb == "run" else []))
    assert done.returncode == exit_codes.USAGE
    assert b"expected a number of seconds" in done.stderr and b"Traceback" not in done.stderr


@pytest.mark.parametrize("value", ["1", "0", "-5", "ten"])
def test_a_monitor_window_of_fewer_than_two_steps_is_a_usage_error(tmp_path, value):
    done = run_cli("run", "--monitor", "--monitor-window", value, "--out", tmp_path / "run", "--", "true")
    assert done.returncode == exit_codes.USAGE
    assert b"monitor-window" in done.stderr and b"Traceback" not in done.stderr
