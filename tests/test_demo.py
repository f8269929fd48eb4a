"""The demo runs a real torchrun + gloo job that hangs on a skipped collective, and diagnoses it."""

import json
from pathlib import Path

import pytest

from conftest import run_cli
from torchtriage import exit_codes

pytest.importorskip("torch")


@pytest.mark.slow
@pytest.mark.parametrize("ranks, culprit", [(2, 1), (3, 0)])
def test_demo_diagnoses_the_rank_that_skipped_the_collective(tmp_path, ranks, culprit):
    done = run_cli(
        "demo",
        "--json",
        "--part",
        "log",
        "--ranks",
        ranks,
        "--culprit",
        culprit,
        "--timeout",
        5,
        "--out",
        tmp_path,
        timeout=240,
    )
    assert done.returncode == exit_codes.OK, done.stderr.decode()
    verdict = json.loads(done.stdout)["log"]
    assert verdict["culprit_ranks"] == [culprit]
    assert verdict["facts"]["user_frame"]["function"] == "main"
    assert verdict["facts"]["collective_by_rank"][str(culprit)] == "barrier"
    assert (tmp_path / "job.log").stat().st_size > 0


@pytest.mark.slow
def test_the_live_demo_diagnoses_a_hung_job_while_it_is_alive_and_stops_it(tmp_path):
    done = run_cli("demo", "--json", "--part", "live", "--out", tmp_path, timeout=240)
    assert done.returncode == exit_codes.OK, done.stderr.decode()
    verdict = json.loads(done.stdout)["live"]
    assert verdict["culprit_ranks"] == [1]
    assert {"stacks", "flight_recorder"} <= set(verdict["facts"]["sources_used"])
    assert verdict["facts"]["user_frame"]["line"] == 109
    # The job is gone: no process of it (they all carry the run folder in their environment) is left.
    marker = f"TORCHTRIAGE_RUN_DIR={tmp_path / 'run'}".encode()
    leftover = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes():
                leftover.append(environ.parent.name)
        except OSError:
            continue
    assert leftover == []


def test_offline_commands_never_import_torch(tmp_path):
    import subprocess
    import sys

    from conftest import H200

    probe = (
        "import sys; from torchtriage.cli import main; "
        f"main(['triage', '--json', {str(H200 / 'oom.log')!r}]); main(['rules']); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
