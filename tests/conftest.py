import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from leftovers import adopt_orphans, kill_leftovers

FIXTURES = Path(__file__).parent / "fixtures"
H200 = FIXTURES / "h200x2"


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per core, at most four. The live tests spend most of their time waiting for a real
    job to hang (a timeout, a watchdog window), so two of them overlap well even on two cores; past four, the
    ranks of the jobs running at once (up to 16 each) outgrow a small machine's memory."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


def run_cli(*args, stdin: bytes | None = None, timeout: float = 120):
    """Run the real console entry point in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "torchtriage", *map(str, args)],
        input=stdin,
        capture_output=True,
        timeout=timeout,
    )


def triage_json(*paths, stdin: bytes | None = None) -> tuple[int, dict]:
    done = run_cli("triage", "--json", *paths, stdin=stdin)
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    return done.returncode, json.loads(done.stdout)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(autouse=True)
def _environment_restored():
    """Code under test may set the process's environment (set_flight_recorder_env arms TORCH_FR_DUMP_TEMP_FILE
    for the ranks it would start). Whatever a test leaves there is undone after it, so no later test on the same
    worker starts its job in another's environment (a kept variable makes `run` warn before its first line)."""
    before = dict(os.environ)
    yield
    for name in set(os.environ) - set(before):
        del os.environ[name]
    for name, value in before.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


@pytest.fixture(autouse=True, scope="module")
def _no_leftover_processes():
    """Workers a failed or timed-out job test left behind are killed with their module (tests/leftovers.py)."""
    adopt_orphans()
    yield
    kill_leftovers()


def pytest_configure(config):
    """Tests send SIGINT to the commands they start, as a terminal's Ctrl-C does. A test run started in the
    background of a non-interactive shell (`bash .ci/run &`) has SIGINT ignored, and an ignored signal stays
    ignored across exec: every command it started would ignore the Ctrl-C. A handled one is reset to the default
    at exec, so the session handles it (as Python's default handler does)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
