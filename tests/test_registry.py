"""The source registry: every verb reads a file as what its content says it is, and an absence of input
is never an all-clear."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, H200, run_cli
from torchtriage import exit_codes
from torchtriage.model import SourceKind
from torchtriage.sources.registry import discover, rank_from_name

H200X1 = FIXTURES / "h200x1"
SKIP_LOG = FIXTURES / "logs" / "gloo_skip_allreduce" / "run.log"  # rank 1 skipped an all_reduce (gloo, CPU)


def _json(done) -> dict:
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        (SKIP_LOG, SourceKind.LOG),
        (H200 / "skip" / "pyspy_rank0.txt", SourceKind.PYSPY),
        (FIXTURES / "h200x2_live" / "barrier" / "captures" / "vm-20261130-055503" / "rank00.json", SourceKind.PYSPY),
        (H200 / "skip" / "nccl_trace_rank_0", SourceKind.FLIGHT_RECORDER),
        (H200X1 / "formats" / "frjson" / "fr_json_rank_0", SourceKind.FLIGHT_RECORDER),
        (H200 / "oom_snapshot.pickle", SourceKind.MEMORY_SNAPSHOT),
        (FIXTURES / "h200x2_runtime" / "memory" / "train_snapshot.pickle.gz", SourceKind.MEMORY_SNAPSHOT),
        (FIXTURES / "traces" / "gloo_cpu" / "trace_rank0.json.gz", SourceKind.PROFILER_TRACE),
        (H200X1 / "formats" / "ptrace.json", SourceKind.PROFILER_TRACE),
        (H200X1 / "formats" / "timeline.json.gz", SourceKind.MEMORY_TIMELINE),
        (H200 / "nvml.json", SourceKind.NVIDIA),
        (FIXTURES / "h200x2_live" / "barrier" / "run" / "hang" / "verdict.json", SourceKind.TORCHTRIAGE_OUTPUT),
        (FIXTURES / "h200x2_live" / "barrier" / "run" / "hang" / "verdict.txt", SourceKind.TORCHTRIAGE_OUTPUT),
        (H200 / "README.md", SourceKind.DOCUMENT),
    ],
)
def test_every_recorded_artifact_is_recognised_by_its_content(path, kind):
    problems: list[str] = []
    (found,) = discover([str(path)], problems)
    assert (found.kind, problems) == (kind, [])


def test_recognition_does_not_follow_the_name(tmp_path):
    (tmp_path / "rank3.json").write_bytes((H200 / "skip" / "run.log").read_bytes())
    (tmp_path / "trace_rank1.log").write_bytes((H200 / "oom_snapshot.pickle").read_bytes())
    kinds = {Path(i.path).name: i.kind for i in discover([str(tmp_path)], [])}
    assert kinds == {"rank3.json": SourceKind.LOG, "trace_rank1.log": SourceKind.MEMORY_SNAPSHOT}


def test_log_lines_that_start_with_a_bracket_are_logs_and_json_lines_too(tmp_path):
    for name, text in {
        "a.log": "[rank2]: RuntimeError: x\n",
        "b.log": "[1,3]<stderr>: RuntimeError: x\n",
        "c.log": "[2026-11-30 10:00:01] step 1 loss 2.3\n",
        "d.log": '{"time": 1, "msg": "step 1"}\n{"time": 2, "msg": "step 2"}\n',
    }.items():
        (tmp_path / name).write_text(text)
    assert {i.kind for i in discover([str(tmp_path)], [])} == {SourceKind.LOG}


def test_ranks_from_names():
    assert rank_from_name("out/run/attempt_0/3/stderr.log") == 3
    assert rank_from_name("node1-rank12.err") == 12
    assert rank_from_name("nccl_trace_rank_5", SourceKind.FLIGHT_RECORDER) == 5
    assert rank_from_name("host7-dump-9", SourceKind.FLIGHT_RECORDER) == 9
    assert rank_from_name("host7-dump-9.log", SourceKind.LOG) is None  # a log's trailing number is no rank


def test_diagnose_reads_a_log_named_as_a_file_as_the_log_it_is():
    verdict = _json(run_cli("diagnose", SKIP_LOG, "--json"))
    assert verdict["category"] == "nccl_timeout" and verdict["culprit_ranks"] == [1]
    assert verdict["confidence"] != "high" or verdict["findings"]
    assert verdict["facts"]["sources_used"] == ["logs"]


def test_diagnose_reads_py_spy_dumps_named_as_files():
    verdict = _json(run_cli("diagnose", H200 / "skip" / "pyspy_rank0.txt", H200 / "skip" / "pyspy_rank1.txt", "--json"))
    assert verdict["culprit_ranks"] == [1] and verdict["facts"]["sources_used"] == ["stacks"]


def test_gzip_on_standard_input_is_read_like_the_file():
    plain = _json(run_cli("triage", "--json", SKIP_LOG))
    piped = _json(run_cli("triage", "--json", "-", stdin=gzip.compress(SKIP_LOG.read_bytes())))
    assert (piped["category"], piped["culprit_ranks"], piped["summary"]) == (
        plain["category"],
        plain["culprit_ranks"],
        plain["summary"],
    )


@pytest.mark.parametrize("verb", ["triage", "diagnose"])
def test_empty_standard_input_says_so_and_exits_3(verb):
    done = run_cli(verb, "-", stdin=b"")
    assert done.returncode == exit_codes.BAD_INPUT
    assert b"standard input is empty" in done.stderr and b"Traceback" not in done.stderr


def test_diagnose_of_an_empty_folder_is_no_all_clear(tmp_path):
    done = run_cli("diagnose", tmp_path)
    assert done.returncode == exit_codes.BAD_INPUT and b"nothing readable" in done.stderr


@pytest.mark.parametrize("verb", ["diagnose", "fr"])
def test_a_folder_of_dumps_none_of_which_reads_is_no_all_clear(tmp_path, verb):
    # Files named and shaped as dumps, every one cut short: the flight recorder read nothing, so nothing was
    # diagnosed, and the exit says the input, not the job.
    dumps = FIXTURES / "fr_cross_group" / "early_exit_c7_8r" / "fr"
    for rank in (0, 1):
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes((dumps / f"nccl_trace_rank_{rank}").read_bytes()[:100])
    done = run_cli(verb, tmp_path)
    assert done.returncode == exit_codes.BAD_INPUT, done.stdout
    assert b"no flight-recorder dump could be read" in done.stderr and b"truncated" in done.stderr


def test_diagnose_reads_snapshots_and_traces_when_that_is_all_there_is(tmp_path):
    shutil.copy(H200 / "oom_snapshot.pickle", tmp_path)
    shutil.copytree(FIXTURES / "traces" / "gloo_cpu", tmp_path / "traces")
    done = run_cli("diagnose", tmp_path, "--json")
    verdict = _json(done)
    assert done.returncode == exit_codes.PROBLEM_FOUND
    # The OOM is a cause in itself: it outranks the straggler's skew.
    assert verdict["category"] == "oom"
    assert verdict["facts"]["sources_used"] == ["memory_snapshot", "profiler_trace"]


def test_one_dump_of_a_two_rank_job_cannot_be_compared():
    done = run_cli("fr", FIXTURES / "fr" / "skip_2r" / "nccl_trace_rank_0", "--json")
    verdict = _json(done)
    assert done.returncode == exit_codes.BAD_INPUT
    assert verdict["summary"].startswith("cannot compare") and verdict["confidence"] == "low"
    assert "rank 1" in verdict["summary"]


def test_a_world_of_one_is_read_and_says_there_is_nothing_to_compare():
    done = run_cli("fr", H200X1 / "nccl_ws1" / "nccl_trace_rank_0", "--json")
    verdict = _json(done)
    assert done.returncode == exit_codes.OK and verdict["confidence"] == "low"


def test_the_report_of_an_oom_run_headlines_the_oom_not_a_skew(tmp_path, capsys):
    from torchtriage.cli import main

    page = tmp_path / "r.html"
    assert main(["report", str(FIXTURES / "h200x2_runtime"), "--html", str(page)]) == exit_codes.PROBLEM_FOUND
    out = capsys.readouterr().out
    assert out.startswith("verdict   oom")
    html = page.read_text()
    assert "flight-recorder dumps</b>: missing" in html  # snapshot_stream.json is not a dump
    assert "snapshot_stream.json: a JSON document of no kind torchtriage reads" in html


@pytest.mark.parametrize(
    "argv",
    [
        ["triage", "{missing}"],
        ["fr", "{missing}"],
        ["trace", "{missing}"],
        ["memory", "{missing}"],
        ["diagnose", "{missing}"],
        ["report", "{missing}", "--html", "{page}"],
        ["nvlink", "--from", "{missing}"],
    ],
)
def test_a_missing_path_is_exit_3_in_every_verb(tmp_path, argv):
    args = [a.format(missing=tmp_path / "nope", page=tmp_path / "r.html") for a in argv]
    done = run_cli(*args)
    assert done.returncode == exit_codes.BAD_INPUT, done.stderr
    assert b"no such file" in done.stderr and b"Traceback" not in done.stderr


def test_a_closed_pipe_keeps_the_verdicts_exit_code():
    reader = "import sys; sys.stdin.buffer.read(10)"
    consumer = subprocess.Popen([sys.executable, "-c", reader], stdin=subprocess.PIPE)
    done = subprocess.run(
        [sys.executable, "-m", "torchtriage", "triage", str(H200 / "oom.log")], stdout=consumer.stdin, timeout=60
    )
    consumer.stdin.close()
    consumer.wait(timeout=30)
    assert done.returncode == exit_codes.PROBLEM_FOUND


@pytest.mark.parametrize("verb", ["triage", "fr", "trace", "memory", "diagnose"])
def test_a_fifo_is_refused_not_waited_on(tmp_path, verb):
    fifo = tmp_path / "rank0.log"
    os.mkfifo(fifo)
    shutil.copy(H200 / "oom.log", tmp_path / "rank1.log")
    named = run_cli(verb, fifo, timeout=60)
    assert named.returncode == exit_codes.BAD_INPUT and b"a FIFO, not a file" in named.stderr
    if verb in ("triage", "diagnose"):
        in_folder = run_cli(verb, tmp_path, "--json", timeout=60)
        verdict = _json(in_folder)
        assert verdict["category"] == "oom" and any("a FIFO" in p for p in verdict["problems"])


def test_a_healthy_snapshot_is_ok(capsys):
    from torchtriage.cli import main

    assert main(["memory", str(H200X1 / "formats" / "snap_nohist.pickle")]) == exit_codes.OK
    out = capsys.readouterr().out
    assert out.startswith("verdict   ok") and "fragment" not in out.split("\n\n")[0]
    assert "104.00 MiB cached in 3 segments that hold no tensor" in out


def test_whole_segments_freed_after_an_oom_are_cache_not_fragmentation(capsys):
    from torchtriage.cli import main

    snapshot = FIXTURES / "h200x2_runtime" / "memory" / "oomcase-rank01.pickle"  # 136 GiB freed after the OOM
    assert main(["memory", str(snapshot), "--json"]) == exit_codes.PROBLEM_FOUND
    verdict = json.loads(capsys.readouterr().out)
    kinds = [f["kind"] for f in verdict["findings"]]
    assert "memory.oom" in kinds and "memory.fragmentation" not in kinds
    assert not any(a["env"].get("PYTORCH_CUDA_ALLOC_CONF") for a in verdict["actions"])
    assert "136.00 GiB cached in 17 segments that hold no tensor" in verdict["summary"]


@pytest.mark.parametrize("text", ['{"other": 1}', '{"traceEvents": []}'])
def test_json_without_trace_events_is_no_all_clear(tmp_path, text):
    path = tmp_path / "trace_rank0.json"
    path.write_text(text)
    done = run_cli("trace", path)
    assert done.returncode == exit_codes.BAD_INPUT, done.stdout
    assert b"no straggler" not in done.stdout and b"10000" not in done.stdout


def test_an_unreadable_subfolder_is_named_not_skipped_in_silence(tmp_path, monkeypatch):
    # Permissions cannot stop root (the test may run as root), so the refusal is made where os.walk lists.
    locked = tmp_path / "locked"
    locked.mkdir()
    (tmp_path / "rank0.log").write_text("[rank0]: RuntimeError: boom\n")
    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(locked))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    problems: list[str] = []
    found = discover([str(tmp_path)], problems)
    assert [os.path.basename(i.path) for i in found] == ["rank0.log"]
    assert problems == [f"{locked}: cannot be read: Permission denied (check its permissions)."]


def test_a_folder_of_thousands_is_sniffed_on_every_core_with_the_same_result(tmp_path, monkeypatch):
    from torchtriage.sources import registry

    stack = 'Process 7: python train.py\nPython v3.12.3\n\nThread 0x1 (idle): "MainThread"\n    main (train.py:3)\n'
    for rank in range(2100):
        (tmp_path / f"rank{rank:02d}.txt").write_text(stack.replace("7", str(40000 + rank)))
    (tmp_path / "rank2100.txt").write_bytes(b"")
    (tmp_path / "notes.bin").write_bytes(b"\x00\x01" * 100)
    monkeypatch.setattr(registry, "usable_cores", lambda: 2)
    forked_problems: list[str] = []
    forked = discover([str(tmp_path)], forked_problems)
    monkeypatch.setattr(registry, "_FORK_FROM", 10**9)
    serial_problems: list[str] = []
    assert forked == discover([str(tmp_path)], serial_problems) and forked_problems == serial_problems
    assert [i.rank for i in forked if i.kind == SourceKind.PYSPY] == list(range(2100))
    assert any("rank2100.txt: the file is empty" in p for p in forked_problems)


def test_a_backstop_that_never_fired_is_no_problem_but_an_empty_dump_is(tmp_path):
    """Every rank of an armed job holds its faulthandler backstop open, empty until the rank's own threads cannot
    run: in a stall's folder that is the normal state. An empty stack dump is a rank that answered nothing."""
    from torchtriage.protocol import backstop_name

    stack = 'Process 7: python train.py\nPython v3.12.3\n\nThread 0x1 (idle): "MainThread"\n    main (train.py:3)\n'
    (tmp_path / "rank00.txt").write_text(stack)
    (tmp_path / backstop_name(0)).write_bytes(b"")
    (tmp_path / backstop_name(1)).write_text(
        'Thread 0x1 (most recent call first):\n  File "train.py", line 3 in main\n'
    )
    (tmp_path / "faulthandler-rank2.txt").write_bytes(b"")  # a debug server's dump that came back empty
    problems: list[str] = []
    found = discover([str(tmp_path)], problems)
    assert sorted(os.path.basename(i.path) for i in found) == [backstop_name(1), "rank00.txt"]
    assert [i.rank for i in found if i.path.endswith(backstop_name(1))] == [1]
    assert problems == [
        f"{tmp_path / 'faulthandler-rank2.txt'}: the file is empty (nothing was written to it, or it was cut off)."
    ]


