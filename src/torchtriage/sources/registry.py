"""The one source registry: every kind of artifact torchtriage reads, recognised by its content.

Each kind is declared once — what it is, how its first bytes (un-gzipped) give it away, which verb
reads it on its own, and whether a trailing number in its name is a rank — and one discovery walks the
paths of every verb: files, folders (recursively), gzip and standard input. A file named on the command
line is read as what it is, never as what the verb expected; what a verb does not read is listed with
the verb that does. Only regular files are opened: a FIFO, socket or device would block or never end.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import sys
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import BinaryIO

from torchtriage.model import SourceKind
from torchtriage.protocol import BACKSTOP_PREFIX
from torchtriage.sources import folder_walk
from torchtriage.sources.fields import as_int
from torchtriage.sources.forked import can_fork, map_forked, usable_cores
from torchtriage.sources.limits import ByteBudget
from torchtriage.sources.streams import (
    GZIP_MAGIC,
    KERNEL_FILE,
    Budgeted,
    FoundFiles,
    Replay,
    TolerantGunzip,
    describe_os_error,
    found_in_folder,
    give_file,
    give_folder,
    is_kernel_interface,
    open_fd,
    open_regular,
    unreadable,
)

STDIN = "-"
HEAD_BYTES = 8192
_PICKLE = re.compile(rb"\A\x80[\x02-\x05]")
_FIRST_BYTE = re.compile(rb"\s*(.)", re.DOTALL)
_PYSPY_TEXT = re.compile(rb"\A\s*Process \d+: .*\n\s*Python v\d", re.MULTILINE)
# A dump starts with its header: after a fatal error's or a timeout's first line, a thread's (or the stack's).
_FAULTHANDLER = re.compile(
    rb"\A\s*(?:(?:Fatal Python error: |Timeout \().*\n+)?"
    rb"(?:(?:Current thread|Thread) 0x[0-9a-fA-F]+[^\n]*|Stack) \(most recent call first\):"
)
_NVIDIA_SMI = re.compile(rb"^\s*(?:\+ nvidia-smi |Link \d+: |GPU \d+: .*\(UUID: )", re.MULTILINE)
_OWN_TEXT = (b"verdict   ", b"requested by torchtriage ")
# Schemas of torchtriage's records that are evidence, each holding its sentence in "line":
# runtime/nonfinite_verdict.py (nonfinite.jsonl), runtime/straggler.py (monitor/stragglers.jsonl) and
# `torchtriage run`'s record of how the job ended (run-exit.json, sources/run_exit.py).
_READ_AS_LOGS = (b"nonfinite", b"straggler", b"run_exit")
_DOCUMENTS = (".md", ".rst", ".html", ".htm", ".svg", ".png", ".jpg", ".jpeg", ".pdf")
_SOURCE_CODE = (".py", ".sh", ".cfg", ".toml", ".yaml", ".yml")

# Per-rank files come with any naming: rank3.log, rank_03.txt, proc-3.out, log.rank3, node1-rank12.err. Not
# "worker-N": Kubeflow's PyTorchJob names its pods <job>-worker-<n> and DeepSpeed's hostfiles name hosts worker-<n>,
# one per node, each holding many ranks; a file named after one is a node's.
_RANK_WORD = re.compile(r"(?:^|[^a-z])(?:rank|proc|process)[-_.]?(\d{1,12})(?!\d)", re.IGNORECASE)
# torchrun --log-dir writes <dir>/<run_id>/attempt_<n>/<local_rank>/{stdout,stderr}.log
_TORCHRUN_LAYOUT = re.compile(r"attempt_\d+[/\\](\d{1,12})[/\\](?:stdout|stderr|error)\.(?:log|json)$")
# Dumps and traces written as <prefix><rank>: nccl_trace_rank_3, comm_lib_trace_3, trace.3.json.gz
_TRAILING_NUMBER = re.compile(r"(?<!\d)(\d{1,12})(?:\.(?:pkl|pickle|json|bin|gz|pt|trace))*$", re.IGNORECASE)


@dataclass(frozen=True)
class Head:
    """What sniffing sees of an artifact: its name and first bytes, un-gzipped."""

    name: str
    data: bytes
    compressed: bool

    @functools.cached_property
    def text_start(self) -> bytes:
        """The first byte after ASCII white space (b"" for none), found without copying the head."""
        found = _FIRST_BYTE.match(self.data)
        return found.group(1) if found else b""

    def has(self, *keys: bytes, within: int = HEAD_BYTES) -> bool:
        return any(key in self.data[:within] for key in keys)


@dataclass(frozen=True)
class SourceType:
    kind: SourceKind
    what: str  # "a py-spy stack dump", for messages
    read_by: str  # the verb that reads it on its own
    sniff: Callable[[Head], bool]
    trailing_number_is_rank: bool = False
    # The bytes its first byte after ASCII white space may be (empty: any): a kind that cannot start so is not
    # asked, which spares a folder of a million logs a dozen sniffs each. Each is what its sniff requires.
    starts_with: bytes = b""


def _is_pickle(head: Head) -> bool:
    return bool(_PICKLE.match(head.data))


def _is_json_object(head: Head) -> bool:
    return head.text_start == b"{"


def _json_list_of_objects(head: Head) -> bool:
    return bool(re.match(rb"\s*\[\s*(\{|\])", head.data))


def _is_text(head: Head) -> bool:
    return b"\x00" not in head.data or _text_with_holes(head.data)


# Bytes text holds: printable ASCII, tab, line ends, form feed, backspace, ANSI escapes, and every byte of
# UTF-8's (or Latin-1's) non-ASCII characters.
_TEXT_BYTES = bytes(range(32, 127)) + b"\t\n\r\x08\x0c\x1b" + bytes(range(128, 256))
_NUL_RUN = re.compile(rb"\x00+")
_HOLE_BYTES = 16  # NULs shorter than this on average are a binary format's fields, not an unwritten stretch


def _text_with_holes(data: bytes) -> bool:
    """Text with NUL bytes in it: unwritten stretches (a file extended but never written there, as a node's
    crash leaves a log on a shared file system: its size was recorded, its last blocks not), which come in long
    runs, or a stray NUL or two a program printed (at most one byte in a hundred). Either way what lies between
    them is text; a binary format's NULs are many and short, among control bytes."""
    rest = data.replace(b"\x00", b"")
    if not rest.strip():
        return False
    nuls = len(data) - len(rest)
    if nuls < _HOLE_BYTES * len(_NUL_RUN.findall(data)) and nuls * 100 > len(data):
        return False
    return len(rest.translate(None, _TEXT_BYTES)) * 100 <= len(rest)


