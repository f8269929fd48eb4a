"""Run py-spy on many processes at once, each run bounded, and none left attached afterwards.

Why py-spy `dump` runs *without* `--nonblocking`: the default pauses the rank's threads (ptrace) for the
instant of the sample, so every frame of the stack comes from one moment. `--nonblocking` reads the
memory of a running process and can return a torn stack, which is worse than useless when the question
is "which collective is this rank in". A hung rank loses nothing from a pause of milliseconds.

Why each py-spy runs in its own session (`start_new_session`): Ctrl-C in the terminal then reaches
torchtriage only, and torchtriage decides how each py-spy stops: `dump` is killed (SIGKILL) and waited
for; `record` is first asked with SIGINT, on which py-spy stops sampling, detaches and writes what it
has, and is killed if it has not exited within a grace period. Killing a py-spy detaches it (the kernel
detaches a dead tracer's tracees); the runner then checks each target's /proc status and reports any
rank left stopped or traced, with the command to resume it. No signal is ever sent to a training rank.

What py-spy writes is private: its standard output goes to a new 0600 file, and it runs with umask 077, so the
files it writes itself (`record -o`) are 0600 too (they hold the rank's stacks, and with --locals its values).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torchtriage.errors import EnvironmentProblem
from torchtriage.protocol import open_private

PY_SPY_ENV = "TORCHTRIAGE_PY_SPY"  # an explicit path to the py-spy binary, checked first
# How long `record`'s py-spy gets to write its files after SIGINT before it is killed.
RECORD_STOP_GRACE_S = 5.0
PRIVATE_UMASK = 0o077  # py-spy's own files: readable by their owner only


def install_hint() -> str:
    return (
        f"install it with `{sys.executable} -m pip install py-spy` (or `pip install py-spy` in the job's "
        f"environment), then put it on PATH or set {PY_SPY_ENV}=/path/to/py-spy"
    )


def find_py_spy() -> str:
    """py-spy's path: $TORCHTRIAGE_PY_SPY, else on PATH, else next to this Python (a venv's bin/, which
    is not on PATH when the venv is not activated). Raises EnvironmentProblem (exit 4) with the fix."""
    explicit = os.environ.get(PY_SPY_ENV)
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise EnvironmentProblem(f"{PY_SPY_ENV}={explicit} is not an executable file; {install_hint()}.")
    on_path = shutil.which("py-spy")
    if on_path:
        return on_path
    # Not resolved: a venv's python is a symlink out of the venv, and py-spy lives in the venv's bin/.
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    raise EnvironmentProblem(f"py-spy is not installed (not on PATH, nor in {beside.parent}); {install_hint()}.")


def py_spy_version(py_spy: str) -> str | None:
    try:
        done = subprocess.run([py_spy, "--version"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def reason_from_stderr(stderr: str) -> str:
    """py-spy's own reason, without the Rust backtrace that follows it when RUST_BACKTRACE is set."""
    text = stderr.split("Stack backtrace:")[0]
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("py-spy>")]
    return " ".join(lines)[:1000] or "py-spy printed no reason"


@dataclass(frozen=True)
class Step:
    """One py-spy run. `stdout_path`: where its standard output goes, unmodified (None: kept in memory)."""

    argv: tuple[str, ...]
    timeout_s: float
    stdout_path: Path | None = None
    output_paths: tuple[Path, ...] = ()  # the files py-spy itself writes (`record -o`)


@dataclass
class StepResult:
    step: Step
    ok: bool = False
    error: str | None = None
    stdout: str = ""  # when not written to a file
    stderr: str = ""
    returncode: int | None = None
    py_spy_pid: int | None = None


@dataclass
class RunReport:
    results: list[list[StepResult]]  # per lane, per step
    interrupted: bool = False
    left_stopped: list[str] = field(default_factory=list)  # warnings about targets found stopped/traced


