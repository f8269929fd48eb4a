"""What one input may cost to read: one policy, applied by every reader.

Artifacts come from other machines, from jobs that died mid-write, from someone else's bug report. A
file that is small on disk can be huge once read: a gzip stream of zeros, a pickle that refers to one
object a billion times through its memo, JSON nested a million deep. Every reader counts what it reads
against these budgets as it goes, and a file past one is refused with what was exceeded and the flag that
raises it; the other files are still read.

The defaults fit the largest real artifacts with room to spare: flight-recorder dumps of a few MB each,
py-spy dumps and JSON reports of KBs, logs and profiler traces of several GB, memory snapshots of tens of
GB (those are streamed, so their budget bounds time, not memory).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace

__all__ = [
    "Limits", "LimitExceeded", "ByteBudget", "active", "using", "activate", "parse_limit", "describe_size",
    "seconds_for_size", "SIZES",
]  # fmt: skip


@dataclass(frozen=True)
class Limits:
    # Bytes one file read whole may hold after decompression (flight-recorder dumps, py-spy and
    # faulthandler dumps, JSON reports, layouts).
    bytes: int = 512 << 20
    # Bytes one streamed file may hold after decompression (logs, profiler traces, memory snapshots).
    stream_bytes: int = 64 << 30
    # Values a streamed pickle (a memory snapshot) may keep for later opcodes to refer back to: its memo.
    # (Pickles read whole are bounded by `bytes`; their shared references are never expanded: every field
    # is checked for its kind before anything walks it.)
    items: int = 200_000_000
    # Nesting depth of the containers of a pickle (real ones nest fewer than 10 deep); JSON is
    # bounded by the parser's own recursion limit.
    depth: int = 200
    # The largest rank number taken from a file (the largest real jobs have about 10^5 ranks): a world is
    # sometimes inferred as every rank up to the largest seen.
    rank: int = (1 << 20) - 1
    # Memory a reader of pickles (a child process: sources/isolated.py) may take beyond its size when it
    # starts: a 20,000-entry flight-recorder dump takes about 100 MB; memory snapshots are streamed.
    memory: int = 1 << 30
    # Seconds a reader may spend on one file, plus one second per 8 MB of it (a snapshot of 10 GB is read in
    # minutes; a dump of a few MB in milliseconds).
    seconds: int = 20
    # Values a pickle expands to when each shared reference is counted by what it refers to (a "billion
    # laughs" is small on disk and enormous once walked): genuine dumps expand to a few million.
    expansion: int = 50_000_000
    # Bytes the answers of every rank's debug server may hold together (`diagnose --store`), written into the
    # capture folder as they come: each answer is sure of an equal share and holds at most `bytes`. A rank's
    # stack is KBs, its flight recorder a few MB: 4 GB is about 4,000 ranks' worth.
    answers: int = 4 << 30


# The limits counted in bytes (written with K, M, G or T).
SIZES = ("bytes", "stream_bytes", "memory", "answers")
# Flag names as written on the command line: --limit stream-bytes=100G
_FLAG_NAMES = {f.name.replace("_", "-"): f.name for f in fields(Limits)}
_SIZE = re.compile(r"(?i)^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

_active = Limits()


class LimitExceeded(ValueError):
    """One input is past a budget. `what` says which and how far; `hint` gives the flag that raises it."""

    def __init__(self, what: str, limit_name: str, needed: int | None = None) -> None:
        """`needed`: the value the input holds (a rank), where the limit must reach it to read the file."""
        self.what = what
        self.limit_name = limit_name
        flag = limit_name.replace("_", "-")
        current = getattr(_active, limit_name)
        raised = max(current * 4, needed or 0)
        larger = _flag_size(raised) if limit_name in SIZES else f"{raised}"
        self.hint = f"raise the limit with --limit {flag}={larger} if the file is genuine"
        super().__init__(f"{what}: refused ({self.hint})")


def _flag_size(count: int) -> str:
    for unit, size in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if count >= size and count % size == 0:
            return f"{count // size}{unit}"
    return str(count)


def seconds_for_size(size: int) -> float:
    """The time a reader may take for a file of `size` bytes beyond the policy's `seconds`."""
    return size / (8 << 20)


def describe_size(count: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count} bytes"


def active() -> Limits:
    """The limits in force for this process (the defaults, or what the command line set)."""
    return _active


def activate(limits: Limits) -> None:
    global _active
    _active = limits


@contextlib.contextmanager
def using(limits: Limits) -> Iterator[Limits]:
    previous = _active
    activate(limits)
    try:
        yield limits
    finally:
        activate(previous)


def parse_limit(text: str, base: Limits | None = None) -> Limits:
    """`NAME=VALUE` (bytes, stream-bytes, memory: a size like 2G; the others: a count) over `base`.

    Raises ValueError with a message for the user."""
    base = base or _active
    name, sep, value = text.partition("=")
    key = _FLAG_NAMES.get(name.strip().lower())
    if not sep or key is None:
        raise ValueError(f"--limit {text}: give NAME=VALUE, NAME one of {', '.join(_FLAG_NAMES)}")
    match = _SIZE.match(value)
    if not match:
        raise ValueError(f"--limit {text}: {value!r} is not a number (sizes may end in K, M, G or T)")
    number = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if number < 1:
        raise ValueError(f"--limit {text}: must be at least 1")
    return replace(base, **{key: number})


class ByteBudget:
    """Counts the bytes a reader takes from one file (after decompression) against a limit."""

    __slots__ = ("what", "limit_name", "limit", "used")

    def __init__(self, what: str = "it", streamed: bool = False) -> None:
        self.what = what
        self.limit_name = "stream_bytes" if streamed else "bytes"
        self.limit = getattr(_active, self.limit_name)
        self.used = 0

    def take(self, count: int) -> None:
        self.used += count
        if self.used > self.limit:
            what = f"{self.what} holds more than {describe_size(self.limit)} after decompression"
            raise LimitExceeded(what, self.limit_name)
