"""No process a test started outlives its module.

A job the tests start is a launcher and its workers, each worker in a session of its own (as torchrun starts
them); a test that fails or times out may kill the launcher and leave the workers behind, orphaned. The test
process makes itself their child subreaper (Linux: `PR_SET_CHILD_SUBREAPER`), so an orphan is re-parented to
it rather than to init; after each test module, every process still its child is killed with its process
group and reaped. Module-scoped fixtures that keep a job across tests are torn down before this runs.
"""

from __future__ import annotations

import ctypes
import os
import signal
from multiprocessing import resource_tracker
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> bool:
    """Make this process the subreaper of its descendants; False where the platform has no such thing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name is in parentheses and may hold spaces: the fields after its last ")" are fixed.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def leftover_children() -> list[int]:
    """This process's children but multiprocessing's resource tracker (started by the generators' pools,
    tests/parallel.py), which lives as long as the test process and is no test's leftover."""
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    return [pid for pid in children(os.getpid()) if pid != tracker]


def kill_leftovers() -> list[int]:
    """Kill every child of this process (and each one's process group), reap them; the pids killed."""
    killed = leftover_children()
    for pid in killed:
        for kill, target in ((os.killpg, pid), (os.kill, pid)):
            try:
                kill(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for pid in killed:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return killed