def _profiler_trace(head: Head) -> bool:
    keys = (b'"traceEvents"', b'"schemaVersion"', b'"distributedInfo"', b'"deviceProperties"')
    return _is_json_object(head) and head.has(*keys)


def _flight_recorder(head: Head) -> bool:
    keys = (b"entries", b"pg_config", b"pg_status")
    if _is_pickle(head):
        return head.has(*keys, within=4096) and not head.has(b"segments", b"device_traces", within=256)
    return _is_json_object(head) and head.has(*(b'"' + k + b'"' for k in keys))


def _memory_snapshot(head: Head) -> bool:
    return _is_pickle(head) and head.has(b"segments", b"device_traces", within=256)


def _memory_timeline(head: Head) -> bool:
    # profile.export_memory_timeline: [[times...], [[sizes per category]...]]: numbers, no keys at all.
    return bool(re.match(rb"\s*\[\s*\[\s*-?\d", head.data))


def _pyspy(head: Head) -> bool:
    if _json_list_of_objects(head):
        return head.has(b'"thread_id"', b'"frames"') or bool(re.match(rb"\s*\[\s*\]\s*\Z", head.data))
    return bool(_PYSPY_TEXT.match(head.data))


def _faulthandler(head: Head) -> bool:
    return bool(_FAULTHANDLER.match(head.data))


# PyTorch's debug server's periodic dump of every rank's stack (sources/debug_server_dumps.py)
_DEBUG_SERVER_STACKS = re.compile(
    rb"\A(?:PARTIAL DATA: \d+/\d+ workers responded\n)?[^\0]{0,4096}?^=== Rank \d+: ", re.MULTILINE
)


def _debug_server_stacks(head: Head) -> bool:
    return head.data.startswith((b"=== Rank ", b"PARTIAL DATA: ")) and bool(_DEBUG_SERVER_STACKS.match(head.data))


