"""Hostile inputs built by construction: files written from nothing to look like one kind and be another, or to be
a valid container of hostile content, and folders built to mislead the walk.

The other generators start from a recorded artifact and change its bytes (tests/mutations.py) or one of its values
(tests/hostile_json.py, tests/hostile_pickles.py, tests/hostile_logs.py). Here each case is written from a
template of the format and an attack on its structure, drawn from a seed:

- polyglot:   the first bytes of one kind (a py-spy header, a pickle protocol, `{"traceEvents"`, a gzip magic, a
              faulthandler or debug-server header, a record's schema) followed by another kind or garbage;
- fr:         a flight-recorder job (pickles or JSON, four ranks) whose one rank has fields of the wrong kind:
              text where numbers go, ranks, sizes and times negative, huge or non-finite, objects where lists
              go, repeated keys, a million entries, names full of NULs, surrogates and terminal escapes;
- trace:      profiler traces whose events lack fields, have unknown phases, times as text, negative
              durations, huge ids, arguments of the wrong kind;
- snapshot:   memory snapshots whose segments, blocks and events have the wrong shapes;
- pyspy:      py-spy JSON and text dumps whose threads and frames are of the wrong kind or absurdly deep;
- records:    torchtriage's own records (identity, run-exit, capture summary, nonfinite.jsonl, the monitor's
              windows and decisions) with every field of the wrong kind;
- gzip:       concatenated members, a member cut short, garbage after the end, a bomb of 1000:1;
- text:       a 50 MB line, a million empty lines, only CR, only NUL, UTF-16 and Latin-1, torchrun's failure
              report with absurd values, a traceback 100,000 frames deep, rank prefixes of 20 digits,
              faulthandler and debug-server dumps, layouts (JSON, and YAML with aliases) with absurd values;
- nvidia:     nvidia-smi sessions and NVML dumps with absurd counters, link and GPU numbers, 20,000 GPUs;
- folder:     link loops, links to /dev/zero, /proc/self/mem and a secret outside the folder, a FIFO, a socket,
              a device node, an unreadable folder, 20 levels of nesting, a path past PATH_MAX, names of invalid
              UTF-8, newlines, escapes and markup, the step monitor's files linked out of the folder.

Values are of the wrong kind (text, lists, objects, NaN, 1e400), of the right kind and absurd (0, -1, 2^64,
the largest rank, 20 digits, digits that are not ASCII: '²'), or built to be shown (terminal escapes, bidi
overrides, lone surrogates, HTML markup).

Each case names the commands to run and the exit codes each may end with. A command passes when it ends within
the time bound under a memory bound, with one of its exit codes, no traceback and no "internal error", nothing
from the files reaching the terminal raw (no control character but newline and tab in what it prints) nor the
HTML page as markup, JSON output that parses, and no byte of a file outside the folder it was given shown.

Run on demand: `python tests/crafted_files.py --count 300 [--start N] [--family F]` prints the failing seeds;
`--regressions` runs the inputs that once broke a reader (REGRESSIONS, listed in crafted_regressions.txt). A seed
names a case only for this version of the generator: an input that fails is kept in REGRESSIONS, built exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import json
import os
import pickle
import random
import re
import resource
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from crafted_templates import (
    ESCAPES,
    MARKUP,
    OOM,
    T0,
    attack_tree,
    capture_summary,
    fr_dump,
    fr_entry,
    hostile,
    identity,
    json_bytes,
    monitor_window,
    nonfinite,
    pyspy_threads,
    run_exit,
    snapshot,
    straggler,
    trace,
)

FAMILIES = ("polyglot", "fr", "trace", "snapshot", "pyspy", "records", "gzip", "text", "nvidia", "folder")
MEMORY_BOUND = 3 << 30
TIME_BOUND_S = 120
ANY = frozenset({0, 1, 3})  # a verdict, a problem, or input it cannot read
# What a terminal would act on: every C0 control but tab and newline, DEL, C1, bidi controls, lone surrogates.
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
SECRET = "sk-crafted-9f3e1d"


# ----------------------------------------------------------------------------------------------- the cases


@dataclass
class Case:
    """Files to write (relative path -> bytes), special entries (links, FIFOs, sockets, modes), and the commands.

    A command's arguments: `@name` is `name` inside the case's folder (`@` alone: the folder), `%name` a file in
    a scratch folder beside it (an HTML page to write)."""

    seed: int
    family: str
    detail: str
    files: dict[bytes, bytes] = field(default_factory=dict)
    specials: list[tuple] = field(default_factory=list)
    commands: list[tuple[tuple[str, ...], frozenset[int]]] = field(default_factory=list)
    forbidden: tuple[str, ...] = ()  # text that must never be shown: what lies outside the folder
    expected: tuple[str, ...] = ()  # text every command must show: the reader's own words for what is wrong

    def add(self, name: str | bytes, data: bytes | str) -> None:
        self.files[os.fsencode(name)] = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data

    def run(self, *args: str, codes: frozenset[int] = ANY) -> None:
        self.commands.append((args, codes))


# ------------------------------------------------------------------------------------------------ families


def gz(data: bytes, level: int = 9) -> bytes:
    """`data` gzip'd, the same bytes every time (no time stamp): a seed builds its case again exactly."""
    return gzip.compress(data, level, mtime=0)


def _with_peers(case: Case, name: Callable[[int], str], make: Callable[[int], bytes], world: int) -> None:
    for rank in range(world):
        case.add(name(rank), make(rank))


HEADERS: dict[str, bytes] = {
    "pyspy-text": b"Process 4242: python train.py\nPython v3.11.7 (/usr/bin/python3)\n\n",
    "pyspy-json": b'[{"pid": 1, "thread_id": 2, "frames": [',
    "pickle-fr": b"\x80\x04\x95\x00\x01\x00\x00\x00\x00\x00\x00}\x94(\x8c\x07entries\x94]\x94(",
    "pickle-snapshot": b"\x80\x04}\x94(\x8c\x08segments\x94]\x94(",
    "trace": b'{"traceEvents": [{"ph": "X", "name": "ProfilerStep#1", "ts": 1, "dur": 2, ',
    "gzip": b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03",
    "faulthandler": b"Fatal Python error: Segmentation fault\n\nCurrent thread 0x7f3a (most recent call first):\n",
    "debug-server": b"=== Rank 0: ",
    "identity": b'{"schema": "torchtriage.identity/1", "rank": 0, ',
    "run-exit": b'{"schema": "torchtriage.run_exit/1", "exit_code": ',
    "fr-json": b'{"version": "2.10", "pg_config": {}, "entries": [',
    "smi": b"GPU 0: NVIDIA H200 (UUID: GPU-1234)\n\t Link 0: ",
    "memory-timeline": b"[[1, 2, 3], [[",
    "registrations": b'{"schema": "torchtriage.registrations/1", "hosts": {"node-0": [',
    "summary": b'{"schema": "torchtriage.dump", "processes": [{"rank": ',
    "nonfinite": b'{"schema": "torchtriage.nonfinite/1", "line": "',
    "own-text": b"verdict   hang  (confidence: low)\n",
}


def _body(rng: random.Random) -> tuple[str, bytes]:
    kind = rng.choice(("random", "pickle", "json", "log", "gzip", "nul", "escapes", "utf16", "nothing"))
    if kind == "random":
        return kind, rng.randbytes(rng.choice((10, 5000, 200_000)))
    if kind == "pickle":
        return kind, pickle.dumps(fr_dump(0, 2, 3), protocol=rng.choice((2, 4, 5)))
    if kind == "json":
        return kind, json_bytes(trace(0))
    if kind == "log":
        return kind, (OOM.format(r=0) * 3).encode()
    if kind == "gzip":
        return kind, gz(b"Traceback (most recent call last):\n" * 100)
    if kind == "nul":
        return kind, b"\0" * rng.choice((1, 9000, 1 << 20))
    if kind == "escapes":
        return kind, (ESCAPES * 50 + "\n").encode() * 20
    if kind == "utf16":
        return kind, ("\ufeff" + OOM.format(r=0)).encode("utf-16-le")
    return kind, b""


