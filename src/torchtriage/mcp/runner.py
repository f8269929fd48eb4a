"""One CLI run in a child process, bounded in time and in the output kept.

The child is `python -m torchtriage VERB ...` from the same installation as the server, in a session of its
own, with no standard input (the server's is the protocol) and a private working folder (so nothing on the
path is imported from where the agent points). At the deadline the whole session is killed, the child's own
children with it. Output past the cap is read and counted but not kept: the child never blocks on a full
pipe, and its exit code stays its own.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

_CHUNK = 1 << 16


@dataclass(frozen=True)
class Bounds:
    timeout_s: float
    max_output_bytes: int


@dataclass
class Captured:
    """The first `cap` bytes of a stream, and how many it held in all."""

    cap: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    def take(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.total += len(chunk)

    @property
    def truncated(self) -> bool:
        return self.total > len(self.data)

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


@dataclass
class CliRun:
    argv: list[str]  # after `torchtriage`
    exit_code: int | None  # None when it was killed at the deadline
    stdout: Captured
    stderr: Captured
    timed_out: bool


async def run_cli(argv: list[str], bounds: Bounds, cwd: str) -> CliRun:
    """Run `torchtriage *argv` within `bounds`; never raises for what the child does."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "torchtriage",
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=_child_environment(),
        start_new_session=True,
    )
    stdout, stderr = Captured(bounds.max_output_bytes), Captured(bounds.max_output_bytes)
    timed_out = False
    try:
        await asyncio.wait_for(
            asyncio.gather(_drain(process.stdout, stdout), _drain(process.stderr, stderr), process.wait()),
            bounds.timeout_s,
        )
    except asyncio.TimeoutError:
        timed_out = True
    finally:
        # Also when the call is cancelled, or a child's child still holds the pipes: nothing outlives the call.
        if timed_out or process.returncode is None:
            _kill_session(process.pid)
            await process.wait()
    return CliRun(argv, None if timed_out else process.returncode, stdout, stderr, timed_out)


async def _drain(stream: asyncio.StreamReader | None, into: Captured) -> None:
    while stream is not None and (chunk := await stream.read(_CHUNK)):
        into.take(chunk)


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _child_environment() -> dict[str, str]:
    """This process's environment, with the server's own torchtriage first on the path: the child runs the
    same code as the server, wherever it was started from."""
    package_parent = str(Path(__file__).resolve().parents[2])
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, environment.get("PYTHONPATH")]))
    environment["NO_COLOR"] = "1"
    return environment
