"""`diagnose --store` against hostile ranks: one byte budget for every answer, one deadline for every rank, a
bounded world, and a store that is not there or never answers said in one line.

Every case is real: a TCPStore served from this process, with `debug_server/rank<N>` registered as torch
registers it, pointing at HTTP servers on loopback (threads of this process) that answer without end, trickle
one byte every 2 s, or answer as a waiting rank does. The collector runs as the user runs it, in a process of
its own; where memory is the point, under an address-space limit 1.5 GB above its size once torch is
imported, so an answer held whole ends it.
"""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import run_cli
from test_debug_server import _fr_json, _spy_text
from torchtriage import exit_codes

torch_debug = pytest.importorskip("torch.distributed.debug", reason="torch >= 2.10 has the debug server")

WORLD_KEY = "torchtriage/debug_server/world_size"
# The collector as the user runs it, under RLIMIT_AS: its size once torch is imported (what it imports before
# it reads the store) plus argv[1] bytes.
BOUNDED = """
import resource, sys
import torch.distributed
from torchtriage.cli import main
with open("/proc/self/statm") as statm:
    baseline = int(statm.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (baseline + int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_AS)[1]))
sys.exit(main(sys.argv[2:]))
"""
HEADROOM = 1536 << 20
OUTER_TIMEOUT_S = 120  # a command still running then has failed: nothing here should take a tenth of it


def run_bounded(*args, headroom: int = HEADROOM) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BOUNDED, str(headroom), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=OUTER_TIMEOUT_S,
    )


class HostileWorkers:
    """Debug-server workers on loopback, one per rank, registered in a real TCPStore; each behaves as told:

        normal       a waiting rank's stack and flight recorder (the culprit's: where it went instead)
        flood        every handler answers `flood_bytes`, its length announced, made as it is sent
        flood-open   the same without a length: the body ends when the connection does
        flood-stack  py-spy's dump floods (no length), the rest as `normal`
        trickle      the status and headers, then one byte of body every 2 s
        trickle-head one byte of the status line every 2 s

    `sent` counts the body bytes the servers managed to send."""

    def __init__(self, behaviours: list[str], culprit: int = 1, flood_bytes: int = 300 << 20) -> None:
        from torch.distributed import TCPStore

        self.stop = threading.Event()
        self.sent = 0
        self._lock = threading.Lock()
        self.store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.servers = []
        world = len(behaviours)
        for rank, behaviour in enumerate(behaviours):
            stack = _spy_text(
                rank, "train_step", 41 if rank == culprit else 37, None if rank == culprit else "all_reduce"
            )
            fr = _fr_json(rank, world, 4 if rank == culprit else 5, pending=rank != culprit)
            bodies = {"pyspy_dump": stack.encode(), "fr_trace_json": json.dumps(fr).encode()}
            server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler(behaviour, bodies, flood_bytes))
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self.servers.append(server)
            self.register(rank, f"http://127.0.0.1:{server.server_address[1]}")
        self.address = f"127.0.0.1:{self.store.port}"

    def register(self, rank: int, url: str | bytes) -> None:
        self.store.set(f"debug_server/rank{rank}", url)

    def _count(self, count: int) -> None:
        with self._lock:
            self.sent += count

    def _handler(self, behaviour: str, bodies: dict[str, bytes], flood_bytes: int):
        workers = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the http.server interface
                name = self.path.split("?")[0].rsplit("/", 1)[-1]
                try:
                    if behaviour == "trickle-head":
                        self._trickle(b"HTTP/1.0 200 OK\r\nX-Slow: " + b"x" * 10_000)
                    elif behaviour == "trickle":
                        self.send_response(200)
                        self.send_header("Content-Length", "1000000")
                        self.end_headers()
                        self._trickle(b"y" * 1_000_000)
                    elif behaviour in ("flood", "flood-open") or (behaviour, name) == ("flood-stack", "pyspy_dump"):
                        self._flood(announced=behaviour == "flood")
                    else:
                        self._answer(bodies.get(name))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the collector gave up on this answer: what it is for

            def _answer(self, body: bytes | None) -> None:
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write(body if body is not None else b"Handler not found")

            def _flood(self, announced: bool) -> None:
                self.send_response(200)
                if announced:
                    self.send_header("Content-Length", str(flood_bytes))
                self.end_headers()
                piece = b'{"entries": [' + b"0," * (1 << 19)
                left = flood_bytes
                while left > 0 and not workers.stop.is_set():
                    self.wfile.write(piece[:left])
                    workers._count(min(left, len(piece)))
                    left -= len(piece)

            def _trickle(self, data: bytes) -> None:
                for at in range(len(data)):
                    self.wfile.write(data[at : at + 1])
                    self.wfile.flush()
                    if workers.stop.wait(2):
                        return

            def log_message(self, *args):
                pass

        return Handler

    def close(self) -> None:
        self.stop.set()
        for server in self.servers:
            server.shutdown()
            server.server_close()