POLYGLOT_NAMES = (
    "rank0.log", "nccl_trace_rank_0", "trace_rank0.json", "snapshot.pickle", "rank00.json", "x.bin", "summary.json",
    "registrations.json", "run-exit.json", "identity/rank1.json", "monitor/stragglers.jsonl", "nvidia_smi.txt",
)  # fmt: skip


def polyglot(case: Case, rng: random.Random) -> None:
    head = rng.choice(sorted(HEADERS))
    body_kind, body = _body(rng)
    cut = rng.choice((len(HEADERS[head]), rng.randrange(1, len(HEADERS[head]) + 1)))
    name = rng.choice(POLYGLOT_NAMES)
    case.detail = f"{head} header (first {cut} bytes) + {body_kind}, named {name}"
    data = HEADERS[head][:cut] + body
    if rng.random() < 0.25:  # the same, gzip'd: the sniffer looks through the compression
        data, name = gz(data), name + ".gz"
        case.detail += ", gzip'd"
    case.add(name, data)
    if rng.random() < 0.5:  # beside a genuine peer, so the verbs that compare ranks have something to compare
        case.add("rank1.log", OOM.format(r=1))
    for verb in ("triage", "diagnose", "fr", "trace"):
        case.run(verb, "@")
    verb = rng.choice(("triage", "diagnose", "fr", "trace", "memory", "history"))
    case.run(verb, f"@{name}", codes=ANY | {2} if verb == "history" else ANY)  # history takes folders only
    case.run("nvlink", "--from", "@")
    case.run(rng.choice(("triage", "diagnose", "fr", "trace")), "-", f"<{name}")  # the same on standard input
    case.run("report", "--html", "%page.html", "@")


def fr_semantic(rng: random.Random, dumps: list[dict], victim: int) -> str:
    """Values of the right kind that no genuine job writes: sequence numbers, groups, peers, states, times."""
    dump = dumps[victim]
    rows = dump["entries"]
    what = rng.choice(
        (
            "seq gap",
            "seq all one",
            "seq reversed",
            "seq negative",
            "p2p",
            "groups",
            "ranks text",
            "unknown group",
            "states",
            "record ids",
            "names",
            "sizes",
            "times",
            "rank key",
            "peer world",
            "gloo idle rank",
            "gloo idle rank",
        )
    )
    if what == "gloo idle rank":  # gloo, one rank in no op: the analysis asks what the dumps show of group ids
        _, pg_id = hostile(rng, False)
        for d in dumps:
            for row in d["entries"]:
                row.update(profiling_name="gloo:all_reduce", pg_id=pg_id)
        dump["entries"] = []
        return f"{what}, every pg_id = {str(pg_id)[:20]!r}"
    if what == "seq gap":
        rows[-1]["collective_seq_id"] = rows[-1]["op_id"] = 10**12
        dump["pg_status"]["0"]["last_enqueued_collective"] = 10**12
    elif what == "seq all one":
        for row in rows:
            row["collective_seq_id"] = row["op_id"] = 1
    elif what == "seq reversed":
        for row, seq in zip(rows, range(len(rows), 0, -1), strict=True):
            row["collective_seq_id"] = row["op_id"] = seq
    elif what == "seq negative":
        for row in rows:
            row["collective_seq_id"] = row["p2p_seq_id"] = -row["collective_seq_id"]
    elif what == "p2p":
        peer = rng.choice((99999999999999999999, -1, 1_048_575, 2**63 - 1, "²"))
        for d in dumps:
            for row in d["entries"]:
                row.update(
                    is_p2p=True,
                    profiling_name=rng.choice(("nccl:send", "nccl:recv", "nccl:send 1", f"nccl:recv {peer}")),
                    p2p_seq_id=rng.choice((row["collective_seq_id"], peer if isinstance(peer, int) else 0)),
                    collective_seq_id=0,
                )
        what += f" (peer {peer})"
    elif what == "groups":
        count = rng.choice((5_000, 50_000))
        for d in dumps:
            d["pg_config"] |= {
                str(g): {"name": str(g), "desc": f"g{g}", "ranks": "[0, 1, 2, 3]"} for g in range(1, count)
            }
            d["pg_status"] |= {
                str(g): {"last_enqueued_collective": 1, "last_started_collective": 1, "last_completed_collective": 0}
                for g in range(1, count)
            }
            d["entries"] += [{**fr_entry(0, state="scheduled", pg=str(g)), "pg_id": g} for g in range(1, count, 7)]
        what += f" ({count:,})"
    elif what == "ranks text":
        text = rng.choice(
            (
                "[0, 0, 0, 0]",
                "[]",
                "[3, 2, 1, 0]",
                "[0, 1]",
                "[1048575, 0]",
                "[-1, 0, 1, 2]",
                "0, 1, 2, 3",
                "[0, 1, 2, 3" + ", 3" * 100_000 + "]",
                str(list(range(1_048_576))),
                "[²]",
                "[0.5, 1e400]",
            )
        )
        for d in dumps if rng.random() < 0.5 else [dump]:
            d["pg_config"]["0"]["ranks"] = text
        what += f" {text[:30]!r}"
    elif what == "unknown group":
        for row in rows:
            row["process_group"] = (rng.choice(("7", "", "0" * 300, ESCAPES)), "nowhere")
            row["pg_id"] = rng.choice((7, -1, 2**40))
    elif what == "states":
        for row in rows:
            row["state"] = rng.choice(("cancelled", "", "COMPLETED", ESCAPES, "started"))
            row["time_discovered_started_ns"] = rng.choice((None, 0, T0 * 2, -T0))
    elif what == "record ids":
        base = rng.choice((2**62, 10**6, -50))
        for index, row in enumerate(rows):
            row["record_id"] = base + index * rng.choice((1, 0, 10**9))
    elif what == "names":
        name = rng.choice(
            ("nccl:", ":", "x" * 4096, "nccl:" + ESCAPES, "gloo:all_reduce", "nccl:all_reduce" * 300, "\ud800")
        )
        for row in rows:
            row["profiling_name"] = name
        what += f" {name[:20]!r}"
    elif what == "sizes":
        sizes = rng.choice(([[2**62, 2**62]], [[-1]], [[0] * 10_000], [[[[[[1]]]]]], [list(range(1000))] * 1000))
        for row in rows:
            row["input_sizes"] = row["output_sizes"] = sizes
    elif what == "times":
        for index, row in enumerate(rows):
            row["time_created_ns"] = rng.choice((0, -1, 2**63 - 1, T0 - index * 10**12))
            row["timeout_ms"] = rng.choice((0, -1, 2**63 - 1, 1))
    elif what == "rank key":
        dump["rank"] = rng.choice((0, victim, 1_048_575, 2**62))
        what += f" {dump['rank']}"
    else:  # every dump says its group is far larger than the dumps read
        for d in dumps:
            d["pg_config"]["0"]["ranks"] = str(list(range(rng.choice((4096, 65_536, 1_048_576)))))
    return what


