"""Finding and opening the artifacts a user points us at: files, folders (recursively), gzip, stdin.

Nothing here interprets content beyond what is needed to refuse it early: a binary file or a pickle
is named as such so the user knows which command reads it instead.
"""

from __future__ import annotations

import os
import re
import sys
import zlib
from dataclasses import dataclass
from typing import BinaryIO

STDIN = "-"
_SNIFF_BYTES = 8192
_GZIP_MAGIC = b"\x1f\x8b"
# Protocol 2+ pickles start with PROTO (0x80) and the protocol number.
_PICKLE_MAGIC = re.compile(rb"\A\x80[\x02-\x05]")

# Per-rank log files come with any naming: rank3.log, rank_03.txt, worker-3.out, log.rank3,
# node1-rank12.err, stdout_rank_3. Digits right after a rank/worker word are the rank.
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])(?:rank|worker|proc|process)[-_.]?(\d{1,6})(?!\d)", re.IGNORECASE)
# torchrun --redirects/--log-dir writes <dir>/<run_id>/attempt_<n>/<local_rank>/{stdout,stderr}.log
_TORCHRUN_LAYOUT = re.compile(r"attempt_\d+[/\\](\d{1,6})[/\\](?:stdout|stderr|error)\.(?:log|json)$")


@dataclass(frozen=True)
class Artifact:
    """One input to read: a path, or stdin."""

    path: str
    rank_hint: int | None  # the rank its name implies, when lines carry no rank prefix

    @property
    def display(self) -> str:
        return "<stdin>" if self.path == STDIN else self.path


def rank_from_path(path: str) -> int | None:
    match = _TORCHRUN_LAYOUT.search(path)
    if match:
        return int(match.group(1))
    match = _RANK_IN_NAME.search(os.path.basename(path))
    return int(match.group(1)) if match else None


def _natural_key(path: str) -> list[object]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path)]


def discover(paths: list[str], problems: list[str]) -> list[Artifact]:
    """Expand the user's paths into artifacts; what cannot be found is added to `problems`."""
    artifacts: list[Artifact] = []
    for path in paths:
        if path == STDIN:
            artifacts.append(Artifact(STDIN, None))
        elif os.path.isdir(path):
            found = []
            for root, dirs, files in os.walk(path, onerror=lambda err: problems.append(_describe_os_error(err))):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found.extend(os.path.join(root, name) for name in files if not name.startswith("."))
            if not found:
                problems.append(f"{path}: the folder holds no files; point at the folder with the logs.")
            artifacts.extend(Artifact(p, rank_from_path(p)) for p in sorted(found, key=_natural_key))
        elif os.path.exists(path):
            artifacts.append(Artifact(path, rank_from_path(path)))
        else:
            problems.append(f"{path}: no such file or folder; check the path.")
    return artifacts


def _describe_os_error(err: OSError) -> str:
    reason = err.strerror or type(err).__name__
    hint = " (check its permissions)" if isinstance(err, PermissionError) else ""
    return f"{err.filename}: cannot be read: {reason}{hint}."


class Unreadable(Exception):
    """An artifact that is not a readable text log; the message says why and what to do."""


def open_text_stream(artifact: Artifact) -> BinaryIO:
    """Open an artifact for streaming as raw bytes, transparently un-gzipping it.

    Raises `Unreadable` for missing permissions, binary content and pickles, with a message that
    says what the file looks like and which command reads it.
    """
    if artifact.path == STDIN:
        return sys.stdin.buffer
    try:
        raw: BinaryIO = open(artifact.path, "rb")  # noqa: SIM115 - the caller closes it
    except OSError as err:
        raise Unreadable(_describe_os_error(err)) from None
    head = raw.read(_SNIFF_BYTES)
    raw.seek(0)
    stream: BinaryIO = raw
    if head.startswith(_GZIP_MAGIC):
        stream = TolerantGunzip(raw)  # type: ignore[assignment]
        try:
            head = stream.peek(_SNIFF_BYTES)
        except zlib.error as err:
            raw.close()
            raise Unreadable(f"{artifact.path}: a gzip file that cannot be decompressed ({err}).") from None
    if not head:
        stream.close()
        raise Unreadable(f"{artifact.path}: the file is empty; was the log written to another path?")
    if _PICKLE_MAGIC.match(head):
        stream.close()
        raise Unreadable(
            f"{artifact.path}: a pickle, not a log (a flight-recorder dump or memory snapshot?); "
            "read it with `torchtriage fr` or `torchtriage memory`."
        )
    if b"\x00" in head:
        stream.close()
        raise Unreadable(f"{artifact.path}: binary data, not a text log; skipped.")
    return stream


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
