"""Readers stay inside the folders given and inside each file's size, and any byte of a name is printed safely.

A run folder is written by a job and often copied from elsewhere: it may hold a link to a credentials file
(its content would be quoted in the verdict and in the HTML page meant for a bug report), a link to a kernel
file that blocks forever (/proc/kmsg), a FIFO, a log a live job still writes, 100,000 files, or names of any
bytes. Every command here runs as a user runs it; a command that would wait forever fails by its timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from torchtriage import exit_codes
from torchtriage.analysis.pipeline import matcher_for
from torchtriage.sources import registry, streams
from torchtriage.sources.log_records import read_logs
from torchtriage.sources.logs import scan_lines
from torchtriage.sources.registry import discover, open_input
from torchtriage.sources.streams import Refused, open_counted, open_regular, read_whole

SECRET = "sk-live-4f9c2e71d8a0b3"
OOM_LINE = (
    "[rank{rank}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {rank} has a total "
    "capacity of 79.10 GiB of which 1.12 GiB is free.\n"
)
# Would be quoted in the verdict if it were read: an exception no rule knows, with the secret in its message.
SECRET_LOG = f"[rank3]: Traceback (most recent call last):\n[rank3]: RuntimeError: token={SECRET}\n"
VERBS_OF_FOLDERS = ["triage", "diagnose", "report"]


def torchtriage(*args, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The real command; a traceback or an internal error fails the test whatever else it shows."""
    done = subprocess.run(
        [sys.executable, "-m", "torchtriage", *args],
        capture_output=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    err = done.stderr.decode(errors="replace")
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]
    return done


def everything_shown(verb: str, folder: Path, tmp_path: Path, env: dict | None = None) -> tuple[int, str]:
    """Exit code, and all a user sees of `verb` on `folder`: text, JSON and the HTML page."""
    if verb == "report":
        page = tmp_path / "page.html"
        done = torchtriage("report", "--html", str(page), str(folder), env=env)
        shown = done.stdout + done.stderr + page.read_bytes()
        return done.returncode, shown.decode("utf-8")
    text = torchtriage(verb, str(folder), env=env)
    as_json = torchtriage(verb, "--json", str(folder), env=env)
    return text.returncode, (text.stdout + text.stderr + as_json.stdout + as_json.stderr).decode("utf-8")


def run_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A run folder beside a folder of secrets; the run's rank 0 hit an OOM."""
    run, outside = tmp_path / "run", tmp_path / "home"
    run.mkdir()
    outside.mkdir()
    (run / "rank0.log").write_text(OOM_LINE.format(rank=0))
    (outside / "credentials.log").write_text(SECRET_LOG)
    return run, outside


# --------------------------------------------------------------------------------------- links out of a folder


@pytest.mark.parametrize("verb", VERBS_OF_FOLDERS)
def test_a_link_to_a_secret_outside_the_folder_is_named_not_read(tmp_path, verb):
    run, outside = run_folder(tmp_path)
    (run / "rank3.log").symlink_to(outside / "credentials.log")
    (run / "more").symlink_to(outside, target_is_directory=True)
    (run / "attempt_1").mkdir()
    (run / "attempt_1" / "rank4.log").symlink_to(Path("../../home/credentials.log"))  # relative, out through ..
    code, shown = everything_shown(verb, run, tmp_path)
    assert code == exit_codes.PROBLEM_FOUND  # rank 0's OOM is still diagnosed
    assert "CUDA out of memory" in shown
    assert SECRET not in shown
    real = os.path.realpath(outside / "credentials.log")
    assert f"rank3.log: a link to a file outside the folder given ({real}); not read — name the file itself" in shown
    assert f"attempt_1/rank4.log: a link to a file outside the folder given ({real})" in shown
    assert f"more: a link to a folder outside the folder given ({os.path.realpath(outside)})" in shown


def test_a_link_named_on_the_command_line_is_read(tmp_path):
    run, outside = run_folder(tmp_path)
    (run / "rank3.log").symlink_to(outside / "credentials.log")
    done = torchtriage("triage", str(run / "rank3.log"))
    assert SECRET in done.stdout.decode()  # the user chose this file


