"""`dump` and `record` on a real hung torchrun + gloo job, with the real py-spy.

The job is tests/jobs/hang.py (HANG_MODE=skip: rank 1 sleeps while rank 0 waits in all_reduce). Its
whole process group is killed in a finally block, whatever happens.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli
from hung_job import HungJob, job_environment, torchrun_command
from torchtriage import exit_codes

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
HANG = ROOT / "tests" / "jobs" / "hang.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(PY_SPY).exists(), reason="py-spy is not installed"),
    pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed"),
]


def job_command(ranks=2):
    return torchrun_command(ranks)


def job_env():
    return job_environment("skip", 1)


@pytest.fixture
def hung_job():
    job = HungJob()
    try:
        yield job
    finally:
        job.kill()


def py_spy_processes(pids):
    """Live py-spy processes pointed at any of `pids`."""
    found = []
    wanted = {str(p) for p in pids}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")  # any process's bytes
        except OSError:
            continue
        if argv and Path(argv[0]).name == "py-spy" and wanted & set(argv):
            found.append(int(entry.name))
    return found


def status(pid):
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def assert_untouched(pids):
    for pid in pids:
        st = status(pid)
        assert st["TracerPid"] == "0", f"pid {pid} is still traced"
        assert not st["State"].startswith(("T", "t")), f"pid {pid} was left stopped: {st['State']}"
    assert py_spy_processes(pids) == []


def only_folder(out):
    (folder,) = out.iterdir()
    return folder


def main_thread_functions(rank_json):
    threads = json.loads(rank_json.read_text())
    (main,) = [t for t in threads if t["thread_name"] == "MainThread"]
    return [frame["name"] for frame in main["frames"]]


def test_dump_from_the_agent_pid_writes_each_ranks_stacks(tmp_path, hung_job):
    done = run_cli("dump", "--json", "--pid", hung_job.agent, "--out", tmp_path)
    assert done.returncode == exit_codes.OK, done.stderr.decode()
    summary = json.loads(done.stdout)
    folder = only_folder(tmp_path)
    assert json.loads((folder / "summary.json").read_text()) == summary
    assert summary["kind"] == "dump" and summary["ok"] is True
    assert [(p["rank"], p["pid"], p["world_size"], p["agent_pid"]) for p in summary["processes"]] == [
        (0, hung_job.ready[0], 2, hung_job.agent),
        (1, hung_job.ready[1], 2, hung_job.agent),
    ]
    assert (folder / "rank00.txt").read_text().startswith(f"Process {hung_job.ready[0]}:")
    assert "culprit_skip (hang.py:" in (folder / "rank01.txt").read_text()
    assert "all_reduce" in main_thread_functions(folder / "rank00.json")
    assert "culprit_skip" in main_thread_functions(folder / "rank01.json")
    # Rank 1 is idle in its own line (a C call its Python frames do not name): its native frames are taken, once
    # for its place, and show the sleep; rank 0's all_reduce needs none.
    assert "time_sleep" in (folder / "rank01.native.txt").read_text()
    assert not (folder / "rank00.native.txt").exists()
    assert summary["processes"][1]["files"] == ["rank01.txt", "rank01.json", "rank01.native.txt"]
    assert_untouched(hung_job.ready.values())


def test_default_discovery_finds_the_job_in_its_own_pid_namespace(tmp_path):
    # Other jobs may run on this machine; a private pid namespace holds exactly one.
    if subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode:
        pytest.skip("cannot create a pid namespace here (needs root and unshare)")
    driver = tmp_path / "driver.py"
    driver.write_text(
        f"""
import json, os, signal, subprocess, sys
job = subprocess.Popen({job_command()!r}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       start_new_session=True)
try:
    ready = {{}}
    for line in job.stdout:
        if line.startswith("READY "):
            fields = dict(p.split("=") for p in line.split()[1:])
            ready[fields["rank"]] = int(fields["pid"])
            if len(ready) == 2:
                break
    done = subprocess.run([sys.executable, "-m", "torchtriage", "dump", "--json", "--out", {str(tmp_path / "out")!r}],
                          capture_output=True, text=True, timeout=120)
    print(json.dumps({{"rc": done.returncode, "out": done.stdout, "err": done.stderr, "ready": ready}}))
finally:
    os.killpg(job.pid, signal.SIGKILL)
"""
    )
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(driver)],
        env=job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the namespace's init: its death ends everything inside
        except ProcessLookupError:
            pass
        proc.wait()
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["rc"] == exit_codes.OK, result["err"] + stderr
    summary = json.loads(result["out"])
    assert {str(p["rank"]): p["pid"] for p in summary["processes"]} == result["ready"]
    assert all(p["files"][:2] == [f"rank0{p['rank']}.txt", f"rank0{p['rank']}.json"] for p in summary["processes"])


def test_a_process_that_cannot_be_attached_is_named_and_the_ranks_are_still_captured(tmp_path, hung_job):
    not_python = subprocess.Popen(["sleep", "300"])
    try:
        done = run_cli("dump", "--pid", hung_job.agent, "--pid", not_python.pid, "--out", tmp_path)
    finally:
        not_python.kill()
        not_python.wait()
    stdout = done.stdout.decode()
    assert done.returncode == exit_codes.PROBLEM_FOUND, done.stderr.decode()
    (reason,) = [line for line in stdout.splitlines() if f"(pid {not_python.pid})" in line]
    assert "Failed to find python version" in reason and "does not look like a Python program" in reason
    folder = only_folder(tmp_path)
    assert sorted(p.name for p in folder.glob("rank*")) == [
        "rank00.json",
        "rank00.txt",
        "rank01.json",
        "rank01.native.txt",
        "rank01.txt",
    ]
    summary = json.loads((folder / "summary.json").read_text())
    assert [p["ok"] for p in summary["processes"]] == [True, True, False]


def test_record_writes_a_flame_graph_and_a_speedscope_profile_per_rank(tmp_path, hung_job):
    done = run_cli("record", "--json", "--idle", "--duration", 2, "--pid", hung_job.agent, "--out", tmp_path)
    assert done.returncode == exit_codes.OK, done.stderr.decode()
    folder = only_folder(tmp_path)
    for rank in (0, 1):
        assert "<svg" in (folder / f"rank0{rank}.svg").read_text()
        profile = json.loads((folder / f"rank0{rank}.speedscope.json").read_text())
        assert "speedscope" in profile["$schema"]
    summary = json.loads(done.stdout)
    assert summary["kind"] == "record"
    assert all(p["samples"][f"rank0{p['rank']}.svg"]["samples"] > 0 for p in summary["processes"])
    assert_untouched(hung_job.ready.values())


def test_ctrl_c_during_record_leaves_no_py_spy_attached(tmp_path, hung_job):
    workers = list(hung_job.ready.values())
    cli = subprocess.Popen(
        [sys.executable, "-m", "torchtriage", "record", "--duration", "120", "--pid", str(hung_job.agent)]
        + ["--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(py_spy_processes(workers)) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(py_spy_processes(workers)) == 4, "the four recorders never started"
        time.sleep(1)
        cli.send_signal(signal.SIGINT)
        stdout, stderr = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 130, stderr
    assert_untouched(workers)
    summary = json.loads((only_folder(tmp_path) / "summary.json").read_text())
    assert summary["interrupted"] is True
