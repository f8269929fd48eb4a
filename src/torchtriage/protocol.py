"""The run folder and the names shared by `torchtriage run`, the ranks' hang watchdog and live `diagnose`.

`torchtriage run --out DIR` tells every rank where DIR is through the environment; the ranks write
into it and `diagnose` asks them, through a file in it, for a fresh dump. Both sides read the names
here, so neither imports the other.

    DIR/fr/nccl_trace_rank_<N>     the flight recorder's dumps on a timeout (TORCH_FR_DUMP_TEMP_FILE)
    DIR/hang/rank<NN>.txt          each rank's stack when the watchdog fired (py-spy's text form)
    DIR/hang/fr/nccl_trace_rank_<N>   each rank's flight-recorder buffer at that moment
    DIR/hang/verdict.json, .txt    the fused verdict of the latest stall, written by the first rank to notice
    DIR/hang/.earlier/<time>/      the files of earlier stalls (each stall is an episode; dot folders are not read)
    DIR/hang/REQUEST               created by `diagnose` to ask every armed rank for a fresh dump, with a token
    DIR/hang/.requests/<token>/    each rank's stack and flight-recorder buffer for that request
    DIR/debug_server.json          with --debug-server: the job's store address, for `diagnose --store`
    DIR/nonfinite.jsonl            NonFiniteGuard(locate=True): where each skipped step's NaN was born
    DIR/monitor/steps-rank<R>.jsonl   with --monitor: one line per window of each rank's step timings
    DIR/monitor/stragglers.jsonl   with --monitor: the straggler decisions (rank 0)
    DIR/run-exit.json              how the job ended (`run`): the launcher's exit code or signal, its start and end
    DIR/identity/rank<N>.json      where each rank runs: host, pid, local rank, GPU (index, UUID, PCI bus id), attempt
    DIR/.attempt-<n>/              the same files of the n-th attempt (n >= 1) when the launcher restarted the job's
                                   workers (torchrun --max-restarts) or `run` was started again on DIR (a requeue):
                                   DIR itself holds attempt 0, and no attempt writes over another's files
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path

RUN_DIR_ENV = "TORCHTRIAGE_RUN_DIR"
STALL_SECONDS_ENV = "TORCHTRIAGE_STALL_SECONDS"
HANG_SUBDIR = "hang"
FR_SUBDIR = "fr"
FR_PREFIX = "nccl_trace_rank_"
# The flight recorder's variables: (new spelling, older spelling, first torch that reads the new one). Older torch
# gets both spellings; from that version on only the new one, because torch warns that the old one is deprecated.
FR_BUFFER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", (2, 10))
FR_DUMP_ON_TIMEOUT_ENV = ("TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_NCCL_DUMP_ON_TIMEOUT", (2, 15))
FR_DUMP_FILE_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", (2, 10))


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as torch's "2.13.0+cpu"; (0, 0) when it holds none."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def fr_spellings(variable: tuple[str, str, tuple[int, int]], torch_version: tuple[int, int]) -> tuple[str, ...]:
    """The names to set for one flight-recorder variable on a torch release ((0, 0): unknown, both)."""
    new, old, since = variable
    return (new,) if torch_version >= since else (new, old)


# The watchdog's faulthandler backstop: a file each rank holds open for a timer that fires only when the rank's
# own threads cannot run (the GIL held forever). Empty is its normal state, not a file that failed to be written.
BACKSTOP_PREFIX = "faulthandler-backstop-rank"


def backstop_name(rank: int | None) -> str:
    return f"{BACKSTOP_PREFIX}{rank if rank is not None else os.getpid()}.txt"


REQUEST_FILE = "REQUEST"
REQUESTS_SUBDIR = ".requests"  # a dot folder: no reader of the run folder fuses a request's dumps
VERDICT_STEM = "verdict"
DEBUG_SERVER_ENV = "TORCHTRIAGE_DEBUG_SERVER"
DEBUG_SERVER_FILE = "debug_server.json"
MONITOR_WINDOW_ENV = "TORCHTRIAGE_MONITOR_WINDOW"  # set by `run --monitor`: the step monitor's window
MONITOR_SUBDIR = "monitor"
# Written by `torchtriage run` once its launcher has ended (cli/run_end.py), read by triage (sources/run_exit.py).
RUN_EXIT_FILE = "run-exit.json"
RUN_EXIT_SCHEMA = "torchtriage.run_exit/1"
# PyTorch's debug server registers each rank's worker URL in the job's store under this prefix
# (torch/distributed/debug/_store.py); `run --debug-server` adds the world size under the second key.
DEBUG_SERVER_STORE_PREFIX = "debug_server/"
DEBUG_SERVER_WORLD_KEY = "torchtriage/debug_server/world_size"
# Keys the watchdogs of one job share in its c10d store.
WATCHDOG_STORE_PREFIX = "torchtriage/watchdog/"
# Each rank's identity record (runtime/identity.py writes it at start, sources/identity.py reads it).
IDENTITY_SUBDIR = "identity"
# A watchdog the program started itself (no `torchtriage run`) records where its rank runs as `run` would in a run
# folder, in this dot folder of its own folder: `.run/identity/rank<N>.json`.
OWN_RUN_SUBDIR = ".run"
IDENTITY_SCHEMA = "torchtriage.identity/1"
# The launcher's count of restarts of the workers (torchelastic sets it in every worker: 0, 1, 2 ...).
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
# Set by `run`: the number of the attempt its launcher's first workers are (attempts earlier runs on the same
# folder recorded come first, so a requeued job writes beside them, never over them).
FIRST_ATTEMPT_ENV = "TORCHTRIAGE_FIRST_ATTEMPT"
ATTEMPT_PREFIX = ".attempt-"  # a dot folder: `diagnose DIR` reads attempt 0 alone, never two attempts as one job
# For tests only: the host name a rank records and a capture reports, so that two launchers on one machine can
# stand for two nodes. Never set it on a real job: a verdict would name a machine that does not exist.
TEST_HOSTNAME_ENV = "TORCHTRIAGE_TEST_HOSTNAME"


def host_name() -> str:
    """This machine's name, as a rank records it and a live capture reports it."""
    return os.environ.get(TEST_HOSTNAME_ENV) or socket.gethostname()