def _nvidia(head: Head) -> bool:
    if _is_json_object(head):
        return head.has(b'"gpus"') and head.has(b'"driver"', b'"nvml"')
    return _is_text(head) and bool(_NVIDIA_SMI.search(head.data)) and not head.has(b"Traceback (most recent")


def _own_schema(head: Head) -> bytes | None:
    found = re.search(rb'"schema"\s*:\s*"torchtriage\.([a-z_]+)', head.data[:512]) if _is_json_object(head) else None
    return found.group(1) if found else None


def _record_read_as_log(head: Head) -> bool:
    """The guard's nonfinite.jsonl, the monitor's stragglers.jsonl and run's run-exit.json are evidence, not
    output: each record holds the sentence that was logged ("line"), so the file is read as a log, one record a
    line."""
    return _own_schema(head) in _READ_AS_LOGS


def _identity(head: Head) -> bool:
    """A rank's record of where it runs (runtime/identity.py writes it; sources/identity.py reads it)."""
    return _own_schema(head) == b"identity"


def _torchtriage_output(head: Head) -> bool:
    if _is_json_object(head):
        return _own_schema(head) is not None and not _record_read_as_log(head) and not _identity(head)
    return head.data.lstrip().startswith(_OWN_TEXT)


def _document(head: Head) -> bool:
    """Notes, pages, pictures and source code are not evidence; their name and content say so together."""
    if head.name.lower().endswith(_DOCUMENTS):
        return True
    stripped = head.data.lstrip()
    return head.name.endswith(_SOURCE_CODE) and not stripped.startswith((b"[", b"{")) and _is_text(head)


def _log(head: Head) -> bool:
    return _is_text(head) and not _is_pickle(head)


# Tried in this order: the most specific first; any other text is a log.
SOURCE_TYPES: tuple[SourceType, ...] = (
    SourceType(
        SourceKind.IDENTITY, "a rank's identity record (its host, pid and GPU)", "diagnose", _identity, False, b"{"
    ),
    SourceType(SourceKind.TORCHTRIAGE_OUTPUT, "torchtriage's own output", "", _torchtriage_output, False, b"{vr"),
    SourceType(SourceKind.MEMORY_SNAPSHOT, "a CUDA memory snapshot", "memory", _memory_snapshot, False, b"\x80"),
    # A trace's distributedInfo holds a pg_config too: the trace's own keys decide first.
    SourceType(SourceKind.PROFILER_TRACE, "a profiler trace", "trace", _profiler_trace, True, b"{"),
    SourceType(SourceKind.FLIGHT_RECORDER, "a flight-recorder dump", "fr", _flight_recorder, True, b"{\x80"),
    SourceType(
        SourceKind.MEMORY_TIMELINE, "a memory timeline (export_memory_timeline)", "", _memory_timeline, False, b"["
    ),
    SourceType(SourceKind.PYSPY, "a py-spy stack dump", "diagnose", _pyspy, False, b"[P"),
    SourceType(SourceKind.FAULTHANDLER, "a faulthandler stack dump", "diagnose", _faulthandler, False, b"FTCS"),
    SourceType(
        SourceKind.DEBUG_SERVER_STACKS,
        "a debug server's dump of every rank's stack",
        "diagnose",
        _debug_server_stacks,
        False,
        b"=P",
    ),
    SourceType(SourceKind.NVIDIA, "nvidia-smi or NVML output", "nvlink --from", _nvidia),
    SourceType(SourceKind.DOCUMENT, "a document or source file", "", _document),
    SourceType(SourceKind.LOG, "a log", "triage", _log),
)
# What is none of the above, told apart only to say it well.
_UNKNOWN_PICKLE = SourceType(
    SourceKind.UNKNOWN,
    "a pickle, not a log, and by its first keys neither a flight-recorder dump (`torchtriage fr`) nor a memory "
    "snapshot (`torchtriage memory`)",
    "",
    _is_pickle,
    False,
    b"\x80",
)


# What the first byte after ASCII white space may be where the text, stripped of Unicode white space (the
# separators U+001C..U+001F too), starts with a bracket; a byte past ASCII may start white space (U+00A0).
_MAY_START_JSON = (b"{", b"[", b"\x1c", b"\x1d", b"\x1e", b"\x1f")


