"""The streaming scanner finds every matching line, with the right line number, whatever the block size."""

import gzip
import io

import pytest

from torchtriage.knowledge.prefilter import literal_trie_regex
from torchtriage.sources import logs
from torchtriage.sources.logs import scan_lines

WORDS = ["Watchdog caught", "CUDA out of memory", "Error", "Xid"]


def naive(data: bytes, words):
    return [(i, line) for i, line in enumerate(data.split(b"\n"), 1) if any(w.encode() in line for w in words)]


def make_log(lines=3000):
    out = []
    for i in range(lines):
        if i % 97 == 0:
            out.append(f"[rank{i % 8}]: RuntimeError: CUDA out of memory. Tried to allocate {i} MiB")
        elif i % 131 == 0:
            out.append(f"NVRM: Xid (PCI:0000:3b:00): 79, pid={i}")
        else:
            out.append(f"[rank{i % 8}]: step {i} loss 1.{i:04d}")
    return ("\n".join(out) + "\n").encode()


@pytest.mark.parametrize("block", [257, 1000, 1 << 20])
def test_hits_and_line_numbers_match_a_naive_reading(monkeypatch, block):
    monkeypatch.setattr(logs, "BLOCK_BYTES", block)
    data = make_log()
    got = list(scan_lines(io.BytesIO(data), literal_trie_regex(WORDS)))
    assert got == naive(data, WORDS)


def test_last_line_without_newline_and_crlf():
    data = b"ok\r\nstep 1\r\nRuntimeError: x\r\nfinal Xid 79"
    got = list(scan_lines(io.BytesIO(data), literal_trie_regex(WORDS)))
    assert got == [(3, b"RuntimeError: x\r"), (4, b"final Xid 79")]


def test_a_line_longer_than_a_block_is_scanned_in_pieces(monkeypatch):
    monkeypatch.setattr(logs, "BLOCK_BYTES", 1024)
    data = b"a" * 10_000 + b" Xid 79 " + b"b" * 10_000 + b"\nnext Error\n"
    got = list(scan_lines(io.BytesIO(data), literal_trie_regex(WORDS)))
    assert any(b"Xid 79" in line and len(line) <= 2048 for _, line in got)
    assert got[-1] == (2, b"next Error")


def test_gzip_stream():
    data = make_log(500)
    got = list(scan_lines(gzip.GzipFile(fileobj=io.BytesIO(gzip.compress(data))), literal_trie_regex(WORDS)))
    assert got == naive(data, WORDS)


def test_trie_regex_finds_words_sharing_prefixes():
    rx = literal_trie_regex(["Error", "ErrorCode", "Err", "Exception"])
    assert rx.search(b"xx Err yy")
    assert rx.search(b"an Exception!")
    assert not rx.search(b"E r r")


def test_concatenated_and_truncated_gzip_keep_every_line_they_hold():
    from torchtriage.sources.streams import TolerantGunzip

    first, second = make_log(300), b"final Xid 79\n"
    joined = gzip.compress(first) + gzip.compress(second)
    stream = TolerantGunzip(io.BytesIO(joined))
    assert list(scan_lines(stream, literal_trie_regex(WORDS))) == naive(first + second, WORDS)
    assert not stream.truncated

    whole = gzip.compress(first)
    cut = TolerantGunzip(io.BytesIO(whole[: len(whole) - 40]))
    got = list(scan_lines(cut, literal_trie_regex(WORDS)))
    assert cut.truncated
    assert got and got == naive(first, WORDS)[: len(got)]


def test_the_re2_prefilter_and_the_python_fallback_find_the_same_lines():
    from torchtriage.knowledge.prefilter import compile_prefilter

    data = make_log(2000)
    fast = list(scan_lines(io.BytesIO(data), compile_prefilter(WORDS)))
    fallback = list(scan_lines(io.BytesIO(data), literal_trie_regex(WORDS)))
    assert fast == fallback == naive(data, WORDS)


