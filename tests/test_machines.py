"""The culprit's machine: every verdict names the host, pid (and GPU) of its culprit where a source says it, and
says so when none does. The job is real: torchrun + gloo under `torchtriage run`, rank 1 hanging."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, run_cli
from hung_job import TORCHRUN, HungJob, ready_lines
from torchtriage.protocol import IDENTITY_SCHEMA, TEST_HOSTNAME_ENV
from torchtriage.sources.identity import read_identity
from torchtriage.sources.registrations import REGISTRATIONS_SCHEMA, read_registrations, registered_host

PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")


def _wait_for(path: Path, job: HungJob, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared:\n" + "".join(job.output[-30:])
        time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed")
@pytest.mark.skipif(not Path(PY_SPY).exists(), reason="py-spy is not installed")
def test_every_verdict_of_a_hung_job_names_the_culprits_host_and_pid(tmp_path):
    # The ranks record where they run; the test names their machine "node-b" (a test-only override of the host
    # name), so that the verdict is seen to take the host from the rank's record, not from where it was read.
    out = tmp_path / "run"
    run = [sys.executable, "-m", "torchtriage", "run", "--out", str(out), "--stall-seconds", "3", "--"]
    with HungJob(mode="skip", culprit=1, prefix=run, env={TEST_HOSTNAME_ENV: "node-b"}) as job:
        record = out / "identity" / "rank1.json"
        assert stat.S_IMODE(record.stat().st_mode) == 0o600  # private, like everything in the run folder
        # Live: the capture reads host and pid from the processes it finds.
        pids = [arg for rank in sorted(job.ready) for arg in ("--pid", job.ready[rank])]
        live = run_cli("diagnose", *pids, "--out", tmp_path / "live", "--json")
        assert live.stdout, live.stderr.decode()
        verdict = json.loads(live.stdout)
        assert verdict["culprit_ranks"] == [1]
        (machine,) = verdict["culprit_machines"]
        assert machine["pid"] == job.ready[1] and machine["rank"] == 1
        assert "capture" in machine["sources"] and "identity" in machine["sources"]
        _wait_for(out / "hang" / "verdict.json", job)
    # Post-mortem: the run folder, in each of the three renderings.
    done = run_cli("diagnose", out, "--json")
    verdict = json.loads(done.stdout)
    assert verdict["culprit_ranks"] == [1]
    (machine,) = verdict["culprit_machines"]
    assert (machine["host"], machine["pid"], machine["local_rank"]) == ("node-b", job.ready[1], 1)
    assert machine["sources"][0] == "identity"
    text = run_cli("diagnose", out).stdout.decode()
    assert f"machine   rank 1: host node-b, pid {job.ready[1]}" in text
    page = tmp_path / "report.html"
    run_cli("report", out, "--html", page)
    assert f"machine: rank 1: host node-b, pid {job.ready[1]}" in page.read_text()


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed")
def test_the_watchdogs_own_verdict_and_runs_end_line_name_the_culprits_machine(tmp_path):
    # The watchdog's verdict is the one a user reads first (DIR/hang/verdict.txt, and `run`'s last lines): it names
    # the host the culprit recorded ("node-b", a test-only override of the host name) beside the pid its stack gives.
    out = tmp_path / "run"
    run = [sys.executable, "-m", "torchtriage", "run", "--out", str(out), "--stall-seconds", "3", "--"]
    with HungJob(mode="skip", culprit=1, prefix=run, env={TEST_HOSTNAME_ENV: "node-b"}) as job:
        _wait_for(out / "hang" / "verdict.json", job)
        os.kill(job.agent, signal.SIGTERM)  # as a scheduler ends a job: `run` passes it on, then says how it ended
        job.proc.wait(timeout=60)
        deadline = time.monotonic() + 10
        while not any("torchtriage run: the job" in line for line in job.output) and time.monotonic() < deadline:
            time.sleep(0.2)  # the last lines are still in the pipe
    verdict = json.loads((out / "hang" / "verdict.json").read_text())
    assert verdict["culprit_ranks"] == [1], verdict["summary"]
    (machine,) = verdict["culprit_machines"]
    assert (machine["host"], machine["pid"], machine["local_rank"]) == ("node-b", job.ready[1], 1)
    assert "identity" in machine["sources"]
    assert f"rank 1: host node-b, pid {job.ready[1]}" in (out / "hang" / "verdict.txt").read_text()
    (said,) = [line for line in job.output if line.startswith("torchtriage run: a stall was diagnosed")]
    assert f"the culprit ran on node-b (pid {job.ready[1]})" in said, "".join(job.output[-20:])


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed")
def test_a_diagnosis_through_the_store_names_the_host_each_rank_registered(tmp_path):
    # `diagnose --store` reaches the ranks through the URLs their debug servers registered in the job's store
    # (http://<the rank's host>:<port>); that host, and the pid the rank's stack names, place the culprit.
    from hung_job import clean_environment, stop_agents
    from test_debug_server import _diagnose_until_hung, _ready_lines, _start_agents, _store_address

    procs = _start_agents(tmp_path / "run", "hang.py", clean_environment(HANG_MODE="skip", HANG_CULPRIT="1"), 1, 2)
    try:
        ready = ready_lines("".join(_ready_lines(procs[0])))
        address = _store_address(tmp_path / "run", procs)
        verdict = _diagnose_until_hung(address, 2, tmp_path)
    finally:
        stop_agents(procs)
    assert verdict["culprit_ranks"] == [1], verdict["summary"]
    (machine,) = verdict["culprit_machines"]
    assert (machine["host"], machine["pid"]) == (socket.gethostname(), ready[1])
    assert "debug_server" in machine["sources"]


# What `kubectl get pods -o custom-columns=NAME:.metadata.name,NODE:.spec.nodeName` prints for the pods of
# STANDIN_PODS, their nodes from STANDIN_NODES (pod=node,...); everything else is the shared stand-in's.
_KUBECTL_WITH_NODES = """#!{python}
import os, sys
args = sys.argv[1:]
if args[:2] == ["get", "pods"] and any(a.startswith("custom-columns=") for a in args):
    nodes = dict(pair.split("=") for pair in os.environ["STANDIN_NODES"].split(","))
    print("\\n".join(f"{{pod}}   {{nodes.get(pod, '<none>')}}" for pod in os.environ["STANDIN_PODS"].split(",")))
    sys.exit(0)
