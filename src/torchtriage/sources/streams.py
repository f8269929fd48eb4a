"""Byte streams that readers share: a gzip file read as far as it goes, and standard input replayed."""

from __future__ import annotations

import zlib
from typing import BinaryIO


class TolerantGunzip:
    """Streams a gzip file's content, and keeps what a truncated file holds instead of losing it.

    Python's GzipFile raises at a cut-off end and drops the block it was reading; logs copied off a
    dying node are often cut, and the lines before the cut are exactly the ones that matter.
    Concatenated members (`cat a.gz b.gz`) are read one after another.
    """

    _RAW_CHUNK = 1 << 20

    def __init__(self, raw: BinaryIO):
        self.raw = raw
        self.truncated = False
        self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._pending = b""
        self._done = False

    def _fill(self, size: int) -> None:
        while len(self._pending) < size and not self._done:
            chunk = self.raw.read(self._RAW_CHUNK)
            if not chunk:
                self._done = True
                self.truncated = not self._inflater.eof
                self._pending += self._inflater.flush() if not self._inflater.eof else b""
                break
            self._pending += self._inflater.decompress(chunk)
            while self._inflater.eof and self._inflater.unused_data:
                rest = self._inflater.unused_data
                self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._pending += self._inflater.decompress(rest)

    def peek(self, size: int) -> bytes:
        self._fill(size)
        return self._pending[:size]

    def read(self, size: int = -1) -> bytes:
        self._fill(size if size >= 0 else 1 << 62)
        if size < 0:
            size = len(self._pending)
        data, self._pending = self._pending[:size], self._pending[size:]
        return data

    def close(self) -> None:
        self.raw.close()


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
