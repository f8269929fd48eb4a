"""Stall episodes: how the watchdogs of one job agree, through its c10d store, on which stall they dump for.

A job may stall more than once: a rank pauses for a long checkpoint and resumes, then another rank hangs
for good. Each stall is an episode, numbered in the store: the first rank to stall claims the next number
(one compare-and-set, so two ranks stalling together share one episode), sets that episode's wake-up key
(every rank's listener waits on the next one) and every rank dumps once per episode. Episode N's files
replace episode N-1's in the hang folder: the claimant first moves the earlier files into
`hang/.earlier/<time>/` (a dot folder, which the readers skip, so no verdict ever fuses two episodes), and
the others wait for that move before they write.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

from torchtriage.protocol import REQUEST_FILE, make_private_folders, new_private_folder
from torchtriage.protocol import WATCHDOG_STORE_PREFIX as STORE_PREFIX

EARLIER_SUBDIR = ".earlier"
_ARCHIVE_WAIT = timedelta(seconds=10)  # how long a joining rank waits for the claimant's move
_KEPT = (REQUEST_FILE,)  # never moved: diagnose's request, which it removes itself
_KEPT_PREFIX = ("faulthandler-",)  # the backstop's open files: faulthandler keeps writing to them


def run_prefix() -> str:
    """Per torchelastic run and restart: an episode of an earlier attempt does not fire in the next."""
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"{STORE_PREFIX}{run}/{restart}/"


def wake_key(episode: int) -> str:
    """The key the claimant of `episode` sets in the root of the job's store, waking every listener."""
    return f"{run_prefix()}wake/{episode}"


def current_episode(shared) -> int:
    """The number of the latest episode claimed (0: none yet)."""
    return int(shared.add(STORE_PREFIX + "episode", 0))


def claim_episode(shared, seen: int) -> tuple[int, bool]:
    """The episode after `seen`, and whether this rank claimed it (moves the earlier files) or joins it.

    compare_set makes one number of two ranks that stall at once; an `add` on the episode's own key tells
    the one rank that claimed it."""
    current = shared.compare_set(STORE_PREFIX + "episode", str(seen), str(seen + 1))
    episode = int(current.decode() if isinstance(current, bytes) else current)
    return episode, int(shared.add(f"{STORE_PREFIX}{episode}/claimed", 1)) == 1


def archive_earlier(folder: Path) -> Path | None:
    """Move the files of an earlier episode (or an earlier attempt) out of `folder`; where they went."""
    try:
        entries = [e for e in folder.iterdir() if not e.name.startswith(".") and not _kept(e.name)]
    except OSError:
        return None
    if not entries:
        return None
    target = _new_earlier_folder(folder / EARLIER_SUBDIR)
    for entry in entries:
        try:
            os.replace(entry, target / entry.name)
        except OSError:
            continue  # another rank's file being replaced right now: it stays, the move goes on
    return target


def _new_earlier_folder(earlier: Path) -> Path:
    """A new folder in `earlier`, named by the time: private (0700), as the stacks moved into it are."""
    make_private_folders(earlier)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    suffix = 0
    while True:
        target = earlier / (f"{stamp}-{suffix}" if suffix else stamp)
        try:
            new_private_folder(target)
            return target
        except FileExistsError:
            suffix += 1  # an earlier stall in the same second


def _kept(name: str) -> bool:
    return name in _KEPT or name.startswith(_KEPT_PREFIX)


def mark_archived(shared, episode: int) -> None:
    shared.set(f"{STORE_PREFIX}{episode}/archived", "1")


def wait_archived(shared, episode: int) -> None:
    """Wait (bounded) until the claimant of `episode` has moved the earlier files; a claimant that died
    first costs this rank the wait only."""
    try:
        shared.wait([f"{STORE_PREFIX}{episode}/archived"], _ARCHIVE_WAIT)
    except Exception:  # noqa: BLE001 - a timeout: write anyway, the claimant is gone
        pass


def announce(shared, root, episode: int, rank: int | None, stalled: bool) -> None:
    """This rank has dumped for `episode`; a stalled claimant also wakes every rank's listener."""
    if stalled:
        shared.set(f"{STORE_PREFIX}{episode}/stalled/{rank}", "1")
        if root is not None:
            root.set(wake_key(episode), str(rank))
    shared.add(f"{STORE_PREFIX}{episode}/dumped", 1)


def wait_for_dumps(shared, episode: int, expected: int, seconds: float) -> int:
    """How many ranks dumped for `episode`, waiting up to `seconds` for `expected`."""
    deadline = time.monotonic() + seconds
    while True:
        dumped = int(shared.add(f"{STORE_PREFIX}{episode}/dumped", 0))
        if dumped >= expected or time.monotonic() >= deadline:
            return dumped
        time.sleep(0.5)


def is_reporter(shared, episode: int) -> bool:
    """The first rank to ask becomes the episode's reporter."""
    return int(shared.add(f"{STORE_PREFIX}{episode}/reporter", 1)) == 1
