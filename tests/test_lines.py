"""Peeling launcher prefixes and log headers off real line shapes."""

import pytest

from torchtriage.sources.lines import normalise


@pytest.mark.parametrize(
    "raw, text, rank",
    [
        (
            "[rank3]:[E1130 02:54:48.068043558 ProcessGroupNCCL.cpp:689] [Rank 3] Watchdog caught",
            "[Rank 3] Watchdog caught",
            3,
        ),
        ("[default5]:Traceback (most recent call last):", "Traceback (most recent call last):", 5),
        ('[default1]:[rank9]:  File "train.py", line 3, in <module>', ' File "train.py", line 3, in <module>', 9),
        # `torchrun --role rank --tee 3` (torchtitan's launcher): the tee prefix is the role and the local rank,
        # the process's own excepthook prefix the global rank
        (
            "[rank0]:[rank8]: torch.OutOfMemoryError: CUDA out of memory.",
            "torch.OutOfMemoryError: CUDA out of memory.",
            8,
        ),
        ("12: RuntimeError: boom", "RuntimeError: boom", 12),
        ("[1,7]<stderr>:ncclInternalError", "ncclInternalError", 7),
        ("[Rank 4] loss: nan", "loss: nan", 4),
        ("\x1b[31m[rank2]:\x1b[0m CUDA error\r", "CUDA error", 2),
        ("W1130 02:54:18.606000 625 torch/distributed/run.py:851] Sending process 670", "Sending process 670", None),
        ("2026-11-30 04:32:11,123 - ERROR - something broke", "ERROR - something broke", None),
        ("  rank      : 1 (local_rank: 1)", "  rank      : 1 (local_rank: 1)", None),
        ("[0]:", "[0]:", None),
    ],
)
def test_prefixes_are_peeled_and_the_rank_kept(raw, text, rank):
    line = normalise(raw)
    assert line.text == text
    assert line.rank == rank


def test_times_from_glog_and_iso_headers_are_comparable():
    glog = normalise("[rank0]:[E1130 02:54:48.068043558 ProcessGroupNCCL.cpp:689] x")
    python_logging = normalise("E1130 02:55:54.770000 625 torch/distributed/elastic/multiprocessing/api.py:986] y")
    iso = normalise("2026-11-30T02:54:49Z z")
    assert glog.severity == "E"
    assert glog.time < iso.time < python_logging.time


@pytest.mark.parametrize(
    "header, november",
    [
        ("[rank5]:[W728 15:01:59.562622567 TCPStore.cpp:340] ", "[W1128 15:01:59.562622567 TCPStore.cpp:340] "),
        ("[W105 00:00:01.000000000 socket.cpp:1] ", "[W1105 00:00:01.000000000 socket.cpp:1] "),
    ],
)
def test_c10s_unpadded_dates_are_a_header_in_every_month(header, november):
    # c10/util/Logging.cpp writes the date as month * 100 + day: January 5th is "105", July 28th "728".
    line = normalise(header + "x")
    assert (line.text, line.severity) == ("x", "W")
    assert line.time < normalise(november + "x").time  # the same day and time in November is later


def test_every_kind_of_terminal_sequence_is_peeled_before_matching():
    from torchtriage.sources.lines import strip_ansi

    assert strip_ansi("\x1b[1;31mNCCL WARN\x1b[0m x") == "NCCL WARN x"  # CSI
    assert strip_ansi("\x1b]0;title\x1b\\NCCL WARN") == "NCCL WARN"  # OSC ended by ST
    assert strip_ansi("\x1b]8;;http://x\x07link\x1b]8;;\x07") == "link"  # hyperlinks, ended by BEL
    assert strip_ansi("\x1bP+q544e\x1b\\ok") == "ok"  # DCS
    assert strip_ansi("\x9b31mC1 CSI") == "C1 CSI"
    assert strip_ansi("\x1b(Bcharset") == "charset"


def test_an_nccl_line_of_a_release_without_the_tag_gets_it_back():
    old = normalise("node1:4242:4301 [0] misc/ibvwrap.cc:212 WARN Call to ibv_open_device failed")
    assert old.text == "node1:4242:4301 [0] misc/ibvwrap.cc:212 NCCL WARN Call to ibv_open_device failed"
    new = "node1:4242:4301 [0] misc/ibvwrap.cc:212 NCCL WARN Call to ibv_open_device failed"
    assert normalise(new).text == new
    assert normalise("WARN this is not NCCL").text == "WARN this is not NCCL"


# --- A rank field of a logging format ---------------------------------------------------------------------------

_LAYERS = (
    lambda r: f"[rank{r.randint(0, 99)}]:",
    lambda r: f"[default{r.randint(0, 7)}]:",
    lambda r: f"[trainer{r.randint(0, 9)}]:",
    lambda r: f"[1,{r.randint(0, 31)}]<stderr>:",
    lambda r: f"[Rank {r.randint(0, 9)}] ",
    lambda r: f"rank{r.randint(0, 9)}: ",
    lambda r: f"{r.randint(0, 63):>2}: ",
    lambda r: f"[rank{r.randint(10**12, 10**13)}]:",  # past the rank limit: no prefix
    lambda r: "10.0.0.5: ",
    lambda r: "node-07: ",
    lambda r: f"(RayTrainWorker pid={r.randint(1, 99999)}, ip=10.0.0.5) ",
    lambda r: "[E1130 02:54:48.068043558 ProcessGroupNCCL.cpp:689] ",
    lambda r: "W1130 02:54:18.606000 625 torch/distributed/run.py:851] ",
    lambda r: "2026-11-30 04:32:11,123 - ",
    lambda r: "[W socket.cpp:663] ",
    lambda r: "\x1b[31m",
    lambda r: " ",
)
# Prefixes peeled before any message (a bare host name is peeled only before a rank prefix), and colour
_PREFIXES = _LAYERS[:7] + (_LAYERS[8], _LAYERS[10], _LAYERS[-2])
_MESSAGES = ("RuntimeError: boom", "loss: nan", "[titan] step 5", "Watchdog caught", "", "12: x", "[0]:")


