"""`diagnose --store`: every rank's state from PyTorch's debug server, found through the job's store.

The live tests start real torchrun + gloo jobs under `torchtriage run --debug-server` (the worker HTTP
server of torch.distributed.debug in every rank), let them really hang, and diagnose them from outside
with nothing but the store's address. The others serve the real handler names from threads on loopback,
registered in a real TCPStore, to cover what a live job cannot do on demand (ranks that never answer).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import run_cli
from hung_job import TORCHRUN, clean_environment, stop_agents
from torchtriage import exit_codes

JOBS = Path(__file__).parent / "jobs"
torch_debug = pytest.importorskip("torch.distributed.debug", reason="torch >= 2.10 has the debug server")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_agents(
    out: Path, job: str, env: dict, nodes: int, per_node: int, slurm_job: str | None = None, pods=None
) -> list[subprocess.Popen]:
    """`nodes` torchrun agents on this host, each under `torchtriage run --debug-server` writing one folder,
    meeting through c10d's rendezvous as that many nodes would (with `slurm_job`, each carries the job and
    node ids SLURM gives the tasks of a node)."""
    port = _free_port()
    procs = []
    for node in range(nodes):
        if slurm_job is not None:
            env = {**env, "SLURM_JOB_ID": slurm_job, "SLURM_NODEID": str(node)}
        if pods is not None:
            env = {**env, "HOSTNAME": pods[node]}  # the pod's name, as the kubelet sets it
        command = [sys.executable, "-m", "torchtriage", "run", "--debug-server", "--out", str(out)]
        command += ["--stall-seconds", "600", "--", str(TORCHRUN), "--nnodes", str(nodes), "--node_rank", str(node)]
        command += ["--nproc_per_node", str(per_node), "--rdzv_backend", "c10d"]
        command += ["--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "debug", str(JOBS / job)]
        procs.append(
            subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, text=True
            )
        )
    return procs


def _store_address(out: Path, procs, timeout: float = 120) -> str:
    path = out / "debug_server.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not path.exists():
        assert all(p.poll() is None for p in procs), "the job ended before its debug server started"
        time.sleep(0.5)
    assert path.exists(), "rank 0 wrote no debug_server.json"
    return json.loads(path.read_text())["store"]


def diagnose_store(address: str, out: Path, *extra: str) -> tuple[int, dict, str]:
    done = run_cli("diagnose", "--store", address, "--out", str(out), "--json", *extra)
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    text = done.stdout.decode()
    return done.returncode, json.loads(text) if text.strip().startswith("{") else {}, done.stderr.decode()


def _diagnose_until_hung(address: str, ranks: int, tmp_path: Path, timeout: float = 120) -> dict:
    """`diagnose --store` until every rank answered and the job is in its hang (the workers register within
    a watchdog poll of the process group's creation, and the warm-up steps take a moment)."""
    deadline = time.monotonic() + timeout
    verdict: dict = {}
    while time.monotonic() < deadline:
        code, verdict, _ = diagnose_store(address, tmp_path / "cap", "--timeout", "5")
        answered = verdict.get("facts", {}).get("debug_server", {}).get("answered")
        if code == exit_codes.PROBLEM_FOUND and answered == ranks and verdict.get("culprit_ranks"):
            return verdict
        time.sleep(2)
    raise AssertionError(f"no verdict from every rank: {verdict.get('summary')}")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "culprit", "function"),
    [
        ("world_for_subgroup", 6, "all_reduce_on_the_world_instead"),
        ("early_exit", 1, "end_of_training"),
        ("opposite_order", 5, "sync_world"),
        ("skip_send", 5, "sync_world"),  # where it went instead of sending
    ],
)
def test_two_agents_with_the_debug_server_are_diagnosed_from_outside(tmp_path, case, culprit, function):
    # Two agents acting as two nodes, four ranks each; rank 6 is on the second "node".
    procs = _start_agents(tmp_path / "run", "cross_group.py", clean_environment(CASE=case, CULPRIT=str(culprit)), 2, 4)
    try:
        address = _store_address(tmp_path / "run", procs)
        found = _diagnose_until_hung(address, 8, tmp_path)
    finally:
        stop_agents(procs)
    assert found["culprit_ranks"] == [culprit], found["summary"]
    assert found["confidence"] == "high", found["summary"]
    assert found["facts"]["debug_server"]["world_size"] == 8
    assert found["facts"].get("user_frame", {}).get("function") == function, (found["facts"].keys(), found["summary"])
    captured = Path(found["facts"]["capture_folder"])
    assert sorted(p.name for p in (captured / "fr").iterdir()) == [f"debug_server_fr_rank_{r}.json" for r in range(8)]