# The kernel module prints one message over four lines under its tag (kernel-open/nvidia/nv.c), and the
# kernel log puts its timestamp before each.
NVRM_MISMATCH = [
    "[   12.104251] NVRM: API mismatch: the client has the version 550.90.07, but",
    "[   12.104252] NVRM: this kernel module has the version 550.54.15.  Please",
    "[   12.104253] NVRM: make sure that this kernel module and all NVIDIA driver",
    "[   12.104254] NVRM: components have the same version.",
]


@pytest.mark.parametrize("word", ["API mismatch", "kernel module has", "components have"])
def test_one_message_over_lines_under_one_tag_is_read_whole_from_any_of_its_lines(word):
    data = ("\n".join(["[   12.0] usb 1-1: new device", *NVRM_MISMATCH, "[   13.0] eth0: link up"]) + "\n").encode()
    got = list(scan_lines(io.BytesIO(data), literal_trie_regex([word])))
    assert len(got) == 1 and got[0][0] == 2
    text = got[0][1].decode()
    assert text.startswith(NVRM_MISMATCH[0]) and text.endswith("components have the same version.")
    assert "but this kernel module has the version 550.54.15." in text


def test_the_records_of_an_ordinary_log_are_never_joined():
    lines = [
        "INFO: loading model weights from the hub",
        "INFO: starting training loop now",
        "NVRM: GPU at PCI:0000:3b:00: GPU-1f2e3d4c",
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.",
        "NVRM: a GPU crash dump has been created.",
        "worker 3: step 10 done, loss 2.1",
        "worker 3: step 11 done, loss 2.0",
    ]
    data = ("\n".join(lines) + "\n").encode()
    got = list(scan_lines(io.BytesIO(data), literal_trie_regex([":"])))
    assert [text.decode() for _, text in got] == lines


def test_behind_one_hosts_tag_a_ranks_labelled_line_and_the_launchers_are_two_writers():
    # pdsh puts the node's name before every line it prints: a rank's step line under srun's label, cut short, and
    # mpirun's report after it start alike up to that tag, and the report goes on in lower-case words. They are two
    # writers' lines (the label says so), not one message: joined, the kill took the step line's rank 27.
    step = "ip-10-42-14-17: 27: 2026-03-15 13:02:42 | INFO | train_inner | epoch 001: 123 / 5000 loss=2.533, lr=0"
    killed = "ip-10-42-14-17: mpirun noticed that process rank 0 with PID 1816244 on node x exited on signal 9."
    data = f"{step}\n{killed}\n".encode()
    got = list(scan_lines(io.BytesIO(data), literal_trie_regex(["exited on signal"])))
    assert [(number, text.decode()) for number, text in got] == [(2, killed)]
    # one writer's message over two lines behind the host, neither labelled, is still read whole
    same = [f"node7: {NVRM_MISMATCH[0][15:]}", f"node7: {NVRM_MISMATCH[1][15:]}"]
    got = list(scan_lines(io.BytesIO(("\n".join(same) + "\n").encode()), literal_trie_regex(["kernel module has"])))
    assert len(got) == 1 and got[0][1].decode().endswith("550.54.15.  Please") and got[0][0] == 1


def test_the_span_search_finds_what_search_finds_and_is_silent_on_empty_ranges(capfd):
    """The prefilter's fast call gives the spans `search` gives, and an empty or inverted range is no hit (RE2
    itself would log such a range to the user's terminal)."""
    from torchtriage.knowledge.prefilter import compile_prefilter, span_search

    compiled = compile_prefilter(["NCCL WARN", "Traceback", "Error"])
    find = span_search(compiled)
    buffer = b"ok\nx NCCL WARN y\nTraceback\nno\nValueError: z\n"
    for pos in range(len(buffer) + 2):
        for end in (pos - 1, pos, pos + 5, len(buffer), len(buffer) + 3):
            expected = compiled.search(buffer, pos, end)
            assert find(buffer, pos, end) == (None if expected is None else expected.span()), (pos, end)
    assert capfd.readouterr().err == ""