def test_a_rank_field_of_a_logging_format_is_the_lines_rank():
    # `%(asctime)s - rank %(rank)s - %(levelname)s - %(message)s`: the field right after the date, delimited like
    # the fields around it, is the rank; a rank after a header with no field delimiter is the message's.
    line = normalise("2025-11-06 10:14:02,551 - rank 2 - ERROR - Uncaught exception")
    assert (line.rank, line.text) == (2, "ERROR - Uncaught exception")
    assert normalise("2025-11-06 10:14:02,551 | rank=12 | ERROR | boom").rank == 12
    assert normalise("[E1130 02:54:48.068043558 ProcessGroupNCCL.cpp:689] [Rank 3] Watchdog caught x").rank is None
    assert normalise("[2023-01-01 10:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=10").rank is None
    assert normalise("2025-11-06 10:14:02,551 - rank 2 of 8 finished").rank is None


def test_a_launchers_rank_prefix_outranks_a_logging_formats_rank_field():
    """For any stack of leading prefixes before a dated line with a rank field: the prefixes' rank if they carry
    one (the launcher knows which process printed), else the field's."""
    import random

    rng = random.Random(5)
    for _ in range(5000):
        layers = "".join(rng.choice(_PREFIXES)(rng) for _ in range(rng.randint(0, 4)))
        dated = "2026-11-30 04:32:11,123 - rank 7 - INFO - " + rng.choice(_MESSAGES)
        outer = normalise(layers + "RuntimeError: boom").rank
        assert normalise(layers + dated).rank == (7 if outer is None else outer), layers + dated


@pytest.mark.parametrize(
    "line",
    [
        "[default1]:[W socket.cpp:558] [c10d] The client socket has failed to connect to [node54]:29500",
        "[rank3]:[E1011 20:12:04.884770356 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective",
        "3: [W1011 20:12:04.884000 4242 torch/distributed/run.py:851] Setting OMP_NUM_THREADS",
        "(RayTrainWorker pid=1234, ip=10.0.0.5) [rank2]:[W socket.cpp:601] [c10d] The client socket",
    ],
)
def test_a_container_runtimes_timestamp_leaves_the_line_as_the_process_wrote_it(line):
    # `kubectl logs --timestamps` / `docker logs -t` put RFC 3339 in UTC with nanoseconds before every line: the
    # launcher's prefix and c10's header still start the message, so the rank and a warning's severity are read.
    stamped = normalise("2025-10-11T18:12:04.884770356Z " + line)
    bare = normalise(line)
    assert (stamped.text, stamped.rank, stamped.severity) == (bare.text, bare.rank, bare.severity)
    assert stamped.severity is not None and stamped.rank is not None
    later = normalise("2025-10-11T18:12:05.9Z " + line)
    assert later.time - stamped.time == pytest.approx(1.015229644, abs=1e-6)  # one clock for every line


@pytest.mark.parametrize(
    "line, text",
    [
        ("worker-1: Traceback (most recent call last):", "Traceback (most recent call last):"),
        ('worker-1:   File "/w/train.py", line 88, in <module>', 'File "/w/train.py", line 88, in <module>'),
        ("ip-10-42-22-17:     work.wait()", "    work.wait()"),
        ("gpu-node-021: torch.distributed.DistBackendError: NCCL", "torch.distributed.DistBackendError: NCCL"),
        ("node57: KeyboardInterrupt", "KeyboardInterrupt"),
        # what is no traceback keeps the words before it: they may be the message's own
        ("node57: step 5 loss 3.2", "node57: step 5 loss 3.2"),
        ("RuntimeError: CUDA error: out of memory", "RuntimeError: CUDA error: out of memory"),
    ],
)
def test_a_traceback_under_pdshs_host_prefix_is_read_as_a_traceback(line, text):
    # DeepSpeed's multi-node launcher runs the ranks through pdsh, which puts "<host>: " before every line.
    assert normalise(line).text.lstrip() == text.lstrip()


@pytest.mark.parametrize(
    "line, host",
    [
        ("worker-1: Traceback (most recent call last):", "worker-1"),
        ("gpu-node-021: [rank3]: torch.distributed.DistBackendError: NCCL", "gpu-node-021"),
        ("10.0.0.5: [default1]:[rank9]: boom", "10.0.0.5"),
        ("(RayTrainWorker pid=4242, ip=10.1.2.3) [rank1]: boom", "10.1.2.3"),
        # a prefix that names a process only, and words that are the message's own, name no host
        ("(pid=4242) [rank1]: boom", None),
        ("node57: step 5 loss 3.2", None),
        ("RuntimeError: CUDA error: out of memory", None),
        # a host after a log header is the message's ("... connect to node-3: [rank1] ...")
        ("[E1130 02:54:48.068043558 ProcessGroupNCCL.cpp:689] node-3: [rank1]: x", None),
    ],
)
def test_the_host_a_launcher_put_before_a_line_is_kept(line, host):
    # The machine that printed the line: what names it where no rank or report does (pdsh's one-host log).
    assert normalise(line).host == host
