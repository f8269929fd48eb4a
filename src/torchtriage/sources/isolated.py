"""Readers of untrusted bytes run in bounded children: whatever a file does to its reader, this process lives.

A crafted pickle can crash the C unpickler (a dict key nested a million deep is hashed recursively until the
stack overflows: SIGSEGV), make it work for hours (shared references hashed or walked as a tree) or fill
memory. No check written in Python can run before the C code that crashes, so the reading itself happens
in a forked child under three bounds: an address-space limit (`RLIMIT_AS`: the child's size at fork plus
the policy's `memory`), a CPU-time limit (`RLIMIT_CPU`, reset per file: the policy's `seconds`, plus time for
the file's size where the caller gives it) and a wall-clock deadline the parent keeps, three times as long:
a crafted file costs CPU, while a genuine one on a loaded machine waits for a core, and must not be refused
for it. A file
whose reader died of a signal, passed its memory or ran out of time becomes a `Stopped` result for that
file only; the other files are read on (by fresh children where a child died), and results come back as
plain records, pickled by our own child.

The parent never reads the items itself: it runs the caller's `meanwhile`, then only waits and collects.
Children die with their parent (`PR_SET_PDEATHSIG`), so an interrupted command leaves nothing running.
Where there is no fork (Windows), the items are read here, with the pre-scan as the only defence.
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from torchtriage.sources import limits
from torchtriage.sources.limits import describe_size

T = TypeVar("T")
R = TypeVar("R")

__all__ = ["Stopped", "Raised", "map_isolated", "call_isolated", "can_isolate"]

_HEAD = struct.Struct("<cI")  # a message: its tag and its length
_START, _RESULTS, _PROGRESS = b"S", b"R", b"P"
_MAX_CHUNKS = 4096


class Stopped(NamedTuple):
    """An item whose reader did not finish: `reason` says why, `limit_name` the limit it passed (if any)."""

    reason: str
    limit_name: str | None = None

    def message(self) -> str:
        """What to tell the user about the file."""
        text = f"the reader stopped ({self.reason}): the file is malformed or crafted"
        if self.limit_name is not None:
            flag = self.limit_name.replace("_", "-")
            text += f" (if it is genuine, raise the limit: --limit {flag}=...)"
        return text


class Raised(NamedTuple):
    """An exception the function raised in a child, to be raised again here (a bug, not the input's)."""

    error: BaseException


def can_isolate() -> bool:
    return hasattr(os, "fork")


def map_isolated(
    function: Callable[[T], R],
    items: Sequence[T],
    jobs: int,
    meanwhile: Callable[[], object] | None = None,
    child_init: Callable[[], object] | None = None,
    seconds_for: Callable[[T], float] | None = None,
) -> list[R | Stopped]:
    """`[function(item) for item in items]` in at most `jobs` bounded children; an item whose child died,
    passed its memory or ran out of time is a `Stopped`. `seconds_for(item)` is extra time an item may take
    beyond the policy's `seconds` (a large file's share)."""
    if not can_isolate():
        if meanwhile is not None:
            meanwhile()
        return [function(item) for item in items]
    results: dict[int, Any] = {}
    todo = list(range(len(items)))
    first = True
    while todo:
        pool = _Pool(function, items, todo, jobs, child_init, seconds_for)
        if first and meanwhile is not None:
            meanwhile()
        first = False
        found = pool.collect()
        if not found:  # not one item resolved: the children cannot start (no memory, no processes)
            found = {i: Stopped("it could not be started", "memory") for i in todo}
        results.update(found)
        todo = [i for i in todo if i not in results]
    out = [results[i] for i in range(len(items))]
    for result in out:
        if isinstance(result, Raised):
            raise result.error
    return out


def call_isolated(
    function: Callable[[Callable[[int], None]], R],
    progress: Callable[[int], None] | None = None,
    extra_seconds: float = 0.0,
) -> R | Stopped:
    """`function(tick)` in one bounded child; `tick(n)` there calls `progress(n)` here."""
    if not can_isolate():
        return function(progress or (lambda n: None))
    pool = _Pool(lambda _: function(_tick), [None], [0], 1, None, lambda _: extra_seconds, progress)
    result = pool.collect().get(0) or Stopped("it could not be started", "memory")
    if isinstance(result, Raised):
        raise result.error
    return result


# --- the child -----------------------------------------------------------------------------------------

_out_fd: int | None = None  # in a child: where its messages go


def _send(tag: bytes, payload: bytes) -> None:
    view = memoryview(_HEAD.pack(tag, len(payload)) + payload)
    while view:
        view = view[os.write(_out_fd, view) :]


def _tick(count: int) -> None:
    if _out_fd is not None:
        _send(_PROGRESS, struct.pack("<q", count))


def _bound_this_process(memory: int) -> None:
    """Limit what this (child) process may take, make it die with its parent, and keep it quiet: what it
    stops on is said once, by the parent (a crash dump of a child on the user's terminal says nothing)."""
    import faulthandler
    import resource

    faulthandler.disable()
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 2)
    os.close(quiet)

    try:
        with open("/proc/self/statm", "rb") as statm:
            size = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (size + memory, resource.getrlimit(resource.RLIMIT_AS)[1]))
    except (OSError, ValueError):
        pass  # no /proc (macOS) or a hard limit below ours: the parent's deadline still holds
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# The wall-clock deadline against the CPU limit: the CPU limit is what stops a crafted file's work; the wall
# clock only catches a child that stopped running at all, and leaves a loaded machine room to share its cores.
WALL_FACTOR = 3