def test_links_that_stay_inside_the_folders_given_are_read(tmp_path):
    run, outside = run_folder(tmp_path)
    other = tmp_path / "node1"
    other.mkdir()
    (other / "rank1.log").write_text(OOM_LINE.format(rank=1))
    (run / "latest").mkdir()
    (run / "latest" / "rank0.log").symlink_to(Path("../rank0.log"))
    (run / "rank1.log").symlink_to(other / "rank1.log")  # into another folder given
    verdict = json.loads(torchtriage("triage", "--json", str(run), str(other)).stdout)
    for path in (run / "latest" / "rank0.log", run / "rank1.log", other / "rank1.log"):
        assert str(path) in verdict["sources"]
    assert not any("outside" in problem for problem in verdict["problems"])


def test_a_file_swapped_for_a_link_after_listing_is_not_read(tmp_path):
    """Discovery checked the folder; what a reader opens later is checked again, on the descriptor."""
    run, outside = run_folder(tmp_path)
    (run / "rank3.log").write_text(OOM_LINE.format(rank=3))
    (run / "node1").mkdir()
    (run / "node1" / "rank1.log").write_text(OOM_LINE.format(rank=1))
    found = {os.path.basename(i.path): i for i in discover([str(run)], [])}
    assert set(found) == {"rank0.log", "rank3.log", "rank1.log"}
    (run / "rank3.log").unlink()
    (run / "rank3.log").symlink_to(outside / "credentials.log")
    (run / "node1" / "rank1.log").unlink()
    (run / "node1").rmdir()
    (run / "node1").symlink_to(outside, target_is_directory=True)
    (outside / "rank1.log").write_text(SECRET_LOG)
    for name in ("rank3.log", "rank1.log"):
        with pytest.raises(Refused, match="outside the folder given"):
            read_whole(found[name].path)
    # A small log's content was read when it was listed, inside the folder: what is read is that, never the link.
    swapped = [found["rank3.log"], found["rank1.log"]]
    records = read_logs(swapped, matcher_for())
    assert {e.rank for e in records.events} == {1, 3}
    assert all(SECRET not in e.text for e in records.events)
    # A log opened again when it is read (one past the bytes kept from sniffing) is checked again, and refused.
    records = read_logs([replace(found_input, content=None) for found_input in swapped], matcher_for())
    assert not records.files_read and not records.events
    assert all("outside the folder given" in p for p in records.problems)


# ------------------------------------------------------------------------- kernel files, FIFOs, devices


@pytest.mark.parametrize("target", ["/proc/kmsg", "/proc/self/environ", "/sys/kernel/notes", "/dev/zero"])
def test_a_link_in_a_folder_to_a_kernel_file_or_device_returns_at_once(tmp_path, target):
    if not os.path.exists(target):
        pytest.skip(f"{target} does not exist here")
    run, _ = run_folder(tmp_path)
    (run / "rank5.log").symlink_to(target)
    done = torchtriage("triage", str(run), env={"TT_TEST_TOKEN": SECRET}, timeout=60)  # a wait fails by timeout
    out = done.stdout.decode()
    assert done.returncode == exit_codes.PROBLEM_FOUND and "CUDA out of memory" in out
    assert "rank5.log: a link to a file outside the folder given" in out
    assert SECRET not in out


@pytest.mark.parametrize("target", ["/proc/kmsg", "/proc/self/environ", "/proc/self/status"])
def test_a_kernel_file_named_even_through_a_link_is_refused(tmp_path, target):
    link = tmp_path / "rank5.log"
    link.symlink_to(target)
    for path in (target, link):
        done = torchtriage("triage", str(path), env={"TT_TEST_TOKEN": SECRET}, timeout=60)
        err = done.stderr.decode()
        assert done.returncode == exit_codes.BAD_INPUT
        assert "a file of the kernel's interfaces (/proc, /sys)" in err and "save what it shows to a file" in err
        assert SECRET not in err + done.stdout.decode()


