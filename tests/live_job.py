"""A real job launched for live diagnosis, as the harnesses of real hangs drive it (tests/sim_live.py,
benchmarks/live_api.py): its console kept in a file, its ranks' pids read from their READY lines, and
everything it started killed at the end, orphans included.

The jobs print `READY rank=<r> pid=<pid>` right before they hang; torchrun starts each worker in a session of
its own, so killing the launcher's session does not reach them: `kill()` kills every process group it saw
below the launcher and each process, and says which survived.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hung_job import clean_environment, ready_lines  # noqa: E402


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def parent(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def descendants(pid: int) -> list[int]:
    """Every process below pid, read in one pass over /proc."""
    by_parent: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            by_parent.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in by_parent.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def leftovers(mark: str) -> list[str]:
    """Live processes whose command line holds `mark` (a job's script name): none may outlive its job."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if mark in command and alive(int(entry.name)):
            found.append(f"{entry.name} {command.strip()}")
    return found


class Job:
    """A launched job: its console in a file (and in `lines`), the ranks' pids from their READY lines."""

    def __init__(self, command: list[str], env: dict[str, str], ranks: int, log: Path) -> None:
        self.ranks = ranks
        self.log = log
        self.ready: dict[int, int] = {}
        self.all_ready = threading.Event()
        self.seen: set[int] = set()
        self.lines: list[str] = []
        self._file = log.open("w")
        self._file.write("$ " + " ".join(command) + "\n")
        self._file.flush()
        self.proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            self._file.write(line)
            self._file.flush()
            found = ready_lines(line)
            if found:
                self.ready.update(found)
                self.remember()
                if len(self.ready) == self.ranks:
                    self.all_ready.set()

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.all_ready.wait(0.2):
                return True
            if self.proc.poll() is not None:
                return self.all_ready.wait(1)
        return False

    def remember(self) -> None:
        """Note every process below the launcher now, so that kill() reaches them even once orphaned."""
        self.seen.update(descendants(self.proc.pid))

    @property
    def agent(self) -> int | None:
        """torchrun's agent: the parent of the ranks."""
        for pid in self.ready.values():
            if alive(pid):
                return parent(pid)
        return None

    def ranks_alive(self) -> dict[int, bool]:
        return {rank: alive(pid) for rank, pid in sorted(self.ready.items())}

    def kill(self) -> list[int]:
        """Kill everything the job started; the pids still alive a moment later (none, or a leak)."""
        self.remember()
        for pid in self.ready.values():
            self.seen.update(descendants(pid))  # a rank's DataLoader worker, the watchdog's verdict process
        pids = [*self.ready.values(), *self.seen, self.proc.pid]
        groups = set()
        for pid in pids:
            try:
                groups.add(os.getpgid(pid))
            except (ProcessLookupError, PermissionError):
                pass
        for group in groups - {os.getpgrp()}:
            if group > 1:
                try:
                    os.killpg(group, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self._reader.join(timeout=5)
        self._file.close()
        deadline = time.monotonic() + 5
        while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
            time.sleep(0.1)  # SIGKILL is delivered, the process is reaped by its parent (or init) a moment later
        return left


def torchtriage(*args: str, timeout: float = 300) -> tuple[int, str, str]:
    """Run the CLI as a user would, from the checkout: (exit code, stdout, stderr); 124 when it timed out."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "torchtriage", *args], cwd=ROOT, env=clean_environment(), capture_output=True,
            text=True, timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        return 124, out, "timeout"
    return done.returncode, done.stdout, done.stderr


def provenance(paths: dict[str, str]) -> dict:
    """The code that ran and judged: the commit, and per named path the files changed since it and a digest of
    the changes (another hand may be editing them while the cases run)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else ""

    found = {"head": git("rev-parse", "HEAD").strip()}
    for name, path in paths.items():
        diff = git("diff", "HEAD", "--", path)
        found[f"{name}_changed"] = git("diff", "HEAD", "--name-only", "--", path).split()
        found[f"{name}_diff_sha256"] = hashlib.sha256(diff.encode()).hexdigest()[:16] if diff else None
    return found