@pytest.mark.slow
def test_a_rank_that_does_not_answer_is_named_and_stays_the_suspect(tmp_path):
    # Rank 1 sleeps instead of joining; then it is stopped (SIGSTOP): its worker thread cannot answer either.
    env = clean_environment(HANG_MODE="skip", HANG_CULPRIT="1")
    procs = _start_agents(tmp_path / "run", "hang.py", env, 1, 2)
    try:
        address = _store_address(tmp_path / "run", procs)
        _diagnose_until_hung(address, 2, tmp_path)
        pid = next(int(line.split("pid=")[1]) for line in _ready_lines(procs[0]) if line.startswith("READY rank=1 "))
        os.kill(pid, signal.SIGSTOP)
        try:
            code, verdict, _ = diagnose_store(address, tmp_path / "cap", "--timeout", "2")
        finally:
            os.kill(pid, signal.SIGCONT)
    finally:
        stop_agents(procs)
    assert code == exit_codes.PROBLEM_FOUND
    assert verdict["facts"]["debug_server"]["not_answering"].keys() == {"1"}
    assert any(p.startswith("rank 1 did not answer at http://") and "within 2 s" in p for p in verdict["problems"])
    assert verdict["culprit_ranks"] == [1]  # rank 0's flight recorder and stack wait for it
    assert verdict["confidence"] != "high"  # what rank 1 does is not seen


def _ready_lines(proc, want: int = 2, timeout: float = 60) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and sum(line.startswith("READY") for line in lines) < want:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
    return lines


# ----------------------------------------------------------------- simulated workers, a real TCPStore


def _spy_text(rank: int, function: str, line: int, op: str | None) -> str:
    """A rank's stack in py-spy's text form, as the worker's pyspy_dump handler returns it."""
    frames = [f"    {op} (torch/distributed/distributed_c10d.py:2950)"] if op else ["    sleep (time.py:0)"]
    frames += [f"    {function} (train.py:{line})", "    main (train.py:90)", "    <module> (train.py:99)"]
    state = "active" if op else "idle"
    return "\n".join([f"Process {1000 + rank}: python train.py", "Python v3.11.7", "",
                      f'Thread {1000 + rank} ({state}): "MainThread"', *frames, ""])  # fmt: skip


def _fr_json(rank: int, world: int, last_seq: int, pending: bool) -> dict:
    """A gloo flight-recorder dump as fr_trace_json returns it (JSON: no frames)."""
    entries = [
        {"record_id": s - 1, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": s,
         "p2p_seq_id": 0, "op_id": s, "profiling_name": "gloo:all_reduce", "time_created_ns": 1000 + s,
         "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]], "output_dtypes": ["Float"],
         "state": "scheduled", "retired": False, "timeout_ms": 600000, "is_p2p": False}
        for s in range(1, last_seq + 1)
    ]  # fmt: skip
    done = last_seq - 1 if pending else last_seq
    return {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}},
        "pg_status": {"0": {"last_enqueued_collective": last_seq, "last_completed_collective": done}},
        "entries": entries,
    }


