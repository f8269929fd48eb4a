"""A hang watchdog inside each rank: notices a stall, leaves the evidence and a verdict before the kill.

`HangWatchdog` runs one daemon thread per rank. Progress is any counter of runtime/progress.py moving:
the main thread's stack, the collectives issued on any group, the optimizer steps, an explicit
`progress()` call. When none has moved for `stall_seconds`:

1. the rank writes every thread's stack (py-spy's text form, so the stack readers take it as is)
   and its flight-recorder buffer (torch records gloo and NCCL collectives alike) into `out_dir`;
2. through the c10d store — never through the communicator that may be stuck — it asks every other
   rank to do the same, so the culprit, which may not be stalled at all, leaves its stack too;
3. the first rank to notice becomes the reporter: it waits for the others' files, fuses them into
   one verdict and writes `verdict.json` and `verdict.txt` into `out_dir`, naming the stall's number
   and time.

Each stall is an episode (runtime/stall_episodes.py): once the job moves again the watchdog re-arms, and
a later stall replaces the evidence (the earlier one is kept in `out_dir/.earlier/`) with a verdict of its
own. A live `diagnose` request is served once per token, into a folder of its own, and uses nothing up.

Do no harm: the thread sleeps between polls without holding the GIL, reads frames only briefly,
swallows its own failures (a warning, never an exception into training), and changes no control
flow of the training loop. A faulthandler timer armed well past the stall backs it up for a main
thread that holds the GIL forever, which no Python thread could observe, unless the program armed
faulthandler's one timer itself: then the program's timer stands.
"""

from __future__ import annotations

import faulthandler
import json
import os
import subprocess
import sys
import threading
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path

from torchtriage.protocol import (
    DEBUG_SERVER_ENV,
    FR_PREFIX,
    FR_SUBDIR,
    IDENTITY_SUBDIR,
    OWN_RUN_SUBDIR,
    RUN_DIR_ENV,
    STALL_SECONDS_ENV,
    VERDICT_STEM,
    backstop_name,
    hang_dir,
    make_private_folders,
    open_private,
    request_folder,
    request_token,
    write_whole,
)
from torchtriage.runtime.blocked_call import blocked_call
from torchtriage.runtime.progress import ProgressCounters, stack_signature
from torchtriage.runtime.stall_episodes import (
    EARLIER_SUBDIR,
    announce,
    archive_earlier,
    claim_episode,
    current_episode,
    is_reporter,
    mark_archived,
    run_prefix,
    wait_archived,
    wait_for_dumps,
    wake_key,
)

_REPORT_WAIT_S = 30.0  # how long the reporter waits for the other ranks' files
_VERDICT_TIMEOUT_S = 120.0  # how long the verdict's analysis may take, in a process of its own


