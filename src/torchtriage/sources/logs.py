"""Streaming the lines of a log that might matter, without holding the log in memory.

Multi-GB logs are mostly step lines and NCCL INFO chatter. The scanner reads big blocks and lets one
compiled prefilter (the literal anchors of every rule, plus the markers of tracebacks and of
torchrun's failure report) find candidate positions at C speed; only the lines around those
positions are decoded and handed on. A line longer than a block is cut into block-sized pieces, so a
megabyte-long line costs no more memory than a block.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

from torchtriage.knowledge.prefilter import span_search
from torchtriage.sources.lines import starts_with_log_header

if TYPE_CHECKING:
    from torchtriage.knowledge.may_match import Gate

BLOCK_BYTES = 8 << 20
# A hit line is cut to this length before matching: messages that matter are short, and a
# pathological line must not make every rule scan megabytes.
MAX_LINE_CHARS = 16_384


class Tail:
    """The last bytes of a stream, from a line's start, filled in by `scan_lines` when it ends.

    A stalled job's evidence is where its log stops: the last lines, a stack dump, a Ctrl-C. The scan
    keeps references to the last pieces of its buffers that hold that many bytes and cuts the tail from them
    once, so keeping it costs no copy per block."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.data = b""
        self.first_line = 1  # the line number of the tail's first line
        self.wrapping: Wrapping | None = None  # how the log was hard-wrapped: its tail is rejoined as its scan is
        self._pieces: list[tuple[int, bytes, int, int]] = []  # (number of the line at begin, buffer, begin, end)

    def _keep(self, line_base: int, buffer: bytes, end: int, begin: int = 0) -> None:
        if end <= begin:
            return
        self._pieces.append((line_base, buffer, begin, end))
        held = 0
        for index in range(len(self._pieces) - 1, 0, -1):  # the pieces before those that hold the tail go
            held += self._pieces[index][3] - self._pieces[index][2]
            if held > self.max_bytes:
                del self._pieces[:index]
                break

    def _finish(self) -> None:
        pieces: list[bytes] = []
        need = self.max_bytes
        first_line = 1
        for line_base, buffer, begin, end in reversed(self._pieces):
            start = max(begin, end - need)
            pieces.insert(0, buffer[start:end])
            need -= end - start
            first_line = line_base + buffer.count(b"\n", begin, start)
            if need <= 0:
                break
        data = b"".join(pieces)
        if need <= 0:  # cut inside a line: start at the next one
            newline = data.find(b"\n")
            data = data[newline + 1 :] if newline >= 0 else b""
            first_line += 1
        self.data, self.first_line, self._pieces = data, first_line, []


# A carriage return not followed by a newline ends a line, as Python's universal newlines (and so torchrun's
# --tee, which reads each rank's output in text mode) read it: a log written with old Mac line ends, or a
# terminal's progress bar (tqdm, a download) that rewrites its line after one, each rewrite a line as it was
# printed. Without it such a log is one line a block long, and the matcher sees only its first 16 KB.
# CRLF is left as it is: its line ends at the newline, the CR stays on the line as it always did.
_LONE_CR = re.compile(rb"\r(?!\n)")


@functools.cache
def _lone_cr_search():
    """A search for a CR followed by another byte than LF. RE2 (in Latin-1, so that any byte follows) finds it
    at memchr speed: a CRLF log's block of 8 MB costs 1 ms, against 10 ms to count its CRs and its CRLFs."""
    try:
        import re2
    except ImportError:  # pragma: no cover - google-re2 is a dependency
        return re.compile(rb"\r[^\n]")
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1
    return re2.compile(rb"\r[^\n]", options)


_NUL_RUN = re.compile(rb"\x00+")


