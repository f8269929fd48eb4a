"""A clean exit for gloo ranks whose flight recorder torchtriage armed.

With the flight recorder armed (`TORCH_FR_BUFFER_SIZE`), torch 2.13's gloo often aborts a rank at
interpreter exit after its work is done ("terminate called without an active exception", exit code -6),
so torchrun reports a healthy job failed: 10 of 12 plain torchrun runs of a 2-rank gloo job, 8 of 12
under `run`. The mechanism (seen in gdb): a gloo worker thread (`pt_gloo_runloop`) destroys its last
finished work, whose tensors it must release with the GIL; the main thread held the GIL from its last
collective into the interpreter's finalisation, and a thread that asks for the GIL then is ended with
`pthread_exit`, whose unwinding through a destructor that may not throw calls `std::terminate`.

So a rank we armed, at exit and after the program's own exit handlers, lets go of the GIL for a moment
while gloo's threads exist: a worker waiting for it finishes its release before finalisation starts.
Measured: 0 of 10 such runs aborted with the pause, on the same job that aborted 10 of 12 without it.
Nothing else changes: no group is destroyed, no collective issued.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from pathlib import Path

from torchtriage.protocol import FR_BUFFER_ENV

SETTLE_SECONDS = 0.05  # time for a worker waiting for the GIL to take it (the GIL is handed over in microseconds)
GLOO_WORKER = "pt_gloo_runloop"  # the name ProcessGroupGloo gives its worker threads

_registered = False


def flight_recorder_armed(environ=os.environ) -> bool:
    for name in FR_BUFFER_ENV[:2]:
        value = environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return True
    return False


def gloo_workers_running(tasks: Path = Path("/proc/self/task")) -> bool:
    """Whether this process has gloo worker threads (where /proc cannot say: whether torch.distributed
    was imported, which any gloo group needs)."""
    try:
        return any(_thread_name(task) == GLOO_WORKER for task in tasks.iterdir())
    except OSError:
        return "torch.distributed" in sys.modules


def _thread_name(task: Path) -> str:
    try:
        return (task / "comm").read_text().strip()
    except OSError:
        return ""  # a thread that ended meanwhile


def settle() -> bool:
    """Let gloo's workers finish releasing their last work before the interpreter finalises; whether it
    paused."""
    if not flight_recorder_armed() or not gloo_workers_running():
        return False
    time.sleep(SETTLE_SECONDS)
    return True


def register() -> None:
    """Settle at exit (once per process). Registered early, it runs after the program's own exit handlers,
    the last Python code before finalisation."""
    global _registered
    if not _registered:
        _registered = True
        atexit.register(settle)
