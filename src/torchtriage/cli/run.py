"""`torchtriage run [--out DIR] [--stall-seconds N] -- LAUNCHER ARGS...`: a job armed for diagnosis.

Runs any launcher (torchrun, `python -m torch.distributed.run`, srun, mpirun ...) unchanged, with:
- the flight recorder armed (buffer, dump on timeout, dump path in DIR/fr), unless the user set it;
- a hang watchdog injected into every rank through a `sitecustomize` on PYTHONPATH: after N seconds
  without progress it writes every rank's stacks and flight-recorder buffer and the fused verdict
  into DIR/hang, before the NCCL watchdog or the scheduler kills the job;
- with --monitor, the step monitor in every rank (DIR/monitor: step timings per window, the straggler);
- with --debug-server, PyTorch's debug-server worker in every rank (for `diagnose --store`).
The child's output passes through untouched and its exit code is returned. Once it ends, `run` says how (the
watchdog's verdict if a stall was diagnosed, then whether the job finished, failed or was ended by a signal) and
keeps how the launcher ended in DIR/run-exit.json, which triage reads with the rest of the folder (cli/run_end.py).

Every rank records where it runs (DIR/identity/rank<N>.json: host, pid, GPU; runtime/identity.py), so that each
verdict names the culprit's machine. Each attempt keeps its own folder: when the launcher restarts the workers
(torchrun --max-restarts) or `run` is started again on DIR (a requeue), attempt n writes into DIR/.attempt-<n>,
never over an earlier attempt's files; `torchtriage history DIR` compares them.

DIR is made private (0700: the ranks' stacks show the values they hold), and checked writable before the job
starts: a folder the ranks cannot write to would lose the evidence of the very hang it is there for.
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torchtriage
from torchtriage.cli.common import SECONDS
from torchtriage.cli.run_end import LauncherEnd, forget_earlier_end, say_and_record
from torchtriage.errors import EnvironmentProblem, UsageError
from torchtriage.protocol import (
    DEBUG_SERVER_ENV,
    DEBUG_SERVER_FILE,
    FIRST_ATTEMPT_ENV,
    FR_BUFFER_ENV,
    FR_DUMP_FILE_ENV,
    FR_DUMP_ON_TIMEOUT_ENV,
    FR_PREFIX,
    FR_SUBDIR,
    MONITOR_WINDOW_ENV,
    RUN_DIR_ENV,
    STALL_SECONDS_ENV,
    attempt_dir,
    fr_spellings,
    make_private_folders,
    open_private,
    open_to_others,
    recorded_attempts,
    release,
)

INJECT_DIR = Path(__file__).resolve().parent.parent / "runtime" / "inject"


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", metavar="DIR", help="where diagnostics go (default: ./torchtriage-run-<time>)")
    parser.add_argument(
        "--stall-seconds",
        type=SECONDS,
        default=300.0,
        help="seconds without progress before a rank counts as stalled (default 300)",
    )
    parser.add_argument(
        "--debug-server",
        action="store_true",
        help="start PyTorch's debug-server worker in every rank (torch >= 2.10), so that "
        "`torchtriage diagnose --store HOST:PORT` reaches every node; the address lands in DIR/debug_server.json",
    )
    parser.add_argument(
        "--monitor",
        action="store_true",
        help="run the step monitor in every rank: step timings per window in DIR/monitor, the straggler "
        "rank and its reason (data, compute, launch, communication) logged by rank 0",
    )
    parser.add_argument(
        "--monitor-window",
        type=int,
        default=50,
        metavar="STEPS",
        help="optimizer steps per monitor window (default 50)",
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="-- LAUNCHER ARGS", help="the launcher and its arguments, after --"
    )


def flight_recorder_env(
    out_dir: Path, environ: dict[str, str], torch_version: tuple[int, int]
) -> tuple[dict[str, str], list[str]]:
    """The flight-recorder settings to add, and a warning for each that the user already set differently.

    A variable the user set under either spelling is theirs (torch reads the new one first: adding it
    would override theirs). Otherwise the spellings the job's torch reads: both on releases before the
    new one, only the new one after (torch warns, once per rank, that the old one is deprecated).
    """
    prefix = str(out_dir / FR_SUBDIR / FR_PREFIX)
    wanted = ((FR_BUFFER_ENV, "20000"), (FR_DUMP_ON_TIMEOUT_ENV, "1"), (FR_DUMP_FILE_ENV, prefix))
    added, kept = {}, []
    for variable, value in wanted:
        theirs = [(name, environ[name]) for name in variable[:2] if environ.get(name) not in (None, "")]
        if not theirs:
            added.update(dict.fromkeys(fr_spellings(variable, torch_version), value))
        kept += [
            f"{name}={current} (yours, kept; torchtriage would set {value})"
            for name, current in theirs
            if current != value
        ]
    return added, kept


def installed_torch_version() -> tuple[int, int]:
    """The release of the torch this Python would import, read from its metadata (importing torch takes
    seconds); (0, 0) when there is none."""
    from importlib import metadata

    try:
        return release(metadata.version("torch"))
    except metadata.PackageNotFoundError:
        return (0, 0)


def armed_environment(
    out_dir: Path,
    stall_seconds: float,
    environ: dict[str, str],
    debug_server: bool = False,
    monitor_window: int | None = None,
    first_attempt: int = 0,
) -> tuple[dict[str, str], list[str]]:
    env = dict(environ)
    env[FIRST_ATTEMPT_ENV] = str(first_attempt)
    if monitor_window is not None:
        env[MONITOR_WINDOW_ENV] = str(monitor_window)
    if debug_server:
        env[DEBUG_SERVER_ENV] = "1"
        # The worker's py-spy handler runs `py-spy` from the rank's PATH: ours goes last, never shadowing.
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if Path(spy).exists():
            env["PATH"] = os.pathsep.join(p for p in (environ.get("PATH", ""), str(Path(spy).parent)) if p)
    added, kept = flight_recorder_env(out_dir, environ, installed_torch_version())
    env.update(added)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(INJECT_DIR), environ.get("PYTHONPATH", "")) if p)
    env[RUN_DIR_ENV] = str(out_dir)
    env[STALL_SECONDS_ENV] = str(stall_seconds)
    env["TORCHTRIAGE_HOME"] = str(Path(torchtriage.__file__).resolve().parent.parent)
    return env, kept


def run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UsageError("give the launcher after --, e.g. torchtriage run -- torchrun --nproc_per_node 8 train.py")
    out_dir = Path(args.out or f"torchtriage-run-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    try:
        make_private_folders(out_dir)  # a folder that exists is the user's: left as it is
    except OSError as err:
        what = "a file, not a folder" if out_dir.exists() else (err.strerror or str(err))
        raise UsageError(f"--out {out_dir}: {what}; give a folder for the diagnostics.") from None
    check_writable(out_dir)
    exposed = open_to_others(out_dir)
    if exposed is not None:
        print(
            f"torchtriage run: {out_dir} is readable by other users ({exposed}); what the ranks write there (their "
            "stacks, flight-recorder dumps) may be too: `chmod 700` it, or give a private folder",
            file=sys.stderr,
        )
    if args.monitor_window < 2:
        raise UsageError(f"--monitor-window {args.monitor_window}: a window needs at least 2 steps")
    window = args.monitor_window if args.monitor else None
    first = first_attempt(out_dir)
    env, kept = armed_environment(out_dir, args.stall_seconds, dict(os.environ), args.debug_server, window, first)
    for message in kept:
        warnings.warn(f"torchtriage run: {message}", stacklevel=1)
    print(f"torchtriage run: diagnostics in {out_dir} (stall after {args.stall_seconds:g} s)", file=sys.stderr)
    if args.debug_server:
        print(
            f"torchtriage run: debug server in every rank; its store address will be in {out_dir / DEBUG_SERVER_FILE}"
            " (torchtriage diagnose --store HOST:PORT)",
            file=sys.stderr,
        )
    forget_earlier_end(out_dir)
    started = time.time()
    forwarded: list[int] = []
    code = _run_forwarding(command, env, forwarded)
    end = LauncherEnd(Path(command[0]).name, code, started, time.time(), tuple(forwarded))
    say_and_record(out_dir, end, first)
    return end.exit_code


def first_attempt(out_dir: Path) -> int:
    """The attempt this run's first workers are: 0 in a fresh folder; after the attempts earlier runs recorded there
    (a requeued job started again on the same folder), the next, so that none writes over an earlier one's files.
    Every node's `run` sees the same folder before any rank of the job starts (the ranks start once every node's
    launcher has joined), so the nodes of one job agree."""
    earlier = recorded_attempts(out_dir)
    if not earlier:
        return 0
    first = max(earlier) + 1
    print(
        f"torchtriage run: {out_dir} holds the files of {len(earlier)} earlier attempt(s); this run's go to "
        f"{attempt_dir(out_dir, first)} and on (torchtriage history {out_dir} compares them)",
        file=sys.stderr,
    )
    return first


# One block of data: a full file system refuses it where an empty file would still be made.
_PROBE_BYTES = 4096
_WHY_NOT_WRITABLE = {
    errno.EROFS: "is on a read-only file system",
    errno.EACCES: "is not writable by this user",
    errno.EPERM: "is not writable by this user",
    errno.ENOSPC: "has no space left",
    errno.EDQUOT: "is over your disk quota",
}


def check_writable(folder: Path) -> None:
    """Write and remove a probe file in `folder`, before the job starts: EnvironmentProblem (exit 4) with the
    reason when it cannot be written (read-only, not ours, full)."""
    probe = folder / f".torchtriage-probe-{os.getpid()}"
    try:
        if os.path.lexists(probe):  # left by an earlier run with this pid that was killed meanwhile
            probe.unlink()
        try:
            with os.fdopen(open_private(probe), "wb") as file:
                file.write(b"\0" * _PROBE_BYTES)
                file.flush()
                os.fsync(file.fileno())  # where space is only claimed on the way to the disk (network file systems)
        finally:
            if os.path.lexists(probe):
                probe.unlink()
    except OSError as err:
        why = _WHY_NOT_WRITABLE.get(err.errno, f"cannot be written ({err.strerror or err})")
        raise EnvironmentProblem(
            f"--out {folder} {why}: the ranks could not leave their stacks, flight-recorder dumps or verdict there. "
            "Give a folder you can write with room to spare (--out DIR); the job was not started."
        ) from None


# What a scheduler or a user sends to stop or poke a job. Kubernetes and many schedulers signal only the
# container's first process: as an entrypoint, `run` must pass these on, or the job would never stop.
FORWARDED = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2") if hasattr(signal, name)
)
_FROM_THE_KERNEL = 0x80  # SI_KERNEL: Ctrl-C or a hangup from the terminal, which reached the child too


def _start(command: list[str], env: dict[str, str], blocked: bool) -> subprocess.Popen:
    def unblock() -> None:  # the child starts with the default signal mask, not ours
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)

    try:
        return subprocess.Popen(command, env=env, preexec_fn=unblock if blocked else None)  # noqa: PLW1509
    except FileNotFoundError:
        raise EnvironmentProblem(f"{command[0]}: command not found; check the launcher's name and PATH.") from None
    except PermissionError:
        raise EnvironmentProblem(
            f"{command[0]}: not executable (check its permissions, or run it with its interpreter)."
        ) from None
    except OSError as err:
        raise EnvironmentProblem(f"{command[0]}: cannot be started ({err.strerror or err}).") from None


def _run_forwarding(command: list[str], env: dict[str, str], forwarded: list[int]) -> int:
    """Run the launcher; each signal sent to this process is passed to it (and added to `forwarded`), and its
    exit code returned.

    A signal the terminal sent (Ctrl-C, hangup) reached the launcher already, through the process group
    they share: it is not sent twice, which would turn a clean shutdown into an abort. Where the sender
    cannot be told apart (no sigtimedwait), Ctrl-C is left to the terminal and the rest are forwarded."""
    if hasattr(signal, "sigtimedwait"):
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        try:
            child = _start(command, env, blocked=True)
            while (code := child.poll()) is None:
                info = signal.sigtimedwait(FORWARDED, 0.2)
                if info is not None and info.si_code != _FROM_THE_KERNEL:
                    _pass_on(child, info.si_signo, forwarded)
            return code
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    child = _start(command, env, blocked=False)  # pragma: no cover - platforms without sigtimedwait
    previous = {sig: signal.signal(sig, lambda sig, _f: _pass_on(child, sig, forwarded)) for sig in FORWARDED}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _pass_on(child: subprocess.Popen, sig: int, forwarded: list[int]) -> None:
    try:
        child.send_signal(sig)
        forwarded.append(sig)
    except ProcessLookupError:  # it exited meanwhile
        pass