def capture_folder(out: Path) -> Path:
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return folder


def verdict_of(done) -> dict:
    text = done.stdout if isinstance(done.stdout, str) else done.stdout.decode()
    return json.loads(text) if text.strip().startswith("{") else {}


def text_of(stream) -> str:
    return stream if isinstance(stream, str) else stream.decode(errors="replace")


# ---------------------------------------------------------------------------------------- one byte budget


def test_two_ranks_answering_300_mb_each_are_cut_within_one_budget_in_bounded_memory(tmp_path):
    # Every handler of both ranks answers 300 MB: 2.4 GB offered. Rank 0 announces its length, rank 1 does not.
    workers = HostileWorkers(["flood", "flood-open"])
    try:
        done = run_bounded("diagnose", "--store", workers.address, "--out", tmp_path, "--timeout", "60",
                           "--limit", "answers=256M")  # fmt: skip
    finally:
        workers.close()
    assert done.returncode == exit_codes.BAD_INPUT, done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    assert "no rank's answer could be read" in done.stderr
    # One line per handler, naming both ranks, the budget they passed and the flag that raises it.
    for handler in ("pyspy_dump", "fr_trace_json", "dump_traceback", "dump_nccl_trace_json"):
        line = f"the {handler} answer of ranks 0-1 was larger than its share of the 256 MiB all the answers may hold"
        assert line in done.stderr, done.stderr
    assert "--limit answers=1G" in done.stderr
    assert workers.sent < 600 << 20  # it stopped reading: an announced length past the budget is never read
    # Nothing cut is left where `diagnose DIR` would read it.
    assert [p for p in capture_folder(tmp_path).rglob("*") if not p.is_dir()] == []


def test_a_rank_that_floods_cannot_take_the_other_ranks_share(tmp_path):
    # Rank 4's py-spy dump answers 300 MB without a length; the others answer as waiting ranks, rank 2 departed.
    workers = HostileWorkers(["normal"] * 4 + ["flood-stack"], culprit=2)
    try:
        done = run_cli("diagnose", "--store", workers.address, "--out", tmp_path, "--json", "--timeout", "60",
                       "--limit", "answers=64M", timeout=OUTER_TIMEOUT_S)  # fmt: skip
    finally:
        workers.close()
    verdict = verdict_of(done)
    assert done.returncode == exit_codes.PROBLEM_FOUND, text_of(done.stderr)
    assert verdict["culprit_ranks"] == [2], verdict["summary"]
    assert verdict["facts"]["debug_server"]["answered"] == 5
    cut = [p for p in verdict["problems"] if p.startswith("the pyspy_dump answer of rank 4 was larger")]
    assert cut and "--limit answers=256M" in cut[0], verdict["problems"]
    assert workers.sent < 128 << 20
    folder = Path(verdict["facts"]["capture_folder"])
    assert sorted(p.name for p in folder.glob("rank*.txt")) == [f"rank{r:02d}.txt" for r in range(4)]


