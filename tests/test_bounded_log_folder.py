"""A folder of thousands of logs is read on every core, and its records are those of reading the logs one by one:
the same events in the same order (each with the matcher's own rule), tracebacks, torchrun reports, ranks,
problems and tails."""

from __future__ import annotations

import dataclasses
import gzip
import os
import sys

import pytest

from torchtriage.analysis.pipeline import matcher_for
from torchtriage.model import SourceKind
from torchtriage.sources import log_records, registry
from torchtriage.sources.log_records import LogRecords, read_logs
from torchtriage.sources.registry import discover

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79 GiB"
CONTENTS = (
    "step {n} loss 2.31\n",
    "[rank{r}]:[E1130 02:54:48.068043558 ProcessGroupNCCL.cpp:689] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum={n}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600055 "
    "milliseconds before timing out.\n",
    'Traceback (most recent call last):\n  File "/w/train.py", line {n}, in <module>\n    step()\n' + OOM + "\n",
    "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-30_04:32:11\n  host      : node{r}\n"
    "  rank      : {r} (local_rank: 0)\n  exitcode  : -9 (pid: {n})\n",
    "INFO: NCCL version 2.21.5+cuda12.4\n[rank{r}]: progress 10%\r[rank{r}]: progress 90%\r" + OOM + "\r",
    "srun: error: node{r}: task {r}: Exited with exit code 1\nsrun: Terminating StepId=7.0\n"
    "srun: error: node{r}: tasks 0-{r}: Terminated\n" + OOM + "\n",
    "[rank{r}]:gpu-a:4121:4190 [0] NCCL INFO Connected all rings\n",  # chatter: rank r informing, not reporting
)


def write_folder(folder, count: int) -> None:
    for n in range(count):
        text = CONTENTS[n % len(CONTENTS)].format(n=n, r=n % 64)
        if n % 97 == 0:
            (folder / f"rank{n}.log.gz").write_bytes(gzip.compress(text.encode()))
        else:
            (folder / f"rank{n}.log").write_text(text)
    # one record of torchtriage's own cut off while it was written: a problem, and the file not counted as read
    (folder / "nonfinite.jsonl").write_text('{"schema": "torchtriage.nonfinite/1", "line": "cut')


def plain(records: LogRecords, matcher) -> dict:
    """Everything the records hold, comparable; each event's rule must be the matcher's own object."""
    assert all(event.rule is matcher.rules_by_id[event.rule.id] for event in records.events)
    events = [
        dataclasses.asdict(dataclasses.replace(event, rule=None)) | {"rule": event.rule.id} for event in records.events
    ]
    return {
        "events": events,
        "tracebacks": [dataclasses.asdict(t) for t in records.tracebacks],
        "child_failures": [dataclasses.asdict(c) for c in records.child_failures],
        "ranks_seen": records.ranks_seen,
        "ranks_informing": records.ranks_informing,
        "ranks_reporting": records.ranks_reporting,
        "files_read": records.files_read,
        "problems": records.problems,
        "tails": [(t.file, t.rank, t.first_line, t.data) for t in records.tails],
        "launches_finished": records.launches_finished,
        "boots": records.boots,
        "ended_by_launcher": records.ended_by_launcher,
    }


@pytest.fixture(scope="module")
def folder_of_logs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("logs")
    write_folder(folder, 2_100)
    return folder


def test_thousands_of_logs_read_on_every_core_give_the_records_of_reading_them_one_by_one(folder_of_logs, monkeypatch):
    logs = [i for i in discover([str(folder_of_logs)], []) if i.kind == SourceKind.LOG]
    matcher = matcher_for()
    forks = []

    def counted(function, items, jobs, **options):
        forks.append((len(items), jobs))
        return registry.map_forked(function, items, jobs, **options)

    monkeypatch.setattr(log_records, "map_forked", counted)
    monkeypatch.setattr(log_records, "usable_cores", lambda: 2)  # a child even on a machine of one core
    on_every_core = read_logs(logs, matcher)
    assert forks == [(len(logs), 2)]
    monkeypatch.setattr(log_records, "usable_cores", lambda: 1)
    one_by_one = read_logs(logs, matcher)
    assert len(forks) == 1
    assert plain(on_every_core, matcher) == plain(one_by_one, matcher)
    assert len(on_every_core.events) > 1_700 and on_every_core.tracebacks and on_every_core.child_failures
    assert any("nonfinite.jsonl" in problem for problem in on_every_core.problems)
    assert on_every_core.ended_by_launcher == set(range(64))  # srun's account of the tasks it ended
    assert on_every_core.ranks_informing and on_every_core.ranks_reporting  # the levels of the lines that counted


def test_standard_input_among_thousands_of_logs_is_read_here_after_them(folder_of_logs, monkeypatch):
    read_end, write_end = os.pipe()
    os.write(write_end, b"x" * 20_000 + b"\n[rank5]: " + OOM.encode() + b"\n")
    os.close(write_end)
    monkeypatch.setattr(sys, "stdin", open(read_end))  # noqa: SIM115 - closed by the monkeypatch's owner below
    monkeypatch.setattr(registry._Stdin, "head", None)
    monkeypatch.setattr(log_records, "usable_cores", lambda: 2)
    try:
        inputs = [i for i in discover([str(folder_of_logs), "-"], []) if i.kind == SourceKind.LOG]
        records = read_logs(inputs, matcher_for())
    finally:
        sys.stdin.close()
    assert records.files_read[-1] == "<stdin>"
    last = records.events[-1]
    assert (last.file, last.rank, last.line, last.order) == ("<stdin>", 5, 2, len(records.events) - 1)
