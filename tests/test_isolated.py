"""Readers in bounded children (sources/isolated.py): whatever one item does to its reader, the others are read
and this process lives; a stopped item says why and which limit raises it."""

from __future__ import annotations

import os
import signal
import time

import pytest

from torchtriage.sources import limits
from torchtriage.sources.isolated import Raised, Stopped, call_isolated, map_isolated


def _read(item):
    """Stands in for a reader: each item says what the file would do to it."""
    if item == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)  # the C unpickler's stack overflow
    if item == "memory":
        hoard = []
        while True:
            hoard.append(bytearray(64 << 20))
    if item == "spin":
        while True:
            pass
    if item == "bug":
        raise KeyError("a bug of ours")
    return f"read {item} in {os.getpid()}"


def test_every_item_is_read_or_stopped_in_order_and_this_process_lives():
    items = ["a", "segv", "b", "memory", "c", "d", "segv", "e"]
    with limits.using(limits.parse_limit("memory=256M")):
        found = map_isolated(_read, items, jobs=2)
    assert [r.split()[1] if isinstance(r, str) else r.reason for r in found] == [
        "a", "SIGSEGV", "b", "over 256 MiB of memory", "c", "d", "SIGSEGV", "e"
    ]  # fmt: skip
    assert all(int(r.split()[-1]) != os.getpid() for r in found if isinstance(r, str))  # read by children
    assert found[3].limit_name == "memory" and "--limit memory=" in found[3].message()


def test_an_item_past_its_time_is_stopped_and_the_child_killed():
    start = time.monotonic()
    with limits.using(limits.parse_limit("seconds=1")):
        found = map_isolated(_read, ["a", "spin", "b"], jobs=1)
    assert found[0].startswith("read a") and found[2].startswith("read b")
    # The CPU limit (1 s and the kernel's slack) or the wall-clock deadline (three times the limit) stops it.
    assert found[1] in (Stopped("over 1 s of CPU", "seconds"), Stopped("over 3 s", "seconds")), found[1]
    assert time.monotonic() - start < 20


def test_extra_time_for_a_large_file_is_its_own():
    with limits.using(limits.parse_limit("seconds=1")):
        found = map_isolated(lambda s: time.sleep(s) or "slept", [2.0], jobs=1, seconds_for=lambda s: s + 1)
    assert found == ["slept"]


def test_a_bug_in_the_reader_is_raised_here_not_hidden():
    with pytest.raises(KeyError, match="a bug of ours"):
        map_isolated(_read, ["a", "bug"], jobs=1)


def test_one_call_reports_progress_and_its_result():
    ticks = []

    def work(tick):
        for n in (1, 2, 3):
            tick(n)
        return {"pid": os.getpid()}

    found = call_isolated(work, ticks.append)
    assert ticks == [1, 2, 3] and found["pid"] != os.getpid()
    assert call_isolated(lambda tick: os.kill(os.getpid(), signal.SIGSEGV)) == Stopped("SIGSEGV", None)


def test_no_child_outlives_the_call():
    before = _children()
    map_isolated(_read, ["a", "segv", "b"] * 20, jobs=3)
    assert _children() == before


def test_raised_carries_an_exception_that_cannot_travel():
    class Local(Exception):  # a class defined in a function does not pickle
        pass

    def fails(_):
        raise Local("no way back")

    with pytest.raises(RuntimeError, match="Local: no way back"):
        map_isolated(fails, [1], jobs=1)
    assert Raised(ValueError("x")).error.args == ("x",)


def _children() -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                        found.add(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return found