def _line_blocks(stream: BinaryIO) -> Iterator[bytes]:
    """The stream's blocks, never empty, each lone CR made a newline and each run of NUL bytes (a stretch of
    the file never written: the registry reads such text as a log with holes) a line end. A CR that ends a block
    waits for the next block's first byte, which says whether it starts a CRLF."""
    held = b""
    while True:
        block = stream.read(BLOCK_BYTES)
        if not block:
            if held:
                yield b"\n"  # a CR at the very end of the stream ends its last line
            return
        if b"\x00" in block:  # what was written before a hole and after it are different writes: other lines
            block = _NUL_RUN.sub(b"\n", block)
        if held:
            block, held = held + block, b""
        if b"\r" not in block:  # most logs: one pass at memchr speed
            yield block
            continue
        lone = _lone_cr_search().search(block) is not None  # before the last CR is held: "\r\r" ends a line
        if block.endswith(b"\r"):
            block, held = block[:-1], b"\r"
        if lone:  # a log of CR line ends has no CRLF: every CR is a line end, replaced at C speed
            block = block.replace(b"\r", b"\n") if b"\r\n" not in block else _LONE_CR.sub(b"\n", block)
        if block:
            yield block


# The stretch of lines the gate is first asked about past a line that holds a prefilter word, and the most it is
# asked about at once: the stretch doubles while no line of it could match, so a log dense with anchor lines is
# read in few calls, and a stretch of binary bytes (which the gate's automaton reads slowly) costs little per word
# the prefilter finds in it.
_GATE_FIRST = 1 << 10
_GATE_MOST = 256 << 10