def identity_file(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / IDENTITY_SUBDIR / f"rank{rank}.json"


def attempt_dir(run_dir: str | Path, attempt: int) -> Path:
    """The folder of the attempt numbered `attempt`: the run folder itself for the first."""
    return Path(run_dir) if attempt == 0 else Path(run_dir) / f"{ATTEMPT_PREFIX}{attempt}"


def attempt_number(environ: Mapping[str, str]) -> int:
    """A rank's attempt, from its environment: the first attempt of `run`'s launcher plus the launcher's restarts."""
    total = 0
    for name in (FIRST_ATTEMPT_ENV, RESTART_COUNT_ENV):
        value = environ.get(name, "")
        total += int(value) if value.isascii() and value.isdigit() and len(value) < 10 else 0
    return total


def _small_number(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) < 10


def recorded_attempts(run_dir: str | Path) -> dict[int, Path]:
    """Attempt -> its folder, for the attempts whose ranks wrote into `run_dir` (attempt 0: the folder itself, when
    its ranks left their identity records, a stall's files or `run`'s record of the end)."""
    run_dir = Path(run_dir)
    found: dict[int, Path] = {}
    if any((run_dir / name).exists() for name in (IDENTITY_SUBDIR, HANG_SUBDIR, RUN_EXIT_FILE)):
        found[0] = run_dir
    try:
        entries = list(os.scandir(run_dir))
    except OSError:
        return found
    for entry in entries:
        number = entry.name.removeprefix(ATTEMPT_PREFIX)
        # ASCII digits, a few: a folder named '.attempt-²' (a digit to isdigit(), which int() refuses) is no attempt
        if entry.name.startswith(ATTEMPT_PREFIX) and _small_number(number) and entry.is_dir(follow_symlinks=False):
            found[int(number)] = Path(entry.path)
    return dict(sorted(found.items()))


def hang_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / HANG_SUBDIR


def write_whole(path: Path, text: str | bytes) -> None:
    """Write `text` (or bytes) under another name in the same folder, then rename it: whoever reads the run folder
    while a rank writes (another rank, `diagnose`, a user's script) sees the file whole or not at all. The
    other name starts with a dot, which every reader skips. The file is private (0600): stacks and verdicts
    name the job's files and values."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_native_id()}")
    try:
        partial.unlink()  # left by a write of an earlier process with this pid that did not finish
    except FileNotFoundError:
        pass
    write_private(partial, text)
    os.replace(partial, path)


# Captures and run folders are private to their owner: py-spy's --locals and the watchdog's stacks show the values
# a rank holds (a token read from the environment, a path), and /tmp is read by every user of a node.
PRIVATE_FOLDER_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def open_private(path: Path) -> int:
    """A new file at `path`, 0600 whatever the umask, as a descriptor open for writing. Never an existing file,
    nor a symlink planted at its name (O_EXCL refuses both: FileExistsError)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)  # open's mode passes through the umask, which may take the owner's bits
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, data: str | bytes) -> None:
    """`data` in a new private file at `path` (see open_private)."""
    with os.fdopen(open_private(path), "wb") as file:
        file.write(data.encode() if isinstance(data, str) else data)


