"""init_distributed and the store helpers: launcher environment (pure) and real torchrun + gloo jobs (slow)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchtriage.runtime import setup

JOBS = Path(__file__).parent / "jobs"
TORCHRUN = Path(sys.executable).parent / "torchrun"
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
SLURM_VARS = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID")


def run_setup_job(env: dict) -> tuple[str, dict[int, dict]]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_", "DIST_"))}
    done = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(JOBS / "runtime_setup.py")],
        env={**clean, "PYTHONUNBUFFERED": "1", **env},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line[len("RESULT ") :]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return done.stderr, {r["rank"]: r for r in records}


@pytest.fixture
def no_launcher(monkeypatch):
    for name in LAUNCH_VARS + SLURM_VARS:
        # Set, then removed: monkeypatch remembers the variable's state before, so whatever the code under
        # test sets (RANK=5 from SLURM_PROCID) is undone too, and no later test's torchrun agent inherits it.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


@pytest.mark.parametrize(
    "nodelist, host",
    [("gpu[03-05,9],cpu1", "gpu03"), ("node7", "node7"), ("a,b", "a"), ("rack1-[2-4]-ib", "rack1-2-ib"), ("", None)],
)
def test_first_slurm_host(nodelist, host):
    assert setup.first_slurm_host(nodelist) == host


def test_slurm_variables_map_to_torchs(no_launcher, monkeypatch):
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "16")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[12-13]")
    monkeypatch.setenv("SLURM_JOB_ID", "4471234")
    assert setup._apply_slurm_env() is True
    assert [os.environ[n] for n in LAUNCH_VARS] == ["5", "16", "1", "gpu12", str(10000 + 1234)]


def test_torchrun_variables_win_over_slurm(no_launcher, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("SLURM_PROCID", "3")
    assert setup._apply_slurm_env() is False
    assert os.environ["RANK"] == "0"


def test_missing_master_addr_explains_how_to_launch(no_launcher, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(setup.LaunchError) as err:
        setup.init_distributed(arm_flight_recorder=False)
    message = str(err.value)
    assert "WORLD_SIZE=4 but MASTER_ADDR is not set" in message
    assert "torchrun --nproc_per_node 8 train.py" in message


def test_bare_srun_without_rendezvous_is_refused(no_launcher, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    with pytest.raises(setup.LaunchError, match="MASTER_ADDR and MASTER_PORT are not set.*srun"):
        setup.init_distributed(arm_flight_recorder=False)


def test_without_a_launcher_nothing_is_initialised(no_launcher):
    torch = pytest.importorskip("torch")
    info = setup.init_distributed(arm_flight_recorder=False)
    assert (info.initialized, info.world_size, info.launcher) == (False, 1, "none")
    assert not torch.distributed.is_initialized()


def test_flight_recorder_variables_keep_the_users(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    for name in setup.FR_BUFFER_ENV[:2] + setup.FR_DUMP_ON_TIMEOUT_ENV[:2] + setup.FR_DUMP_FILE_ENV[:2]:
        monkeypatch.setenv(name, "")  # set, then removed: monkeypatch then undoes what the code sets too
        monkeypatch.delenv(name)
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "500")
    with pytest.warns(UserWarning, match="keeping your TORCH_NCCL_TRACE_BUFFER_SIZE='500'"):
        setup.set_flight_recorder_env(tmp_path)
    assert os.environ.get("TORCH_FR_BUFFER_SIZE") is None  # the user's spelling alone decides
    assert os.environ["TORCH_FR_DUMP_ON_TIMEOUT"] == os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert os.environ["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "nccl_trace_rank_")


@pytest.mark.slow
def test_timeout_comes_from_the_environment_and_subgroups_inherit_it():
    pytest.importorskip("torch")
    log, results = run_setup_job({"DIST_NCCL_TIMEOUT_MINUTES": "2"})
    assert sorted(results) == [0, 1]
    for result in results.values():
        assert (result["timeout_s"], result["pg_timeout_s"], result["subgroup_timeout_s"]) == (120.0, 120.0, 120.0)
        assert (result["backend"], result["launcher"], result["world_size"]) == ("gloo", "torchrun", 2)
        assert result["fr"]["TORCH_FR_BUFFER_SIZE"] == "20000"
        assert result["fr"]["TORCH_FR_DUMP_TEMP_FILE"].endswith("nccl_trace_rank_")
        assert result["store_value"] == "v1"
        assert "store_wait('never_set') timed out after 0.5s" in result["store_timeout"]


@pytest.mark.slow
@pytest.mark.parametrize("raw, warned", [("abc", True), ("0", True), ("", False)])
def test_malformed_or_empty_timeout_falls_back_to_30_minutes(raw, warned):
    pytest.importorskip("torch")
    log, results = run_setup_job({"DIST_NCCL_TIMEOUT_MINUTES": raw, "TORCH_FR_BUFFER_SIZE": "5000"})
    assert {r["pg_timeout_s"] for r in results.values()} == {1800.0}
    assert {r["subgroup_timeout_s"] for r in results.values()} == {1800.0}
    assert (f"DIST_NCCL_TIMEOUT_MINUTES={raw!r}" in log) is warned
    assert {r["fr"]["TORCH_FR_BUFFER_SIZE"] for r in results.values()} == {"5000"}
    assert "keeping your TORCH_FR_BUFFER_SIZE='5000'" in log