class _Workers:
    """`world` debug-server workers on loopback, registered in a real TCPStore as torch's do. `silent` ranks
    accept the connection and never answer (a wedged process); the culprit sleeps where the others wait."""

    def __init__(self, world: int, culprit: int, silent: set[int] = frozenset(), garbage: set[int] = frozenset()):
        from torch.distributed import TCPStore

        self.release = threading.Event()
        self.store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.servers = []
        for rank in range(world):
            departs = rank == culprit
            stack = _spy_text(rank, "train_step", 41 if departs else 37, None if departs else "all_reduce")
            fr = _fr_json(rank, world, 4 if rank == culprit else 5, pending=rank != culprit)
            body = {"pyspy_dump": stack.encode(), "fr_trace_json": json.dumps(fr).encode()}
            if rank in garbage:
                body["fr_trace_json"] = b"\x00\xffnot json"
            server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler(body, rank in silent))
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self.servers.append(server)
            self.store.set(f"debug_server/rank{rank}", f"http://127.0.0.1:{server.server_address[1]}")
        self.address = f"127.0.0.1:{self.store.port}"

    def _handler(self, bodies: dict[str, bytes], silent: bool):
        release = self.release

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the http.server interface
                if silent:
                    release.wait(30)
                    return
                name = self.path.split("?")[0].rsplit("/", 1)[-1]
                body = bodies.get(name)
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write(body if body is not None else f"Handler {name} not found".encode())

            def log_message(self, *args):
                pass

        return Handler

    def close(self):
        from concurrent.futures import ThreadPoolExecutor

        self.release.set()
        with ThreadPoolExecutor(64) as pool:  # each shutdown waits out its server's poll interval
            list(pool.map(lambda server: (server.shutdown(), server.server_close()), self.servers))


def test_every_rank_is_asked_at_once_and_the_silent_ones_are_named(tmp_path):
    silent = {3, 40, 77, 100, 101, 150, 151, 152, 200, 210, 230, 240, 255}  # 5% of 256
    workers = _Workers(256, culprit=17, silent=silent)
    try:
        # 10 s, not 1: on a loaded machine 243 answering workers must not pass for silent ones.
        code, verdict, _ = diagnose_store(workers.address, tmp_path, "--timeout", "10")
    finally:
        workers.close()
    assert code == exit_codes.PROBLEM_FOUND
    assert verdict["culprit_ranks"] == [17], verdict["summary"]  # the others wait in seq 5 for it
    assert verdict["facts"]["user_frame"]["line"] == 41  # its own line, from its stack (JSON has no frames)
    server = verdict["facts"]["debug_server"]
    assert (server["world_size"], server["answered"]) == (256, 256 - len(silent))
    assert {int(r) for r in server["not_answering"]} == silent
    assert sum(p.startswith("rank ") and "did not answer" in p for p in verdict["problems"]) == len(silent)


def test_the_world_size_is_read_from_the_store_and_missing_ranks_are_named(tmp_path):
    workers = _Workers(8, culprit=2)
    workers.store.delete_key("debug_server/rank5")  # never registered
    try:
        code, verdict, _ = diagnose_store(workers.address, tmp_path, "--world-size", "8")
    finally:
        workers.close()
    assert verdict["facts"]["debug_server"]["unregistered"] == [5]
    assert any("rank 5 registered no debug server" in p for p in verdict["problems"])
    assert verdict["culprit_ranks"] == [2]


def test_a_worker_that_answers_garbage_leaves_its_rank_unread_not_a_traceback(tmp_path):
    workers = _Workers(4, culprit=1, garbage={2})
    try:
        code, verdict, stderr = diagnose_store(workers.address, tmp_path)
    finally:
        workers.close()
    assert code == exit_codes.PROBLEM_FOUND and "Traceback" not in stderr
    assert verdict["culprit_ranks"] == [1]


def test_bad_store_addresses_get_one_clear_message(tmp_path):
    done = run_cli("diagnose", "--store", "not-an-address")
    assert done.returncode == exit_codes.USAGE and b"HOST:PORT" in done.stderr
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    done = run_cli("diagnose", "--store", f"127.0.0.1:{port}", "--timeout", "2", "--out", str(tmp_path))
    assert done.returncode not in (exit_codes.OK, exit_codes.PROBLEM_FOUND) and b"Traceback" not in done.stderr
    assert b"cannot reach the job's store" in done.stderr
    from torch.distributed import TCPStore

    empty = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    done = run_cli("diagnose", "--store", f"127.0.0.1:{empty.port}", "--out", str(tmp_path))
    assert b"no debug server registered" in done.stderr and b"Traceback" not in done.stderr


