"""The hang watchdog on its own: a stalled main thread leaves its stack and a verdict; it never imports
torch behind the program's back."""

import subprocess
import sys
import types

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