def fr_case(case: Case, rng: random.Random) -> None:
    world = 4
    in_json = rng.random() < 0.4
    entries = rng.choice((3, 5, 20))
    victim = rng.randrange(world)
    dumps = [fr_dump(rank, world, entries) for rank in range(world)]
    style = rng.choice(("field", "field", "fields", "every-entry", "structure", "many", "semantic", "semantic"))
    if style == "semantic":
        said = fr_semantic(rng, dumps, victim)
    elif style in ("field", "fields"):
        said, dumps[victim] = attack_tree(rng, dumps[victim], in_json, touches=1 if style == "field" else 4)
    elif style == "every-entry":
        key = rng.choice(sorted(dumps[victim]["entries"][0]))
        what, value = hostile(rng, in_json)
        dumps[victim]["entries"] = [{**e, key: value} for e in dumps[victim]["entries"]]
        said = f"every entry's {key} = {what}"
    elif style == "structure":
        what, value = rng.choice(
            [
                ("entries an object", {"0": fr_entry(0)}),
                ("entries a text", "entries"),
                ("pg_config a list", [["0", "default_pg", "[0, 1, 2, 3]"]]),
                ("pg_config ranks huge", {"0": {"name": "0", "desc": "x", "ranks": str([0, 2**70, -5, 10**9])}}),
                ("pg_config ranks not a list", {"0": {"name": "0", "desc": "x", "ranks": "[[[[0]]]]"}}),
                (
                    "pg_config ranks a range of a million",
                    {"0": {"name": "0", "desc": "x", "ranks": str(list(range(10**6)))}},
                ),
                (
                    "pg_status counters huge",
                    {
                        "0": {
                            "last_enqueued_collective": 10**12,
                            "last_started_collective": -(10**12),
                            "last_completed_collective": 2**64,
                        }
                    },
                ),
                ("the dump a list", [fr_entry(0)]),
                ("the dump a number", 7),
                ("process_group of one item", [{**fr_entry(i), "process_group": ("0",)} for i in range(3)]),
            ]
        )
        key = {
            "entries an": "entries",
            "entries a ": "entries",
            "pg_config": "pg_config",
            "pg_status": "pg_status",
            "process_g": "entries",
        }.get(what[:9], "")
        if what.startswith("pg_config"):
            key = "pg_config"
        dumps[victim] = value if not key else {**dumps[victim], key: value}
        said = what
    else:
        count = rng.choice((100_000, 1_000_000 if not in_json else 300_000))
        row = fr_entry(0)
        dumps[victim]["entries"] = [row] * count  # pickled as one memo reference each: small on disk
        said = f"{count:,} entries"
    case.detail = f"{'JSON' if in_json else 'pickle'} dumps, rank {victim}: {said}"
    for rank, dump in enumerate(dumps):
        if in_json:
            data = json_bytes(dump) if not isinstance(dump, dict) or "entries" in dump else json_bytes(dump)
            case.add(f"fr_dump_json_rank_{rank}", data)
        else:
            case.add(f"nccl_trace_rank_{rank}", pickle.dumps(dump, protocol=rng.choice((2, 4))))
    case.run("fr", "@")
    case.run("fr", "--json", "@")
    case.run("diagnose", "@")
    case.run("report", "--html", "%page.html", "@")