# ------------------------------------------------------------------------------ SLURM, with a stand-in srun

STANDINS = Path(__file__).parent / "standins"


@pytest.mark.slow
def test_diagnose_slurm_runs_one_capture_per_node_and_reads_them_together(tmp_path):
    # Two agents acting as two nodes, two ranks each; rank 3 (the second node) sleeps instead of joining.
    env = clean_environment(HANG_MODE="skip", HANG_CULPRIT="3")
    procs = _start_agents(tmp_path / "run", "hang.py", env, 2, 2, slurm_job="4242")
    try:
        ready = [line for proc in procs for line in _ready_lines(proc)]
        assert len(ready) == 4, ready
        time.sleep(2)  # the peers block in their all_reduce
        log = tmp_path / "srun.log"
        path = f"{STANDINS}{os.pathsep}{os.environ['PATH']}"
        done = subprocess.run(
            [sys.executable, "-m", "torchtriage", "diagnose", "--slurm", "4242", "--out", str(tmp_path / "shared")],
            env={**os.environ, "PATH": path, "STANDIN_LOG": str(log), "STANDIN_JOBID": "4242"},
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        stop_agents(procs)
    assert "Traceback" not in done.stderr, done.stderr
    step = log.read_text().split()
    assert step[:5] == ["--overlap", "--jobid", "4242", "--ntasks-per-node=1", "--kill-on-bad-exit=0"]
    assert step[5:9] == [sys.executable, "-m", "torchtriage", "dump"]
    nodes = sorted(p for p in (tmp_path / "shared").iterdir() if p.is_dir())
    assert len(nodes) == 2, (done.stdout, done.stderr)  # one folder per node
    assert done.returncode == exit_codes.PROBLEM_FOUND, done.stdout
    sleep_line = next(
        n for n, line in enumerate((JOBS / "hang.py").read_text().splitlines(), 1) if "time.sleep(FOREVER_S)" in line
    )
    assert "culprit   3" in done.stdout and f"hang.py:{sleep_line} in culprit_skip" in done.stdout, done.stdout


def test_diagnose_slurm_says_what_is_wrong_without_srun_or_with_a_wrong_job(tmp_path):
    bare = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    done = subprocess.run(
        [sys.executable, "-m", "torchtriage", "diagnose", "--slurm", "4242", "--out", str(tmp_path)],
        env=bare, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == exit_codes.ENVIRONMENT and "srun is not on PATH" in done.stderr
    wrong = {**os.environ, "PATH": f"{STANDINS}{os.pathsep}{os.environ['PATH']}", "STANDIN_JOBID": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torchtriage", "diagnose", "--slurm", "4242", "--out", str(tmp_path / "o")],
        env=wrong, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == exit_codes.ENVIRONMENT and "Invalid job id" in done.stderr
    assert "Traceback" not in done.stderr
    done = run_cli("diagnose", "--slurm", "not-a-job")
    assert done.returncode == exit_codes.USAGE and b"job's id" in done.stderr


@pytest.mark.slow
def test_dump_and_record_with_slurm_capture_each_node_its_own_ranks(tmp_path):
    env = clean_environment(HANG_MODE="skip", HANG_CULPRIT="3")
    procs = _start_agents(tmp_path / "run", "hang.py", env, 2, 2, slurm_job="4242")
    standin = {**os.environ, "PATH": f"{STANDINS}{os.pathsep}{os.environ['PATH']}", "STANDIN_JOBID": "4242"}
    try:
        assert len([line for proc in procs for line in _ready_lines(proc)]) == 4
        dumped = subprocess.run(
            [sys.executable, "-m", "torchtriage", "dump", "--slurm", "4242", "--out", str(tmp_path / "stacks")],
            env=standin, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        recorded = subprocess.run(
            [sys.executable, "-m", "torchtriage", "record", "--slurm", "4242", "--duration", "1", "--idle",
             "--out", str(tmp_path / "flames")],
            env=standin, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    finally:
        stop_agents(procs)
    assert dumped.returncode == exit_codes.OK, dumped.stdout + dumped.stderr
    assert "2 node folder(s) of SLURM job 4242" in dumped.stdout
    # Each node's step took the ranks of its own node only: the two agents carry SLURM_NODEID 0 and 1.
    by_node = sorted(
        sorted(r["rank"] for r in json.loads((folder / "summary.json").read_text())["processes"])
        for folder in (tmp_path / "stacks").iterdir()
    )
    assert by_node == [[0, 1], [2, 3]]
    assert recorded.returncode == exit_codes.OK, recorded.stdout + recorded.stderr
    assert len(list((tmp_path / "flames").glob("*/rank*.svg"))) == 4


def test_slurm_and_pid_do_not_go_together():
    done = run_cli("dump", "--slurm", "4242", "--pid", "1")
    assert done.returncode == exit_codes.USAGE and b"--pid names processes of this node" in done.stderr


# ------------------------------------------------------------------- Kubernetes, with a stand-in kubectl


@pytest.mark.slow
def test_diagnose_pods_execs_the_capture_in_every_pod_and_reads_them_together(tmp_path):
    # Two pods of one job (a PyTorchJob's master and worker), two ranks each; rank 2 sleeps instead of joining.
    pods = ["myjob-master-0", "myjob-worker-0"]
    procs = _start_agents(tmp_path / "run", "hang.py", clean_environment(HANG_MODE="skip", HANG_CULPRIT="2"), 2, 2,
                          pods=pods)  # fmt: skip
    # In a pod, torchtriage is installed where the training runs: its console script is on the pod's PATH.
    path = os.pathsep.join((str(STANDINS), str(Path(sys.executable).parent), os.environ["PATH"]))
    standin = {**os.environ, "PATH": path, "STANDIN_PODS": ",".join(pods),
               "STANDIN_SELECTOR": "training.kubeflow.org/job-name=myjob"}  # fmt: skip
    try:
        assert len([line for proc in procs for line in _ready_lines(proc)]) == 4
        time.sleep(2)
        done = subprocess.run(
            [sys.executable, "-m", "torchtriage", "diagnose", "--pods", "training.kubeflow.org/job-name=myjob",
             "--out", str(tmp_path / "pods"), "--json"],
            env=standin, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    finally:
        stop_agents(procs)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout.startswith("{"), done.stderr[-2000:]
    verdict = json.loads(done.stdout)
    assert sorted(p.name for p in (tmp_path / "pods").iterdir()) == sorted(pods)  # one folder per pod
    # Each pod's capture took its own ranks (the pods share this host's process table here).
    summaries = {pod: json.loads((tmp_path / "pods" / pod / "summary.json").read_text()) for pod in pods}
    ranks = {pod: sorted(r["rank"] for r in summary["processes"]) for pod, summary in summaries.items()}
    assert sorted(ranks.values()) == [[0, 1], [2, 3]]  # c10d's rendezvous decides which pod holds which
    assert verdict["culprit_ranks"] == [2], verdict["summary"]
    assert verdict["facts"]["user_frame"]["function"] == "culprit_skip"


def test_diagnose_pods_says_what_is_wrong(tmp_path):
    standin = {**os.environ, "PATH": f"{STANDINS}{os.pathsep}{os.environ['PATH']}", "STANDIN_PODS": "a-0",
               "STANDIN_SELECTOR": "app=x"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "torchtriage", "diagnose", "--pods", "app=other", "--out", str(tmp_path)],
        env=standin, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == exit_codes.ENVIRONMENT and "no running pod matches -l app=other" in done.stderr
    bare = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    done = subprocess.run(
        [sys.executable, "-m", "torchtriage", "diagnose", "--pods", "app=x"], env=bare, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == exit_codes.ENVIRONMENT and "kubectl is not on PATH" in done.stderr
    done = run_cli("diagnose", "--namespace", "ns")
    assert done.returncode == exit_codes.USAGE and b"go with --pods" in done.stderr


def test_a_pods_archive_is_read_as_data(tmp_path):
    import io
    import tarfile

    from torchtriage.collect.kubernetes import _extract

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (("rank00.txt", b"stack"), ("../escape.txt", b"x"), ("/etc/owned", b"x")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    refused = _extract(buffer.getvalue(), tmp_path / "pod")
    assert sorted(refused) == ["../escape.txt", "/etc/owned", "link"]
    assert [p.name for p in (tmp_path / "pod").iterdir()] == ["rank00.txt"]
    assert not (tmp_path / "escape.txt").exists()


# ------------------------------------------------------------ the debug server's periodic dumps (dump_dir)


def _faulthandler_text(function: str, line: int, in_collective: bool) -> str:
    """A rank's stack in faulthandler's form, as the worker's dump_traceback handler returns it."""
    frames = ['  File "/venv/torch/distributed/distributed_c10d.py", line 2950 in all_reduce'] if in_collective else []
    frames += [f'  File "/job/train.py", line {line} in {function}', '  File "/job/train.py", line 99 in <module>']
    return "Thread 0x00007f0000000001 (most recent call first):\n" + "\n".join(frames) + "\n"


def _stacks_dump(sections: dict[int, str], failed: dict[int, str] | None = None) -> str:
    """A `stacks_<time>.txt` as the debug server's periodic dumper writes it (StacksHandler.dump)."""
    parts = []
    failed = failed or {}
    if failed:
        total = len(sections) + len(failed)
        parts += [f"PARTIAL DATA: {len(sections)}/{total} workers responded"]
        parts += [f"  Rank {rank}: {why}" for rank, why in failed.items()] + [""]
    for rank in sorted({*sections, *failed}):
        parts.append(f"=== Rank {rank}: http://node{rank // 4}:4{rank:04d}/handler/dump_traceback? ===")
        parts.append(sections[rank] if rank in sections else "Error: 500")
    return "\n".join(parts)


def test_the_debug_servers_periodic_stacks_dumps_are_read_the_newest_first(tmp_path):
    dump_dir = tmp_path / "debug_dumps"
    dump_dir.mkdir()
    # An hour ago every rank was training; now ranks 0-2 wait in all_reduce and rank 3 sleeps. Rank 5 is gone.
    old = {r: _faulthandler_text("forward", 30, in_collective=False) for r in range(6)}
    (dump_dir / "stacks_20261201_100000.txt").write_text(_stacks_dump(old))
    now = {r: _faulthandler_text("sync_gradients", 41, in_collective=True) for r in (0, 1, 2, 4)}
    now[3] = _faulthandler_text("load_checkpoint", 57, in_collective=False)
    (dump_dir / "stacks_20261201_110000.txt").write_text(_stacks_dump(now, failed={5: "timed out"}))
    done = run_cli("diagnose", str(dump_dir), "--json")
    verdict = json.loads(done.stdout)
    assert verdict["culprit_ranks"] == [3], verdict["summary"]
    assert verdict["facts"]["user_frame"]["function"] == "load_checkpoint"
    assert any("rank 5 gave no stack in this dump (timed out)" in p for p in verdict["problems"])


def test_a_stacks_dump_is_named_as_what_it_is(tmp_path):
    path = tmp_path / "stacks_20261201_110000.txt"
    path.write_text(_stacks_dump({0: _faulthandler_text("f", 1, True)}))
    done = run_cli("triage", str(path))
    assert b"debug server's dump of every rank's stack" in done.stderr + done.stdout


def test_a_stacks_dump_with_nothing_readable_says_so(tmp_path):
    text = b"=== Rank 0: x ===\n\x00\xffnot a stack\n=== Rank 1: y ===\n"
    (tmp_path / "stacks_20261201_110000.txt").write_bytes(text)
    done = run_cli("diagnose", str(tmp_path))
    assert done.returncode == exit_codes.BAD_INPUT and b"Traceback" not in done.stderr
    assert b"(rank 0): no 'Thread 0x" in done.stderr
