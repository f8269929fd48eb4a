"""faulthandler's stack dumps (`faulthandler.dump_traceback`, `dump_traceback_later`, a fatal signal),
as the same per-thread stacks py-spy gives.

CPython writes (Python/traceback.c, `_Py_DumpTracebackThreads`), innermost frame first:

    Fatal Python error: Segmentation fault         (a fatal signal; or "Timeout (0:05:00)!" for _later)

    Thread 0x00007f3cc367c6c0 [name] (most recent call first):     ([name]: Python 3.14+, where known)
      File "/path/train.py", line 63 in step
      File "/path/train.py", line 90 in <module>

    Current thread 0x00007f3cc43e3b80 (most recent call first):
      File ...

With `all_threads=False` the header is "Stack (most recent call first):". faulthandler says nothing of
a thread's state; the main thread is the one whose outermost frame is a module, not threading's
bootstrap.
"""

from __future__ import annotations

import re

from torchtriage.errors import InputError
from torchtriage.model import Frame
from torchtriage.sources.fields import as_int
from torchtriage.sources.pyspy import ProcessStack, ThreadStack

_THREAD = re.compile(
    r"^(?:(?P<current>Current thread)|Thread) 0x(?P<id>[0-9a-fA-F]+)(?: \[(?P<name>[^\]]*)\])?(?: <[^>]*>)?"
    r" \(most recent call first\):\s*$|^Stack \(most recent call first\):\s*$"
)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<function>.+?)\s*$')
_BOOTSTRAP = ("_bootstrap", "_bootstrap_inner")


def parse_faulthandler(text: str, source: str = "<input>") -> ProcessStack:
    """Every thread of one faulthandler dump; an InputError when no thread header is found."""
    threads: list[ThreadStack] = []
    ident: int | None = None
    name: str | None = None
    frames: list[Frame] = []

    def close() -> None:
        if ident is not None:
            threads.append(ThreadStack(ident, name, True, False, tuple(frames), os_thread_id=None, state_known=False))

    for number, line in enumerate(text.splitlines(), 1):
        header = _THREAD.match(line)
        if header:
            close()
            ident = int(header.group("id") or "0", 16)
            name, frames = header.group("name"), []
            continue
        frame = _FRAME.match(line)
        if frame and ident is not None:
            frames.append(
                Frame(frame.group("file"), as_int(frame.group("line"), 0), frame.group("function"), printed_at=number)
            )
    close()
    if not threads:
        raise InputError(f"{source}: no 'Thread 0x… (most recent call first):' header: not a faulthandler dump")
    return ProcessStack(pid=0, source=source, threads=tuple(_name_main_thread(threads)), has_full_paths=True)


def _name_main_thread(threads: list[ThreadStack]) -> list[ThreadStack]:
    """faulthandler names no thread MainThread: the one that did not start in threading's bootstrap is it."""

    def started_by_threading(thread: ThreadStack) -> bool:
        return bool(thread.frames) and thread.frames[-1].function in _BOOTSTRAP

    main = next((t for t in threads if not started_by_threading(t)), None)
    if main is None:
        return threads
    return [
        ThreadStack(t.thread_id, "MainThread", t.active, t.owns_gil, t.frames, t.os_thread_id, state_known=False)
        if t is main
        else t
        for t in threads
    ]