def new_private_folder(path: Path) -> None:
    """Create the folder `path`, 0700 whatever the umask; FileExistsError when the name is taken."""
    os.mkdir(path, PRIVATE_FOLDER_MODE)
    # mkdir's mode passes through the umask; chmod does not. Through a descriptor that refuses a symlink, so the
    # mode set is the folder's just made, whatever was put at its name meanwhile.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
    try:
        os.fchmod(fd, PRIVATE_FOLDER_MODE)
    finally:
        os.close(fd)


def make_private_folders(path: Path) -> None:
    """The folder `path` and its missing parents, each made 0700. What exists already (a folder the user named,
    or one another process made meanwhile) is left as it is. NotADirectoryError when `path` is not a folder."""
    missing, above = [], path
    while not os.path.lexists(above) and above.parent != above:
        missing.append(above)
        above = above.parent
    for folder in reversed(missing):
        try:
            new_private_folder(folder)
        except FileExistsError:
            continue
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))


def open_to_others(folder: Path) -> str | None:
    """How other users can read `folder` ("mode 0755"), or None when they cannot list it."""
    try:
        mode = os.stat(folder).st_mode & 0o777
    except OSError:
        return None
    return f"mode {mode:04o}" if mode & 0o044 else None


# Live `diagnose` asks armed ranks for fresh dumps with a request file holding a token: each watchdog serves each
# token once, into hang/.requests/<token>/, and stays armed for the next request and the next stall.
_TOKEN = re.compile(r"^id ([0-9A-Za-z_-]{1,64})$", re.MULTILINE)
_REQUEST_BYTES = 4096


def request_token(folder: Path) -> str | None:
    """The token of the request file in `folder`, or None; a file without one (an older diagnose) is
    named by its content."""
    try:
        with open(folder / REQUEST_FILE, "rb") as file:
            text = file.read(_REQUEST_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    found = _TOKEN.search(text)
    if found:
        return found.group(1)
    return "legacy-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def request_folder(folder: Path, token: str) -> Path:
    return folder / REQUESTS_SUBDIR / token


def write_request(folder: Path, token: str) -> None:
    """Ask every armed rank whose hang folder is `folder` for a fresh dump into request_folder(token)."""
    make_private_folders(folder)  # the hang folder of a job whose ranks have not made it yet: private, as they make it
    write_whole(folder / REQUEST_FILE, f"requested by torchtriage diagnose at {time.time():.0f}\nid {token}\n")


def withdraw_request(folder: Path, token: str) -> None:
    """Remove the request file if it still holds `token` (a later diagnose's request stays)."""
    if request_token(folder) == token:
        try:
            (folder / REQUEST_FILE).unlink()
        except OSError:
            pass