def _env_rank(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def _loaded(name: str):
    """A module the program has finished importing, or None.

    The watchdog thread never imports torch itself: importing from a second thread while the main
    thread is still importing the same package breaks the main thread's import (torch's C modules are
    registered late). It only uses what the program has fully loaded.
    """
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


def format_stacks(frames_by_thread: dict[int, object], main_ident: int, stalled: bool) -> str:
    """All threads' stacks in py-spy's `dump` text form, innermost frame first."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    lines = [f"Process {os.getpid()}: {' '.join(sys.argv)}", f"Python v{sys.version.split()[0]} ({sys.executable})", ""]
    ordered = sorted(frames_by_thread.items(), key=lambda item: item[0] != main_ident)
    for ident, frame in ordered:
        # py-spy's statuses: a main thread that has not moved for the whole stall window is blocked.
        status = "idle" if stalled and ident == main_ident else "active"
        lines.append(f'Thread {ident:#x} ({status}): "{names.get(ident, "Thread")}"')
        waiting_in = blocked_call(frame)
        if waiting_in:
            lines.append(f"    {waiting_in[0]} ({waiting_in[1]}:0)")  # a native frame, as py-spy --native names it
        for each, lineno in traceback.walk_stack(frame):  # innermost first
            code = each.f_code
            lines.append(f"    {code.co_name} ({code.co_filename}:{lineno})")
            lines += _c10d_arguments(each)
        lines.append("")
    return "\n".join(lines)


# What the analysis reads of a torch.distributed frame (which group a collective was given, the peer of a
# send or recv), in py-spy's `--locals` form. Only names, numbers and type names are written: no object's
# repr is ever called (a tensor's would print it, and on a GPU wait for it).
_C10D_FILES = ("distributed_c10d.py", "c10d_logger.py")
_PEER_ARGUMENTS = ("src", "dst", "group_src", "group_dst", "tag")
_NAME_ARGUMENTS = ("group_name",)  # the group `_new_process_group_helper` creates: c10d's short counter name


def _c10d_arguments(frame) -> list[str]:
    filename = frame.f_code.co_filename.replace("\\", "/")
    if not filename.endswith(_C10D_FILES):
        return []
    try:
        values = dict(frame.f_locals)  # the frame is blocked in a C call: its locals do not move
    except Exception:  # noqa: BLE001 - a frame that cannot show its locals shows none
        return []
    shown = []
    if filename.endswith("c10d_logger.py") and "kwargs" in values and "args" in values:
        args, kwargs = values["args"], values["kwargs"]
        if isinstance(args, tuple) and isinstance(kwargs, dict):
            shown.append(f"args: ({', '.join(f'<{type(a).__name__}>' for a in args)})")
            shown.append(
                "kwargs: {"
                + ", ".join(f'"{k}": <{type(v).__name__}>' for k, v in kwargs.items() if isinstance(k, str))
                + "}"
            )
    for name in _PEER_ARGUMENTS:
        value = values.get(name)
        if type(value) is int:
            shown.append(f"{name}: {value}")
    for name in _NAME_ARGUMENTS:
        value = values.get(name)
        if type(value) is str and len(value) <= 64:
            shown.append(f'{name}: "{value}"')
    return ["        Locals:", *(f"            {line}" for line in shown)] if shown else []


def _gathering_ranks(frame) -> bool:
    """Whether the main thread is inside `init_process_group`, waiting for the job's ranks to arrive: no
    training step has run, a slow rank (an import on a busy file system) is still coming, and torch's own
    rendezvous timeout names one that never does. The stall clock starts once it returns."""
    depth = 0
    while frame is not None and depth < 64:
        code = frame.f_code
        if code.co_name == "init_process_group" and code.co_filename.endswith("distributed_c10d.py"):
            return True
        frame, depth = frame.f_back, depth + 1
    return False


class _ProgramTimers:
    """Whether the program armed faulthandler's one timer itself (`dump_traceback_later`): then it is theirs,
    and the watchdog's backstop steps aside until they cancel it."""

    armed = False


_FAULTHANDLER_ARM = faulthandler.dump_traceback_later
_FAULTHANDLER_CANCEL = faulthandler.cancel_dump_traceback_later


def _guard_program_timers() -> None:
    """Note the program's own calls to faulthandler's timer, which holds one timer per process."""
    if getattr(faulthandler.dump_traceback_later, "_torchtriage", False):
        return

    def dump_traceback_later(*args, **kwargs):
        _ProgramTimers.armed = True
        return _FAULTHANDLER_ARM(*args, **kwargs)

    def cancel_dump_traceback_later():
        _ProgramTimers.armed = False
        return _FAULTHANDLER_CANCEL()

    dump_traceback_later._torchtriage = True  # type: ignore[attr-defined]
    faulthandler.dump_traceback_later = dump_traceback_later
    faulthandler.cancel_dump_traceback_later = cancel_dump_traceback_later


class HangWatchdog:
    """Writes stacks, flight-recorder dumps and a fused verdict when this rank stops making progress.

    Use as a context manager or with start()/stop(). Progress is read from counters (runtime/progress.py):
    the main thread's stack, collectives issued, optimizer steps, and `progress()` calls from the loop.
    Each stall is an episode (runtime/stall_episodes.py): the watchdog dumps once per episode and re-arms
    as soon as the job moves again, so a later stall gets a verdict of its own.
    """

    def __init__(
        self,
        stall_seconds: float = 300.0,
        out_dir: str | os.PathLike = "torchtriage-hang",
        poll_seconds: float | None = None,
        report: bool = True,
        debug_server: bool = False,
        run_dir: str | os.PathLike | None = None,
    ):
        if stall_seconds <= 0:
            raise ValueError("stall_seconds must be positive")
        self.stall_seconds = float(stall_seconds)
        self.out_dir = Path(out_dir)
        self.poll_seconds = poll_seconds or max(1.0, min(5.0, self.stall_seconds / 10))
        self.report = report
        self.rank = _env_rank("RANK")
        self.world_size = _env_rank("WORLD_SIZE")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._main_ident = threading.main_thread().ident
        self._counters = ProgressCounters()
        self._last_reading: tuple | None = None
        self._last_progress = time.monotonic()
        self._stall_handled = False  # this stall (since the last progress) has had its dump
        self._dumped_episode = 0  # the latest episode this rank dumped for
        self._dumped_at = float("-inf")
        self._woken = 0  # the latest episode the listener was woken for
        self._served_request: str | None = None
        self._backstop_armed = False
        # PyTorch's debug-server worker, started once the default process group exists (False: it failed)
        self.debug_server = debug_server
        self.run_dir = run_dir
        self._debug_worker: object | None = None
        self._listener: threading.Thread | bool | None = None  # None: not started, False: polling instead
        self._own_store: object | None = None  # see _coordination

    # -- public -------------------------------------------------------------------------------
    def progress(self) -> None:
        self._counters.note_progress()

    def start(self) -> HangWatchdog:
        if self._thread is None:
            if self.run_dir is None:
                self._record_identity()
            _guard_program_timers()
            self._thread = threading.Thread(target=self._run, name="torchtriage-watchdog", daemon=True)
            self._thread.start()
            self._arm_backstop()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._cancel_backstop()
        self._counters.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.poll_seconds + 1)

    def __enter__(self) -> HangWatchdog:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self._poll()
            except Exception as err:  # noqa: BLE001 - the watchdog must never take training down
                warnings.warn(f"torchtriage watchdog: {type(err).__name__}: {err}", RuntimeWarning, stacklevel=1)

    def _poll(self) -> None:
        frame = sys._current_frames().get(self._main_ident)
        now = time.monotonic()
        reading = (stack_signature(frame), self._counters.reading())
        if reading != self._last_reading or _gathering_ranks(frame):
            self._last_reading = reading
            self._last_progress = now
            self._stall_handled = False  # re-armed: a later stall is a new episode
            self._arm_backstop()
        stalled = now - self._last_progress >= self.stall_seconds
        store = self._store()
        if self.debug_server and self._debug_worker is None and store is not None:
            self._start_debug_server()
        if store is not None and self._listener is None:
            self._start_listener(store)
        self._serve_request(stalled)
        if stalled and not self._stall_handled:
            self._stall_handled = True
            self._on_stall(store)
        elif store is not None and self._requested_episode(store) > self._dumped_episode:
            self._join(store, self._requested_episode(store), stalled)

    def _requested_episode(self, store) -> int:
        """The latest episode another rank started, as the listener heard it (or as polled without one)."""
        if self._listener is False:
            try:
                return current_episode(self._coordination(store))
            except Exception:  # noqa: BLE001 - the store went away: nothing requested
                return self._dumped_episode
        return self._woken

    def _arm_backstop(self) -> None:
        # Re-armed on every observed move; fires only if this thread itself cannot run. Never over a timer the
        # program armed itself: faulthandler holds one, and the program's (its exit=True included) wins.
        if _ProgramTimers.armed:
            self._backstop_armed = False
            return
        try:
            if not hasattr(self, "_backstop_file"):
                self._backstop_file = self._open_backstop_file()
            _FAULTHANDLER_ARM(self.stall_seconds * 2 + 30, repeat=False, file=self._backstop_file)
            self._backstop_armed = True
        except (OSError, ValueError, RuntimeError):
            pass

    def _open_backstop_file(self):
        """The file faulthandler writes every thread's stack into, kept open: private (0600, in a 0700 folder) like
        every stack the watchdog writes. A file an earlier run of this rank left is replaced, never written
        through (it may be a link planted at its name)."""
        make_private_folders(self.out_dir)
        path = self.out_dir / backstop_name(self.rank)
        path.unlink(missing_ok=True)
        return os.fdopen(open_private(path), "w")

    def _cancel_backstop(self) -> None:
        if self._backstop_armed and not _ProgramTimers.armed:
            _FAULTHANDLER_CANCEL()
        self._backstop_armed = False

    def _start_debug_server(self) -> None:
        from torchtriage.runtime import debug_server

        why = debug_server.unavailable()
        try:
            self._debug_worker = debug_server.start_worker(self.run_dir) if why is None else False
        except Exception as err:  # noqa: BLE001 - the job runs on without it
            self._debug_worker, why = False, f"{type(err).__name__}: {err}"
        if why:
            warnings.warn(f"torchtriage: the debug server did not start: {why}", RuntimeWarning, stacklevel=1)

    # -- episodes ----------------------------------------------------------------------------
    def _on_stall(self, store) -> None:
        """This rank stalled: join the episode another rank started, or claim the next one."""
        if store is None:  # a process alone: no other rank to agree with
            archive_earlier(self.out_dir)
            self._dump(self.out_dir, stalled=True)
            self._dumped_episode += 1
            if self.report:
                self._write_verdict(None, self._dumped_episode)
            return
        shared = self._coordination(store)
        seen = current_episode(shared)
        if seen > self._dumped_episode:
            self._join(store, seen, stalled=True)  # started by another rank; the listener had not said so yet
            return
        if seen == self._dumped_episode and self._dumped_at >= self._last_progress:
            return  # this rank dumped for the current episode while already stalled: that dump is this stall's
        episode, claimed = claim_episode(shared, seen)
        if claimed:
            root = _root_tcp_store(shared) or _root_tcp_store(store)
            if root is not None:
                root.set(wake_key(episode), str(self.rank))  # first, so no listener waits behind a dead claimant
            archive_earlier(self.out_dir)
            mark_archived(shared, episode)
        self._episode_dump(shared, store, episode, stalled=True, claimed=claimed)
        if self.report and is_reporter(shared, episode):
            self._write_verdict(shared, episode)

    def _join(self, store, episode: int, stalled: bool) -> None:
        shared = self._coordination(store)
        self._episode_dump(shared, store, episode, stalled=stalled, claimed=False)

    def _episode_dump(self, shared, store, episode: int, *, stalled: bool, claimed: bool) -> None:
        if not claimed:
            wait_archived(shared, episode)
        self._dump(self.out_dir, stalled)
        self._dumped_episode, self._dumped_at = episode, time.monotonic()
        announce(shared, _root_tcp_store(shared) or _root_tcp_store(store), episode, self.rank, stalled)

    def _serve_request(self, stalled: bool) -> None:
        """A live `diagnose` asked for fresh dumps: each request once, into a folder of its own."""
        token = request_token(self.out_dir)
        if token is None or token == self._served_request:
            return
        self._served_request = token
        self._dump(request_folder(self.out_dir, token), stalled)

    # -- evidence ----------------------------------------------------------------------------
    def _name(self) -> str:
        return f"rank{self.rank:02d}" if self.rank is not None else f"pid{os.getpid()}"

    def _dump(self, folder: Path, stalled: bool) -> None:
        make_private_folders(folder)  # stacks show what the ranks hold
        stacks = format_stacks(sys._current_frames(), self._main_ident, stalled)
        write_whole(folder / f"{self._name()}.txt", stacks)
        fr = self._flight_recorder_dump()
        if fr is not None:
            fr_dir = folder / FR_SUBDIR
            make_private_folders(fr_dir)
            write_whole(fr_dir / f"{FR_PREFIX}{self.rank if self.rank is not None else os.getpid()}", fr)

    @staticmethod
    def _flight_recorder_dump() -> bytes | None:
        """This rank's flight-recorder buffer, pickled as torch writes it.

        NCCL collectives are recorded in a buffer of their own (`_dump_nccl_trace`), gloo's and the
        other backends' in the generic one (`_dump_fr_trace`): the first that holds entries is taken.
        """
        torch = _loaded("torch")
        if torch is None:
            return None
        from torchtriage.sources.safe_pickle import safe_loads

        c10d = getattr(torch._C, "_distributed_c10d", None)
        fallback = None
        for name in ("_dump_nccl_trace", "_dump_fr_trace"):
            dump = getattr(c10d, name, None)
            if dump is None:
                continue
            try:
                data = dump(True, True, False)
                if safe_loads(data).get("entries"):
                    return data
                fallback = fallback or data
            except Exception:  # noqa: BLE001 - an old torch or a disabled recorder: stacks still tell a lot
                continue
        return fallback

    # -- coordination through the c10d store -------------------------------------------------
    @staticmethod
    def _store():
        dist = _loaded("torch.distributed") if _loaded("torch") is not None else None
        if dist is None:
            return None
        try:
            if not dist.is_available() or not dist.is_initialized():
                return None
            return dist.distributed_c10d._get_default_store()
        except Exception:  # noqa: BLE001
            return None

    # Idle, the watchdogs cost the job's store nothing: each rank's listener holds one wait on a wake-up key
    # (on a connection of its own: a client blocked in a wait serves nothing else), which the first stalled
    # rank sets. Polling from every rank every few seconds would be 3,200 requests a second at 16k ranks.
    def _start_listener(self, store) -> None:
        root = _root_tcp_store(store)
        if root is None:
            self._listener = False
            return
        self._listener = threading.Thread(
            target=self._listen, args=(root.host, root.port), name="torchtriage-listener", daemon=True
        )
        self._listener.start()

    def _listen(self, host: str, port: int) -> None:
        from torch.distributed import TCPStore

        for attempt in range(_LISTEN_ATTEMPTS):
            try:
                client = TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=60))
                while not self._stop.is_set():
                    episode = max(self._woken, self._dumped_episode) + 1
                    client.wait([wake_key(episode)], _LISTEN_FOR)
                    self._woken = episode
                return
            except Exception:  # noqa: BLE001 - the store went away (the job ends) or refused: retry, then poll
                if self._stop.wait(5.0 * (attempt + 1)):
                    return
        self._listener = False

    def _coordination(self, store):
        """The store the watchdogs talk through once one stalls: a client of their own to the job's TCPStore,
        made then. The job's client serves one call at a time, and its main thread may be blocked in it (a
        store.get for a key nobody set, a new group's rendezvous): the watchdog must not queue behind it. Keys
        are per torchelastic run and restart. Where the job's store is no TCPStore, the job's store itself."""
        if self._own_store is None:
            self._own_store = store
            root = _root_tcp_store(store)
            if root is not None:
                try:
                    from torch.distributed import PrefixStore, TCPStore

                    client = TCPStore(root.host, root.port, is_master=False, wait_for_workers=False,
                                      timeout=timedelta(seconds=60))  # fmt: skip
                    self._own_store = PrefixStore(run_prefix(), client)
                except Exception:  # noqa: BLE001 - the job's own client then, as before
                    self._own_store = store
        return self._own_store

    def _write_verdict(self, shared, episode: int) -> None:
        if shared is not None:
            wait_for_dumps(shared, episode, self.world_size or 1, _REPORT_WAIT_S)
        # The analysis runs as `torchtriage diagnose`, in a process of its own: it holds neither this rank's
        # GIL nor its memory, and the runtime imports none of the analysis. Without the run's variables, that
        # process arms no watchdog of its own. It writes into a dot folder first: should a later stall begin
        # meanwhile, this verdict never lands among that stall's files.
        env = {k: v for k, v in os.environ.items() if k not in (RUN_DIR_ENV, STALL_SECONDS_ENV)}
        staging = self.out_dir / f".verdict-{episode}"
        command = [sys.executable, "-m", "torchtriage", "diagnose", str(self.out_dir), *self._identities()]
        command += ["--write-verdict", str(staging)]
        done = subprocess.run(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=_VERDICT_TIMEOUT_S, check=False
        )
        written = staging / f"{VERDICT_STEM}.json"
        if not written.exists():
            reason = done.stderr.decode(errors="replace").strip()[-500:]
            warnings.warn(f"torchtriage watchdog: no verdict was written: {reason}", RuntimeWarning, stacklevel=1)
            return
        self._stamp_verdict(written, episode)
        if shared is not None and current_episode(shared) != episode:
            return  # a later stall began: this verdict stays in its dot folder
        for part in sorted(staging.iterdir()):
            os.replace(part, self.out_dir / part.name)
        try:
            staging.rmdir()
        except OSError:
            pass

    def _identities(self) -> list[str]:
        """The ranks' identity records of this attempt: the verdict then names the culprit's host (and GPU) beside
        the pid its stack dump gives. `run` records them in the run folder; a watchdog the program started itself
        in a dot folder of its own (`_record_identity`)."""
        folder = Path(self.run_dir or self.out_dir / OWN_RUN_SUBDIR) / IDENTITY_SUBDIR
        return [str(folder)] if folder.is_dir() else []

    def _record_identity(self) -> None:
        """Where this rank runs, recorded as `run` records it, for a watchdog the program started itself: in a dot
        folder of `out_dir`, which no stall's archive moves and no folder walk fuses (the verdict names it)."""
        from torchtriage.runtime.identity import identity_record, watch_for_gpu, write_identity

        try:
            record = identity_record(os.environ)
            if record["rank"] is None:
                return
            folder = self.out_dir / OWN_RUN_SUBDIR
            write_identity(folder, record)
            watch_for_gpu(folder, record)
        except Exception as err:  # noqa: BLE001 - the watchdog must never take training down
            warnings.warn(
                f"torchtriage watchdog: where this rank runs was not recorded: {err}", RuntimeWarning, stacklevel=1
            )

    def _stamp_verdict(self, written: Path, episode: int) -> None:
        """Name the stall the verdict is of: its number in this job, when it was noticed, by which rank."""
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        verdict = json.loads(written.read_text())
        verdict["facts"]["reported_by_rank"] = self.rank
        verdict["facts"]["watchdog"] = {"episode": episode, "noticed_at": at, "reported_by_rank": self.rank}
        write_whole(written, json.dumps(verdict, indent=2) + "\n")
        text = written.with_suffix(".txt")
        if text.exists():
            line = f"watchdog  stall {episode} of this job, noticed at {at} by rank {self.rank}"
            if episode > 1:
                line += f"; the earlier stalls' files are in {EARLIER_SUBDIR}/"
            write_whole(text, text.read_text().rstrip("\n") + "\n" + line + "\n")


_LISTEN_FOR = timedelta(days=30)  # one wait; a wait that times out logs a warning
_LISTEN_ATTEMPTS = 3


def _root_tcp_store(store):
    """The TCPStore under the default store's prefixes (the job's own client), or None for another kind."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store if type(store).__name__ == "TCPStore" and getattr(store, "port", None) else None


def start_from_environment() -> HangWatchdog | None:
    """Start a watchdog configured by TORCHTRIAGE_STALL_SECONDS and TORCHTRIAGE_RUN_DIR, if set."""
    out_dir = os.environ.get(RUN_DIR_ENV)
    if not out_dir:
        return None
    try:
        stall = float(os.environ.get(STALL_SECONDS_ENV, "300"))
    except ValueError:
        warnings.warn(f"torchtriage: {STALL_SECONDS_ENV} is not a number; using 300", stacklevel=1)
        stall = 300.0
    debug_server = os.environ.get(DEBUG_SERVER_ENV) == "1"
    watchdog = HangWatchdog(stall_seconds=stall, out_dir=hang_dir(out_dir), debug_server=debug_server, run_dir=out_dir)
    return watchdog.start()