def _cpu_bound(seconds: float) -> None:
    """This item may use `seconds` of CPU from now: past it, SIGXCPU ends the child."""
    import resource

    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(used.ru_utime + used.ru_stime + seconds) + 2
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.getrlimit(resource.RLIMIT_CPU)[1]))
    except (OSError, ValueError):
        pass


def _run_child(function, items, queue: int, chunk: int, out: int, child_init, policy, seconds_for) -> None:
    global _out_fd
    _out_fd = out
    _bound_this_process(policy.memory)
    if child_init is not None:
        child_init()
    while len(token := os.read(queue, 4)) == 4:
        first = int.from_bytes(token, "little") * chunk
        done = []
        for index in range(first, min(first + chunk, len(items))):
            _send(_START, index.to_bytes(4, "little"))
            _cpu_bound(policy.seconds + (seconds_for(items[index]) if seconds_for else 0.0))
            done.append((index, _guarded(function, items[index], policy)))
        try:
            sent = pickle.dumps(done, pickle.HIGHEST_PROTOCOL)
        except (RecursionError, MemoryError, pickle.PicklingError, TypeError):  # records the input shaped badly
            sent = pickle.dumps([(i, Stopped("its records could not be sent back", "depth")) for i, _ in done])
        _send(_RESULTS, sent)


def _guarded(function, item, policy) -> Any:
    try:
        return function(item)
    except MemoryError:
        return Stopped(f"over {describe_size(policy.memory)} of memory", "memory")
    except RecursionError:
        return Stopped("it nests deeper than the reader follows", "depth")
    except Exception as err:  # noqa: BLE001 - a bug of ours: raised again in the parent
        try:
            pickle.dumps(err)
            return Raised(err)
        except Exception:  # noqa: BLE001 - an exception that cannot travel: its text does
            return Raised(RuntimeError(f"{type(err).__name__}: {err}"))


# --- the parent ----------------------------------------------------------------------------------------


class _Child:
    __slots__ = ("pid", "fd", "buffer", "current", "since", "done", "ended")

    def __init__(self, pid: int, fd: int) -> None:
        self.pid, self.fd = pid, fd
        self.buffer = bytearray()
        self.current: int | None = None  # the item it works on
        self.since = 0.0
        self.done: set[int] = set()
        self.ended = False