class LineFinder:
    """Where the next line to hand on starts: the prefilter finds a line that holds one of its words; where the
    reader does not need every such line (`every_hit()` False), the gate (`Matcher.gate`) is asked whether
    any line from there on could match, a stretch of lines at a time, and the first that could is found by halving
    the stretch: the lines between cost calls into C, not a Python step each."""

    def __init__(
        self, prefilter, gate: Callable[[], Gate | None] | None = None, every_hit: Callable[[], bool] | None = None
    ):
        self._literal = span_search(prefilter)  # the prefilter's first hit in a range, made once per stream
        self._gate_of = gate  # built at the first hit: a log without one never pays for it
        self._gate: Gate | None = None
        self._every_hit: Callable[[], bool] = every_hit or (lambda: False)

    def next_line(self, buffer: bytes, pos: int, end: int) -> int | None:
        """The start of the next line of buffer[pos:end] (`pos` a line's start) to hand on, or None."""
        view, size = memoryview(buffer), _GATE_FIRST
        while True:
            span = self._literal(buffer, pos, end)
            if span is None:
                return None
            start = buffer.rfind(b"\n", 0, span[0]) + 1
            if self._gate_of is not None:
                self._gate, self._gate_of = self._gate_of(), None
            if self._gate is None or self._gate.block is None or self._every_hit():
                return start
            pos = _line_end(buffer, span[1], end)
            if self._gate.could_match(view[start:pos]):
                return start  # the line itself (most hit lines of a failing job's log are read in full)
            stop = _line_end(buffer, min(pos + size, end), end)
            if not self._gate.block.could_match(view[pos:stop]):
                pos, size = stop, min(2 * size, _GATE_MOST)
                continue
            pos = self._first_that_could_match(buffer, view, pos, stop)
            # A line with no prefilter word is left as the prefilter leaves it (a message cut before its anchor
            # can still end like a rule's phrase): the lines handed on are the same with the gate or without.
            if self._literal(buffer, pos, _line_end(buffer, pos, end)) is not None:
                return pos
            pos = _line_end(buffer, pos, end)

    def _first_that_could_match(self, buffer: bytes, view: memoryview, start: int, stop: int) -> int:
        """The first line of buffer[start:stop] (whole lines, one of which could match) that could match: the
        stretch halved at a line's end until one line is left (the first, where the set gave up on the whole)."""
        ask = self._gate.block.could_match  # type: ignore[union-attr]
        while (first_end := _line_end(buffer, start, stop)) < stop:
            half = _line_end(buffer, (start + stop) // 2, stop)
            half = first_end if half >= stop else half  # the middle falls in the last line
            if ask(view[start:half]):
                stop = half
            else:
                start = half
        return start


def _line_end(buffer: bytes, pos: int, end: int) -> int:
    """Where the line that holds buffer[pos] ends, past its newline; `end` where none comes before it."""
    newline = buffer.find(b"\n", pos, end)
    return end if newline == -1 else newline + 1


def scan_lines(
    stream: BinaryIO,
    prefilter,
    tail: Tail | None = None,
    gate: Callable[[], Gate | None] | None = None,
    every_hit: Callable[[], bool] | None = None,
) -> Iterator[tuple[int, bytes]]:
    """Yield (1-based line number, raw line) for each line that contains a prefilter hit; at the end,
    fill `tail` with the stream's last bytes. A line ends at a newline or at a CR not followed by one.

    With `gate` (`Matcher.gate`, called at the first hit), only the lines of those that could match a rule
    or marker are yielded, except while `every_hit()` says the reader wants each one (a traceback or torchrun's
    report is open)."""
    carry = b""
    line_base = 1  # number of the first line in `buffer`
    width: Wrapping | None = None
    first = True
    blocks = _line_blocks(stream)
    find = LineFinder(prefilter, gate, every_hit)
    while True:
        block = next(blocks, b"")
        if not block and not carry:
            break
        begin = 0  # where the lines of `buffer` still to read start
        if carry and block and width is None and (ends := block.find(b"\n")) >= 0:
            # The line carried over ends in this block: read it on its own, then the block from the next line,
            # without copying the block behind the carried bytes (8 MB a block: a sixth of the scan's time).
            line, begin = carry + block[: ends + 1], ends + 1
            yield from _hits(line, len(line), find, line_base)
            if tail is not None:
                tail._keep(line_base, line, len(line))
            buffer, carry, line_base = block, b"", line_base + 1
        else:
            buffer = carry + block
        if first:  # the first block shows whether the log was hard-wrapped
            width, first = wrap_width(buffer[:_WRAP_SAMPLE]), False
            if tail is not None:
                tail.wrapping = width
        if block:
            cut = buffer.rfind(b"\n") + 1
            if cut == 0 and len(buffer) < BLOCK_BYTES:
                carry = buffer  # an incomplete line: wait for the rest
                continue
            if cut == 0:
                cut = len(buffer)  # a line longer than a block: scan it in pieces
        else:
            cut = len(buffer)  # end of input: the last line needs no newline
        if width is not None and block:
            held = _hold_wrapped(buffer, cut, width.width)
            if held == 0 and len(buffer) < 4 * BLOCK_BYTES:
                carry = buffer  # one wrapped message so far: wait for its end
                continue
            cut = held or cut
        if width is None:
            yield from _hits(buffer, cut, find, line_base, begin)
        else:
            yield from _wrapped_hits(buffer, cut, prefilter, line_base, width)
        if tail is not None:
            tail._keep(line_base, buffer, cut, begin)
        line_base += buffer.count(b"\n", begin, cut)
        carry = buffer[cut:]
        if not block:
            break
    if tail is not None:
        tail._finish()


def _hits(buffer: bytes, end: int, find: LineFinder, line_base: int, begin: int = 0) -> Iterator[tuple[int, bytes]]:
    """The hit lines of buffer[begin:end] (`begin` a line's start, the number `line_base`)."""
    counted_to, line_no = begin, line_base
    pos = begin
    while True:
        start = find.next_line(buffer, pos, end)
        if start is None:
            return
        stop = buffer.find(b"\n", start, end)
        if stop == -1:
            stop = end
        start, stop, message = _whole_message(buffer, start, stop, end, floor=pos)
        line_no += buffer.count(b"\n", counted_to, start)
        counted_to = start
        yield line_no, message
        pos = stop + 1


# --- One message over several lines under one tag ----------------------------------------------------
# Some programs print one message over several lines, each under the same tag, cut mid-sentence: the
# NVIDIA driver's "NVRM: API mismatch: the client has the version %s, but" / "NVRM: this kernel module
# has the version %s.  Please" (kernel-open/nvidia/nv.c), under the kernel log's timestamps. A line
# continues the one before only when both start alike up to the same tag (timestamps' digits aside),
# the first stops mid-sentence and the second goes on in lower-case words: two records of an ordinary
# log do not look like that, and a logger's records (INFO:, WARNING:) are never joined.

_JOIN_MAX = 4  # lines of one message, at most
# A tag at a line's start, behind a kernel log's timestamp or a syslog's "host kernel: " at most.
_TAG_END = re.compile(rb"^(?:\[[^\]\n]{0,40}\] ?)?(?:[^:\n]{0,40}: )?([A-Za-z][\w.-]{1,15}): $")
_LEVELS = frozenset(b"info warn warning error err debug trace notice critical fatal note".split())
_GOES_ON = re.compile(rb"(?:[A-Za-z0-9,)]|\w \w+)$")
_LOWER_WORDS = re.compile(rb"[a-z]+ [a-z]")


def _tag_length(line: bytes, following: bytes) -> int:
    """The length of the start both lines share up to a tag ("[  39.75] NVRM: "), or 0."""
    a, b = line[:96].translate(_DIGITS), following[:96].translate(_DIGITS)
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    cut = a.rfind(b": ", 0, same) + 2
    if cut < 2:
        return 0
    tag = _TAG_END.match(a[:cut])
    return cut if tag and tag.group(1).lower() not in _LEVELS else 0


def _goes_on(line: bytes, following: bytes) -> int:
    """Where `following`'s text starts if it is the rest of `line`'s message, else 0."""
    line, following = line.rstrip(b"\r"), following.rstrip(b"\r")
    cut = _tag_length(line, following)
    if not cut:
        return 0
    body = line[cut:].rstrip()
    if body.count(b" ") < 2 or not _GOES_ON.search(body):
        return 0
    if _OUTER.match(body).group("label") != _OUTER.match(following, cut).group("label"):
        return 0  # behind one host's tag (pdsh's), two writers: a rank's line under its launcher's label, and another
    return cut if _LOWER_WORDS.match(following, cut) else 0


def _whole_message(buffer: bytes, start: int, stop: int, end: int, floor: int) -> tuple[int, int, bytes]:
    """The message a hit line belongs to: (its first line's start, its last line's end, its text)."""
    line = buffer[start:stop]
    if b": " not in line[:96]:
        return start, stop, line  # the fast path: no tag, nothing to join
    parts = [line]
    for _ in range(_JOIN_MAX - 1):  # back to the message's first line
        if start <= floor or start < 2:
            break
        before = buffer.rfind(b"\n", 0, start - 1) + 1
        if before < floor:
            break
        cut = _goes_on(buffer[before : start - 1], parts[0])
        if not cut:
            break
        parts[0] = parts[0][cut:]
        parts.insert(0, buffer[before : start - 1])
        start = before
    while len(parts) < _JOIN_MAX and stop < end:  # on to its last
        after = buffer.find(b"\n", stop + 1, end)
        after = end if after == -1 else after
        following = buffer[stop + 1 : after]
        cut = _goes_on(buffer[buffer.rfind(b"\n", 0, stop) + 1 : stop], following)
        if not cut:
            break
        parts.append(following[cut:])
        stop = after
    if len(parts) == 1:
        return start, stop, line
    return (
        start,
        stop,
        b" ".join(part.rstrip(b"\r").rstrip() if i < len(parts) - 1 else part for i, part in enumerate(parts)),
    )


# --- Logs hard-wrapped at a fixed width --------------------------------------------------------------
# A log pasted through a terminal or a browser is often cut at a fixed column (100-137), mid-word: the
# message a rule knows is then split over two lines. Such a log shows it in its line lengths: many lines
# of exactly one length, none longer, and the line after each one not starting like it (a new record of
# an ordinary log repeats its prefix; a continuation does not). Only then are the lines rejoined.

_WRAP_SAMPLE = 1 << 20
WRAP_MIN_WIDTH = 60
_PREFIX = 6  # bytes of a line's start compared with the next line's, digits as one
_DIGITS = bytes.maketrans(b"123456789", b"000000000")


def _starts_alike(line: bytes, following: bytes) -> bool:
    """The same kind of start: `[1,5]<stdout>` and `[1,7]<stdout>`, two records of one log; behind the colour
    codes a logger puts before some records and not others (`\x1b[1;31mDLL 2025` and `DLL 2025`). A launcher's
    prefix stays: the rest of a `[rank0]: iteration ...` record may start with `iterations`."""
    return _start(following) == _start(line)


def _start(line: bytes) -> bytes:
    """A line's kind of start, as _starts_alike compares it: its first bytes behind colour codes, digits as one."""
    return _uncoloured(line)[:_PREFIX].translate(_DIGITS)


_LEADING_COLOUR = re.compile(rb"(?:\x1b\[[0-?]{0,16}[ -/]{0,4}[@-~])+")


def _uncoloured(line: bytes) -> bytes:
    found = _LEADING_COLOUR.match(line)
    return line[found.end() :] if found else line


class Wrapping(NamedTuple):
    width: int
    padded: bool  # a terminal capture that pads every line to the width with spaces
    peeled: bool  # the width is that of the lines behind a prefix every line carries (a launcher's, colour)


# What a launcher or a colouring logger puts before every line, wrapped or not: colour codes, srun's
# `3: `, mpirun's `[1,3]<stderr>:`, torchrun's `[default3]:` / `[rank3]:`.
_OUTER = re.compile(
    rb"(?:\x1b\[[0-?]{0,16}[ -/]{0,4}[@-~]){0,4}"
    rb"(?P<label> {0,5}\d{1,6}: |\[\d{1,6},\d{1,6}\]<std(?:out|err)>: ?|\[(?:rank|default)\d{1,6}\]: ?)?"
    rb"(?:\x1b\[[0-?]{0,16}[ -/]{0,4}[@-~]){0,4}"
)


def _body(line: bytes) -> bytes:
    return line[_OUTER.match(line).end() :]


def wrap_width(sample: bytes) -> Wrapping | None:
    """How a log was hard-wrapped at a fixed width, or None for an ordinary log.

    A terminal wraps the whole line, prefix and all; a program that wraps before a launcher prefixes
    its lines leaves the prefix on every piece: both are tried."""
    if len(sample) < 2 * WRAP_MIN_WIDTH or sample.count(b"\n") < 2:
        return None  # not two complete lines at the width, the least a wrap shows (a folder's tiny logs)
    lines = [line.rstrip(b"\r") for line in sample.split(b"\n")[:-1]]  # complete lines only
    return _wrapping(lines, peeled=False) or _wrapping(lines, peeled=True)


def _wrapping(raw_lines: list[bytes], peeled: bool) -> Wrapping | None:
    lines = [_body(line) for line in raw_lines] if peeled else raw_lines
    lengths = Counter(len(line) for line in lines if len(line) >= WRAP_MIN_WIDTH)
    allowed_longer = max(1, 0.02 * len(lines))  # a line or two a terminal did not cut (a wide character)
    width, longer = None, 0
    for length in sorted(lengths, reverse=True):  # the widest length that several lines reach exactly
        if lengths[length] >= 2:
            width = length
            break
        longer += lengths[length]
    if width is None or longer > allowed_longer:
        return None
    at_width = [line for line in lines if len(line) == width]
    # A capture padded with spaces: nearly every line is at the width, most ending in a run of spaces.
    padded = len(at_width) >= 0.9 * sum(1 for line in lines if line.strip()) and sum(
        1 for line in at_width if line.endswith(b"  ")
    ) >= 0.5 * len(at_width)
    wrapping = Wrapping(width, padded, peeled)
    follows = [(i, line, lines[i + 1]) for i, line in enumerate(lines[:-1]) if len(line) == width and lines[i + 1]]
    continuing = sum(1 for i, _, _ in follows if _continues(raw_lines[i], raw_lines[i + 1], wrapping))
    if not follows or continuing < 0.5 * len(follows):
        return None
    cut_words = sum(1 for _, line, following in follows if line[-1:].isalnum() and following[:1].isalnum())
    if lengths[width] >= 3:
        return None if _whole_records(follows, lines, wrapping) else wrapping
    # Of two, one that ends in text (not a terminal's padding) with a record's header after it was whole, and the
    # "cut word" two words.
    whole = any(line[-1:] != b" " and _starts_with_header(following) for _, line, following in follows)
    return wrapping if (cut_words or _pieces_lack_the_prefix(lines, follows)) and not whole else None


def _pieces_lack_the_prefix(lines: list[bytes], follows: list[tuple[int, bytes, bytes]]) -> bool:
    """Whether the log's records all start alike (a launcher's or a host's prefix before each: `node29:
    [default0]:`) and the lines after those at the width do not: a terminal's wrap leaves its pieces without the
    prefix, wherever the column fell (between two words: `... NCCL WARN` / ` NET/IB : Unable to query port 1`)."""
    starts = Counter(_start(line) for line in lines if line)
    if not starts:
        return False
    common, count = starts.most_common(1)[0]
    pieces = [following for _, _, following in follows]
    records = len(lines) - len(pieces) - _cut_head(lines, common)
    return count >= 0.9 * records and not any(_start(piece) == common for piece in pieces)


# The most lines before a log's first record that its cut head may be: the end of a record and its pieces.
_CUT_HEAD_LINES = 3


def _cut_head(lines: list[bytes], common: bytes) -> int:
    """How many lines come before the first that starts as the records do, at most _CUT_HEAD_LINES: a log cut at its
    start (a paste, a `tail`) begins with the rest of a record, whose first line's length says nothing of the width
    and whose pieces follow it unprefixed; a banner before the records is no record of theirs either."""
    first = next((i for i, line in enumerate(lines[: _CUT_HEAD_LINES + 1]) if _start(line) == common), None)
    return first if first is not None and first <= _CUT_HEAD_LINES else 0


# The bytes of a line's end compared with other lines' ends (_whole_records).
_ENDING = 12


def _whole_records(follows: list[tuple[int, bytes, bytes]], lines: list[bytes], wrapping: Wrapping) -> bool:
    """Whether each line at the width that something follows ends as a shorter line of the log ends: whole records
    that reach the log's widest length by chance (Megatron's step lines, a few characters apart, three of them at
    the widest, then a launcher's separator and message), not pieces a terminal cut at a column, which end where
    the column fell and leave the record's end to the next line."""
    if wrapping.padded:
        return False
    endings = {line[-_ENDING:] for line in lines if _ENDING <= len(line) < wrapping.width}
    return all(line[-_ENDING:] in endings for _, line, _ in follows)


def _continues(line: bytes, following: bytes, wrapping: Wrapping) -> bool:
    """Whether `following` is the rest of `line`: `line` was cut at the width (in a padded capture, not
    padded to it: its text ended before the edge) and `following` does not start a record of its own."""
    line = line.rstrip(b"\r")
    theirs, mine = _OUTER.match(following).group(0), _OUTER.match(line).group(0)
    if theirs and theirs != mine and (not mine or _launcher(theirs) == _launcher(mine)):
        # Another launcher-prefixed record (another rank's line) starts here. Under another launcher's kind of
        # prefix than this line's, it is text the wrap cut ("…Mlx" then "5: mlx5dv_create_qp failed").
        return False
    if wrapping.peeled:
        # A program's own wrap under a launcher's prefix: both pieces carry the same prefix.
        prefix = _OUTER.match(line).group(0)
        if not prefix or _OUTER.match(following).group(0) != prefix:
            return False
        line, following = line[len(prefix) :], following[len(prefix) :]
    return (
        len(line) == wrapping.width
        and not (wrapping.padded and line.endswith(b" "))
        and bool(following.strip())
        and not _starts_alike(line, following)
        and not _starts_with_header(following)
    )


def _starts_with_header(line: bytes) -> bool:
    """Whether a line starts, behind a launcher's prefix, with a header only a log's record starts with."""
    return starts_with_log_header(_body(line)[:128].decode("utf-8", "replace"))


def _starts_like_record(first: bytes, following: bytes, wrapping: Wrapping) -> bool:
    """Whether `following` starts as the message's first line does: another record of the log (pdsh's `node-07: `
    or c10's `[E0520 ` before each), though the piece before it was cut at the width. Under a program's own wrap
    (every piece behind the launcher's prefix), what follows the prefix is compared."""
    if wrapping.peeled:
        first, following = _body(first), _body(following)
    return _starts_alike(first, following)


def _launcher(prefix: bytes) -> str:
    """Which launcher's kind of prefix (as _OUTER reads them): srun's, mpirun's, torchrun's, or colour alone. srun's
    --label pads every task id of a step to the widest one (" 5: " among 16 tasks): a label of another width is
    not that step's ("5: mlx5dv_create_qp failed", a wrapped line's rest, among " 78: " labels)."""
    if b"<std" in prefix:
        return "mpirun"
    if b"[rank" in prefix or b"[default" in prefix:
        return "torchrun"
    label = _OUTER.match(prefix).group("label")  # what is left of a prefix _OUTER read: srun's label, or none
    return f"srun {len(label.rstrip().rstrip(b':'))}" if label else "colour"


def _hold_wrapped(buffer: bytes, cut: int, width: int) -> int:
    """Where to end this block so that a wrapped message at its end is read whole with the next one:
    before the chain of lines cut at the width that ends it (0: the whole buffer is one such chain)."""
    held = cut
    while held > 0:
        start = buffer.rfind(b"\n", 0, held - 1) + 1
        if len(buffer[start : held - 1].rstrip(b"\r")) != width:
            break
        held = start
    return held


def _wrapped_hits(
    buffer: bytes, end: int, prefilter, line_base: int, wrapping: Wrapping
) -> Iterator[tuple[int, bytes]]:
    """Like `_hits`, over the messages rejoined: (the number of a message's first line, the message)."""
    lines = buffer[:end].split(b"\n")
    if buffer[:end].endswith(b"\n"):
        lines.pop()
    for first, message in rejoined(lines, wrapping):
        if prefilter.search(message) is not None:
            yield line_base + first, message


def rejoined(lines: list[bytes], wrapping: Wrapping) -> Iterator[tuple[int, bytes]]:
    """The messages of a hard-wrapped log's lines: (the index of a message's first line, the message), its pieces
    joined and the launcher's prefix each piece repeats dropped."""
    index = 0
    while index < len(lines):
        first = index
        parts = [lines[index].rstrip(b"\r")]
        while (
            index + 1 < len(lines)
            and _continues(lines[index], lines[index + 1], wrapping)
            and not _starts_like_record(parts[0], lines[index + 1], wrapping)
        ):
            index += 1
            piece = lines[index].rstrip(b"\r")
            prefix = _OUTER.match(piece).group(0)
            if prefix and prefix == _OUTER.match(parts[0]).group(0):
                piece = piece[len(prefix) :]  # the launcher's prefix on each piece of one message
            parts.append(piece)
        yield first, b"".join(parts)
        index += 1