def _every_kind_in_order(head) -> int:
    """The sniff without the first-byte shortcut: each kind asked in order."""
    from torchtriage.sources import registry

    return next((index for index, kind in enumerate(registry._SNIFF_ORDER) if kind.sniff(head)), -1)


def test_the_first_byte_shortcut_sniffs_every_head_as_asking_every_kind_does():
    """A kind is skipped only where its own sniff could not hold: every recorded artifact, under every white space
    a file may start with, and seeded random heads made of the bytes that start each kind, sniff alike."""
    import random

    from torchtriage.sources.registry import Head, _head_of, _sniff_index

    heads = []
    for path in sorted(p for p in FIXTURES.rglob("*") if p.is_file()):
        raw = path.read_bytes()[:8192]
        for lead in (b"", b"  ", b"\n\t\x0b\x0c\r "):
            heads.append(_head_of(path.name, lead + raw))
    rng = random.Random(7)
    starts = [b"{", b"[", b"\x80\x04", b"P", b"F", b"T", b"C", b"S", b"=", b"v", b"r", b"+", b"G", b"L", b"\xa0", b""]
    words = [
        b'"schema": "torchtriage.identity"',
        b"Process 1: x\nPython v3",
        b"=== Rank 0: ",
        b"Stack (most recent call first):",
        b"verdict   ",
        b"GPU 0: H100 (UUID: x)",
        b"entries",
        b"segments",
        b'"traceEvents"',
        b"]",
        b"}",
        b"\n",
        b"\x00",
    ]
    for _ in range(3000):
        body = b" " * rng.randrange(3) + rng.choice(starts) + b"".join(rng.choices(words, k=rng.randrange(5)))
        heads.append(Head(rng.choice(["rank1.log", "notes.md", "x.py", "d.json"]), body, False))
    assert all(_sniff_index(head) == _every_kind_in_order(head) for head in heads)