def _json_document(head: Head) -> bool:
    """One JSON document, as far as its first bytes go: not JSON lines (a log), nor a log line that
    happens to start with a bracket ("[rank3]: ...", "[1,3]<stderr>: ..."). A `.json` file that starts
    like JSON is JSON, however broken (its reader says where)."""
    if head.text_start not in _MAY_START_JSON and head.text_start < b"\x80":
        return False  # decided without decoding the head: most files of a folder are not JSON
    text = head.data.decode("utf-8", errors="replace").lstrip()
    if text[:1] not in ("{", "[") or _record_read_as_log(head):
        return False
    if head.name.lower().endswith((".json", ".json.gz")):
        return True
    try:
        _, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as err:
        # A document longer than the head ends mid-value: the error is at the cut, or in a cut string.
        return err.pos > len(text) // 2 or err.msg.startswith("Unterminated string")
    return not text[end:].strip()


_UNKNOWN_JSON = SourceType(SourceKind.UNKNOWN, "a JSON document of no kind torchtriage reads", "", _json_document)
_BINARY = SourceType(SourceKind.UNKNOWN, "binary data, not a text log", "", lambda head: True)
BY_KIND = {t.kind: t for t in SOURCE_TYPES} | {SourceKind.UNKNOWN: _BINARY}
# JSON that no kind claims is not a log; a pickle that none claims is named as a pickle.
_LAST = (SourceKind.DOCUMENT, SourceKind.LOG)
_SNIFF_ORDER = (
    *(t for t in SOURCE_TYPES if t.kind not in _LAST),
    _UNKNOWN_JSON,
    *(BY_KIND[kind] for kind in _LAST),
    _UNKNOWN_PICKLE,
)


@functools.cache
def _may_be(first: bytes) -> tuple[tuple[int, SourceType], ...]:
    """The kinds, with their places in _SNIFF_ORDER, that a head whose first byte after white space is `first`
    may be, in order."""
    return tuple(
        (index, kind)
        for index, kind in enumerate(_SNIFF_ORDER)
        if not kind.starts_with or (first and first in kind.starts_with)
    )


def _sniff_index(head: Head) -> int:
    """Where the kind of an artifact is in _SNIFF_ORDER (-1: binary data)."""
    return next((index for index, kind in _may_be(head.text_start) if kind.sniff(head)), -1)


def _type_at(index: int) -> SourceType:
    return _SNIFF_ORDER[index] if index >= 0 else _BINARY


def sniff(head: Head) -> SourceType:
    """The kind of an artifact from its first bytes (and, for documents, its name)."""
    return _type_at(_sniff_index(head))


def rank_from_name(path: str, kind: SourceKind | None = None) -> int | None:
    """The rank a file's name or place implies: torchrun's log layout, a rank word, or — for dumps and
    traces written as `<prefix><rank>` — a trailing number."""
    match = _TORCHRUN_LAYOUT.search(path)
    if match:
        return as_int(match.group(1), None)
    name = os.path.basename(path)
    words = _RANK_WORD.findall(name)
    if words:
        return as_int(words[-1], None)
    if kind is not None and BY_KIND[kind].trailing_number_is_rank:
        match = _TRAILING_NUMBER.search(name)
        return as_int(match.group(1), None) if match else None
    return None


@dataclass(frozen=True)
class Input:
    """One artifact to read: a regular file, or standard input."""

    path: str
    type: SourceType
    compressed: bool
    rank: int | None  # what its name implies; a loader may read a better one from the content
    named: bool = True  # named by the user, not found in a folder
    # A small log's whole content, read when it was sniffed: a folder of a million files is opened once.
    content: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def kind(self) -> SourceKind:
        return self.type.kind

    @property
    def display(self) -> str:
        return "<stdin>" if self.path == STDIN else self.path


def log_input(name: str) -> Input:
    """An input read as a log whatever it holds (text in memory, for tests and notebooks)."""
    return Input(name, BY_KIND[SourceKind.LOG], False, None)


class _Stdin:
    """Standard input, read once: its first bytes are kept for sniffing and replayed to the reader."""

    head: bytes | None = None

    @classmethod
    def peek(cls) -> bytes:
        if cls.head is None:
            cls.head = sys.stdin.buffer.read(HEAD_BYTES)
        return cls.head

    @classmethod
    def stream(cls) -> BinaryIO:
        return Replay(cls.peek(), sys.stdin.buffer)