os.execv(sys.executable, [sys.executable, {standin!r}, *args])
"""


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed")
@pytest.mark.skipif(not Path(PY_SPY).exists(), reason="py-spy is not installed")
def test_a_diagnosis_of_pods_names_the_node_the_culprits_pod_ran_on(tmp_path):
    # Two pods of one job, two ranks each, rank 2 hanging. The machine to cordon or drain is the pod's node, which
    # kubectl knows (the pod itself does not): the verdict names it, with the pid the pod's capture found.
    from hung_job import clean_environment, stop_agents
    from test_debug_server import STANDINS, _ready_lines, _start_agents

    # Pod names of this run's own: a capture takes the torchrun jobs whose HOSTNAME is its pod's, so another run of
    # this test on the machine at the same time must not share them.
    job_name = f"myjob{os.getpid()}"
    pods, nodes = [f"{job_name}-master-0", f"{job_name}-worker-0"], ["gpu-node-a", "gpu-node-b"]
    kubectl = tmp_path / "bin" / "kubectl"
    kubectl.parent.mkdir()
    kubectl.write_text(_KUBECTL_WITH_NODES.format(python=sys.executable, standin=str(STANDINS / "kubectl")))
    kubectl.chmod(0o755)
    path = os.pathsep.join((str(kubectl.parent), str(Path(sys.executable).parent), os.environ["PATH"]))
    selector = f"training.kubeflow.org/job-name={job_name}"
    env = {**os.environ, "PATH": path, "STANDIN_PODS": ",".join(pods), "STANDIN_SELECTOR": selector,
           "STANDIN_NODES": ",".join(f"{pod}={node}" for pod, node in zip(pods, nodes, strict=True))}  # fmt: skip
    job = clean_environment(HANG_MODE="skip", HANG_CULPRIT="2")
    procs = _start_agents(tmp_path / "run", "hang.py", job, 2, 2, pods=pods)
    try:
        ready = ready_lines("".join(line for proc in procs for line in _ready_lines(proc)))
        time.sleep(2)
        command = [sys.executable, "-m", "torchtriage", "diagnose", "--pods", selector, "--out", str(tmp_path / "pods")]
        done = subprocess.run([*command, "--json"], env=env, capture_output=True, text=True, timeout=180)
    finally:
        stop_agents(procs)
    assert done.stdout.startswith("{"), done.stderr[-2000:]
    verdict = json.loads(done.stdout)
    assert verdict["culprit_ranks"] == [2], verdict["summary"]
    summaries = {pod: json.loads((tmp_path / "pods" / pod / "summary.json").read_text()) for pod in pods}
    (holder,) = [pod for pod in pods if 2 in {p["rank"] for p in summaries[pod]["processes"]}]
    (machine,) = verdict["culprit_machines"]
    assert (machine["host"], machine["pod"], machine["pid"]) == (nodes[pods.index(holder)], holder, ready[2])
    assert "capture" in machine["sources"]
    assert summaries[holder]["kubernetes"] == {"pod": holder, "namespace": None, "node": nodes[pods.index(holder)]}


def test_a_verdict_whose_sources_place_no_rank_says_so(tmp_path):
    # A rank's traceback with no launcher report, no capture, no record: nothing read says where it ran.
    log = tmp_path / "job.log"
    log.write_text(
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/srv/job/train.py", line 12, in <module>\n'
        "[rank1]:     step()\n"
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity "
        "of 79.10 GiB of which 1.12 GiB is free.\n"
    )
    verdict = json.loads(run_cli("triage", log, "--json").stdout)
    assert verdict["culprit_ranks"] == [1]
    assert verdict["culprit_machines"] == [
        {
            "rank": 1,
            "host": None,
            "pid": None,
            "gpu_index": None,
            "gpu_uuid": None,
            "gpu_pci_bus_id": None,
            "local_rank": None,
            "attempt": None,
            "sources": [],
            "pod": None,
        }
    ]
    text = run_cli("triage", log).stdout.decode()
    assert "machine   not recorded: nothing read says where rank 1 ran" in text


def test_torchruns_failure_report_places_the_culprit_in_a_log():
    # A real torchrun job's console: its failure report names each failed child's host and pid.
    verdict = json.loads(run_cli("triage", FIXTURES / "logs" / "raise_in_rank", "--json").stdout)
    assert verdict["culprit_ranks"] == [1]
    (machine,) = verdict["culprit_machines"]
    report = (FIXTURES / "logs" / "raise_in_rank" / "run.log").read_text()
    entry = report[report.index("rank      : 1 (local_rank: 1)") :]
    pid = int(entry.split("(pid: ", 1)[1].split(")", 1)[0])
    assert (machine["host"], machine["pid"], machine["sources"]) == ("localhost", pid, ["launcher"])


@pytest.mark.parametrize(
    "record, says",
    [
        (
            {"rank": 3, "host": ["a"], "pid": "x" * 40, "gpu": {"uuid": 5}},
            {"host": None, "pid": None, "gpu_uuid": None},
        ),
        ({"rank": 3, "host": "a\nb", "pid": -4, "gpu": "GPU-1"}, {"host": None, "pid": None, "gpu_uuid": None}),
        ({"rank": 3, "host": "a17", "pid": 42, "gpu": {"index": 2, "uuid": "GPU-9"}}, {"host": "a17", "gpu_index": 2}),
    ],
)
def test_an_identity_record_from_another_machine_is_read_field_by_field(tmp_path, record, says):
    path = tmp_path / "rank3.json"
    path.write_text(json.dumps({"schema": IDENTITY_SCHEMA, **record}))
    machine = read_identity(str(path)).machine
    assert machine.rank == 3
    assert {name: getattr(machine, name) for name in says} == says


def test_a_record_without_a_rank_is_named_not_trusted(tmp_path):
    path = tmp_path / "rank3.json"
    path.write_text(json.dumps({"schema": IDENTITY_SCHEMA, "rank": "three", "host": "a17"}))
    assert read_identity(str(path)) == f"{path}: an identity record without a rank."


def test_a_post_mortem_folder_takes_the_host_from_the_launchers_report_and_the_pid_from_the_stacks():
    # A real 2-rank NCCL hang on one H200: rank 1's stack dump names its process, torchrun's report its host.
    verdict = json.loads(run_cli("diagnose", FIXTURES / "h200x2" / "skip", "--json").stdout)
    (machine,) = verdict["culprit_machines"]
    assert (machine["rank"], machine["host"], machine["pid"]) == (1, "localhost", 670)
    assert machine["sources"] == ["stacks", "launcher"]


@pytest.mark.parametrize(
    "url, host",
    [
        ("http://node-07:41234", "node-07"),
        ("http://GPU-Node-3.cluster.local:80", "GPU-Node-3.cluster.local"),  # as gethostname() said it
        ("http://[fe80::1]:8080", "fe80::1"),
        ("https://node-07:1", None),
        ("http://:80", None),
        ("<a value of 9,000 bytes>", None),
    ],
)
def test_a_registered_url_gives_the_host_the_rank_wrote(url, host):
    assert registered_host(url) == host


def test_registrations_from_a_store_are_read_field_by_field(tmp_path):
    # The store is another machine's: a host that is no name, ranks that are no ranks are left out, never trusted.
    path = tmp_path / "registrations.json"
    hosts = {"node-a": [0, 1], "node-b": [2, "3", -1, 1 << 40, None], "bad\nhost": [4], "": [5], "node-c": "6"}
    path.write_text(json.dumps({"schema": REGISTRATIONS_SCHEMA, "hosts": hosts}))
    problems: list[str] = []
    assert read_registrations(str(path), problems) == {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}
    assert problems == []
    path.write_text(json.dumps({"schema": REGISTRATIONS_SCHEMA, "hosts": ["node-a"]}))
    assert read_registrations(str(path), problems) == {}
    assert problems == [f"{path}: not a record of the debug servers' registrations ({REGISTRATIONS_SCHEMA})."]


def test_a_post_mortem_reads_each_identity_record_once_and_a_rewritten_one_again(tmp_path, monkeypatch):
    from torchtriage.analysis.pipeline import triage_paths
    from torchtriage.sources import identity

    (tmp_path / "identity").mkdir()
    for rank in range(3):
        record = {"schema": IDENTITY_SCHEMA, "rank": rank, "world_size": 3, "host": f"n{rank}", "pid": 100 + rank}
        (tmp_path / "identity" / f"rank{rank}.json").write_text(json.dumps(record))
    (tmp_path / "rank1.log").write_text("[rank1]: torch.OutOfMemoryError: CUDA out of memory.\n")
    reads: list[str] = []
    real = identity.read_identity
    monkeypatch.setattr(identity, "read_identity", lambda path: reads.append(path) or real(path))
    verdict = triage_paths([str(tmp_path)])
    assert sorted(Path(p).name for p in reads) == ["rank0.json", "rank1.json", "rank2.json"]
    assert [(m.rank, m.host) for m in verdict.culprit_machines] == [(1, "n1")]
    # The record rewritten (a restarted attempt on another host) is read again, not taken from memory.
    moved = {"schema": IDENTITY_SCHEMA, "rank": 1, "world_size": 3, "host": "n7-restarted", "pid": 9}
    (tmp_path / "identity" / "rank1.json").write_text(json.dumps(moved))
    verdict = triage_paths([str(tmp_path)])
    assert [(m.rank, m.host) for m in verdict.culprit_machines] == [(1, "n7-restarted")]


def _pdsh_log(tmp_path: Path) -> Path:
    # Two nodes' lines as pdsh merges them ("<host>: " before each); rank 3 fails on node-a07, and rank 0's FSDP
    # warning, printed on node-a02, names rank 3: the line of one machine about another's rank.
    log = tmp_path / "pdsh.log"
    log.write_text(
        "node-a02: [rank0]: UserWarning: Forward order differs from that of the first iteration on rank 3. "
        "Collectives are unchecked and may give incorrect results or hang.\n"
        "node-a07: [rank3]: Traceback (most recent call last):\n"
        'node-a07: [rank3]:   File "/srv/job/train.py", line 40, in <module>\n'
        "node-a07: [rank3]:     loss.backward()\n"
        "node-a07: [rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a "
        "total capacity of 79.10 GiB of which 1.12 GiB is free.\n"
    )
    return log


def test_the_host_prefix_of_the_culprits_own_lines_places_it(tmp_path):
    log = _pdsh_log(tmp_path)
    verdict = json.loads(run_cli("triage", log, "--json").stdout)
    assert verdict["culprit_ranks"] == [3]
    (machine,) = verdict["culprit_machines"]
    assert (machine["host"], machine["sources"]) == ("node-a07", ["host_prefix"])
    assert "machine   rank 3: host node-a07" in run_cli("triage", log).stdout.decode()


def test_a_host_prefix_that_disagrees_places_nobody(tmp_path):
    # The same rank printing from two machines (a restart elsewhere, or a numbering the prefix does not share):
    # neither host is said.
    log = _pdsh_log(tmp_path)
    log.write_text(log.read_text() + "node-b11: [rank3]: torch.OutOfMemoryError: CUDA out of memory.\n")
    verdict = json.loads(run_cli("triage", log, "--json").stdout)
    assert verdict["culprit_ranks"] == [3]
    assert verdict["culprit_machines"][0]["host"] is None


def test_a_failure_no_rank_printed_names_the_host_that_printed_it(tmp_path):
    # DeepSpeed's launcher over pdsh: every line of one node carries its host, none a rank.
    log = tmp_path / "node.log"
    log.write_text(
        "gpu-node-17: RuntimeError: NCCL error in: ../torch/lib/c10d/ProcessGroupNCCL.cpp:825, internal error, "
        "NCCL version 2.9.9\n"
        "gpu-node-17: ncclInternalError: Internal check failed. This is either a bug in NCCL or due to memory "
        "corruption\n"
    )
    verdict = json.loads(run_cli("triage", log, "--json").stdout)
    assert verdict["culprit_ranks"] == []
    assert verdict["facts"]["failing_host"] == {"host": "gpu-node-17", "file": str(log), "line": 1}
    text = run_cli("triage", log).stdout.decode()
    assert "machine   host gpu-node-17" in text and "no rank is named" in text
