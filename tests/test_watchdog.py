"""The hang watchdog on its own: a stalled main thread leaves its stack and a verdict; it never imports
torch behind the program's back."""

import subprocess
import sys
import types
from pathlib import Path

import pytest

from torchtriage.runtime.watchdog import _loaded


def test_a_module_still_being_imported_is_not_used():
    module = types.ModuleType("half_imported")
    module.__spec__ = types.SimpleNamespace(_initializing=True)
    sys.modules["half_imported"] = module
    try:
        assert _loaded("half_imported") is None
        module.__spec__._initializing = False
        assert _loaded("half_imported") is module
    finally:
        del sys.modules["half_imported"]


def test_a_stalled_main_thread_leaves_its_stack_and_a_verdict(tmp_path):
    program = (
        "import time\n"
        "from torchtriage import HangWatchdog\n"
        f"with HangWatchdog(stall_seconds=1, out_dir={str(tmp_path)!r}, poll_seconds=0.2):\n"
        "    def wait_for_peer():\n"
        "        time.sleep(4)\n"
        "    wait_for_peer()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "RANK": "3", "WORLD_SIZE": "1"},
    )
    assert done.returncode == 0, done.stderr
    stacks = (tmp_path / "rank03.txt").read_text()
    assert "Thread" in stacks and '(idle): "MainThread"' in stacks
    assert "wait_for_peer" in stacks.split("MainThread")[1].split("Thread")[0]
    verdict = (tmp_path / "verdict.json").read_text()
    assert '"culprit_ranks"' in verdict
    assert "torch" not in done.stderr


def test_a_thread_blocked_in_a_works_wait_shows_the_c_method_it_is_in():
    # `work.wait()` on a c10d Work is a C method: a Python stack shows only the caller, idle. The watchdog
    # reads the call from the instruction the frame stopped at and the type of the local it was made on.
    import sys
    import threading
    import time

    from torchtriage.runtime.watchdog import format_stacks

    class Work:  # stands for torch's c10d Work: a type named so, from torch, whose wait is a C call
        pass

    Work.__module__ = "torch.distributed.distributed_c10d"
    lock = threading.Lock()
    lock.acquire()
    work = Work()
    work.wait = lock.acquire  # a C method that blocks, as Work.wait does

    def stage():
        handle = work
        handle.wait()

    thread = threading.Thread(target=stage, daemon=True)
    thread.start()
    time.sleep(0.2)
    try:
        text = format_stacks({thread.ident: sys._current_frames()[thread.ident]}, thread.ident, stalled=True)
    finally:
        lock.release()
        thread.join(5)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("stage ("))
    assert lines[at - 1].strip() == "c10d::Work::wait (Work.cpp:0)"


def test_a_rank_waiting_in_init_process_group_for_the_others_is_starting_not_stalled(tmp_path):
    # Rank 0 of two waits in init_process_group for a rank that never comes, until torch's own timeout names it.
    # A stall window of one second passes four times over: nothing is dumped, no verdict written.
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    program = (
        "import datetime\n"
        "import torch.distributed as dist\n"
        "from torchtriage import HangWatchdog\n"
        f"with HangWatchdog(stall_seconds=1, out_dir={str(tmp_path)!r}, poll_seconds=0.2):\n"
        "    try:\n"
        f"        dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{port}', rank=0, world_size=2,\n"
        "                                timeout=datetime.timedelta(seconds=4))\n"
        "    except Exception as error:\n"
        "        print('rendezvous timed out:', type(error).__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "RANK": "0", "WORLD_SIZE": "2"},
    )
    assert "rendezvous timed out" in done.stdout, done.stderr[-2000:]
    assert not (tmp_path / "rank00.txt").exists() and not (tmp_path / "verdict.json").exists()


@pytest.mark.slow
def test_a_watchdog_the_program_started_itself_names_where_its_culprit_ran(tmp_path):
    """Without `torchtriage run`: each rank of a torchrun + gloo job starts its own HangWatchdog; rank 1 stops while
    rank 0 waits in all_reduce. The watchdogs record where their ranks run as `run` would, and the verdict names
    the culprit's host and pid from that record."""
    import json
    import socket
    import time

    from hung_job import TORCHRUN, clean_environment, stop_agents

    out = tmp_path / "hang"
    job = Path(__file__).parent / "jobs" / "faulty_machine.py"
    agent = subprocess.Popen(
        [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(job)],
        env=clean_environment(FAULT="rank:1", OWN_WATCHDOG=str(out)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / "verdict.json").exists() and time.monotonic() < deadline and agent.poll() is None:
            time.sleep(0.5)
        verdict = json.loads((out / "verdict.json").read_text())
    finally:
        stop_agents([agent])
    record = json.loads((out / ".run" / "identity" / "rank1.json").read_text())
    assert verdict["culprit_ranks"] == [1], verdict["summary"]
    (machine,) = verdict["culprit_machines"]
    assert machine["host"] == socket.gethostname() and machine["pid"] == record["pid"]
    assert "identity" in machine["sources"]
