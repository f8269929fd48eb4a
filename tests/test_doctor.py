import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from torchtriage.collect import doctor as d

GIB = 1 << 30


def statuses(checks):
    return {c.name: c.status for c in checks}


def base_facts(**overrides):
    facts = {
        "host": "node0",
        "python": "3.11.7",
        "executable": "/usr/bin/python3",
        "torchtriage": "0.1.0",
        "torch": {"installed": True, "version": "2.11.0", "cuda": "13.0", "device_count": 2, "nccl": "2.28.9"},
        "topology": {"available": True, "gpus": ["NVIDIA H200"] * 2, "matrix": {"GPU0": {"GPU1": "NV18"}}},
        "pyspy": {"path": "/usr/bin/py-spy", "version": "py-spy 0.4.3", "ptrace_allowed": True},
        "env": {},
        "tmpdir": "/tmp",
        "shm": {"total": 64 * GIB, "free": 60 * GIB},
        "port_range": "32768\t60999",
        "nofile": [1048576, 1048576],
        "memlock": [None, None],
        "rdma_devices": [],
        "net_interfaces": ["eth0", "lo"],
        "dump_dir": "/tmp",
        "dump_dir_exists": True,
        "dump_dir_writable": True,
        "dump_disk": {"total": 500 * GIB, "free": 400 * GIB},
    }
    facts.update(overrides)
    return facts


