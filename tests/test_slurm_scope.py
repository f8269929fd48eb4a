"""`--slurm JOBID` on a node shared with another job: exactly that job's ranks are captured.

Two real torchrun + gloo jobs hang on this machine. The test starts the first with SLURM_JOB_ID=1234 in its
environment, as slurmstepd gives every process of a job step; the second carries no job id (started by hand). No
srun here: the capture runs on this node alone, in the environment a step of job 1234 would have.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from hung_job import TORCHRUN, HungJob

PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed"),
    pytest.mark.skipif(not Path(PY_SPY).exists(), reason="py-spy is not installed"),
    pytest.mark.skipif(shutil.which("srun") is not None, reason="srun is here: --slurm runs a job step instead"),
]


def test_slurm_captures_exactly_its_jobs_ranks_beside_another_job(tmp_path):
    with (
        HungJob(mode="skip", culprit=1, env={"SLURM_JOB_ID": "1234"}) as ours,
        HungJob(mode="skip", culprit=0) as other,
    ):
        # Without a job named, the jobs are listed with what tells them apart.
        done = run_cli("dump", "--out", tmp_path / "any")
        listing = done.stderr.decode()
        assert done.returncode == 2 and "torchrun jobs on this node" in listing
        assert "SLURM_JOB_ID=1234" in listing and "TORCHELASTIC_RUN_ID=" in listing

        done = run_cli("dump", "--slurm", "1234", "--out", tmp_path / "dump")
        assert "srun is not on PATH: only this node" in done.stdout.decode(), done.stderr.decode()
        (summary,) = (tmp_path / "dump").glob("*/summary.json")
        captured = {p["rank"]: p["pid"] for p in json.loads(summary.read_text())["processes"]}
        assert captured == ours.ready and not set(captured.values()) & set(other.ready.values())

        done = run_cli("diagnose", "--slurm", "1234", "--out", tmp_path / "diagnose", "--json")
        verdict = json.loads(done.stdout)
        assert verdict["culprit_ranks"] == [1]  # job 1234's culprit; the other job's is rank 0
        assert verdict["culprit_machines"][0]["pid"] == ours.ready[1]


def test_slurm_names_the_jobs_on_the_node_when_none_is_of_that_job(tmp_path):
    with HungJob(mode="skip", culprit=1, env={"SLURM_JOB_ID": "1234"}):
        done = run_cli("dump", "--slurm", "999", "--out", tmp_path / "dump")
    said = done.stderr.decode() + done.stdout.decode()
    assert done.returncode == 4 and "found no torchrun workers of SLURM_JOB_ID=999" in said
    assert "SLURM_JOB_ID=1234" in said


def test_the_job_that_carries_the_id_is_taken_over_one_that_says_nothing():
    from torchtriage.collect.discovery import ProcessFacts, select_ranks

    def proc(pid, ppid, cmdline, env):
        return ProcessFacts(pid, ppid, "S", tuple(cmdline), env, True, "/venv/bin/python3")

    agent = ("/venv/bin/python3", "/venv/bin/torchrun", "--nproc_per_node", "1", "train.py")
    table = {
        100: proc(100, 1, agent, {"SLURM_JOB_ID": "1234"}),
        101: proc(101, 100, ("/venv/bin/python3", "train.py"), {"RANK": "0", "LOCAL_RANK": "0"}),
        200: proc(200, 1, agent, {}),  # started by hand on the node: it says nothing of SLURM
        201: proc(201, 200, ("/venv/bin/python3", "train.py"), {"RANK": "0", "LOCAL_RANK": "0"}),
    }
    assert [r.pid for r in select_ranks(table, "h", place={"SLURM_JOB_ID": "1234"})] == [101]
