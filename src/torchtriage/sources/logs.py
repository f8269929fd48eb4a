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


def scan_lines(stream: BinaryIO, prefilter) -> Iterator[tuple[int, bytes]]:
    """Yield (1-based line number, raw line) for each line that contains a prefilter hit."""
    carry = b""
    line_base = 1  # number of the first line in `buffer`
    while True:
        block = stream.read(BLOCK_BYTES)
        if not block and not carry:
            return
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
        line_base += buffer.count(b"\n", 0, cut)
        carry = buffer[cut:]
        if not block:
            return


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