class ConcurrentRunner:
    """Runs lanes of Steps: the lanes in parallel (all starting together), the steps of one lane in turn.

    `graceful_stop`: on Ctrl-C send SIGINT first (for `record`, which then writes its files), else SIGKILL.
    """

    def __init__(self, graceful_stop: bool = False, env: dict[str, str] | None = None) -> None:
        self.graceful_stop = graceful_stop
        self.env = dict(os.environ if env is None else env)
        self.env["RUST_BACKTRACE"] = "0"  # py-spy's reason without a Rust backtrace under it
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._cancelled = threading.Event()

    # -- one lane, in a worker thread

    def _run_lane(self, lane: Sequence[Step], results: list[StepResult], start: threading.Barrier) -> None:
        try:
            start.wait()
        except threading.BrokenBarrierError:
            pass
        failed = False
        for step in lane:
            result = StepResult(step)
            results.append(result)
            if self._cancelled.is_set():
                result.error = "interrupted before py-spy ran"
            elif failed:  # the same py-spy on the same rank would fail again, maybe after a timeout
                result.error = "not run: the previous py-spy run on this process failed"
            else:
                self._run_step(step, result)
                failed = not result.ok

    def _run_step(self, step: Step, result: StepResult) -> None:
        out = None
        try:
            out = os.fdopen(open_private(step.stdout_path), "wb") if step.stdout_path else subprocess.PIPE
            with self._lock:
                if self._cancelled.is_set():
                    result.error = "interrupted before py-spy ran"
                    return
                proc = subprocess.Popen(
                    step.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.PIPE,
                    env=self.env,
                    start_new_session=True,
                    umask=PRIVATE_UMASK,
                )
                self._live.add(proc)
            result.py_spy_pid = proc.pid
            try:
                stdout, stderr = proc.communicate(timeout=step.timeout_s)
            except subprocess.TimeoutExpired:
                self._kill(proc)
                stdout, stderr = proc.communicate()
                result.error = (
                    f"py-spy did not finish within {step.timeout_s:g} s and was killed (the rank may be in an "
                    "uninterruptible call, e.g. a GPU driver call: retry with a longer --timeout, or --native "
                    "off)"
                )
            except BaseException:  # whatever goes wrong here, no py-spy outlives the command
                self._kill(proc)
                raise
            finally:
                with self._lock:
                    self._live.discard(proc)
        except OSError as err:
            result.error = f"could not run py-spy: {err}"
            return
        finally:
            if out not in (None, subprocess.PIPE):
                out.close()
        result.returncode = proc.returncode
        result.stdout = (stdout or b"").decode("utf-8", "replace")
        result.stderr = (stderr or b"").decode("utf-8", "replace")
        if result.error is None:
            if self._cancelled.is_set() and proc.returncode != 0:
                result.error = "interrupted"
            elif proc.returncode != 0:
                result.error = reason_from_stderr(result.stderr)
            else:
                result.ok = True

    # -- stopping py-spy (never anything else)

    @staticmethod
    def _signal(proc: subprocess.Popen, sig: int) -> None:
        # py-spy leads its own process group (start_new_session): the group holds py-spy and nothing else.
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def _kill(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            self._signal(proc, signal.SIGKILL)

    def _stop_all(self) -> None:
        self._cancelled.set()
        with self._lock:
            live = list(self._live)
        if self.graceful_stop:
            for proc in live:
                if proc.poll() is None:
                    self._signal(proc, signal.SIGINT)
            deadline = time.monotonic() + RECORD_STOP_GRACE_S
            try:
                while any(p.poll() is None for p in live) and time.monotonic() < deadline:
                    time.sleep(0.05)
            except KeyboardInterrupt:  # a second Ctrl-C: stop waiting
                pass
        with self._lock:
            live = list(self._live)
        for proc in live:
            self._kill(proc)
        for proc in live:
            proc.wait()

    def run(self, lanes: Sequence[Sequence[Step]], target_pids: Sequence[int] = ()) -> RunReport:
        results: list[list[StepResult]] = [[] for _ in lanes]
        start = threading.Barrier(len(lanes) + 1) if lanes else None
        threads = [
            threading.Thread(target=self._run_lane, args=(lane, res, start), daemon=True, name=f"py-spy-{i}")
            for i, (lane, res) in enumerate(zip(lanes, results, strict=True))
        ]
        interrupted = False
        before = target_warnings(target_pids)
        try:
            for thread in threads:
                thread.start()
            if start is not None:
                start.wait()  # every lane starts py-spy at once, so record's windows overlap
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.1)
        except KeyboardInterrupt:
            interrupted = True
            self._cancelled.set()
            if start is not None:
                start.abort()
            self._stop_all()
            for thread in threads:
                thread.join()
        report = RunReport(results, interrupted)
        # Only what changed during the capture: a rank the user stopped (Ctrl-Z) or debugs is not ours.
        report.left_stopped = [w for pid, w in target_warnings(target_pids).items() if pid not in before]
        return report


def target_warnings(pids: Sequence[int], proc: Path = Path("/proc")) -> dict[int, str]:
    """Targets that are stopped or traced, with what to do: what a killed tracer could leave behind."""
    warnings = {}
    for pid in pids:
        try:
            status = (proc / str(pid) / "status").read_text()
        except OSError:
            continue  # exited: nothing of ours can linger there
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        state = fields.get("State", "").strip()
        tracer = fields.get("TracerPid", "0").strip()
        if state.startswith(("T", "t")):
            warnings[pid] = f"pid {pid} was left stopped ({state}): resume it with `kill -CONT {pid}`"
        elif tracer not in ("", "0"):
            warnings[pid] = f"pid {pid} is still traced by pid {tracer}"
    return warnings


class sigterm_as_interrupt:  # noqa: N801 - used as a context manager, like contextlib's
    """Within the block, SIGTERM (scancel, a job step ending, `timeout`) stops the capture the way Ctrl-C
    does: every py-spy started is stopped and waited for before torchtriage exits."""

    def __enter__(self) -> sigterm_as_interrupt:
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