def test_a_folder_of_the_kernel_is_not_walked():
    done = torchtriage("triage", "/proc/self", timeout=60)
    assert done.returncode == exit_codes.BAD_INPUT
    assert "/proc/self: a folder of the kernel's interfaces" in done.stderr.decode()


def test_fifos_in_a_folder_directly_or_through_a_link_are_not_waited_on(tmp_path):
    run, _ = run_folder(tmp_path)
    os.mkfifo(run / "rank1.log")
    (run / "rank2.log").symlink_to("rank1.log")
    done = torchtriage("triage", str(run), timeout=60)
    out = done.stdout.decode()
    assert done.returncode == exit_codes.PROBLEM_FOUND
    assert "rank1.log: a FIFO, not a file" in out and "rank2.log: a link to a FIFO, not a file" in out
    named = torchtriage("triage", str(run / "rank2.log"), timeout=60)
    assert named.returncode == exit_codes.BAD_INPUT and "a FIFO, not a file" in named.stderr.decode()


# ---------------------------------------------------------------------------------------- a growing file


class Writer(threading.Thread):
    """A live job appending to its log until told to stop (at most `cap` bytes, so a bug cannot fill a disk)."""

    def __init__(self, path: Path, cap: int = 64 << 20) -> None:
        super().__init__(daemon=True)
        self.path, self.cap, self.stop = path, cap, threading.Event()

    def append(self) -> None:
        with open(self.path, "ab") as log:
            log.write(b"[rank0]: NCCL WARN Watchdog caught collective operation timeout: appended later\n" * 4096)

    def run(self) -> None:
        while not self.stop.is_set() and self.path.stat().st_size < self.cap:
            self.append()

    def begin(self) -> None:
        self.append()  # at least once after the reader opened the file, before it reads
        self.start()

    def end(self) -> None:
        self.stop.set()
        if self.is_alive():
            self.join()


def _growing_log(tmp_path: Path) -> tuple[Path, bytes]:
    log = tmp_path / "rank0.log"
    content = b"step 1 loss 2.0\n" * 2000 + OOM_LINE.format(rank=0).encode()
    log.write_bytes(content)
    return log, content


@pytest.mark.parametrize("reader", ["log", "whole", "counted"])
def test_a_file_being_written_is_read_up_to_its_size_when_opened(tmp_path, monkeypatch, reader):
    log, content = _growing_log(tmp_path)
    writer = Writer(log)

    def open_then_write(path: str):  # the job writes on from the moment the file is opened, and while it is read
        stream = open_regular(path)
        writer.begin()
        return stream

    monkeypatch.setattr(streams, "open_regular", open_then_write)
    monkeypatch.setattr(registry, "open_regular", open_then_write)
    try:
        if reader == "log":
            with open_input(discover([str(log)], [])[0]) as stream:
                lines = [number for number, _ in scan_lines(stream, matcher_for().prefilter)]
            assert lines == [content.count(b"\n")]  # the OOM line, and no line appended
        elif reader == "whole":
            assert read_whole(str(log)) == (content, False)
        else:
            with open_counted(str(log), "the trace", streamed=True) as stream:
                assert b"".join(iter(lambda: stream.read(1 << 16), b"")) == content
    finally:
        writer.end()
    assert log.stat().st_size > len(content)  # it did grow while it was read


# ------------------------------------------------------------------------------------- a folder of thousands


def test_every_log_of_a_folder_of_20000_files_is_found_and_the_rest_counted(tmp_path):
    logs, empty, unknown = [], [], []
    for n in range(20_000):
        folder = tmp_path / f"node{n % 7}" / f"attempt_{n % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        kind = n % 4
        path = folder / (f"rank{n}.log" if kind == 0 else f"x{n}.out" if kind == 1 else f"shard{n}.idx")
        if kind == 0:
            path.write_text(OOM_LINE.format(rank=n) if n == 4444 else f"[rank{n}]: step 1 loss 2.0\n")
            logs.append(str(path))
        elif kind == 1:
            path.write_bytes(b"")
            empty.append(str(path))
        else:
            path.write_text(f'{{"shard": {n}}}\n')
            unknown.append(str(path))
    verdict = json.loads(torchtriage("triage", "--json", str(tmp_path), timeout=300).stdout)
    assert verdict["culprit_ranks"] == [4444]
    assert sorted(verdict["sources"]) == sorted(logs)
    problems = "\n".join(verdict["problems"])
    assert f"and {len(empty) - 3:,} more files, each: the file is empty" in problems
    assert f"and {len(unknown) - 3:,} more files, each: a JSON document of no kind" in problems
    assert len(verdict["problems"]) < 10  # counted, not listed one a line
    done = torchtriage("diagnose", "--json", str(tmp_path), timeout=300)
    assert sorted(json.loads(done.stdout)["sources"]) == sorted(logs)


