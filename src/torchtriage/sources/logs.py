"""Streaming the lines of a log that might matter, without holding the log in memory.

Multi-GB logs are mostly step lines and NCCL INFO chatter. The scanner reads big blocks and lets one
compiled prefilter (the literal anchors of every rule, plus the markers of tracebacks and of
torchrun's failure report) find candidate positions at C speed; only the lines around those
positions are decoded and handed on. A line longer than a block is cut into block-sized pieces, so a
megabyte-long line costs no more memory than a block.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

BLOCK_BYTES = 8 << 20
# A hit line is cut to this length before matching: messages that matter are short, and a
# pathological line must not make every rule scan megabytes.
MAX_LINE_CHARS = 16_384


class Tail:
    """The last bytes of a stream, from a line's start, filled in by `scan_lines` when it ends.

    A stalled job's evidence is where its log stops: the last lines, a stack dump, a Ctrl-C. The scan
    keeps references to its last two blocks and cuts the tail from them once, so keeping it costs no
    copy per block."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.data = b""
        self.first_line = 1  # the line number of the tail's first line
        self._blocks: list[tuple[int, bytes, int]] = []  # (line_base, buffer, end), the last two

    def _keep(self, line_base: int, buffer: bytes, end: int) -> None:
        if end:
            self._blocks = [*self._blocks[-1:], (line_base, buffer, end)]

    def _finish(self) -> None:
        pieces: list[bytes] = []
        need = self.max_bytes
        first_line = 1
        for line_base, buffer, end in reversed(self._blocks):
            start = max(0, end - need)
            pieces.insert(0, buffer[start:end])
            need -= end - start
            first_line = line_base + buffer.count(b"\n", 0, start)
            if need <= 0:
                break
        data = b"".join(pieces)
        if need <= 0:  # cut inside a line: start at the next one
            newline = data.find(b"\n")
            data = data[newline + 1 :] if newline >= 0 else b""
            first_line += 1
        self.data, self.first_line, self._blocks = data, first_line, []


def scan_lines(stream: BinaryIO, prefilter, tail: Tail | None = None) -> Iterator[tuple[int, bytes]]:
    """Yield (1-based line number, raw line) for each line that contains a prefilter hit; at the end,
    fill `tail` with the stream's last bytes."""
    carry = b""
    line_base = 1  # number of the first line in `buffer`
    while True:
        block = stream.read(BLOCK_BYTES)
        if not block and not carry:
            break
        buffer = carry + block
        if block:
            cut = buffer.rfind(b"\n") + 1
            if cut == 0 and len(buffer) < BLOCK_BYTES:
                carry = buffer  # an incomplete line: wait for the rest
                continue
            if cut == 0:
                cut = len(buffer)  # a line longer than a block: scan it in pieces
        else:
            cut = len(buffer)  # end of input: the last line needs no newline
        yield from _hits(buffer, cut, prefilter, line_base)
        if tail is not None:
            tail._keep(line_base, buffer, cut)
        line_base += buffer.count(b"\n", 0, cut)
        carry = buffer[cut:]
        if not block:
            break
    if tail is not None:
        tail._finish()


def _hits(buffer: bytes, end: int, prefilter, line_base: int) -> Iterator[tuple[int, bytes]]:
    counted_to, line_no = 0, line_base
    pos = 0
    while True:
        match = prefilter.search(buffer, pos, end)
        if match is None:
            return
        start = buffer.rfind(b"\n", 0, match.start()) + 1
        stop = buffer.find(b"\n", match.end(), end)
        if stop == -1:
            stop = end
        line_no += buffer.count(b"\n", counted_to, start)
        counted_to = start
        yield line_no, buffer[start:stop]
        pos = stop + 1
