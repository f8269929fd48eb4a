"""Stacks pasted into a log, in every form people paste them: a Python traceback (with or without its
exception line or its header), a faulthandler dump, `py-spy dump` text, a gdb backtrace.

A stalled job leaves no error, only where its threads were: the user pressed Ctrl-C and Python printed
the stack it interrupted, or they dumped the stuck processes and pasted the result. Each form is read
with the line formats of the program that prints it (CPython's traceback.c and faulthandler, py-spy's
dump, gdb's `backtrace`), and every stack becomes `Frame`s innermost first, the order the stack
classifier reads.

Pure: lines in, stacks out; the lines are already normalised (rank prefixes and log headers peeled).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torchtriage.knowledge.linear_regex import compile_linear
from torchtriage.model import Frame
from torchtriage.sources.fields import as_int


def _linear(pattern: str):
    return compile_linear(pattern, "log_stacks")  # RE2: lines of a log may be crafted


# CPython's traceback: `  File "/x/train.py", line 63, in step` (outermost first, under a header).
_TRACEBACK_FRAME = _linear(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d{1,9}), in (?P<function>\S.*)$')
# A frame line hard-wrapped before its function: `File "/x/launch.py", line 235,` then `in <module>`.
_CUT_FRAME = _linear(r'^\s*File "[^"]+", line \d{1,9},?$')
_CUT_REST = _linear(r"^\s*,?\s*in \S")
_TRACEBACK_HEADER = "Traceback (most recent call last)"
# faulthandler (Python/traceback.c): `Thread 0x7f.. (most recent call first):`, frames
# `  File "/x/train.py", line 63 in step` innermost first.
_FAULTHANDLER_HEADER = _linear(
    r"^(?:Current thread|Thread) 0x[0-9a-fA-F]{1,16}(?: \[[^\]]*\])?(?: <[^>]*>)? \(most recent call first\):"
    r"|^Stack \(most recent call first\):"
)
_FAULTHANDLER_FRAME = _linear(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d{1,9}) in (?P<function>\S.*)$')
# py-spy dump: `Thread 12345 (idle): "MainThread"`, frames `    all_reduce (torch/distributed/c10d.py:2050)`
# innermost first; native frames carry no line: `    cudaStreamSynchronize (libcudart.so.12)`.
_PYSPY_HEADER = _linear(
    r'^Thread (?:0[xX][0-9a-fA-F]{1,16}|\d{1,12}) \((?P<status>[a-z+]{1,20})\)(?:: "(?P<name>.*)")?$'
)
_PYSPY_FRAME = _linear(r"^\s+(?P<function>\S.*?) \((?P<file>[^()]*?)(?::(?P<line>\d{1,9}))?\)$")
# gdb: `#3  0x00007f.. in cudaMemcpyAsync () from /usr/lib/libcudart.so.11.0`,
# `#0  pthread_cond_wait@@GLIBC_2.3.2 () at ../sysdeps/...:183`; a long symbol may wrap its `from`.
_GDB_FRAME = _linear(r"^#(?P<depth>\d{1,5})\s+(?:0x[0-9a-fA-F]{1,16} in )?(?P<function>[^\s(]+)")
_GDB_WHERE = _linear(r"\s(?:at|from) (?P<where>\S+)$")
_EXCEPTION = _linear(r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Z]\w*)(?::\s?(?P<message>.*))?$")


@dataclass
class LogStack:
    """One stack found in a log: a traceback, or one thread of a dump."""

    form: str  # "traceback", "faulthandler", "py-spy", "gdb"
    rank: int | None
    line: int  # where it starts in the log
    frames: list[Frame] = field(default_factory=list)  # innermost first
    exception: str | None = None  # a traceback's exception type, when its exception line is there
    message: str = ""
    thread: str | None = None
    active: bool | None = None  # py-spy's status; None where the form does not say
    headed: bool = False  # a traceback under its "Traceback (most recent call last):" header


def _frame(match: Any, line_no: int, native: bool = False) -> Frame:
    return Frame(
        match.group("file"), as_int(match.group("line") or "0", 0), match.group("function"), native, printed_at=line_no
    )


class _Reader:
    def __init__(self) -> None:
        self.stacks: list[LogStack] = []
        self.open: dict[int | None, LogStack] = {}  # per rank: the stack being read

    def _close(self, rank: int | None) -> None:
        stack = self.open.pop(rank, None)
        if stack is None or not stack.frames:
            return
        if stack.form == "traceback":
            stack.frames.reverse()  # printed outermost first
        self.stacks.append(stack)

    def _start(self, form: str, rank: int | None, line_no: int, **kwargs) -> LogStack:
        self._close(rank)
        stack = self.open[rank] = LogStack(form, rank, line_no, **kwargs)
        return stack

    def feed(self, line_no: int, text: str, rank: int | None) -> None:
        stripped = text.strip()
        current = self.open.get(rank)
        if stripped.startswith(_TRACEBACK_HEADER):
            self._start("traceback", rank, line_no, headed=True)
            return
        if _FAULTHANDLER_HEADER.match(stripped):
            self._start("faulthandler", rank, line_no, thread=stripped.split(" (", 1)[0])
            return
        header = _PYSPY_HEADER.match(stripped)
        if header:
            status = set(header.group("status").split("+"))
            self._start("py-spy", rank, line_no, thread=header.group("name"), active="idle" not in status)
            return
        if current is not None and current.form == "py-spy":
            found = _PYSPY_FRAME.match(text)
            if found:
                current.frames.append(_frame(found, line_no, native=not found.group("line")))
                return
        if current is not None and current.form == "faulthandler":
            found = _FAULTHANDLER_FRAME.match(stripped)
            if found:
                current.frames.append(_frame(found, line_no))
                return
        found = _TRACEBACK_FRAME.match(stripped)
        if found:
            if current is None or current.form != "traceback":
                current = self._start("traceback", rank, line_no)  # a traceback pasted without its header
            current.frames.append(_frame(found, line_no))
            return
        found = _GDB_FRAME.match(stripped)
        if found:
            depth = int(found.group("depth"))
            if depth == 0 or current is None or current.form != "gdb":
                current = self._start("gdb", rank, line_no)
            function = found.group("function").split("@@", 1)[0]
            where = _GDB_WHERE.search(stripped)
            current.frames.append(Frame(where.group("where") if where else "", 0, function, True, printed_at=line_no))
            return
        if current is None:
            return
        if current.form == "traceback":
            after_frame = current.frames and current.frames[-1].printed_at in (line_no - 1, line_no - 2)
            if not stripped or text[:1].isspace() or (after_frame and not _EXCEPTION.match(stripped)):
                # The source line under a frame and its ^^^ marker (unindented where a log header was
                # peeled off), or a blank line of a paste.
                return
            exception = _EXCEPTION.match(stripped)
            if exception and current.frames:
                current.exception = exception.group("type")
                current.message = (exception.group("message") or "").strip()
        elif current.form == "gdb" and text[:1].isspace():
            return  # `   from /lib/x.so` wrapped under a long symbol
        self._close(rank)

    def finish(self) -> list[LogStack]:
        for rank in list(self.open):
            self._close(rank)
        self.stacks.sort(key=lambda s: s.line)
        return self.stacks


def rejoin_cut_frames(lines: list[tuple[int, str, int | None]]) -> list[tuple[int, str, int | None]]:
    """Join a frame line that a terminal or browser wrapped before its `in <function>`."""
    joined: list[tuple[int, str, int | None]] = []
    for item in lines:
        if joined and _CUT_REST.match(item[1]) and _CUT_FRAME.match(joined[-1][1]):
            number, text, rank = joined[-1]
            joined[-1] = (number, text.rstrip().rstrip(",") + ", " + item[1].strip().lstrip(",").strip(), rank)
            continue
        joined.append(item)
    return joined


def stacks_in(lines: Iterable[tuple[int, str, int | None]]) -> list[LogStack]:
    """Every stack in (line number, normalised text, rank) lines, in the order they start."""
    reader = _Reader()
    for line_no, text, rank in rejoin_cut_frames(list(lines)):
        reader.feed(line_no, text, rank)
    return reader.finish()
