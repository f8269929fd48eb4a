"""Byte streams that readers share: regular files only, inside the folders given, read up to their size.

Every reader opens its files here. A FIFO, socket or device is refused before anything waits on it, and so is a
file of the kernel's interfaces (/proc, /sys): some of them block forever (/proc/kmsg) or give away what is
not the job's (/proc/self/environ). A file found in a folder the user gave is read only where it lies inside
the folders given: a link out of them is named, not followed (a file named on the command line is read
wherever it leads: the user chose it). Every check is made on the open descriptor, so a file swapped after it
was listed is still caught. A file is read up to its size when it was opened: a log that a live job still
writes ends where it was. A gzip stream is inflated in bounded pieces, so a bomb stops at the limit instead
of after; and what comes out is counted against the byte budget of `limits` (a file read whole has a
smaller one than a stream).
"""

from __future__ import annotations

import errno
import functools
import io
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
# Opened without blocking, so that a FIFO with no writer cannot stall the open itself.
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)
# Filesystems that are the kernel's interfaces, not storage: none of their files is an artifact.
_KERNEL_FILESYSTEMS = frozenset(
    b"proc sysfs debugfs tracefs securityfs configfs cgroup cgroup2 bpf pstore efivarfs fusectl binfmt_misc "
    b"rpc_pipefs nfsd mqueue devpts devtmpfs".split()
)


class Refused(OSError):
    """A file torchtriage does not open or read: not a regular file, a kernel interface, or outside the folders
    given. Its `strerror` says which, for the user."""

    def __init__(self, reason: str) -> None:
        super().__init__(errno.EINVAL, reason)