class _Pool:
    """One round: children over `todo`, taking chunks from a shared queue; `collect` gathers what they did."""

    def __init__(self, function, items, todo, jobs, child_init, seconds_for, progress=None) -> None:
        self.items, self.seconds_for, self.progress = items, seconds_for, progress
        self.policy = limits.active()
        self.results: dict[int, Any] = {}
        subset = [items[i] for i in todo]
        self.todo = todo
        chunk = max(1, len(todo) // (jobs * 16), -(-len(todo) // _MAX_CHUNKS))
        chunks = -(-len(todo) // chunk)
        queue, feed = os.pipe()
        os.write(feed, b"".join(n.to_bytes(4, "little") for n in range(chunks)))
        os.close(feed)
        self.children: list[_Child] = []
        try:
            for _ in range(max(1, min(jobs, chunks))):
                read_end, write_end = os.pipe()
                try:
                    pid = os.fork()
                except OSError:
                    os.close(read_end)
                    os.close(write_end)
                    break
                if pid == 0:
                    status = 1
                    try:
                        os.close(read_end)
                        _run_child(function, subset, queue, chunk, write_end, child_init, self.policy,
                                   seconds_for)  # fmt: skip
                        status = 0
                    finally:
                        os._exit(status)
                os.close(write_end)
                self.children.append(_Child(pid, read_end))
        finally:
            os.close(queue)

    def _deadline(self, child: _Child) -> float:
        extra = self.seconds_for(self.items[self.todo[child.current]]) if self.seconds_for else 0.0
        return child.since + WALL_FACTOR * (self.policy.seconds + extra)

    def collect(self) -> dict[int, Any]:
        """Read every child to its end; the items each one stopped on are `Stopped`. Keyed by item index."""
        selector = selectors.DefaultSelector()
        for child in self.children:
            os.set_blocking(child.fd, False)
            selector.register(child.fd, selectors.EVENT_READ, child)
        try:
            while selector.get_map():
                working = [c for c in self.children if not c.ended and c.current is not None]
                wait = min((self._deadline(c) for c in working), default=time.monotonic() + 1) - time.monotonic()
                for key, _ in selector.select(max(0.0, min(wait, 1.0))):
                    self._read(key.data, selector)
                now = time.monotonic()
                for child in working:
                    if not child.ended and child.current is not None and now > self._deadline(child):
                        self._overtime(child, selector)
        finally:
            selector.close()
            for child in self.children:
                os.close(child.fd)
                _reap(child.pid)
        return self.results

    def _read(self, child: _Child, selector) -> None:
        try:
            data = os.read(child.fd, 1 << 20)
        except BlockingIOError:
            return
        if not data:
            self._ended(child, selector)
            return
        child.buffer += data
        while len(child.buffer) >= _HEAD.size:
            tag, length = _HEAD.unpack_from(child.buffer)
            if len(child.buffer) < _HEAD.size + length:
                break
            payload = bytes(child.buffer[_HEAD.size : _HEAD.size + length])
            del child.buffer[: _HEAD.size + length]
            self._message(child, tag, payload)

    def _message(self, child: _Child, tag: bytes, payload: bytes) -> None:
        if tag == _START:
            child.current, child.since = int.from_bytes(payload, "little"), time.monotonic()
        elif tag == _PROGRESS and self.progress is not None:
            self.progress(struct.unpack("<q", payload)[0])
        elif tag == _RESULTS:
            for index, result in pickle.loads(payload):  # our own child's records, not the input's bytes
                self.results[self.todo[index]] = result
                child.done.add(index)
            child.current = None

    def _ended(self, child: _Child, selector) -> None:
        selector.unregister(child.fd)
        child.ended = True
        status = _reap(child.pid)
        if child.current is not None and self.todo[child.current] not in self.results:
            self.results[self.todo[child.current]] = _why(status, self.policy)

    def _overtime(self, child: _Child, selector) -> None:
        os.kill(child.pid, signal.SIGKILL)  # our own child, reading a file: never a rank of the job
        seconds = self._deadline(child) - child.since
        self.results[self.todo[child.current]] = Stopped(f"over {seconds:.0f} s", "seconds")
        selector.unregister(child.fd)
        child.ended = True


def _reap(pid: int) -> int | None:
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return None


def _why(status: int | None, policy) -> Stopped:
    if status is not None and os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number == signal.SIGXCPU:
            return Stopped(f"over {policy.seconds:.0f} s of CPU", "seconds")
        name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else f"signal {number}"
        return Stopped(name, "memory" if number == signal.SIGKILL else None)
    code = os.WEXITSTATUS(status) if status is not None else "unknown"
    return Stopped(f"its reader exited with status {code}", "memory")
