"""One function over many files, on this process and forked children that share a queue of chunks.

Lighter than a process pool: no helper threads, no import of multiprocessing, and this process works too
instead of waiting. Each child sends its results back, pickled chunk by chunk, when the queue is empty;
items whose results never arrive (a child that died) are done here, so a crash costs time, never results.
Readers use it for what costs per file: sniffing a folder of 32,000 files, loading 16,000 dumps.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Chunk numbers travel through a pipe, written before any process reads; at 4 bytes each, this many fit in the
# smallest pipe buffer (16 KiB on macOS), so writing them never blocks.
_MAX_CHUNKS = 4096
_TOKEN = 4


def can_fork() -> bool:
    return hasattr(os, "fork")


def usable_cores() -> int:
    """The cores this process may run on: its affinity (taskset, a SLURM step's or a container's cpuset), not
    the machine's count, which would start a child per core of a 128-core host for a job given two."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def _take_chunks(
    queue: int, items: Sequence[T], chunk: int, function: Callable[[T], R]
) -> Iterator[list[tuple[int, R]]]:
    """Do chunks of items, taking chunk numbers from the queue until it is empty: a busy core takes fewer."""
    while len(token := os.read(queue, _TOKEN)) == _TOKEN:
        start = int.from_bytes(token, "little") * chunk
        yield [(index, function(items[index])) for index in range(start, min(start + chunk, len(items)))]


def map_forked(
    function: Callable[[T], R],
    items: Sequence[T],
    jobs: int,
    meanwhile: Callable[[], object] | None = None,
    child_init: Callable[[], object] | None = None,
) -> list[R]:
    """`[function(item) for item in items]` on this process and `jobs - 1` forked children.

    `meanwhile` runs here after the children start (this process then takes fewer chunks); `child_init`
    runs first in each child. Results come back pickled: they must be plain data or importable classes."""
    chunk = max(1, len(items) // (jobs * 16), -(-len(items) // _MAX_CHUNKS))
    chunks = -(-len(items) // chunk)
    jobs = min(jobs, chunks)
    queue, feed = os.pipe()
    os.write(feed, b"".join(n.to_bytes(_TOKEN, "little") for n in range(chunks)))
    os.close(feed)
    children: list[tuple[int, int]] = []  # (pid, read end of its result pipe)
    missing = object()
    results: list[Any] = [missing] * len(items)
    try:
        for _ in range(jobs - 1):
            read_end, write_end = os.pipe()
            try:
                pid = os.fork()
            except OSError:  # no more processes to be had: the ones running take the remaining chunks
                os.close(read_end)
                os.close(write_end)
                break
            if pid == 0:  # the child: work, send, and leave without running any of the parent's exit handlers
                status = 1
                try:
                    os.close(read_end)
                    if child_init is not None:
                        child_init()
                    # Each chunk is pickled as soon as it is done, while the others are still worked on: the
                    # parent then waits only for the bytes. They are sent at the end (the parent reads only then).
                    sent = [
                        pickle.dumps(done, pickle.HIGHEST_PROTOCOL)
                        for done in _take_chunks(queue, items, chunk, function)
                    ]
                    with open(write_end, "wb") as out:
                        out.writelines(sent)
                    status = 0
                finally:
                    os._exit(status)
            os.close(write_end)
            children.append((pid, read_end))
        if meanwhile is not None:
            meanwhile()
        for done in _take_chunks(queue, items, chunk, function):
            for index, result in done:
                results[index] = result
        for _pid, read_end in children:
            with open(read_end, "rb", closefd=False) as stream:
                while True:
                    try:
                        done = pickle.load(stream)  # our own child's results, not input from elsewhere
                    except EOFError:
                        break
                    except (pickle.UnpicklingError, ValueError, TypeError, AttributeError, IndexError):
                        break  # a child that died while sending: the items it did not send are done below
                    for index, result in done:
                        results[index] = result
    finally:
        os.close(queue)
        for pid, read_end in children:
            os.close(read_end)  # a child still writing gets a broken pipe instead of waiting forever
            os.waitpid(pid, 0)
    return [result if result is not missing else function(item) for item, result in zip(items, results, strict=True)]