def test_a_folder_is_listed_in_the_natural_order_of_its_paths(tmp_path):
    names = ["rank10.log", "rank2.log", "rank1/x.log", "rank1.log", "a2/x.log", "a10.log", "a1.log", "b/c/d1.log"]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("step 1\n")
    found = [os.path.relpath(i.path, tmp_path) for i in discover([str(tmp_path)], [])]
    expected = ["a1.log", "a2/x.log", "a10.log", "b/c/d1.log", "rank1.log", "rank1/x.log", "rank2.log", "rank10.log"]
    assert found == expected


# ------------------------------------------------------------------------------------ names of any bytes

HOSTILE_NAME = b"rank\xff3\x1b]0;owned\x07\n\xe2\x80\xaeconfidence: high.log"
SHOWN_NAME = "rank\\xff3\\x1b]0;owned\\x07\\n\\u202econfidence: high.log"
STRICT = {"PYTHONIOENCODING": "utf-8:strict"}


@pytest.mark.parametrize("verb", VERBS_OF_FOLDERS)
def test_names_of_invalid_utf8_and_controls_are_shown_escaped_under_a_strict_stdout(tmp_path, verb):
    run = tmp_path / "run"
    run.mkdir()
    with open(os.path.join(os.fsencode(run), HOSTILE_NAME), "w") as log:
        log.write(OOM_LINE.format(rank=3))
    (run / "x\udcfe.bin").write_bytes(b"\x00\x01")  # os.fsencode makes it the byte 0xfe
    args = ["--html", str(tmp_path / "page.html")] if verb == "report" else []
    done = torchtriage(verb, *args, str(run), env=STRICT)
    assert done.returncode == exit_codes.PROBLEM_FOUND
    shown = (done.stdout + done.stderr).decode("utf-8")  # strict: no byte that is not UTF-8
    assert SHOWN_NAME in shown and "x\\xfe.bin" in shown
    for raw in ("\x1b", "\x07", "\u202e", "\nconfidence: high"):
        assert raw not in shown
    if verb == "report":
        assert SHOWN_NAME.split("\\x1b")[0] in (tmp_path / "page.html").read_bytes().decode("utf-8")


def test_json_holds_such_names_as_the_terminal_shows_them(tmp_path):
    with open(os.path.join(os.fsencode(tmp_path), b"rank\xff3.log"), "w") as log:
        log.write(OOM_LINE.format(rank=3))
    done = torchtriage("triage", "--json", str(tmp_path), env=STRICT)
    verdict = json.loads(done.stdout.decode("utf-8"))
    assert verdict["sources"] == [f"{tmp_path}/rank\\xff3.log"]  # the four characters \xff: valid Unicode
    assert b"\\udcff" not in done.stdout


def test_a_named_file_of_invalid_utf8_is_read_and_a_missing_one_said(tmp_path):
    name = os.path.join(os.fsencode(tmp_path), b"rank\xff3.log")
    with open(name, "w") as log:
        log.write(OOM_LINE.format(rank=3))
    done = torchtriage("triage", name, env=STRICT)
    assert done.returncode == exit_codes.PROBLEM_FOUND and "rank\\xff3.log" in done.stdout.decode("utf-8")
    missing = torchtriage("triage", name + b"\xfe", env=STRICT)
    assert missing.returncode == exit_codes.BAD_INPUT
    assert "rank\\xff3.log\\xfe: no such file or folder" in missing.stderr.decode("utf-8")