def test_healthy_facts_are_ok_except_the_flight_recorder():
    checks = d.run_checks(base_facts())
    assert {c.name for c in checks if c.status != "ok"} == {"flight recorder"}
    flight = base_facts(env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"})
    assert d.overall(d.run_checks(flight)) == "ok"


def test_torch_missing_or_cpu_only_warns():
    missing = d.check_torch(base_facts(torch={"installed": False, "error": "ModuleNotFoundError: torch"}))
    assert missing[0].status == "warn" and "not importable" in missing[0].message
    cpu = statuses(d.check_torch(base_facts(torch={"installed": True, "version": "2.11.0+cpu", "cuda": None})))
    assert cpu == {"torch": "ok", "cuda": "warn"}


def test_topology_without_nvlink_between_some_pairs_warns():
    matrix = {"GPU0": {"GPU1": "NV18", "GPU2": "SYS"}, "GPU1": {"GPU0": "NV18", "GPU2": "SYS"}}
    topo = {"available": True, "gpus": ["NVIDIA H200"] * 3, "matrix": matrix}
    (check,) = d.check_topology(base_facts(topology=topo))
    assert check.status == "warn" and "GPU0-GPU2:SYS" in check.message
    (check,) = d.check_topology(base_facts(topology={"available": False, "error": "nvidia-smi is not on PATH"}))
    assert check.status == "warn"


def test_pyspy_and_ptrace():
    facts = base_facts(
        pyspy={
            "path": None,
            "error": "py-spy is not installed; install it",
            "ptrace_allowed": False,
            "ptrace_reason": "kernel.yama.ptrace_scope is 3",
            "ptrace_fix": "reboot",
        }
    )
    assert statuses(d.check_pyspy(facts)) == {"py-spy": "warn", "ptrace": "warn"}


@pytest.mark.parametrize(
    "env, name, status",
    [
        ({"NCCL_SOCKET_IFNAME": "ib9"}, "env NCCL_SOCKET_IFNAME", "fail"),
        ({"NCCL_SOCKET_IFNAME": "eth"}, "env NCCL_SOCKET_IFNAME", "ok"),
        ({"NCCL_SOCKET_IFNAME": "^lo,docker"}, "env NCCL_SOCKET_IFNAME", "ok"),
        ({"NCCL_SOCKET_IFNAME": "=eth"}, "env NCCL_SOCKET_IFNAME", "fail"),
        ({"DIST_NCCL_TIMEOUT_MINUTES": "0"}, "env DIST_NCCL_TIMEOUT_MINUTES", "fail"),
        ({"DIST_STORE_TIMEOUT_HOURS": "four"}, "env DIST_STORE_TIMEOUT_HOURS", "fail"),
        ({"DIST_NCCL_TIMEOUT_MINUTES": "60"}, "env DIST_NCCL_TIMEOUT_MINUTES", "ok"),
        ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, "env TORCH_NCCL_ASYNC_ERROR_HANDLING", "warn"),
        ({"NCCL_ASYNC_ERROR_HANDLING": "1"}, "env NCCL_ASYNC_ERROR_HANDLING", "warn"),
        ({"NCCL_P2P_DISABLE": "1"}, "env NCCL_P2P_DISABLE", "warn"),
        ({"CUDA_DEVICE_MAX_CONNECTIONS": "8"}, "env CUDA_DEVICE_MAX_CONNECTIONS", "warn"),
        ({"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, "env CUDA_DEVICE_MAX_CONNECTIONS", "ok"),
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "env PYTORCH_CUDA_ALLOC_CONF", "ok"),
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segment:True"}, "env PYTORCH_CUDA_ALLOC_CONF", "fail"),
    ],
)
def test_env_checks(env, name, status):
    checks = statuses(d.check_env(base_facts(env=env)))
    assert checks[name] == status


def test_env_lines_carry_the_meaning():
    (check, _) = d.check_env(base_facts(env={"NCCL_DEBUG": "INFO"}))
    assert "NCCL log level" in check.message


@pytest.mark.parametrize("length, status", [(4, "ok"), (65, "warn"), (90, "fail")])
def test_tmpdir_against_the_af_unix_limit(length, status):
    tmpdir = "/" + "x" * (length - 1)
    assert d.check_tmpdir(base_facts(tmpdir=tmpdir))[0].status == status


@pytest.mark.parametrize(
    "shm, status",
    [
        (None, "fail"),
        ({"total": 64 << 20, "free": 64 << 20}, "fail"),
        ({"total": 512 << 20, "free": 500 << 20}, "warn"),
    ],
)
def test_shm(shm, status):
    assert d.check_shm(base_facts(shm=shm))[0].status == status


def test_ports_limits_and_disk():
    assert d.check_ports(base_facts(port_range="50000 51000"))[0].status == "warn"
    master = base_facts(port_range="32768 60999", env={"MASTER_PORT": "40000"})
    assert "MASTER_PORT 40000 is inside" in d.check_ports(master)[0].message
    assert d.check_ports(base_facts(port_range=None))[0].status == "warn"
    limits = statuses(d.check_limits(base_facts(nofile=[1024, 4096], memlock=[65536, 65536], rdma_devices=["mlx5_0"])))
    assert limits == {"open files": "warn", "locked memory": "warn"}
    assert d.check_disk(base_facts(dump_disk={"total": GIB, "free": GIB // 2}))[0].status == "fail"
    assert d.check_disk(base_facts(dump_dir_exists=False))[0].status == "fail"


def test_compare_ranks_names_the_odd_rank():
    facts = [base_facts(env={"NCCL_SOCKET_IFNAME": "eth0", "RANK": str(r)}) for r in range(4)]
    facts[2]["env"]["NCCL_SOCKET_IFNAME"] = "lo"
    facts[3]["env"]["LOCAL_RANK"] = "3"  # per-rank by nature: ignored
    (diff,) = d.compare_ranks(facts)
    assert diff["fact"] == "env NCCL_SOCKET_IFNAME" and diff["odd_ranks"] == [2]
    (check,) = d.check_ranks([diff], 4)
    assert check.status == "fail" and "rank 2" in check.message
    assert d.check_ranks([], 4)[0].status == "ok"


def test_cli_doctor_runs_and_prints_one_screen():
    done = run_cli("doctor", "--no-torch")
    assert done.returncode in (0, 1), done.stderr
    assert b"tmpdir" in done.stdout and b"/dev/shm" in done.stdout and b"Traceback" not in done.stderr
    data = json.loads(run_cli("doctor", "--no-torch", "--json").stdout)
    assert data["schema"] == "torchtriage.doctor/1" and data["status"] in ("ok", "warn", "fail")


def test_cli_doctor_fails_on_a_bad_env(tmp_path):
    env = dict(os.environ, DIST_NCCL_TIMEOUT_MINUTES="0")
    done = subprocess.run(
        [sys.executable, "-m", "torchtriage", "doctor", "--no-torch"], capture_output=True, env=env, timeout=120
    )
    assert done.returncode == 1 and b"DIST_NCCL_TIMEOUT_MINUTES" in done.stdout


def test_cli_ranks_outside_a_launcher_is_a_usage_error():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run(
        [sys.executable, "-m", "torchtriage", "doctor", "--ranks"], capture_output=True, env=env, timeout=120
    )
    assert done.returncode == 2 and b"torchrun" in done.stderr


@pytest.mark.slow
def test_ranks_under_torchrun_name_the_rank_whose_env_differs(tmp_path):
    pytest.importorskip("torch")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun not found")
    wrapper = tmp_path / "rank.sh"
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$RANK" = 1 ]; then export NCCL_SOCKET_IFNAME=lo; else export NCCL_SOCKET_IFNAME=^docker; fi\n'
        f'exec {sys.executable} -m torchtriage doctor --ranks --json --no-torch > "{tmp_path}/out_$RANK.json"\n'
    )
    wrapper.chmod(0o755)
    env = dict(os.environ, TMPDIR="/tmp")
    done = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", "--no-python", str(wrapper)],
        capture_output=True,
        env=env,
        timeout=180,
        cwd=tmp_path,
    )
    report = json.loads((tmp_path / "out_0.json").read_text())
    (diff,) = [x for x in report["rank_differences"] if x["fact"] == "env NCCL_SOCKET_IFNAME"]
    assert diff["values"] == {"'^docker'": [0], "'lo'": [1]}
    failing = [c for c in report["checks"] if c["name"] == "ranks env NCCL_SOCKET_IFNAME"]
    assert failing and failing[0]["status"] == "fail"
    assert report["status"] == "fail" and done.returncode != 0
    assert (tmp_path / "out_1.json").read_text() == ""  # only rank 0 prints