def _decompressed_head(raw: bytes) -> bytes:
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw, HEAD_BYTES)
    except zlib.error:
        return b""


def _head_of(name: str, raw: bytes) -> Head:
    if raw.startswith(GZIP_MAGIC):
        return Head(name, _decompressed_head(raw), True)
    return Head(name, raw, False)


EMPTY = "the file is empty (nothing was written to it, or it was cut off)."


def _unfired_backstop(path: str, reason: str) -> bool:
    """The watchdog's faulthandler backstop, found empty in a folder: it never had to fire (protocol.py)."""
    # The prefix anywhere in the path first: a folder of 400,000 empty files is not cut into names.
    return reason == EMPTY and BACKSTOP_PREFIX in path and os.path.basename(path).startswith(BACKSTOP_PREFIX)


# What sniffing a file gives: its kind (an index in _SNIFF_ORDER, -1: binary), whether it is gzip, its rank, and a
# small log's whole content (see _Carry); or why it is not read. Plain data: the results of a folder of thousands
# come back pickled from children.
_Sniffed = tuple[int, bool, int | None, bytes | None]

# The most bytes of small logs that sniffing keeps for their reader, in all: up to this much, a folder of tiny
# logs is opened once; past it, each log is opened again when it is read.
CARRIED_BYTES = 64 << 20


class _Carry:
    """What is left of one process's share of CARRIED_BYTES. Each forked child spends its own copy, so the
    shares of every process together stay within the whole."""

    def __init__(self, share: int) -> None:
        self.left = share

    def take(self, data: bytes) -> bytes | None:
        if len(data) > self.left:
            return None
        self.left -= len(data)
        return data


_NO_CARRY = _Carry(0)


def _sniff_file(
    path: str, found: bool | None = None, carry: _Carry = _NO_CARRY, opened: FoundFiles | None = None
) -> _Sniffed | str:
    """What a regular file is, from its first bytes (read from the descriptor whose size was taken), or why it
    is not read. `found`: whether it was found in a folder given (None: look it up), then opened by `opened`; a
    log read whole here is kept while `carry` allows."""
    try:
        fd, status = opened.open(path) if opened is not None else open_fd(path, found)
    except OSError as err:
        return unreadable(err)
    try:
        raw = os.read(fd, min(status.st_size, HEAD_BYTES)) if status.st_size else b""
    except OSError as err:
        return unreadable(err)
    finally:
        os.close(fd)
    if not raw:
        return EMPTY
    head = _head_of(os.path.basename(path), raw)
    if head.compressed and not head.data:
        return "a gzip file that cannot be decompressed."
    index = _sniff_index(head)
    kind = _type_at(index).kind
    whole = kind == SourceKind.LOG and not head.compressed and len(raw) == status.st_size
    return index, head.compressed, rank_from_name(path, kind), carry.take(raw) if whole else None


def _input_of(path: str, sniffed: _Sniffed, named: bool) -> Input:
    index, compressed, rank, content = sniffed
    return Input(path, _type_at(index), compressed, rank, named, content)


def _examine(path: str, problems: list[str], named: bool) -> Input | None:
    """The Input a regular file makes, or None (with a problem when it matters)."""
    sniffed = _sniff_file(path)
    if isinstance(sniffed, str):
        problems.append(f"{path}: {sniffed}")
        return None
    return _input_of(path, sniffed, named)


# Below this many files, forking costs more than sniffing them here.
_FORK_FROM = 2048


def _sniff_found(path: str, carry: _Carry, opened: FoundFiles) -> _Sniffed | str:
    return _sniff_file(path, True, carry, opened)