def test_one_answer_never_holds_more_than_a_file_read_whole(tmp_path):
    # The default budget (4 GB together) is far above one answer's bound (the policy's `bytes`, lowered here).
    workers = HostileWorkers(["normal", "flood-stack"], culprit=0, flood_bytes=100 << 20)
    try:
        done = run_cli("diagnose", "--store", workers.address, "--out", tmp_path, "--json", "--timeout", "60",
                       "--limit", "bytes=8M", timeout=OUTER_TIMEOUT_S)  # fmt: skip
    finally:
        workers.close()
    verdict = verdict_of(done)
    assert done.returncode == exit_codes.PROBLEM_FOUND, text_of(done.stderr)
    assert any("pyspy_dump answer of rank 1 was larger than 8 MiB, what one answer may hold" in p
               and "--limit bytes=32M" in p for p in verdict["problems"]), verdict["problems"]  # fmt: skip
    assert workers.sent < 64 << 20


def test_an_answer_that_comes_first_takes_only_its_share_and_what_the_others_leave():
    from torchtriage.collect.bounded_http import SharedBytes

    budget = SharedBytes(total=100 << 20, answers=4, per_answer=80 << 20)
    assert budget.take(0, 25 << 20) is None  # its own share
    assert budget.take(25 << 20, 1) == "answers"  # the other three are sure of theirs
    for _ in range(3):
        assert budget.take(0, 1 << 20) is None
        budget.settle(1 << 20)  # each ended having used 1 MiB of its 25: the rest is free
    assert budget.take(25 << 20, 55 << 20) is None  # up to its own bound, 80 MiB
    assert budget.take(80 << 20, 1) == "bytes"


# -------------------------------------------------------------------------------------------- one deadline


def test_ranks_that_trickle_are_given_up_at_the_deadline(tmp_path):
    # Rank 2 sends its headers, then a byte every 2 s of a 1 MB body; rank 3 a byte of its status line every 2 s.
    # Each byte comes well within the timeout: only a deadline for the whole answer ends them.
    workers = HostileWorkers(["normal", "normal", "trickle", "trickle-head"], culprit=1)
    try:
        done = run_cli("diagnose", "--store", workers.address, "--out", tmp_path, "--json", "--timeout", "3",
                       timeout=OUTER_TIMEOUT_S)  # fmt: skip
    finally:
        workers.close()
    verdict = verdict_of(done)
    assert done.returncode == exit_codes.PROBLEM_FOUND, text_of(done.stderr)
    assert verdict["facts"]["debug_server"]["not_answering"].keys() == {"2", "3"}
    problems = "\n".join(verdict["problems"])
    assert "rank 2 did not answer at http://127.0.0.1:" in problems
    assert "its answer did not end within 3 s" in problems and "too slow, given up" in problems
    assert "rank 3 did not answer at http://127.0.0.1:" in problems and "no answer within 3 s" in problems
    # Nothing of the ranks given up is left.
    folder = Path(verdict["facts"]["capture_folder"])
    assert sorted(p.name for p in folder.glob("rank*.txt")) == ["rank00.txt", "rank01.txt"]
    assert sorted(p.name for p in (folder / "fr").iterdir()) == ["debug_server_fr_rank_0.json",
                                                                 "debug_server_fr_rank_1.json"]  # fmt: skip


def test_what_the_ranks_answer_is_written_private_whatever_the_umask(tmp_path):
    workers = HostileWorkers(["normal", "normal"])
    try:
        done = subprocess.run(
            [sys.executable, "-c", "import os, sys, runpy; os.umask(0); sys.argv = sys.argv[1:]; "
             "runpy.run_module('torchtriage', run_name='__main__')", "torchtriage", "diagnose", "--store",
             workers.address, "--out", str(tmp_path / "out"), "--json"],
            capture_output=True, text=True, timeout=OUTER_TIMEOUT_S,
        )  # fmt: skip
    finally:
        workers.close()
    assert done.returncode == exit_codes.PROBLEM_FOUND, done.stderr
    folder = Path(verdict_of(done)["facts"]["capture_folder"])
    written = [folder, *folder.rglob("*")]
    assert {p.name for p in written} >= {"rank00.txt", "rank01.txt", "debug_server_fr_rank_1.json"}
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path