def test_small_logs_are_read_from_their_sniff_within_the_carried_bytes(tmp_path, monkeypatch):
    """A folder of tiny logs is opened once: each log's content comes from its sniff, up to CARRIED_BYTES in all
    (the rest opened again when read); the verdict is the same either way."""
    from torchtriage.analysis.pipeline import triage_paths
    from torchtriage.sources import registry

    line = "[rank{r}]: step 12 loss 2.31\n"
    for rank in range(40):
        (tmp_path / f"rank{rank}.log").write_text(line.format(r=rank))
    (tmp_path / "rank7.log").write_text(line.format(r=7) + OOM_LINE_7)
    (tmp_path / "rank8.log").write_bytes(gzip.compress(line.format(r=8).encode()))
    whole = discover([str(tmp_path)], [])
    carried = {Path(i.path).name: i.content for i in whole}
    assert carried["rank3.log"] == line.format(r=3).encode() and carried["rank8.log"] is None  # gzip: opened again
    verdict = triage_paths([str(tmp_path)])
    monkeypatch.setattr(registry, "CARRIED_BYTES", 200)
    bounded = discover([str(tmp_path)], [])
    assert 0 < sum(len(i.content or b"") for i in bounded) <= 200
    assert any(i.content is None for i in bounded if not i.path.endswith("rank8.log"))
    again = triage_paths([str(tmp_path)])
    assert (again.category, again.culprit_ranks, again.summary) == (
        verdict.category,
        verdict.culprit_ranks,
        verdict.summary,
    )
    assert (verdict.category, verdict.culprit_ranks) == ("oom", [7])


OOM_LINE_7 = "[rank7]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"


def test_a_folder_swapped_for_a_link_out_after_its_listing_opens_nothing(tmp_path):
    """The files of a folder found are opened inside that folder's descriptor, whose place is asked once: a folder
    swapped for a link out of the folders given after the walk listed it gives nothing away."""
    from torchtriage.sources.streams import FoundFiles, Refused, give_folder

    run, outside = tmp_path / "run", tmp_path / "outside"
    (run / "node1").mkdir(parents=True)
    outside.mkdir()
    (run / "node1" / "rank1.log").write_text("step 1\n")
    (outside / "rank1.log").write_text("token=secret\n")
    give_folder(str(run))
    path = str(run / "node1" / "rank1.log")
    with FoundFiles() as opened:
        fd, status = opened.open(path)
        os.close(fd)
        assert status.st_size == len("step 1\n")
    (run / "node1" / "rank1.log").unlink()
    (run / "node1").rmdir()
    (run / "node1").symlink_to(outside, target_is_directory=True)
    with FoundFiles() as opened, pytest.raises(Refused, match="outside the folder given"):
        opened.open(path)
