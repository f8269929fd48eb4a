"""The test process adopts the workers a killed launcher leaves behind, and kills them with the module."""

import os
import subprocess
import sys
import time

import pytest

from leftovers import adopt_orphans, kill_leftovers, leftover_children


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreapers are Linux's")
def test_an_orphaned_worker_in_a_session_of_its_own_is_adopted_and_killed():
    assert adopt_orphans()
    # A launcher that starts a worker in a session of its own, then dies: the worker is orphaned.
    subprocess.run(["bash", "-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 &"], check=True)
    deadline = time.monotonic() + 10
    while not (orphans := leftover_children()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert orphans, "the orphan was not re-parented to the test process"
    assert set(kill_leftovers()) >= set(orphans)
    assert not leftover_children()
    for pid in orphans:
        assert not os.path.exists(f"/proc/{pid}")
