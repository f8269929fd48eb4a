"""The walk of a folder given: every file under it to examine, in natural order, what is not a file said.

A folder's entries are listed with their types (no call per file) and sorted by name, numbers as numbers; a link
is followed only to a regular file inside the folders given (one out of them is named, not read); a FIFO, socket
or device is named. A tree of many folders can also be cut into pieces, in the same order, whose subtrees are then
walked apart (on other cores: the sort of a million names costs seconds on one).
"""

from __future__ import annotations

import os
import re
import stat

from torchtriage.sources.streams import describe_os_error, inside_given, not_regular, outside

_DIGIT_RUNS = re.compile(r"(\d+)")
_PAST_ANY_RANK = 1 << 64


def natural_key(name: str) -> list[object]:
    """Numbers compare as numbers (rank2 before rank10); one too long to be a rank sorts after every other. The
    split alternates text and runs of digits, so the keys of two names compare text with text and numbers with
    numbers at every place (a text part made of other digits, "²", stays text). On every entry of a folder of a
    million: kept to a split and a loop over its numbers."""
    parts: list[object] = _DIGIT_RUNS.split(name)
    for at in range(1, len(parts), 2):
        run = parts[at]
        parts[at] = (int(run) if len(run) <= 18 else _PAST_ANY_RANK, run)  # type: ignore[arg-type]
    return parts


def _link(path: str, problems: list[str]) -> bool:
    """Whether the link at `path`, found in a folder, leads to a file to read. A link out of the folders given
    is named, not followed; one to a folder inside is not walked twice (its files are found where they are)."""
    target = os.path.realpath(path)
    try:
        mode = os.stat(target).st_mode
    except OSError:
        problems.append(f"{path}: a link to {target}, which does not exist; not read.")
        return False
    if not inside_given(target):
        problems.append(f"{path}: {outside(target, 'a folder' if stat.S_ISDIR(mode) else 'a file')}.")
        return False
    if stat.S_ISDIR(mode):
        return False
    if not stat.S_ISREG(mode):
        problems.append(f"{path}: a link to {not_regular(mode)}.")
        return False
    return True


def _entries_last_first(folder: str, problems: list[str]) -> list[os.DirEntry]:
    """A folder's entries that may matter (not hidden), in natural order from the last: the next one is popped."""
    try:
        with os.scandir(folder) as listing:
            entries = [entry for entry in listing if not entry.name.startswith(".")]
    except OSError as err:
        problems.append(describe_os_error(folder, err))
        return []
    # A folder's key ends with the separator, so that the walk lists paths in the order a sort of the whole
    # paths gives (run/rank1.log before run/rank1/, run/a2/ before run/a10.log), sorting only names.
    keyed = [(natural_key(e.name + os.sep if e.is_dir(follow_symlinks=False) else e.name), e) for e in entries]
    keyed.sort(key=lambda item: item[0], reverse=True)
    return [entry for _, entry in keyed]


# What an entry of a folder is to the walk.
FILE, SUBTREE, PROBLEM = "file", "subtree", "problem"


def _kind_of(entry: os.DirEntry, problems: list[str]) -> str | None:
    """FILE (to examine), SUBTREE (to walk), or None: not examined, with a problem where it matters."""
    if entry.is_dir(follow_symlinks=False):
        return SUBTREE
    if entry.is_file(follow_symlinks=False):
        return FILE
    if entry.is_symlink():
        return FILE if _link(entry.path, problems) else None
    try:
        problems.append(f"{entry.path}: {not_regular(entry.stat(follow_symlinks=False).st_mode)}.")
    except OSError as err:
        problems.append(describe_os_error(entry.path, err))
    return None


def walk(folder: str, problems: list[str]) -> list[str]:
    """Every file under `folder` to examine, in natural order; what is not a regular file is a problem, and so
    is a link out of the folders given."""
    found: list[str] = []
    pending = _entries_last_first(folder, problems)  # a folder's entries replace it: the order stays natural
    while pending:
        entry = pending.pop()
        kind = _kind_of(entry, problems)
        if kind == SUBTREE:
            pending += _entries_last_first(entry.path, problems)
        elif kind == FILE:
            found.append(entry.path)
    return found


def split(folder: str, wanted: int, levels: int = 3) -> list[tuple[str, str]]:
    """The walk of `folder` as pieces in its order: (FILE, path) found on the way, (PROBLEM, sentence) met, and
    (SUBTREE, path) left whole, each of which `walk` gives in its place. Folders are opened a level at a time
    until there are `wanted` subtrees or `levels` were opened."""
    pieces = [(SUBTREE, folder)]
    for _ in range(levels):
        subtrees = sum(kind == SUBTREE for kind, _ in pieces)
        if not subtrees or subtrees >= wanted:
            break
        opened: list[tuple[str, str]] = []
        for kind, value in pieces:
            if kind == SUBTREE:
                opened += _opened(value)
            else:
                opened.append((kind, value))
        pieces = opened
    return pieces


def _opened(folder: str) -> list[tuple[str, str]]:
    """One folder's entries as pieces, each problem where the walk would say it."""
    problems: list[str] = []
    pieces: list[tuple[str, str]] = []
    entries = _entries_last_first(folder, problems)
    while True:
        pieces += [(PROBLEM, problem) for problem in problems]
        problems.clear()
        if not entries:
            return pieces
        entry = entries.pop()
        kind = _kind_of(entry, problems)
        if kind is not None:
            pieces.append((kind, entry.path))
