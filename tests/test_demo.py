"""The demo runs a real torchrun + gloo job that hangs on a skipped collective, and diagnoses it."""

import json

import pytest

from conftest import run_cli
from torchtriage import exit_codes

pytest.importorskip("torch")


@pytest.mark.slow
@pytest.mark.parametrize("ranks, culprit", [(2, 1), (3, 0)])
def test_demo_diagnoses_the_rank_that_skipped_the_collective(tmp_path, ranks, culprit):
    done = run_cli(
        "demo", "--json", "--ranks", ranks, "--culprit", culprit, "--timeout", 5, "--out", tmp_path, timeout=240
    )
    assert done.returncode == exit_codes.OK, done.stderr.decode()
    verdict = json.loads(done.stdout)
    assert verdict["culprit_ranks"] == [culprit]
    assert verdict["facts"]["user_frame"]["function"] == "main"
    assert verdict["facts"]["collective_by_rank"][str(culprit)] == "barrier"
    assert (tmp_path / "job.log").stat().st_size > 0


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
