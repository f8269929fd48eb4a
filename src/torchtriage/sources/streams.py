"""Byte streams that readers share: regular files only, gzip read as far as it goes, every byte counted.

Every reader opens its files here. A FIFO, socket or device is refused before anything waits on it; a
gzip stream is inflated in bounded pieces, so a bomb stops at the limit instead of after; and what comes
out is counted against the byte budget of `limits` (a file read whole has a smaller one than a stream).
"""

from __future__ import annotations

import errno
import os
import stat
import zlib
from typing import BinaryIO

from torchtriage.errors import InputError
from torchtriage.sources.limits import ByteBudget

GZIP_MAGIC = b"\x1f\x8b"
_RAW_CHUNK = 1 << 20
# The most one inflate call may produce: a megabyte of zeros inflates to a gigabyte.
_OUT_CHUNK = 4 << 20


def _kind_of(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def open_regular(path: str) -> BinaryIO:
    """Open a regular file for reading; anything else raises OSError saying what it is.

    Opened without blocking, so that a FIFO with no writer cannot stall the open itself, and checked on the
    open descriptor, so that a file swapped for a FIFO after a check is still caught."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "a folder", path)
        if not stat.S_ISREG(mode):
            reason = f"{_kind_of(mode)}, not a file; torchtriage reads only regular files (it would wait forever)"
            raise OSError(errno.EINVAL, reason)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class Budgeted:
    """A stream whose bytes are counted against a budget as they are read."""

    def __init__(self, raw: BinaryIO, budget: ByteBudget) -> None:
        self.raw = raw
        self.budget = budget

    @property
    def truncated(self) -> bool:
        return getattr(self.raw, "truncated", False)

    def read(self, size: int = -1) -> bytes:
        if size < 0:  # never unbounded: one byte past the budget is enough to know
            size = self.budget.limit - self.budget.used + 1
        data = self.raw.read(size)
        self.budget.take(len(data))
        return data

    def read1(self, size: int = -1) -> bytes:
        reader = getattr(self.raw, "read1", self.raw.read)
        data = reader(size if size >= 0 else _OUT_CHUNK)
        self.budget.take(len(data))
        return data

    def peek(self, size: int = 0) -> bytes:
        return self.raw.peek(size)  # type: ignore[attr-defined]

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> Budgeted:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TolerantGunzip:
    """Streams a gzip file's content, and keeps what a truncated file holds instead of losing it.

    Python's GzipFile raises at a cut-off end and drops the block it was reading; logs copied off a
    dying node are often cut, and the lines before the cut are exactly the ones that matter.
    Concatenated members (`cat a.gz b.gz`) are read one after another. Inflating is done in pieces of at
    most `_OUT_CHUNK`, so memory stays bounded whatever the compression ratio.
    """

    def __init__(self, raw: BinaryIO):
        self.raw = raw
        self.truncated = False
        self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._input = b""  # compressed bytes not yet inflated
        self._pending = b""
        self._offset = 0  # how much of `_pending` was handed out
        self._done = False

    def _inflate_some(self) -> bytes:
        if not self._input:
            self._input = self.raw.read(_RAW_CHUNK)
            if not self._input:
                self._done = True
                self.truncated = not self._inflater.eof
                return self._inflater.flush() if not self._inflater.eof else b""
        out = self._inflater.decompress(self._input, _OUT_CHUNK)
        self._input = self._inflater.unconsumed_tail
        if self._inflater.eof:
            self._input = self._inflater.unused_data + self._input
            if self._input:  # another member follows
                self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        return out

    def _fill(self, size: int) -> None:
        have = len(self._pending) - self._offset
        if have >= size:
            return
        parts = [self._pending[self._offset :]]
        while have < size and not self._done:
            out = self._inflate_some()
            parts.append(out)
            have += len(out)
        self._pending, self._offset = b"".join(parts), 0

    def peek(self, size: int = 1) -> bytes:
        self._fill(max(size, 1))
        return self._pending[self._offset : self._offset + max(size, 1)]

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            parts = [self._pending[self._offset :]]
            while not self._done:
                parts.append(self._inflate_some())
            self._pending, self._offset = b"", 0
            return b"".join(parts)
        self._fill(size)
        data = self._pending[self._offset : self._offset + size]
        self._offset += len(data)
        return data

    def read1(self, size: int = -1) -> bytes:
        if self._offset >= len(self._pending):
            self._pending, self._offset = b"", 0
            while not self._pending and not self._done:
                self._pending = self._inflate_some()
        return self.read(min(size, len(self._pending) - self._offset) if size >= 0 else _OUT_CHUNK)

    def close(self) -> None:
        self.raw.close()


def open_counted(path: str, what: str, streamed: bool) -> BinaryIO:
    """A regular file's content, un-gzipped when it is gzip, each byte counted against the budget."""
    raw = open_regular(path)
    try:
        compressed = raw.read(2) == GZIP_MAGIC
        raw.seek(0)
    except BaseException:
        raw.close()
        raise
    stream: BinaryIO = TolerantGunzip(raw) if compressed else raw  # type: ignore[assignment]
    return Budgeted(stream, ByteBudget(what, streamed))  # type: ignore[return-value]


def read_whole(path: str, what: str = "the file") -> tuple[bytes, bool]:
    """All of a regular file's content (un-gzipped), within the budget for files read whole; and whether a
    gzip stream was cut off. Raises OSError, or LimitExceeded (a ValueError)."""
    raw = open_regular(path)
    try:
        budget = ByteBudget(what, streamed=False)
        if raw.peek(2)[:2] == GZIP_MAGIC:
            return _read_stream(Budgeted(TolerantGunzip(raw), budget))  # type: ignore[arg-type]
        # A plain file is read in one call of its own size (one byte more shows a file still growing): reading
        # in fixed pieces allocated and joined megabytes per file, three times the cost of the read itself.
        size = os.fstat(raw.fileno()).st_size
        data = raw.read(min(size, budget.limit) + 1)
        budget.take(len(data))
        if len(data) <= size:
            return data, False
        return data + _read_stream(Budgeted(raw, budget))[0], False
    finally:
        raw.close()


def _read_stream(stream: Budgeted) -> tuple[bytes, bool]:
    parts = []
    while chunk := stream.read(_OUT_CHUNK):  # in pieces: a bomb is refused at the budget, not after
        parts.append(chunk)
    return b"".join(parts), stream.truncated


def read_input(path: str, what: str = "the file") -> bytes:
    """`read_whole` for readers that fail as a whole: every failure becomes an InputError naming the file."""
    try:
        data, truncated = read_whole(path, what)
    except OSError as err:
        raise InputError(f"{path}: cannot read it ({err.strerror or err})") from None
    except zlib.error as err:
        raise InputError(f"{path}: a gzip file that cannot be decompressed ({err})") from None
    except ValueError as err:  # past a limit
        raise InputError(f"{path}: {err}") from None
    if truncated:
        raise InputError(f"{path}: the gzip file is cut off before its end (truncated while being copied?)")
    return data


def read_text(path: str, what: str = "the file") -> str:
    """A whole text file (UTF-8, undecodable bytes replaced), read as `read_input` does."""
    return read_input(path, what).decode("utf-8", errors="replace")


class Replay:
    """A stream that yields `first`, then the rest of `rest`."""

    def __init__(self, first: bytes, rest: BinaryIO) -> None:
        self.first, self.rest = first, rest

    def read(self, size: int = -1) -> bytes:
        if self.first:
            if size < 0:
                data, self.first = self.first + self.rest.read(), b""
                return data
            data, self.first = self.first[:size], self.first[size:]
            return data
        return self.rest.read(size)

    def close(self) -> None:  # standard input stays open for others
        pass