def _sniff_all(files: list[str], carry: _Carry) -> list[_Sniffed | str]:
    """Each file of a folder sniffed; a folder of thousands (a rank's stack and dump each) on every core."""
    jobs = usable_cores()
    with FoundFiles() as opened:
        if jobs > 1 and len(files) >= _FORK_FROM and can_fork():
            share = _Carry(carry.left // jobs)
            return map_forked(partial(_sniff_found, carry=share, opened=opened), files, jobs)
        return [_sniff_found(f, carry, opened) for f in files]


_Walked = tuple[list[str], list[_Sniffed | str], list[str]]  # files, each one's sniff, the walk's problems


def _walked_and_sniffed(folder: str) -> _Walked:
    """Every file under `folder` to examine, in natural order, each sniffed, and the walk's problems. A tree of
    many folders is cut into subtrees, each walked and sniffed whole by one core (the sort of a million names is
    as costly as their sniffing); the files met on the way are sniffed as a folder's files are."""
    jobs = usable_cores()
    carry = _Carry(CARRIED_BYTES)
    if jobs < 2 or not can_fork():
        return _walk_and_sniff(folder, carry)
    pieces = folder_walk.split(folder, wanted=jobs * 4)
    subtrees = [value for kind, value in pieces if kind == folder_walk.SUBTREE]
    loose = [value for kind, value in pieces if kind == folder_walk.FILE]
    if len(subtrees) > 1:  # each process spends its share; the few files met on the way are opened again
        here_only = partial(_walk_and_sniff, carry=_Carry(carry.left // jobs), here_only=True)
        each: Iterable[_Walked] = map_forked(here_only, subtrees, jobs)
    else:
        each = [_walk_and_sniff(subtree, carry) for subtree in subtrees]
    walked = dict(zip(subtrees, each, strict=True))
    # The whole carry only where no subtree took from it (each process's share is its own copy): else none.
    sniffed_loose = dict(zip(loose, _sniff_all(loose, carry if not subtrees else _NO_CARRY), strict=True))
    files: list[str] = []
    sniffed: list[_Sniffed | str] = []
    problems: list[str] = []
    for kind, value in pieces:
        if kind == folder_walk.FILE:
            files.append(value)
            sniffed.append(sniffed_loose[value])
        elif kind == folder_walk.SUBTREE:
            more_files, more_sniffed, more_problems = walked[value]
            files += more_files
            sniffed += more_sniffed
            problems += more_problems
        else:
            problems.append(value)
    return files, sniffed, problems


def _walk_and_sniff(folder: str, carry: _Carry, here_only: bool = False) -> _Walked:
    """The walk of `folder` and each file's sniff, on every core, or in this process alone (`here_only`: what each
    core does with its subtrees)."""
    problems: list[str] = []
    files = folder_walk.walk(folder, problems)
    if not here_only:
        return files, _sniff_all(files, carry), problems
    with FoundFiles() as opened:
        return files, [_sniff_found(f, carry, opened) for f in files], problems


# Past this many files alike (empty, of no kind read here), the rest are counted, not listed one a line.
LISTED_ALIKE = 5


def fold_alike(problems: list[tuple[str, str]]) -> list[str]:
    """(path, reason) pairs as lines: each reason once with the first few paths and the count of the rest,
    where more than LISTED_ALIKE files share it (a folder of 100,000 empty files is one line, not 100,000)."""
    by_reason: dict[str, list[str]] = {}
    for path, reason in problems:
        by_reason.setdefault(reason, []).append(path)
    lines = []
    for reason, paths in by_reason.items():
        if len(paths) <= LISTED_ALIKE:
            lines += [f"{path}: {reason}" for path in paths]
        else:
            shown = ", ".join(paths[:3])
            lines.append(f"{shown} and {len(paths) - 3:,} more files, each: {reason}")
    return lines


def _discover_folder(folder: str, problems: list[str]) -> list[Input]:
    try:
        if is_kernel_interface(os.stat(folder)):
            problems.append(f"{folder}: a folder of {KERNEL_FILE.removeprefix('a file of ')}.")
            return []
    except OSError as err:
        problems.append(describe_os_error(folder, err))
        return []
    files, sniffs, walk_problems = _walked_and_sniffed(folder)
    found: list[Input] = []
    alike: list[tuple[str, str]] = []
    for path, sniffed in zip(files, sniffs, strict=True):
        if isinstance(sniffed, str):
            if not _unfired_backstop(path, sniffed):
                alike.append((path, sniffed))
        else:
            found.append(_input_of(path, sniffed, named=False))
    problems += walk_problems + fold_alike(alike)
    if not found:
        problems.append(f"{folder}: the folder holds no file torchtriage can read.")
    return found


def discover(paths: Iterable[str], problems: list[str]) -> list[Input]:
    """Every artifact under `paths`, each with its kind; what cannot be read is added to `problems`.

    A file found in a folder is read only inside the folders given (a link out is named, not followed); a file
    named is read wherever it leads. Neither is read if it is not a regular file or is the kernel's (/proc)."""
    paths = list(paths)
    for path in paths:
        if path != STDIN and not os.path.isdir(path) and not found_in_folder(path):
            give_file(path)  # a path found in a folder earlier, discovered again, stays inside the folders given
    for path in paths:
        if path != STDIN and os.path.isdir(path):
            give_folder(path)
    inputs: list[Input] = []
    for path in paths:
        if path == STDIN:
            raw = _Stdin.peek()
            if not raw:
                problems.append("standard input is empty: nothing was piped in.")
                continue
            head = _head_of("<stdin>", raw)
            kind = sniff(head)
            if kind.kind != SourceKind.LOG:  # only logs are streamed; every other reader opens a file by its path
                by = f" (`torchtriage {kind.read_by}` reads it)" if kind.read_by else ""
                problems.append(
                    f"standard input holds {kind.what}{by}, which torchtriage reads only from a file: save it to "
                    "a file and name that (logs alone are read from standard input)."
                )
                continue
            inputs.append(Input(STDIN, kind, head.compressed, None))
        elif os.path.isdir(path):
            inputs += _discover_folder(path, problems)
        elif os.path.lexists(path):
            found_input = _examine(path, problems, named=True)
            if found_input is not None:
                inputs.append(found_input)
        else:
            problems.append(f"{path}: no such file or folder; check the path.")
    return inputs


def open_input(item: Input) -> BinaryIO:
    """The artifact's content as a binary stream, un-gzipped (a cut-off gzip yields what it holds), its bytes
    counted against the budget for streamed files."""
    if item.content is not None:
        raw: BinaryIO = io.BytesIO(item.content)
    else:
        raw = _Stdin.stream() if item.path == STDIN else open_regular(item.path)
    stream = TolerantGunzip(raw) if item.compressed else raw
    return Budgeted(stream, ByteBudget("it", streamed=True))  # type: ignore[return-value,arg-type]


def for_reader(inputs: Iterable[Input], kind: SourceKind, problems: list[str]) -> list[str]:
    """The paths a reader of `kind` reads: that kind, and what no kind claims (a cut or corrupt file: the
    reader then says precisely what is wrong with it). A named file of another kind is a problem."""
    chosen = []
    for item in inputs:
        if item.kind in (kind, SourceKind.UNKNOWN):
            chosen.append(item.path)
        elif item.named:
            by = f"; `torchtriage {item.type.read_by}` reads it" if item.type.read_by else ""
            problems.append(f"{item.display}: this is {item.type.what}, not {BY_KIND[kind].what}{by}.")
    return chosen


def not_read_here(inputs: Iterable[Input], reads: Iterable[SourceKind]) -> list[str]:
    """What a verb does not read, as problems: each file named or of no known kind on its own line, the
    files of another kind found in folders counted, each with the verb that reads them."""
    # Identity records say where ranks ran, not what failed: every verdict reads them for its culprit's machine.
    wanted = set(reads) | {SourceKind.TORCHTRIAGE_OUTPUT, SourceKind.DOCUMENT, SourceKind.IDENTITY}
    lines: list[str] = []
    unknown: list[tuple[str, str]] = []  # of no kind, found in folders: the first few named, the rest counted
    counts: dict[SourceKind, int] = {}
    for item in inputs:
        if item.kind in wanted:
            continue
        if item.named or item.kind == SourceKind.UNKNOWN:
            by = f"; `torchtriage {item.type.read_by}` reads it" if item.type.read_by else ""
            if item.named:
                lines.append(f"{item.display}: {item.type.what}{by}; not read here.")
            else:
                unknown.append((item.display, f"{item.type.what}{by}; not read here."))
        else:
            counts[item.kind] = counts.get(item.kind, 0) + 1
    lines += fold_alike(unknown)
    if counts:
        parts = []
        for kind, count in counts.items():
            kind_type = BY_KIND[kind]
            them = "it" if count == 1 else "them"
            by = f" (`torchtriage {kind_type.read_by}` reads {them})" if kind_type.read_by else ""
            parts.append(f"{count} × {kind_type.what}{by}")
        lines.append("not read here: " + "; ".join(parts))
    return lines