def trace_semantic(rng: random.Random, victim: dict) -> str:
    """Events of the right kind that no profiler writes: steps, collectives and ids that contradict each other."""
    events = victim["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    records = [e for e in events if e.get("name") == "record_param_comms"]
    what = rng.choice(
        ("steps overlap", "step numbers", "many steps", "seq", "group", "ids", "world", "zero", "one time")
    )
    if what == "steps overlap":
        for step in steps:
            step.update(ts=steps[0]["ts"], dur=rng.choice((10**9, 0, 1)))
    elif what == "step numbers":
        number = rng.choice(("99999999999999999999", "²", "-1", "1e400", "9" * 5000, "", "0x10"))
        for step in steps:
            step["name"] = f"ProfilerStep#{number}"
        what += f" {number[:20]!r}"
    elif what == "many steps":
        events += [
            {**steps[0], "name": f"ProfilerStep#{n}", "ts": steps[0]["ts"] + n, "dur": 1} for n in range(100_000)
        ]
    elif what == "seq":
        for record in records:
            record["args"]["Seq"] = rng.choice((1, -1, 2**63, "1", None, 10**12))
    elif what == "group":
        value = rng.choice(("[0, 0]", "", str(list(range(1_048_576))), "[²]", ESCAPES, "[" * 5000))
        for record in records:
            record["args"]["Process Group Ranks"] = value
            record["args"]["Group size"] = rng.choice((0, -1, 1_048_576, 2**62))
        what += f" ranks {value[:20]!r}"
    elif what == "ids":
        for event in events:
            if isinstance(event.get("args"), dict):
                event["args"]["correlation"] = event["args"]["External id"] = rng.choice((0, -1, 2**63 - 1, 1))
    elif what == "world":
        victim["distributedInfo"].update(
            world_size=rng.choice((1, 0, 1_048_576, 1_048_577)), rank=rng.choice((0, 1, 1_048_575))
        )
    elif what == "zero":
        for event in events:
            if "dur" in event:
                event["dur"] = 0
    else:
        for event in events:
            event["ts"] = events[0]["ts"]
    return what


def trace_case(case: Case, rng: random.Random) -> None:
    victim = trace(0)
    events = victim["traceEvents"]
    style = rng.choice(
        ("event", "event", "args", "args", "distributed", "top", "many", "missing", "phase", "semantic", "semantic")
    )
    if style == "semantic":
        said = trace_semantic(rng, victim)
    elif style == "event":
        index = rng.randrange(len(events))
        key = rng.choice(("ts", "dur", "pid", "tid", "args", "name", "cat", "ph", "id"))
        what, value = hostile(rng, True)
        events[index] = {**events[index], key: value}
        said = f"event {index} {key} = {what}"
    elif style == "args":  # the fields the analysis reads: a collective's record, a launch's and a kernel's ids
        index = rng.choice([i for i, e in enumerate(events) if isinstance(e.get("args"), dict) and e["args"]])
        said, args = attack_tree(rng, events[index]["args"], True, touches=rng.choice((1, 3)))
        events[index] = {**events[index], "args": args}
        said = f"event {index} ({events[index]['name']}) args: {said}"
    elif style == "distributed":
        said, info = attack_tree(rng, victim["distributedInfo"], True, touches=2)
        victim["distributedInfo"] = info
        said = f"distributedInfo: {said}"
    elif style == "top":
        said, victim = attack_tree(rng, victim, True)
    elif style == "many":
        count = rng.choice((100_000, 1_000_000))
        victim["traceEvents"] = events + [{"ph": "i", "name": "x", "ts": 1, "pid": 1, "tid": 1}] * count
        said = f"{count:,} instant events"
    elif style == "missing":
        key = rng.choice(("ts", "dur", "ph", "name", "pid", "cat"))
        victim["traceEvents"] = [{k: v for k, v in e.items() if k != key} for e in events]
        said = f"every event without {key}"
    else:
        ph = rng.choice(("Z", "", 5, None, ["X"], "XX", "\x1b[2J"))
        victim["traceEvents"] = [{**e, "ph": ph} if e["ph"] == "X" else e for e in events]
        said = f"every complete event's ph = {ph!r}"
    case.detail = f"trace rank 0: {said}"
    data = json_bytes(victim)
    name = "trace_rank0.json"
    if rng.random() < 0.3:
        data, name = gz(data, level=1), name + ".gz"
    case.add(name, data)
    case.add("trace_rank1.json", json_bytes(trace(1)))
    case.run("trace", "@")
    case.run("trace", f"@{name}")
    case.run("trace", "--json", "@")
    case.run("trace", "--html", "%page.html", "@")
    case.run("report", "--html", "%page.html", "@")


def snapshot_case(case: Case, rng: random.Random) -> None:
    snap = snapshot()
    style = rng.choice(("field", "field", "fields", "shape", "segments", "events"))
    if style in ("field", "fields"):
        said, snap = attack_tree(rng, snap, False, touches=1 if style == "field" else 3)
    elif style == "shape":
        what, value = rng.choice(
            [
                ("segments an object", {"0": snap["segments"][0]}),
                ("segments of numbers", [1, 2, 3]),
                ("blocks an object", [{**snap["segments"][0], "blocks": {"a": 1}}]),
                ("blocks of lists", [{**snap["segments"][0], "blocks": [[1, 2], [3]]}]),
                ("device huge", [{**snap["segments"][0], "device": 10**9}]),
                ("device negative", [{**snap["segments"][0], "device": -7}]),
                ("sizes negative", [{**snap["segments"][0], "total_size": -(2**62), "allocated_size": -1}]),
                ("sizes past 64 bits", [{**snap["segments"][0], "total_size": 2**70}]),
                ("sizes as text", [{**snap["segments"][0], "total_size": "3G", "allocated_size": "x"}]),
                ("sizes NaN", [{**snap["segments"][0], "total_size": float("nan"), "allocated_size": float("inf")}]),
            ]
        )
        snap["segments"], said = value, what
    elif style == "segments":
        count = rng.choice((10_000, 200_000))
        snap["segments"] = snap["segments"] * count
        said = f"{count:,} copies of a segment"
    else:
        what, value = rng.choice(
            [
                ("device_traces an object", {"0": snap["device_traces"][0]}),
                ("device_traces for 10^5 devices", [[]] * 100_000),
                ("events of numbers", [[1, 2, 3]]),
                (
                    "unknown actions",
                    [[{**e, "action": a} for e in snap["device_traces"][0] for a in ("x", "", None, 5)]],
                ),
                (
                    "times backwards and huge",
                    [[{**e, "time_us": t} for e, t in zip(snap["device_traces"][0], (2**63, -1, 0.5), strict=True)]],
                ),
                ("a million events", [[snap["device_traces"][0][1]] * 1_000_000]),
                (
                    "free of never allocated",
                    [[{**snap["device_traces"][0][1], "action": "free_completed", "addr": i} for i in range(50_000)]],
                ),
            ]
        )
        snap["device_traces"], said = value, what
    case.detail = f"snapshot: {said}"
    data = pickle.dumps(snap, protocol=rng.choice((2, 4)))
    name = "snapshot.pickle"
    if rng.random() < 0.25:
        data, name = gz(data, level=1), name + ".gz"
    case.add(name, data)
    case.run("memory", f"@{name}")
    case.run("memory", "--json", f"@{name}")
    case.run("memory", "--html", "%page.html", f"@{name}")
    case.run("memory", f"@{name}", "--compare", f"@{name}")
    case.run("report", "--html", "%page.html", "@")


def _pyspy_text(rng: random.Random, rank: int) -> str:
    frames = rng.choice(
        [
            ["    all_reduce (torch/distributed/distributed_c10d.py:99999999999999999999)"],
            ["    f (x.py:-5)", "    g (:)", "    (:1)"],
            [f"    f{i} (deep.py:{i})" for i in range(100_000)],
            [f"    {ESCAPES} ({ESCAPES}.py:1)"],
            ["    all_reduce (torch/distributed/distributed_c10d.py:3252)"] * 3,
        ]
    )
    thread = rng.choice(("0x7f", "99999999999999999999999", "-1", "nan", ESCAPES))
    return (
        f"Process {rng.choice((4242, 0, 99999999999999999999))}: python train.py\nPython v3.11.7 (/usr/bin/python3)\n\n"
        f'Thread {thread} (idle): "MainThread{rng.choice(("", ESCAPES))}"\n' + "\n".join(frames) + "\n"
    )


LOCAL_VALUES = (
    "²",
    "٣",
    "１",
    "9" * 4000,
    "9" * 4096,
    "99999999999999999999",
    "-1",
    "",
    " ",
    "(",
    "(" * 3000,
    "((((((((",
    "(<Tensor>, " * 2000 + ")",
    "None",
    ESCAPES,
    "'\ud800'",
    "{'group': " * 500,
)


def _hostile_locals(rng: random.Random) -> tuple[str, list[dict]]:
    """A point-to-point call and the c10d wrapper around it, their locals absurd."""
    op = rng.choice(("recv", "send", "irecv", "isend", "new_group", "all_reduce", "barrier"))
    value = rng.choice(LOCAL_VALUES)
    names = rng.choice((("src", "dst", "group_name", "group"), ("args", "kwargs"), ("src",), ("args",)))

    def frame(name: str, file: str, variables: list[dict]) -> dict:
        return {
            "name": name,
            "filename": file,
            "module": None,
            "short_filename": file.rsplit("/", 1)[-1],
            "line": 7,
            "locals": variables,
            "is_entry": False,
        }

    c10d = "/venv/torch/distributed/distributed_c10d.py"
    inner = frame(op, c10d, [{"name": n, "repr": value, "arg": True} for n in names])
    wrapper = frame(
        "wrapper",
        "/venv/torch/distributed/c10d_logger.py",
        [{"name": "args", "repr": value, "arg": True}, {"name": "kwargs", "repr": value, "arg": True}],
    )
    user = frame("train_step", "/job/train.py", [])
    return f"{op} with {', '.join(names)} = {value[:20]!r} ({len(value)} chars)", [inner, wrapper, user]


def _pyspy_locals_text(rng: random.Random) -> str:
    said, frames = _hostile_locals(rng)
    lines = [
        "Process 4242: python train.py",
        "Python v3.11.7 (/usr/bin/python3)",
        "",
        'Thread 0x7f (idle): "MainThread"',
    ]
    for frame in frames:
        lines.append(f"    {frame['name']} ({frame['filename']}:{frame['line']})")
        if frame["locals"]:
            lines.append("        Locals:")
            lines += [f"            {v['name']}: {v['repr']}" for v in frame["locals"]]
    return "\n".join(lines) + "\n"


def pyspy_case(case: Case, rng: random.Random) -> None:
    world = 2
    if rng.random() < 0.3:
        case.detail = "py-spy text with absurd values"
        for rank in range(world):
            case.add(f"rank0{rank}.txt", _pyspy_text(rng, rank))
    elif rng.random() < 0.2:
        case.detail = "py-spy text, --locals absurd"
        for rank in range(world):
            case.add(f"rank0{rank}.txt", _pyspy_locals_text(rng))
    else:
        threads = pyspy_threads(0)
        style = rng.choice(("field", "fields", "frames", "deep", "threads", "locals", "locals"))
        if style in ("field", "fields"):
            said, threads = attack_tree(rng, threads, True, touches=1 if style == "field" else 4)
        elif style == "frames":
            what, value = hostile(rng, True)
            threads[0]["frames"] = [value, {"name": value, "filename": value, "line": value}]
            said = f"frames of {what}"
        elif style == "locals":  # what the analysis reads of py-spy's --locals: a peer, a group, the call's arguments
            said, threads[0]["frames"] = _hostile_locals(rng)
        elif style == "deep":
            threads[0]["frames"] = threads[0]["frames"] * 50_000
            said = "100,000 frames"
        else:
            what, threads = rng.choice(
                [("an object", {"0": threads[0]}), ("a list of numbers", [1, 2]), ("10^5 threads", threads * 100_000)]
            )
            said = f"threads: {what}"
        case.detail = f"py-spy JSON rank 0: {said}"
        case.add("rank00.json", json_bytes(threads))
        case.add("rank01.json", json_bytes(pyspy_threads(1, waiting=False)))
    case.run("diagnose", "@")
    case.run("diagnose", "--json", "@")
    case.run("triage", "@")


def records_case(case: Case, rng: random.Random) -> None:
    kind = rng.choice(("identity", "run-exit", "summary", "nonfinite", "monitor", "stragglers", "registrations"))
    touches = rng.choice((1, 3, 20))
    case.add("rank0.log", OOM.format(r=0))
    if kind == "identity":
        said, record = attack_tree(rng, identity(1), True, touches)
        for rank in (0, 2):
            case.add(f"identity/rank{rank}.json", json_bytes(identity(rank)))
        case.add("identity/rank1.json", json_bytes(record))
    elif kind == "run-exit":
        said, record = attack_tree(rng, run_exit(), True, touches)
        case.add("run-exit.json", json_bytes(record) + b"\n")
    elif kind == "summary":
        said, record = attack_tree(rng, capture_summary(), True, touches)
        case.add("summary.json", json_bytes(record))
    elif kind == "nonfinite":
        said, record = attack_tree(rng, nonfinite(), True, touches)
        case.add("nonfinite.jsonl", json_bytes(nonfinite()) + b"\n" + json_bytes(record) + b"\n")
    elif kind == "monitor":
        windows = [monitor_window(0, 50), monitor_window(0, 100)]
        said, windows = attack_tree(rng, windows, True, touches)
        lines = [json_bytes(w) for w in (windows if isinstance(windows, list) else [windows])]
        case.add("monitor/steps-rank0.jsonl", b"\n".join(lines) + b"\n")
        case.add("monitor/steps-rank1.jsonl", json_bytes(monitor_window(1, 50)) + b"\n")
        case.add("monitor/stragglers.jsonl", json_bytes(straggler(1, 50)) + b"\n")
    elif kind == "registrations":
        record = {
            "schema": "torchtriage.registrations/1",
            "store": "node-0:29500",
            "hosts": {"node-0": [0, 1], "node-1": [2, 3]},
        }
        said, record = attack_tree(rng, record, True, touches)
        case.add("registrations.json", json_bytes(record))
    else:
        said, record = attack_tree(rng, straggler(1, 50), True, touches)
        case.add("monitor/steps-rank1.jsonl", json_bytes(monitor_window(1, 50)) + b"\n")
        case.add("monitor/stragglers.jsonl", json_bytes(record) + b"\n")
    case.detail = f"{kind}: {said[:300]}"
    case.run("triage", "@")
    case.run("diagnose", "@")
    case.run("history", "@")
    case.run("report", "--html", "%page.html", "@")


@functools.lru_cache(maxsize=4)
def bomb(size: int, unit: bytes) -> bytes:
    """A gzip member of `size` bytes of `unit` repeated: about 1000:1 for zeros."""
    out = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = unit * ((1 << 20) // len(unit))
    parts = [out.compress(chunk) for _ in range(size // len(chunk))]
    return b"".join(parts) + out.flush()


def gzip_case(case: Case, rng: random.Random) -> None:
    log = (OOM.format(r=0) + "step 10 ok\n" * 100).encode()
    style = rng.choice(
        ("concatenated", "truncated", "trailing", "bomb-log", "bomb-other", "empty-member", "header-only")
    )
    name = rng.choice(("rank0.log.gz", "nccl_trace_rank_0.gz", "trace_rank0.json.gz", "snapshot.pickle.gz"))
    payload = {
        "rank0.log.gz": log,
        "nccl_trace_rank_0.gz": pickle.dumps(fr_dump(0, 2, 3), protocol=2),
        "trace_rank0.json.gz": json_bytes(trace(0)),
        "snapshot.pickle.gz": pickle.dumps(snapshot(), protocol=4),
    }[name]
    limit: tuple[str, ...] = ()
    if style == "concatenated":
        cut = rng.randrange(1, len(payload))
        data = gz(payload[:cut]) + gz(payload[cut:])
    elif style == "truncated":
        whole = gz(payload)
        data = whole[: rng.randrange(10, len(whole))]
    elif style == "trailing":
        data = gz(payload) + rng.choice((b"\0" * 100, rng.randbytes(1000), b"\x1f\x8b garbage"))
    elif style == "bomb-log":
        name, data = "rank0.log.gz", gz(OOM.format(r=0).encode()) + bomb(1 << 30, b"step ok\n")
        limit = ("--limit", "stream-bytes=64M")
    elif style == "bomb-other":
        head = {
            "nccl_trace_rank_0.gz": b"\x80\x02}q\x00(X\x07\x00\x00\x00entries",
            "trace_rank0.json.gz": b'{"traceEvents": [',
            "snapshot.pickle.gz": b"\x80\x04}\x94(\x8c\x08segments\x94]\x94(",
            "rank0.log.gz": b"",
        }[name]
        data = gz(head) + bomb(1 << 30, b"\0")
        limit = ("--limit", "bytes=64M", "--limit", "stream-bytes=64M")
    elif style == "empty-member":
        data = gz(b"") + gz(payload) + gz(b"")
    else:
        data = gz(payload)[:10]
    case.detail = f"{style} {name}"
    case.add(name, data)
    case.add("rank1.log", OOM.format(r=1))
    verb = {"rank0.log.gz": "triage", "nccl_trace_rank_0.gz": "fr", "trace_rank0.json.gz": "trace"}.get(name, "memory")
    case.run(verb, *limit, f"@{name}")
    case.run("diagnose", *limit, "@")
    case.run("triage", *limit, "@")


TORCHRUN_REPORT = """============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[{index}]:
  time      : {time}
  host      : {host}
  rank      : {rank} (local_rank: {local})
  exitcode  : {code} (pid: {pid})
  error_file: {error_file}
  traceback : {traceback}
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : {time}
  host      : {host}
  rank      : {rank} (local_rank: {local})
  exitcode  : {code} (pid: {pid})
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID {pid}
============================================================
"""


def _absurd(rng: random.Random) -> str:
    return rng.choice(
        (
            "99999999999999999999",
            "-999999999999",
            "9" * 5000,
            "nan",
            "",
            "garbage",
            "-0",
            "1e400",
            "0x7f",
            ESCAPES,
            "\ud800",
            "３",
            "²",
            MARKUP,
        )
    )


def text_case(case: Case, rng: random.Random) -> None:
    style = rng.choice(
        (
            "long-line",
            "empty-lines",
            "only-cr",
            "only-nul",
            "utf16",
            "latin1",
            "torchrun",
            "deep-traceback",
            "rank-prefix",
            "faulthandler",
            "smi",
            "layout-json",
            "layout-yaml",
            "debug-server",
        )
    )
    name, verbs = "rank0.log", ("triage", "diagnose")
    if style == "long-line":
        size = rng.choice((8 << 20, 50 << 20))
        data = (
            b"x" * size + b"\n" + OOM.format(r=0).encode()
            if rng.random() < 0.5
            else OOM.format(r=0).encode()[:-1] + b"y" * size
        )
        said = f"a line of {size >> 20} MB"
    elif style == "empty-lines":
        data = b"\n" * 1_000_000 + OOM.format(r=0).encode() + rng.choice((b"", b"\r\n" * 1_000_000))
        said = "a million empty lines"
    elif style == "only-cr":
        data = rng.choice((b"\r" * (1 << 20), OOM.format(r=0).encode().replace(b"\n", b"\r") * 1000))
        said = "CR only"
    elif style == "only-nul":
        data = b"\0" * rng.choice((1, 8192, 8193, 1 << 22))
        said = "NUL only"
    elif style == "utf16":
        data = (OOM.format(r=0) * 20).encode(rng.choice(("utf-16", "utf-16-be", "utf-32")))
        said = "UTF-16/32 with a BOM"
    elif style == "latin1":
        data = ("é€ß" + OOM.format(r=0) + "caf\xe9 \xff\xfe\n" * 10).encode("latin-1", "replace")
        data += "mixed ✓\n".encode() + b"\xc3\x28\xa0\xa1\xf0\x28\x8c\xbc\n"
        said = "Latin-1 and invalid UTF-8"
    elif style == "torchrun":
        values = {
            k: _absurd(rng)
            for k in ("index", "time", "host", "rank", "local", "code", "pid", "error_file", "traceback")
        }
        data = TORCHRUN_REPORT.format(**values).encode("utf-8", "surrogatepass")
        data = data * rng.choice((1, 2000))
        said = f"torchrun report of {', '.join(f'{k}={v[:12]!r}' for k, v in values.items())}"
    elif style == "deep-traceback":
        depth = rng.choice((10_000, 100_000))
        frames = "".join(f'  File "/job/m{i % 7}.py", line {i}, in f{i}\n    f{i + 1}()\n' for i in range(depth))
        tail = rng.choice(("RecursionError: maximum recursion depth exceeded\n", "", OOM.format(r=0)[9:]))
        data = ("Traceback (most recent call last):\n" + frames + tail).encode()
        if rng.random() < 0.5:
            data = b"".join(b"[rank0]: " + line + b"\n" for line in data.splitlines())
        said = f"a traceback {depth:,} frames deep"
    elif style == "rank-prefix":
        prefix = rng.choice(
            (
                "[rank99999999999999999999]:",
                "[rank-1]:",
                "[rank0000000000000000001]:",
                "[default99999999999999]:",
                "[rank1e400]:",
                "[rank\x1b[31m]:",
                "99999999999999999999: ",
                "[rank２]:",
            )
        )
        data = "".join(f"{prefix} {line}\n" for line in OOM.format(r=99999999999999999999).splitlines() * 100).encode()
        said = f"prefix {prefix!r}"
    elif style == "faulthandler":
        name, verbs = "faulthandler-rank0.txt", ("diagnose",)
        frame = rng.choice(
            (
                '  File "/job/train.py", line 99999999999999999999 in step\n',
                f'  File "{ESCAPES}", line 1 in {ESCAPES}\n',
                '  File "", line -1 in \n',
                '  File "/job/x.py", line 3 in f\n',
            )
        )
        depth = rng.choice((1, 100_000))
        thread = rng.choice(("0x00007f3a4c8b9740", "0x" + "f" * 400, "0x"))
        header = f"Fatal Python error: Aborted\n\nCurrent thread {thread} (most recent call first):\n"
        data = (header + frame * depth).encode()
        said = f"faulthandler, thread {thread[:12]}, {depth:,} frames"
    elif style == "smi":
        name, verbs = "nvidia_smi.txt", ()
        value = _absurd(rng)
        data = (
            f"GPU 0: NVIDIA H200 (UUID: GPU-{value})\n\t Link 0: {value} GB/s\n"
            "\t Link 99999999999999999999: 26.5 GB/s\n"
            f"GPU {value}: NVIDIA H200 (UUID: GPU-2)\n\t Link 0: <inactive>\n"
            f"Xid 79 on GPU {value}\nNVRM: Xid (PCI:0000:{value}): 79, pid={value}, GPU has fallen off the bus.\n"
        ).encode("utf-8", "surrogatepass")
        case.run("nvlink", "--from", f"@{name}")
        case.run("nvlink", "--json", "--from", f"@{name}")
        said = f"nvidia-smi with {value[:12]!r}"
    elif style in ("layout-json", "layout-yaml"):
        name, verbs = ("layout.json" if style == "layout-json" else "layout.yaml"), ()
        layout = {"world_size": 64, "gpus_per_node": 8, "parallelism": {"tp": 8, "pp": 2}}
        if style == "layout-json":
            said, layout = attack_tree(rng, layout, True, touches=2)
            data = json_bytes(layout)
        else:
            value = rng.choice(
                (
                    "99999999999999999999",
                    "-1",
                    ".nan",
                    ".inf",
                    "[1, 2]",
                    "{a: 1}",
                    "!!binary aGk=",
                    "&a [*a]",
                    "0x10",
                    "0o10",
                    "1_000",
                    "yes",
                    "~",
                    "'8'",
                    "!!python/object:os.system x",
                )
            )
            laughs = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
                f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
                f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
                for i in range(8)
            )
            data = (
                f"world_size: {value}\ngpus_per_node: 8\ntensor_model_parallel_size: {value}\n"
                + (laughs + "pipeline_model_parallel_size: *i\n" if rng.random() < 0.4 else "")
            ).encode()
            said = f"yaml value {value!r}"
        case.run("check-layout", "--config", f"@{name}", codes=frozenset({0, 1, 2, 3}))
        case.run("check-layout", "--json", "--config", f"@{name}", codes=frozenset({0, 1, 2, 3}))
    else:
        name, verbs = "stacks.txt", ("diagnose",)
        number = _absurd(rng)
        section = (
            f"=== Rank {number}: ===\nThread 0x1 (most recent call first):\n"
            f'  File "/job/train.py", line {number} in f\n'
        )
        data = section.encode("utf-8", "surrogatepass") * rng.choice((1, 50_000))
        said = f"debug-server stacks, rank {number[:12]!r}"
    case.detail = f"{style}: {said}"
    case.add(name, data)
    for verb in verbs:
        case.run(verb, "@")
        case.run(verb, f"@{name}")
    if verbs:
        case.run("report", "--html", "%page.html", "@")


def _smi_sections(rng: random.Random) -> tuple[str, str]:
    """A recorded nvidia-smi session (`+ nvidia-smi ...` before each output) whose values are absurd."""
    value, gpu, link = (
        _absurd(rng),
        rng.choice(("0", "99999999999999999999", "²", "-1")),
        rng.choice(("0", "65536", "²")),
    )
    gpus = rng.choice((1, 2, 20_000))
    status = "".join(f"GPU {g}: NVIDIA H200 (UUID: GPU-{value})\n\t Link {link}: {value} GB/s\n" for g in range(gpus))
    errors = (
        f"GPU {gpu}: NVIDIA H200 (UUID: GPU-1)\n\t Link {link}: Replay Errors: {value}\n"
        f"\t Link {link}: FEC Errors - {rng.choice(('0', '99999999999999999999', '²'))}: {value}\n"
        f"\t Link {link}: Effective BER: {value}\n\t Link 0: {value}: {value}: {value}\n"
    )
    depth = rng.choice((3, 2000))
    query = (
        "GPU 00000000:00:06.0\n"
        + "".join(" " * i + f"Section {i}\n" for i in range(depth))
        + f"    ECC Errors\n        Volatile\n            DRAM Uncorrectable : {value}\n"
        + f"    Retired Pages\n        Single Bit ECC : {value}\n        Pending Page Blacklist : {value}\n"
        + f"    Remapped Rows\n        Correctable Error : {value}\n"
    )
    size = rng.choice((2, 3000))
    names = [f"GPU{i}" for i in range(size)]
    topology = "\t" + "\t".join(names) + "\n" + "".join(f"{n}\t" + "\tNV18" * size + "\n" for n in names[:50])
    dmesg = f"[ 1.0] NVRM: Xid (PCI:0000:{value}): {rng.choice(('79', '99999999999999999999', '²'))}, pid={value}\n"
    parts = {"nvlink -s": status, "nvlink -e": errors, "-q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER": query,
             "topo -m": topology}  # fmt: skip
    chosen = rng.sample(sorted(parts), rng.randrange(1, len(parts) + 1))
    text = "".join(f"+ nvidia-smi {name}\n{parts[name]}" for name in chosen)
    if rng.random() < 0.3:  # headerless: the kind sniffed from the text
        text = parts[chosen[0]]
    return f"{', '.join(chosen)} with {value[:12]!r}, GPU {gpu}, link {link}, {gpus} GPUs", text + dmesg


def nvidia_case(case: Case, rng: random.Random) -> None:
    if rng.random() < 0.5:
        case.detail, text = _smi_sections(rng)
        case.add("nvidia_smi.txt", text.encode("utf-8", "surrogatepass"))
        name = "nvidia_smi.txt"
    else:
        nvml = {"driver": "580.1", "nvml": "13.580", "gpus": [
            {"index": g, "name": "NVIDIA H200", "uuid": f"GPU-{g}", "bus_id": f"00000000:0{g}:00.0",
             "links": [{"link": n, "state": 1, "version": 6, "replay": 0, "recovery": 0, "crc_flit": 0,
                        "crc_data": 96, "ecc_data": 0} for n in range(2)]} for g in range(2)]}  # fmt: skip
        style = rng.choice(("fields", "many", "duplicates"))
        if style == "fields":
            said, nvml = attack_tree(rng, nvml, True, touches=rng.choice((1, 3, 10)))
        elif style == "many":
            count = rng.choice((65_536, 200_000))
            nvml["gpus"][0]["links"] = [{**nvml["gpus"][0]["links"][0], "link": n % 65_537} for n in range(count)]
            said = f"{count:,} links"
        else:
            nvml["gpus"] = nvml["gpus"] * rng.choice((2, 50_000))
            said = f"{len(nvml['gpus']):,} GPUs of two indices"
        case.detail = f"NVML JSON: {said}"
        case.add("nvml.json", json_bytes(nvml))
        name = "nvml.json"
    case.run("nvlink", "--from", f"@{name}")
    case.run("nvlink", "--per-link", "--from", f"@{name}")
    case.run("nvlink", "--json", "--from", f"@{name}")
    case.run("nvlink", "--from", "@")


def folder_case(case: Case, rng: random.Random) -> None:
    case.add("rank0.log", OOM.format(r=0))
    style = rng.choice(
        ("loop", "device", "proc", "secret", "fifo", "socket", "unreadable", "nested", "names", "dangling", "monitor",
         "device-node", "long-path")
    )  # fmt: skip
    if style == "loop":
        case.specials += [
            ("symlink", "a", "b"),
            ("symlink", "b", "a"),
            ("symlink", "sub/up", ".."),
            ("symlink", "self", "."),
        ]
    elif style == "device":
        case.specials += [("symlink", "rank1.log", "/dev/zero"), ("symlink", "nccl_trace_rank_1", "/dev/urandom")]
    elif style == "device-node":  # a device made in the folder itself, not a link to one
        case.specials += [("device", "rank1.log", 1, 5), ("device", "nccl_trace_rank_1", 1, 3)]
    elif style == "long-path":  # nested past PATH_MAX: the deepest file has no path the kernel takes
        case.specials += [("long-path", "d" * 250, 20, OOM.format(r=3))]
    elif style == "proc":
        target = rng.choice(
            ("/proc/self/mem", "/proc/self/environ", "/proc/kmsg", "/sys/kernel/notes", "/proc/self/fd/0")
        )
        case.specials += [("symlink", "rank1.log", target), ("symlink", "procdir", "/proc/self")]
    elif style == "secret":
        case.specials += [("secret", "rank1.log"), ("secret", "deeper/nccl_trace_rank_1")]
        case.forbidden = (SECRET,)
    elif style == "monitor":  # the step monitor's files, which the HTML page reads by name
        case.add("monitor/steps-rank0.jsonl", json_bytes(monitor_window(0, 50)) + b"\n")
        case.specials += [
            ("secret", "monitor/stragglers.jsonl"),
            ("symlink", "monitor/steps-rank1.jsonl", "/dev/zero"),
            ("fifo", "monitor/steps-rank2.jsonl"),
            ("symlink", "monitor/steps-rank3.jsonl", "/proc/self/environ"),
        ]
        case.forbidden = (SECRET,)
    elif style == "fifo":
        case.specials += [("fifo", "rank1.log"), ("fifo", "nccl_trace_rank_1"), ("symlink", "rank2.log", "rank1.log")]
    elif style == "socket":
        case.specials += [("socket", "rank1.log"), ("socket", "snapshot.pickle")]
    elif style == "unreadable":
        case.add("locked/rank1.log", OOM.format(r=1))
        case.add("locked/deeper/rank2.log", OOM.format(r=2))
        case.specials += [("chmod", "locked/deeper", 0), ("chmod", "locked/rank1.log", 0), ("chmod", "locked", 0o300)]
    elif style == "nested":
        deep = "/".join(f"d{i}" for i in range(20))
        case.add(f"{deep}/rank7.log", OOM.format(r=7))
        case.specials += [("symlink", f"{deep}/back", "../../../../..")]
    elif style == "names":
        for name in (
            b"rank1\xff\xfe.log",
            b"rank2\n[rank0]: fake line.log",
            b"rank3\x1b]0;pwned\x07.log",
            "rank4\u202egol.txt".encode(),
            f"rank6{MARKUP.replace('/', '|')}.log".encode(),
            b"rank5\r.log",
            b"nccl_trace_rank_\xff",
        ):
            case.add(name, OOM.format(r=1) if not name.startswith(b"nccl") else pickle.dumps(fr_dump(1, 2, 3)))
    else:
        case.specials += [("symlink", "rank1.log", "/nonexistent/rank1.log"), ("symlink", "rank2.log", "rank2.log")]
    case.detail = style
    for verb in ("triage", "diagnose", "fr", "trace", "history"):
        case.run(verb, "@")
    case.run("report", "--html", "%page.html", "@")


BUILDERS = {
    "polyglot": polyglot,
    "fr": fr_case,
    "trace": trace_case,
    "snapshot": snapshot_case,
    "pyspy": pyspy_case,
    "records": records_case,
    "gzip": gzip_case,
    "text": text_case,
    "nvidia": nvidia_case,
    "folder": folder_case,
}


def make(seed: int, family: str | None = None) -> Case:
    rng = random.Random(seed)
    family = family or rng.choice(FAMILIES)
    case = Case(seed, family, "")
    BUILDERS[family](case, rng)
    return case


# -------------------------------------------------------------------------------------------- regressions
# Each input that once broke a reader, built exactly (a seed's case changes whenever the generator does).


def _debug_server_header_alone(case: Case) -> None:
    """A debug server's section header cut before its closing `===`, then a pickle: no section at all."""
    case.add("x.bin", HEADERS["debug-server"] + pickle.dumps(fr_dump(0, 2, 3), protocol=2))
    case.run("diagnose", "@")
    case.run("report", "--html", "%page.html", "@")


def _monitor_window(key: str, value: object) -> Callable[[Case], None]:
    def build(case: Case) -> None:
        case.add("rank0.log", OOM.format(r=0))
        case.add("monitor/steps-rank0.jsonl", json_bytes({**monitor_window(0, 50), key: value}) + b"\n")
        case.add("monitor/steps-rank1.jsonl", json_bytes(monitor_window(1, 50)) + b"\n")
        case.add("monitor/stragglers.jsonl", json_bytes({**straggler(1, 50), "rank": [1]}) + b"\n")
        case.run("report", "--html", "%page.html", "@")
        case.expected = ("not step-monitor records",)

    return build


def _monitor_links(case: Case) -> None:
    """The monitor's decisions a link to a record outside the folder; its windows a FIFO and a device."""
    case.add("rank0.log", OOM.format(r=0))
    case.add("monitor/steps-rank0.jsonl", json_bytes(monitor_window(0, 50)) + b"\n")
    case.specials += [("secret", "monitor/stragglers.jsonl"), ("fifo", "monitor/steps-rank2.jsonl")]
    case.specials += [("symlink", "monitor/steps-rank1.jsonl", "/dev/zero")]
    case.forbidden, case.expected = (SECRET,), ("outside the folder given",)
    case.run("report", "--html", "%page.html", "@")


def _capture_processes(value: object) -> Callable[[Case], None]:
    def build(case: Case) -> None:
        case.add("rank0.log", OOM.format(r=0))
        case.add("summary.json", json_bytes({**capture_summary(), "processes": value, "host": ["node", [0]]}))
        for verb in ("triage", "diagnose", "history"):
            case.run(verb, "@")

    return build


def _fr_version(version: object) -> Callable[[Case], None]:
    def build(case: Case) -> None:
        for rank in range(4):
            dump = fr_dump(rank, 4, 5) | ({"version": version} if rank == 2 else {})
            case.add(f"nccl_trace_rank_{rank}", pickle.dumps(dump, protocol=2))
        case.run("fr", "@")
        case.expected = ("nccl_trace_rank_2: its format version",)

    return build


def _gloo_group_ids(pg_id: object, name: str = "0") -> Callable[[Case], None]:
    """A gloo job whose last rank is in no op: whether the dumps show unrecorded ops reads their groups' ids."""

    def build(case: Case) -> None:
        for rank in range(4):
            dump = fr_dump(rank, 4, 5)
            for row in dump["entries"]:
                row.update(profiling_name="gloo:all_reduce", pg_id=pg_id, process_group=(name, "default_pg"))
                if pg_id is None:  # no id: the reader takes the group's name for it
                    del row["pg_id"]
            dump["pg_config"] = {name: dump["pg_config"]["0"] | {"name": name}}
            dump["pg_status"] = {name: dump["pg_status"]["0"]}
            dump["entries"] = dump["entries"] if rank < 3 else []
            case.add(f"nccl_trace_rank_{rank}", pickle.dumps(dump, protocol=2))
        case.run("fr", "@")
        case.run("diagnose", "@")

    return build


def _attempt_folder(name: str) -> Callable[[Case], None]:
    def build(case: Case) -> None:
        case.add("run-exit.json", json_bytes(run_exit()) + b"\n")
        case.add("rank0.log", OOM.format(r=0))
        case.add(f"{name}/rank0.log", OOM.format(r=0))
        case.run("history", "@")

    return build


def _pyspy_peer(peer: str) -> Callable[[Case], None]:
    def build(case: Case) -> None:
        for rank in range(2):
            frames = [
                {"name": "recv", "filename": "/venv/torch/distributed/distributed_c10d.py", "line": 7,
                 "locals": [{"name": "src", "repr": peer, "arg": True}]},
                {"name": "train_step", "filename": "/job/train.py", "line": 88},
            ]  # fmt: skip
            case.add(f"rank0{rank}.json", json_bytes([{**pyspy_threads(rank)[0], "frames": frames}]))
        case.run("diagnose", "@")

    return build


def _many_gpus(form: str) -> Callable[[Case], None]:
    """One machine's NVLink state listing 40,000 GPUs: the analysis compares each with every other."""

    def build(case: Case) -> None:
        count = 40_000
        if form == "nvml":
            gpus = [{"index": g, "name": "NVIDIA H200", "links": []} for g in range(count)]
            case.add("nvml.json", json_bytes({"driver": "580.1", "gpus": gpus}))
        else:
            text = "".join(f"GPU {g}: NVIDIA H200 (UUID: GPU-{g})\n\t Link 0: 26.5 GB/s\n" for g in range(count))
            case.add("nvidia_smi.txt", "+ nvidia-smi nvlink -s\n" + text)
        case.run("nvlink", "--from", "@")
        case.expected = ("one machine has at most",)

    return build


def _dump_on_stdin(case: Case) -> None:
    """A dump piped in: only logs are read from standard input, and the reader of dumps opened a file named -."""
    case.add("nccl_trace_rank_0", pickle.dumps(fr_dump(0, 2, 3), protocol=2))
    case.add("snapshot.pickle", pickle.dumps(snapshot(), protocol=4))
    case.run("fr", "-", "<nccl_trace_rank_0")
    case.run("memory", "-", "<snapshot.pickle")
    case.expected = ("reads only from a file",)


REGRESSIONS: dict[str, Callable[[Case], None]] = {
    "debug-server-header-alone": _debug_server_header_alone,
    "monitor-window-time-as-text": _monitor_window("gpu_forward_ms", ESCAPES),
    "monitor-window-time-as-long-text": _monitor_window("data_ms", "x" * 100_000),
    "monitor-window-step-missing": _monitor_window("last_step", None),
    "monitor-window-nested": _monitor_window("step_ms_p50", {"a": [1]}),
    "monitor-links-out-of-the-folder": _monitor_links,
    "capture-processes-a-number": _capture_processes(1.5),
    "fr-version-superscript-digit": _fr_version("².10"),
    "fr-version-5000-digits": _fr_version("9" * 5000 + ".1"),
    "nvml-40000-gpus": _many_gpus("nvml"),
    "smi-40000-gpus": _many_gpus("smi"),
    "dump-on-standard-input": _dump_on_stdin,
    "fr-gloo-group-id-superscript-digit": _gloo_group_ids("²"),
    "fr-gloo-group-id-5000-digits": _gloo_group_ids("9" * 5000),
    "fr-gloo-group-named-by-a-superscript-digit": _gloo_group_ids(None, name="²"),
    "history-attempt-superscript-digit": _attempt_folder(".attempt-²"),
    "pyspy-peer-superscript-digit": _pyspy_peer("²"),
}


def regression(name: str) -> Case:
    case = Case(0, "regression", name)
    REGRESSIONS[name](case)
    return case


# ----------------------------------------------------------------------------------------------- running


def write(case: Case, folder: Path) -> None:
    for name, data in case.files.items():
        path = os.path.join(os.fsencode(folder), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            out.write(data)
    outside = folder.parent / "outside"
    for special in case.specials:
        what, name = special[0], os.path.join(os.fsencode(folder), os.fsencode(special[1]))
        os.makedirs(os.path.dirname(name), exist_ok=True)
        if what == "symlink":
            os.symlink(special[2], name)
        elif what == "fifo":
            os.mkfifo(name)
        elif what == "socket":
            with socket.socket(socket.AF_UNIX) as server:
                server.bind(name)
        elif what == "chmod":
            os.chmod(name, special[2])
        elif what == "device":
            try:
                os.mknod(name, stat.S_IFCHR | 0o666, os.makedev(special[2], special[3]))
            except PermissionError:  # no CAP_MKNOD here: a FIFO stands in for it
                os.mkfifo(name)
        elif what == "long-path":
            _write_deep(name, special[2], special[3])
        elif what == "secret":
            outside.mkdir(exist_ok=True)
            secret = outside / "credentials.log"
            secret.write_text(  # a log line, and a record of the step monitor, that would be quoted if read
                f"[rank1]: Traceback (most recent call last):\n[rank1]: RuntimeError: token={SECRET}\n"
                + json.dumps({**straggler(0, 50), "line": f"rank 0 is slow: {SECRET}"})
                + "\n"
            )
            os.symlink(secret, name)


def _write_deep(top: bytes, depth: int, text: str) -> None:
    """Folders named `top` nested `depth` deep under its parent, a log at the bottom, made relative to each
    folder's descriptor: the whole path is longer than any path the kernel opens."""
    name = os.path.basename(top)
    where = os.open(os.path.dirname(top), os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=where)
            inner = os.open(name, os.O_RDONLY, dir_fd=where)
            os.close(where)
            where = inner
        log = os.open("rank3.log", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=where)
        os.write(log, text.encode())
        os.close(log)
    finally:
        os.close(where)


def _bounded() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BOUND, MEMORY_BOUND))


def _argv(args: tuple[str, ...], folder: Path, scratch: Path) -> list[str]:
    out = []
    for arg in args:
        if arg.startswith("<"):
            continue  # standard input, not an argument
        if arg.startswith("@"):
            out.append(str(folder / arg[1:]) if arg != "@" else str(folder))
        elif arg.startswith("%"):
            out.append(str(scratch / arg[1:]))
        else:
            out.append(arg)
    return out


def check(
    case: Case, args: tuple[str, ...], codes: frozenset[int], folder: Path, scratch: Path, bound: float
) -> str | None:
    """What went wrong with one command of the case, or None."""
    fed = next((folder / arg[1:] for arg in args if arg.startswith("<")), None)
    try:
        with open(fed if fed else os.devnull, "rb") as stdin:
            done = subprocess.run(
                [sys.executable, "-m", "torchtriage", *_argv(args, folder, scratch)],
                capture_output=True,
                timeout=bound,
                preexec_fn=_bounded,
                stdin=stdin,
            )
    except subprocess.TimeoutExpired:
        return f"did not end within {bound:.0f} s"
    out = done.stdout.decode("utf-8", "surrogateescape") + done.stderr.decode("utf-8", "surrogateescape")
    tail = out[-1500:].replace("\x1b", "\\x1b")
    if done.returncode not in codes:
        return f"exit {done.returncode}: {tail}"
    if "Traceback (most recent call last)" in done.stderr.decode(errors="replace") or "internal error" in out:
        return f"traceback or internal error: {tail}"
    if "--json" in args and done.returncode in (0, 1):
        try:
            json.loads(done.stdout.decode("utf-8"))
        except ValueError as err:
            return f"--json printed what is not JSON in UTF-8 ({err}): {done.stdout[:300]!r}"
    raw = RAW_CONTROL.search(out)
    if raw:
        at = raw.start()
        return f"raw control {raw.group()!r} in the output: {out[max(0, at - 80) : at + 40]!r}"
    page = scratch / "page.html"
    html = page.read_text(errors="replace") if page.exists() else ""
    shown = out + html  # the page is shown too
    if "<script>alert(1)" in html or "<img src=x onerror" in html:
        return "markup from the files reached the HTML page"
    leaked = [s for s in case.forbidden if s in shown]
    if leaked:
        return f"text from outside the folder shown: {leaked}"
    missing = [s for s in case.expected if s not in shown]
    if missing:
        return f"does not say {missing}: {tail}"
    return None


def outcome(case: Case, base: Path, bound: float = TIME_BOUND_S, verbs: int | None = None) -> list[str]:
    """The failures of the case's commands (the first `verbs` of them, else all): '<command>: <what>'."""
    folder, scratch = base / "case", base / "scratch"
    for old in (folder, scratch, base / "outside"):
        if old.exists():
            _unlock(old)
            shutil.rmtree(old)
    folder.mkdir(parents=True)
    scratch.mkdir()
    write(case, folder)
    failures = []
    try:
        for args, codes in case.commands[:verbs]:
            (scratch / "page.html").unlink(missing_ok=True)
            wrong = check(case, args, codes, folder, scratch, bound)
            if wrong:
                failures.append(f"{' '.join(args)}: {wrong}")
    finally:
        _unlock(folder)
    return failures


def _unlock(folder: Path) -> None:
    for root, dirs, _ in os.walk(folder):
        for name in dirs:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                with contextlib.suppress(OSError):  # a path past PATH_MAX: rmtree removes it by descriptor
                    os.chmod(path, 0o755)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--family", choices=FAMILIES)
    parser.add_argument("--seeds", type=int, nargs="*", help="only these seeds")
    parser.add_argument("--regressions", action="store_true", help="the inputs that once broke a reader")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    base = args.out or Path(tempfile.mkdtemp(prefix="crafted-"))
    seeds = args.seeds or range(args.start, args.start + args.count)
    cases = map(regression, REGRESSIONS) if args.regressions else (make(seed, args.family) for seed in seeds)
    failed = total = 0
    for case in cases:
        total += 1
        seed = case.seed if case.family != "regression" else case.detail
        failures = outcome(case, base)
        if failures:
            failed += 1
            print(f"{seed}  # {case.family} {case.detail[:200]}", flush=True)
            for failure in failures:
                print(f"    {failure[:1500]}", flush=True)
    print(f"{total - failed} of {total} right")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