# -------------------------------------------------------------------------------------- a bounded world


def test_a_store_that_claims_a_billion_ranks_is_refused_and_the_users_world_size_wins(tmp_path):
    workers = HostileWorkers(["normal", "normal"])
    workers.store.set(WORLD_KEY, "1000000000")
    try:
        claimed = run_bounded("diagnose", "--store", workers.address, "--out", tmp_path / "a", "--timeout", "10")
        given = run_cli("diagnose", "--store", workers.address, "--out", tmp_path / "b", "--json",
                        "--world-size", "2", timeout=OUTER_TIMEOUT_S)  # fmt: skip
    finally:
        workers.close()
    assert claimed.returncode == exit_codes.BAD_INPUT, claimed.stderr
    assert "says the job has 1,000,000,000 ranks" in claimed.stderr and "internal error" not in claimed.stderr
    assert "--world-size N" in claimed.stderr and "--limit rank=999999999" in claimed.stderr
    assert given.returncode == exit_codes.PROBLEM_FOUND, text_of(given.stderr)
    assert verdict_of(given)["facts"]["debug_server"]["answered"] == 2


def test_what_the_store_holds_is_data(tmp_path):
    # Beside two genuine ranks: a port out of range, a value of 1 MB, another scheme. Each is named; none is asked.
    workers = HostileWorkers(["normal", "normal"], culprit=0)
    for rank, url in ((2, "http://127.0.0.1:99999"), (3, b"http://" + b"h" * (1 << 20)), (4, "file:///etc/passwd")):
        workers.register(rank, url)
    try:
        done = run_cli("diagnose", "--store", workers.address, "--out", tmp_path, "--json", "--world-size", "5",
                       timeout=OUTER_TIMEOUT_S)  # fmt: skip
    finally:
        workers.close()
    verdict = verdict_of(done)
    assert done.returncode == exit_codes.PROBLEM_FOUND and "Traceback" not in text_of(done.stderr)
    assert verdict["facts"]["debug_server"]["not_answering"].keys() == {"2", "3", "4"}
    problems = "\n".join(verdict["problems"])
    assert "rank 2 did not answer at http://127.0.0.1:99999: its registered URL is not http://HOST:PORT" in problems
    assert "<a value of 1,048,583 bytes>" in problems and "'file:///etc/passwd'" in problems


# ------------------------------------------------------------------------------- a store that is not there


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_closed_store_port_is_said_at_once_without_a_cpp_backtrace(tmp_path):
    port = _closed_port()
    done = run_cli("diagnose", "--store", f"127.0.0.1:{port}", "--timeout", "10", "--out", tmp_path,
                   timeout=OUTER_TIMEOUT_S)  # fmt: skip
    stderr = text_of(done.stderr)
    assert done.returncode == exit_codes.ENVIRONMENT
    assert stderr.startswith(f"torchtriage diagnose: cannot reach the job's store at 127.0.0.1:{port} (Connection "
                             "refused); give its MASTER_ADDR:MASTER_PORT")  # fmt: skip
    assert len(stderr.splitlines()) == 1, stderr  # torch's C++ errors and frames never reach the user
    assert "Exception raised from" not in stderr and "frame #" not in stderr


def test_a_port_that_takes_the_connection_and_never_answers_is_given_up(tmp_path):
    # TCPStore's client waits on such a server forever, whatever its timeout: the store is read in a child
    # that is ended at the deadline.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        done = run_cli("diagnose", "--store", f"127.0.0.1:{port}", "--timeout", "2", "--out", tmp_path,
                       timeout=OUTER_TIMEOUT_S)  # fmt: skip
    stderr = text_of(done.stderr)
    assert done.returncode == exit_codes.ENVIRONMENT, stderr
    assert f"the job's store at 127.0.0.1:{port} took the connection but did not answer within 2 s" in stderr
    assert len(stderr.splitlines()) == 1, stderr
