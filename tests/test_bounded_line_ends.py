"""A carriage return alone ends a line, as Python's universal newlines and torchrun's --tee read it: an old Mac
log, or a progress bar that rewrites its line, is read one printed line at a time, so a failure at its end is
matched like any other line. CRLF ends lines as before, its CR left on the line."""

from __future__ import annotations

import io
import json
import random
import re
import subprocess
import sys

import pytest

from torchtriage.knowledge.prefilter import literal_trie_regex
from torchtriage.sources import logs
from torchtriage.sources.logs import Tail, scan_lines

WORDS = ["Error", "Xid", "CUDA out of memory"]
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.10 GiB of which 1.12 GiB is free."
)


def universal_lines(data: bytes, words) -> list[tuple[int, bytes]]:
    """What the scanner must yield: the lines Python's universal newlines make, numbered from 1; a line ended by
    CRLF keeps its CR, as it always did."""
    out = []
    for number, line in enumerate(data.splitlines(keepends=True), 1):
        if line.endswith(b"\r\n"):
            line = line[:-1]
        elif line.endswith((b"\n", b"\r")):
            line = line[:-1]
        if any(word.encode() in line for word in words):
            out.append((number, line))
    return out


def mixed_log(seed: int) -> bytes:
    """Lines of at most 40 bytes ended by LF, CRLF, CR alone or CR CR LF, in random order."""
    rng = random.Random(seed)
    parts = []
    for i in range(600):
        text = rng.choice((f"step {i} loss 2.{i}", f"RuntimeError: {i}", f"NVRM: Xid {i}", "", f"{i:>3}%|##  |"))
        parts.append(text.encode() + rng.choice((b"\n", b"\r\n", b"\r", b"\r\r\n")))
    return b"".join(parts)


@pytest.mark.parametrize("block", [41, 42, 43, 50, 64, 257, 1 << 20])
@pytest.mark.parametrize("seed", range(3))
def test_lines_end_where_universal_newlines_end_them_whatever_the_block_size(monkeypatch, block, seed):
    monkeypatch.setattr(logs, "BLOCK_BYTES", block)  # a CR at a block's end, a CRLF split over two blocks
    data = mixed_log(seed)
    assert list(scan_lines(io.BytesIO(data), literal_trie_regex(WORDS))) == universal_lines(data, WORDS)


def test_a_crlf_log_is_read_as_before():
    data = b"ok\r\nstep 1\r\nRuntimeError: x\r\nfinal Xid 79\r\n"
    assert list(scan_lines(io.BytesIO(data), literal_trie_regex(WORDS))) == [
        (3, b"RuntimeError: x\r"),
        (4, b"final Xid 79\r"),
    ]


def expected_tail(data: bytes, max_bytes: int) -> tuple[bytes, int]:
    """The last `max_bytes` of the log's lines, from the first line that starts inside them, and its number."""
    lines = re.sub(rb"\r(?!\n)", b"\n", data)
    if len(lines) < max_bytes:
        return lines, 1
    cut = len(lines) - max_bytes
    newline = lines.find(b"\n", cut)
    return (lines[newline + 1 :], lines.count(b"\n", 0, cut) + 2) if newline >= 0 else (b"", 0)


@pytest.mark.parametrize("block", [41, 57, 64, 257, 4096])
@pytest.mark.parametrize("max_bytes", [30, 100, 1000, 100_000])
@pytest.mark.parametrize("seed", range(2))
def test_the_tail_is_the_logs_last_lines_whatever_the_block_size(monkeypatch, block, max_bytes, seed):
    monkeypatch.setattr(logs, "BLOCK_BYTES", block)
    for data in (mixed_log(seed), mixed_log(seed).replace(b"\r", b"")):  # with CRs, and with LF alone
        tail = Tail(max_bytes)
        list(scan_lines(io.BytesIO(data), literal_trie_regex(WORDS), tail))
        data_expected, first_line = expected_tail(data, max_bytes)
        assert tail.data == data_expected
        if data_expected:
            assert tail.first_line == first_line


def test_the_tail_of_a_cr_log_is_numbered_as_its_lines(monkeypatch):
    monkeypatch.setattr(logs, "BLOCK_BYTES", 1000)
    data = b"".join(f"{i:>5} %|###|\r".encode() for i in range(3000))
    tail = Tail(200)
    list(scan_lines(io.BytesIO(data), literal_trie_regex(WORDS), tail))
    lines = tail.data.decode().splitlines()
    assert lines[-1] == " 2999 %|###|"
    assert tail.first_line + len(lines) - 1 == 3000


def progress_bar(rewrites: int) -> bytes:
    """What tqdm leaves in a file: one line rewritten after a CR at every update."""
    return b"".join(
        f"\rtrain: {i * 100 // rewrites:3d}%|{'#' * (i % 20):<20}| {i}/{rewrites}".encode() for i in range(rewrites)
    )


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(progress_bar(20_000) + b"\r" + OOM.encode() + b"\n", id="progress-bar"),
        pytest.param(
            b"\r".join(f"[titan] step {i} loss 2.{i:04d}".encode() for i in range(20_000))
            + b"\r"
            + OOM.encode()
            + b"\r",
            id="old-mac",
        ),
    ],
)
def test_an_oom_after_a_megabyte_of_cr_ended_lines_is_the_verdict(tmp_path, data):
    log = tmp_path / "rank0.log"
    log.write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-m", "torchtriage", "triage", "--json", str(log)], capture_output=True, text=True
    )
    verdict = json.loads(done.stdout)
    assert done.returncode == 1, done.stderr
    assert verdict["category"] == "oom", verdict["summary"]
    lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    evidence = [e for f in verdict["findings"] for e in f["evidence"] if e.get("line")]
    assert any(lines[e["line"] - 1].decode() == OOM for e in evidence), evidence


def test_a_tails_lines_are_numbered_as_the_scanner_numbers_them(tmp_path):
    """Form feeds, separators (0x1c-0x1e) and U+2028 inside a line do not end it: the last line of a log that only
    stops is named with its own number, and the finding quotes it whole."""
    log = tmp_path / "job.log"
    log.write_bytes(
        "[rank0]: step 1 loss 2.1\x0cpage\u2028more\n[rank0]: step 2 loss 2.0\x1cx\x1dy\x1ez\n"
        "[rank0]: step 3 still going\n".encode()
    )
    done = subprocess.run([sys.executable, "-m", "torchtriage", "triage", "--json", str(log)], capture_output=True)
    verdict = json.loads(done.stdout)
    stop = verdict["findings"][0]["evidence"][0]
    assert (stop["line"], stop["text"]) == (3, "step 3 still going")