def _kind_of(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def not_regular(mode: int) -> str:
    """What a file that is not a regular one is, said for the user."""
    return f"{_kind_of(mode)}, not a file; torchtriage reads only regular files (it would wait forever)"


KERNEL_FILE = (
    "a file of the kernel's interfaces (/proc, /sys), not an artifact; torchtriage never reads these (some "
    "block forever): save what it shows to a file and name that"
)


@functools.lru_cache(maxsize=1)
def _kernel_devices() -> frozenset[int]:
    """The device numbers of the kernel's interface filesystems mounted here (every file on one has its
    filesystem's number as `st_dev`): from /proc/self/mountinfo, else those of /proc and /sys."""
    devices = set()
    try:
        with open("/proc/self/mountinfo", "rb") as mounts:
            for line in mounts:
                fields = line.split()
                if b"-" in fields[:-1] and fields[fields.index(b"-") + 1] in _KERNEL_FILESYSTEMS:
                    major, _, minor = fields[2].partition(b":")
                    devices.add(os.makedev(int(major), int(minor)))
    except (OSError, ValueError, IndexError):
        pass
    try:
        storage = os.stat("/").st_dev
        devices.update(d for d in (os.stat(m).st_dev for m in ("/proc", "/sys") if os.path.isdir(m)) if d != storage)
    except OSError:
        pass
    return frozenset(devices)


def is_kernel_interface(status: os.stat_result) -> bool:
    """Whether a file (or folder) lies on one of the kernel's interface filesystems (/proc, /sys, ...)."""
    return status.st_dev in _kernel_devices()


# --- The folders given --------------------------------------------------------------------------------
# A path found by walking a folder the user gave lies under that folder as the walk wrote it; it may be read
# only where its real place (links followed) is inside one of the folders given. A file the user named is
# read wherever it leads. Kept for the process: readers reopen the paths discovery found, in this process or
# in its forked children.
_walked: set[str] = set()  # every folder walked, absolute, with a trailing separator
_given: set[str] = set()  # the real places of the folders given, with a trailing separator
_named: set[str] = set()  # every file named, absolute


def _with_separator(path: str) -> str:
    return path if path.endswith(os.sep) else path + os.sep


def give_folder(folder: str) -> None:
    """`folder` was given by the user: what is found in it is read only inside the folders given."""
    _walked.add(_with_separator(os.path.abspath(folder)))
    _given.add(_with_separator(os.path.realpath(folder)))


def give_file(path: str) -> None:
    """`path` was named by the user: it is read wherever it leads."""
    _named.add(os.path.abspath(path))


def inside_given(real: str) -> bool:
    """Whether a real path (links resolved) lies inside one of the folders given."""
    return any(_with_separator(real).startswith(folder) for folder in _given)


def found_in_folder(path: str) -> bool:
    """Whether `path` lies under a folder walked (and was not named itself): it is read only inside the folders
    given."""
    if not _walked:
        return False
    absolute = os.path.abspath(path)
    return absolute not in _named and any(absolute.startswith(folder) for folder in _walked)


def outside(target: str, what: str = "a file") -> str:
    """The reason a link out of the folders given is not followed."""
    return f"a link to {what} outside the folder given ({target}); not read — name the file itself to read it"


def unreadable(err: OSError) -> str:
    """Why a file cannot be read, for the user: what torchtriage refuses, or the system's reason."""
    if isinstance(err, Refused):
        return f"{err.strerror}."
    hint = " (check its permissions)" if isinstance(err, PermissionError) else ""
    return f"cannot be read: {err.strerror or type(err).__name__}{hint}."


def describe_os_error(path: str, err: OSError) -> str:
    return f"{path}: {unreadable(err)}"


def _check_status(status: os.stat_result) -> None:
    if stat.S_ISDIR(status.st_mode):
        raise IsADirectoryError(errno.EISDIR, "a folder")
    if not stat.S_ISREG(status.st_mode):
        raise Refused(not_regular(status.st_mode))
    if is_kernel_interface(status):
        raise Refused(KERNEL_FILE)


def _real_place(fd: int, path: str) -> str:
    """Where the open descriptor's file really is: the kernel's own answer, so nothing swapped since counts."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc (macOS): the path resolved now
        return os.path.realpath(path)


def _open_found(path: str) -> int:
    """Open a file found in a folder without following a link at its end; a link is followed only to a regular
    file inside the folders given, and opened there (the place checked is the place read)."""
    try:
        return os.open(path, _FLAGS | _NO_FOLLOW)
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.EMLINK):  # what O_NOFOLLOW gives for a link (Linux, BSD)
            raise
    target = os.path.realpath(path)
    if not inside_given(target):
        raise Refused(outside(target))
    _check_status(os.lstat(target))  # before opening: opening a device may act on it
    return os.open(target, _FLAGS | _NO_FOLLOW)


def open_fd(path: str, found: bool | None = None) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file at `path` (not set to block: reads of a regular file never wait), and
    its status taken once on that descriptor (its size is what will be read). `found`: whether the path was
    found in a folder given (None: look it up). Raises OSError: `Refused` says why a file is not read."""
    if found is None:
        found = found_in_folder(path)
    if found:
        fd = _open_found(path)
    else:
        _check_status(os.stat(path))  # before opening: opening a device may act on it
        fd = os.open(path, _FLAGS)
    try:
        status = os.fstat(fd)  # on the descriptor: a file swapped since it was listed is caught here
        _check_status(status)
        # An empty file has nothing to give away: a folder of 100,000 of them is not asked where each one is.
        if found and status.st_size and not inside_given(real := _real_place(fd, path)):
            raise Refused(outside(real))
        return fd, status
    except BaseException:
        os.close(fd)
        raise


_DIRECTORY = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_AT_FOLDER = os.open in os.supports_dir_fd


class FoundFiles:
    """Opens the files found in the folders given, one folder at a time, as `open_fd` would: the folder is
    opened once and where it really is asked once (the kernel's answer, on its descriptor), then each of its
    files is opened inside that descriptor without following a link at its end, so none can lead out of it. A
    folder of a million files is then not asked where each file is. A link, and any file where the folder could
    not be opened, goes the way of `open_fd` (which follows a link only inside the folders given, or says why
    not). Use one per process (a forked child opens its own folders) and close it when done."""

    def __init__(self) -> None:
        self._folder: str | None = None
        self._fd = -1

    def open(self, path: str) -> tuple[int, os.stat_result]:
        folder, name = os.path.split(path)
        if folder != self._folder:
            self._enter(folder)
        if self._fd < 0:
            return open_fd(path, True)
        try:
            fd = os.open(name, _FLAGS | _NO_FOLLOW, dir_fd=self._fd)
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.EMLINK):  # a link: followed only to a file inside the folders given
                return open_fd(path, True)
            raise
        try:
            status = os.fstat(fd)
            _check_status(status)
            return fd, status
        except BaseException:
            os.close(fd)
            raise

    def _enter(self, folder: str) -> None:
        self.close()
        self._folder = folder
        if not _AT_FOLDER or not _NO_FOLLOW:
            return
        try:
            fd = os.open(folder or ".", _DIRECTORY)
        except OSError:
            return  # each file then says why it cannot be opened
        if inside_given(_real_place(fd, folder)):
            self._fd = fd
        else:
            os.close(fd)  # swapped for a link out since the walk: each file is refused as open_fd refuses it

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._folder, self._fd = None, -1

    def __enter__(self) -> FoundFiles:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class _UpToSize(io.RawIOBase):
    """A file's bytes up to `size`: a file still being written ends where it was when it was opened."""

    def __init__(self, fd: int, size: int) -> None:
        self._file = io.FileIO(fd, "rb")
        self.size = size
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._file.fileno()

    def readinto(self, buffer) -> int:
        left = self.size - self._position
        if left <= 0:
            return 0
        with memoryview(buffer) as view:
            count = self._file.readinto(view[:left] if len(view) > left else view) or 0
        self._position += count
        return count

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_END:
            offset, whence = self.size + offset, os.SEEK_SET
        self._position = self._file.seek(offset, whence)
        return self._position

    def tell(self) -> int:
        return self._position

    def close(self) -> None:
        self._file.close()
        super().close()


class RegularFile(io.BufferedReader):
    """A regular file opened by `open_regular`; `size` is its size when opened, and no byte past it is read."""

    size: int


def open_regular(path: str) -> RegularFile:
    """Open a regular file for reading, up to its size now; anything else raises OSError saying what it is."""
    fd, status = open_fd(path)
    try:
        if hasattr(os, "set_blocking"):  # as files are for every other reader
            os.set_blocking(fd, True)
        raw = _UpToSize(fd, status.st_size)  # closes the descriptor from here on
    except BaseException:
        os.close(fd)
        raise
    stream = RegularFile(raw)
    stream.size = status.st_size
    return stream


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
        # A plain file is read in one call of its size when opened (one byte more, when that is past the budget,
        # shows it): reading in fixed pieces allocated and joined megabytes per file, three times the cost of
        # the read itself. A file still growing is read as it was when opened.
        data = raw.read(min(raw.size, budget.limit + 1))
        budget.take(len(data))
        return data, False
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
