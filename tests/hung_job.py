"""A real torchrun + gloo job that hangs on purpose (tests/jobs/hang.py), for tests of live diagnosis.

Every process it started is killed when the test ends, whatever happens: the launcher's session and
each worker's own process group (torchrun starts every worker in a session of its own).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HANG = ROOT / "tests" / "jobs" / "hang.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def torchrun_command(ranks: int = 2, script: Path = HANG) -> list[str]:
    # --standalone: a free rendezvous port, so concurrent jobs on this machine never collide.
    return [str(TORCHRUN), "--standalone", "--nproc_per_node", str(ranks), str(script)]


# What a launcher sets for its workers: a job the tests start must not inherit them (its torchrun agent
# would take itself for a rank).
LAUNCHER_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


# Ranks print their READY lines at once into one pipe: two can land on one line ("READY rank=0 pid=7READY rank=2
# pid=9"), since print writes the text and the newline apart.
_READY = re.compile(r"READY rank=(\d+) pid=(\d+)")


def ready_lines(line: str) -> dict[int, int]:
    """rank -> pid of every READY in `line`."""
    return {int(rank): int(pid) for rank, pid in _READY.findall(line)}


def clean_environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES and not k.startswith("TORCHELASTIC_")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def stop_agents(procs) -> None:
    """Kill launchers started with start_new_session=True, each with its session's process group. Their
    workers (sessions of their own, as torchrun starts them) exit within a second of their agent: the test
    jobs watch their parent (tests/jobs/_common.py)."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def job_environment(mode: str = "skip", culprit: int = 1) -> dict[str, str]:
    return clean_environment(HANG_MODE=mode, HANG_CULPRIT=str(culprit))


class HungJob:
    def __init__(self, mode="skip", culprit=1, ranks=2, prefix=(), env=None, ready_timeout=180, script=HANG):
        self.proc = subprocess.Popen(
            [*prefix, *torchrun_command(ranks, script)],
            env={**job_environment(mode, culprit), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.ready: dict[int, int] = {}  # rank -> pid, from the READY lines
        self.output: list[str] = []
        all_ready = threading.Event()

        def read():
            for line in self.proc.stdout:
                self.output.append(line)
                found = ready_lines(line)
                if found:
                    self.ready.update(found)
                    if len(self.ready) == ranks:
                        all_ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not all_ready.wait(ready_timeout):
            self.kill()
            raise AssertionError("the hung job never got ready:\n" + "".join(self.output[-30:]))
        time.sleep(1)  # READY is printed just before the hang point: let the ranks block

    @property
    def agent(self) -> int:
        """The pid of the launcher we started (torchrun's agent, unless a prefix wraps it)."""
        return self.proc.pid

    def kill(self):
        for pid in [*self.ready.values(), self.proc.pid]:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
