"""Whether a log begins inside a message: a paste, a `tail`, a file rotated by size, whose first failure may
be before its first line.

Only the first line that carries something is read, from the log's first bytes: the answer costs that line,
never the log. It is cut when it can only be the rest of something:
- an indented line (a traceback's frame or source line, a message wrapped under its tag), unless it is
  tqdm's bar, whose percentage is padded to three characters;
- the body of a traceback or backtrace without its header: CPython's `File "...", line N`, the carets under a
  frame, c10::Error's `frame #N:`, a native frame of gdb, glibc or UCX;
- a line that opens with a closing bracket or a comma: it closes or goes on with what came before;
- a first word of one letter that is no word ("s raylet.out ...": the end of "logs");
- a host's or launcher's tag (`node-07: `) over an indented frame or source line;
- a lower-case start that shows it began inside a sentence: a bracket it closes and never opened, or a
  sentence it ends before a capitalised one begins (PyTorch's and NCCL's messages are sentences: a cut
  "of memory. Tried to allocate ..." ends one).
A lower-case start alone says nothing: many records begin so. NCCL prefixes each line with the host's name
(`node-07:1234:1234 [0] NCCL INFO ...`); a program, a launcher, a host (pdsh) or a logger tags its line
`name: message`; a training loop prints `rank 0 | step 1`. Those are whole lines. A cut that leaves a whole
word and no such sign ("ed by watchdog at work sequence id: ...") cannot be told from a record, and is not said.
"""

from __future__ import annotations

import codecs
import re
from typing import TYPE_CHECKING

from torchtriage.sources.lines import NCCL_HEADER, normalise
from torchtriage.sources.logs import MAX_LINE_CHARS

if TYPE_CHECKING:
    from torchtriage.sources.log_records import LogTail

# How much of a log is decoded at a time while looking for its first line that carries something.
_HEAD_BYTES = 4096

# tqdm's bar without a description: "{percentage:3.0f}%|" pads the percentage ("  0%|").
_PROGRESS_BAR = re.compile(r" {1,2}\d{1,2}%\|")
# A traceback's or backtrace's body: CPython's frame line and the carets under it (3.11+), c10::Error's
# "frame #3: ...", the flight recorder's stack of a failed collective ("#0 all_reduce from .../x.py:2696", under
# ProcessGroupNCCL's "Stack trace of the failed collective:"), gdb's "#3  0x00007f... in f ()", glibc's and
# UCX's "3 0x0000000000014420 f()".
_BODY = re.compile(r'File "|\^|frame #\d|#\d+ \S+ from \S+:\d+|#?\d{1,4}\s+0x[0-9a-fA-F]{4,16}\b')
_CONTINUES = (")", "]", "}", ",", ";")
# A first word of one letter other than English's "a" and "i": the end of a cut word ("s raylet.out ...").
_WORD_CUT = re.compile(r"(?![ai] )[a-z] [a-z]")
# A tag "name: message": a program's or launcher's ("srun: ..."), a host's (pdsh, DeepSpeed's launcher), a
# logger's or a qualified exception's ("torch.distributed.elastic.multiprocessing.api: ...",
# "torch.OutOfMemoryError: ..."), a field's ("epoch: 81").
_TAG = re.compile(r"[A-Za-z_][\w.@-]*(?: [\w.-]+)?:(?:\s|$)")
# NCCL's lines begin with the host's name: "%s:%d:%d [%d] NCCL INFO " (lines.NCCL_HEADER), "%s:%d:%d NCCL CALL "
# (its debug.cc).
_NCCL_CALL = re.compile(r"[^\s:]{1,255}:\d{1,10}:\d{1,10} NCCL ")
# A sentence ends and a capitalised one begins: "...of memory. Tried to allocate".
_SENTENCE_ENDS = re.compile(r"[a-z)][.!?] +[A-Z][a-z]")


def starts_mid_message(tail: LogTail) -> bool:
    """Whether a log (whose tail is all of it) begins inside a message."""
    return tail.first_line == 1 and continues_a_message(first_line(tail))


def continues_a_message(text: str) -> bool:
    """Whether a log's first line can only be the rest of a message that began before it."""
    stripped = text.strip()
    if not stripped or _PROGRESS_BAR.match(text):
        return False
    if text[:1].isspace() or _is_body(stripped) or _WORD_CUT.match(stripped):
        return True
    tag = _TAG.match(stripped)
    if tag is not None:  # a host's or launcher's tag over a line of its own, which may continue a message
        rest = stripped[tag.end() :]
        return rest[:1].isspace() and (_is_body(rest.strip()) or _closes_what_it_never_opened(rest))
    if not stripped[:1].islower() or NCCL_HEADER.match(stripped) or _NCCL_CALL.match(stripped):
        return False
    return _closes_what_it_never_opened(stripped) or _SENTENCE_ENDS.search(stripped) is not None


def _is_body(text: str) -> bool:
    return _BODY.match(text) is not None or text.startswith(_CONTINUES)


def _closes_what_it_never_opened(text: str) -> bool:
    if ")" not in text and "]" not in text and "}" not in text:
        return False  # most lines close nothing: decided in C
    depth = 0
    for char in text:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                return True
            depth -= 1
    return False


def first_line(tail: LogTail) -> str:
    """The tail's first line that carries something, normalised as its lines are: read from the tail's first
    bytes up to that line's end (or MAX_LINE_CHARS of it), never further."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""  # the line being read: blanks so far, or the start of the first line that carries something
    for start in range(0, len(tail.data), _HEAD_BYTES):
        pending += decoder.decode(tail.data[start : start + _HEAD_BYTES], final=start + _HEAD_BYTES >= len(tail.data))
        unended = ""
        for line in pending.splitlines(keepends=True):  # up to the first line that carries something, no further
            body = line.splitlines()[0]
            if body == line:
                unended = line  # the last line, its end not read yet
                break
            text = normalise(body[:MAX_LINE_CHARS]).text
            if text.strip():  # a launcher's prefix alone ("[default0]:") carries nothing
                return text
        pending = unended
        if len(pending) >= MAX_LINE_CHARS:
            break  # one line longer than any line is read: its start is enough
    return normalise(pending[:MAX_LINE_CHARS]).text if pending.strip() else ""
