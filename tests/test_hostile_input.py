"""Hostile and broken input: bounded memory and time, one clear message, the documented exit code.

Every command here runs as a user would run it, under a memory bound (RLIMIT_AS) and a time bound: an
input that made a reader grow without limit or loop on a counter fails the test by being killed.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import pickle
import pickletools
import resource
import subprocess
import sys

import pytest

from conftest import FIXTURES, H200
from mutations import ladder
from torchtriage import exit_codes
from torchtriage.knowledge.linear_regex import is_linear
from torchtriage.knowledge.rules import default_rules
from torchtriage.report.json_report import json_text
from torchtriage.sources.safe_pickle import safe_load_file

MEMORY_BOUND = 1536 << 20
GENUINE_DUMP = safe_load_file(str(H200 / "size/nccl_trace_rank_0"))
OOM_LINE = (
    "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.10 GiB of which 1.12 GiB is free.\n"
)


def bounded(*args, timeout: float = 90, flags: tuple[str, ...] = ()):
    """The real command under a memory and a time bound; stderr must never hold a traceback."""
    done = subprocess.run(
        [sys.executable, *flags, "-m", "torchtriage", *map(str, args)],
        capture_output=True,
        timeout=timeout,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BOUND, MEMORY_BOUND)),
    )
    out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]
    return done.returncode, out + err


def write_dumps(folder, ranks: int, change=None) -> None:
    """`ranks` genuine dumps of one job (the 2xH200 recording, its group widened); `change(rank, data)`
    edits one in place."""
    for rank in range(ranks):
        data = copy.deepcopy(GENUINE_DUMP)
        data["pg_config"]["0"]["ranks"] = str(list(range(ranks)))
        if change is not None:
            change(rank, data)
        (folder / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(data, protocol=2))


# ------------------------------------------------------------------------------------------------ gzip bombs


def test_a_gzip_bomb_log_is_read_up_to_the_limit(tmp_path):
    log = tmp_path / "rank0.log.gz"
    with gzip.open(log, "wb", compresslevel=9) as out:
        out.write(OOM_LINE.encode())
        block = b"step ok\n" * (1 << 17)
        for _ in range(64):  # 64 MiB of text from about 100 KB on disk
            out.write(block)
    code, text = bounded("triage", "--limit", "stream-bytes=8M", log)
    assert code == exit_codes.PROBLEM_FOUND  # the OOM before the limit is still diagnosed
    assert "CUDA out of memory" in text
    assert "holds more than 8 MiB after decompression" in text and "--limit stream-bytes=" in text


def test_a_gzip_bomb_dump_is_refused_and_its_peers_still_read(tmp_path):
    write_dumps(tmp_path, 4)
    genuine = (tmp_path / "nccl_trace_rank_3").read_bytes()
    with gzip.open(tmp_path / "nccl_trace_rank_3", "wb", compresslevel=9) as out:
        out.write(genuine[:-1] + b"\0" * (32 << 20))  # the pickle never stops: zeros past its end
    code, text = bounded("fr", "--limit", "bytes=4M", tmp_path)
    assert code in (exit_codes.OK, exit_codes.PROBLEM_FOUND)
    assert "nccl_trace_rank_3: the dump holds more than 4 MiB after decompression: refused" in text
    assert "--limit bytes=" in text


@pytest.mark.parametrize("verb, name", [("trace", "trace_rank0.json.gz"), ("memory", "snapshot.pickle.gz")])
def test_a_gzip_bomb_trace_or_snapshot_is_refused(tmp_path, verb, name):
    with gzip.open(tmp_path / name, "wb", compresslevel=9) as out:
        if verb == "trace":
            out.write(b'{"traceEvents": [' + b" " * (32 << 20))
        else:  # a snapshot whose list of segments never ends: small integers, two bytes each
            out.write(b"\x80\x04}\x94(\x8c\x08segments\x94]\x94(" + b"K\x01" * (16 << 20))
    code, text = bounded(verb, "--limit", "stream-bytes=4M", tmp_path / name)
    assert code == exit_codes.BAD_INPUT
    assert "holds more than 4 MiB after decompression" in text and "--limit stream-bytes=" in text


# --------------------------------------------------------------------------------------- not regular files


@pytest.mark.parametrize("verb", ["triage", "fr", "trace", "memory", "diagnose"])
def test_a_fifo_named_directly_is_refused_without_waiting(tmp_path, verb):
    fifo = tmp_path / "nccl_trace_rank_0"
    os.mkfifo(fifo)
    code, text = bounded(verb, fifo, timeout=60)
    assert code == exit_codes.BAD_INPUT
    assert "a FIFO" in text and "regular files" in text


@pytest.mark.parametrize("verb", ["triage", "fr", "trace", "diagnose", "report"])
def test_a_fifo_in_a_folder_is_skipped_with_a_word(tmp_path, verb):
    os.mkfifo(tmp_path / "rank1.log")
    (tmp_path / "rank0.log").write_text(OOM_LINE)
    args = [tmp_path] if verb != "report" else ["--html", tmp_path / "page.html", tmp_path]
    code, text = bounded(verb, *args, timeout=60)
    assert code in (exit_codes.OK, exit_codes.PROBLEM_FOUND, exit_codes.BAD_INPUT)
    assert "rank1.log: a FIFO" in text or verb == "report"  # report writes the problems into the page
    if verb == "report":
        assert "rank1.log: a FIFO" in (tmp_path / "page.html").read_text()


@pytest.mark.parametrize("verb", ["triage", "fr", "trace", "memory"])
def test_a_device_is_refused(verb):
    code, text = bounded(verb, "/dev/zero", timeout=60)
    assert code == exit_codes.BAD_INPUT
    assert "not a regular file" in text or "a device" in text


# ------------------------------------------------------------------------------------- flight-recorder dumps


def _entry0(field, value):
    def change(rank, data):
        if rank == 1:
            data["entries"][0][field] = value

    return change


EXPANDS = "it expands to more than 50,000,000 values once its shared references are followed"


@pytest.mark.parametrize(
    "field, value, said",
    [
        # Shared references are refused by the pre-scan before anything is built (sources/pickle_scan.py)...
        ("profiling_name", ladder(), EXPANDS),
        ("state", ladder(), EXPANDS),
        ("input_sizes", [ladder()] * 3, EXPANDS),
        ("input_sizes", [[4096] * 50_000] * 50_000, EXPANDS),
        ("frames", [{"name": ladder(), "filename": "/job/x.py", "line": 1}], EXPANDS),
        # ... small values of the wrong kind by the column checks (sources/fr_checks.py).
        ("state", ["scheduled", "completed"], "its field `entries[0].state` is a list of 2 items, not text"),
        ("input_sizes", [[[1]]], "not an integer dimension"),
        ("input_dtypes", [[1, 2]], "not a dtype name"),
        ("frames", [{"name": ["f"], "filename": "/job/x.py", "line": 1}], "`frames[].name` is a list"),
        ("process_group", ["0", ["a"]], "not a group's name"),
        ("collective_seq_id", 10**5000, "an integer of about 5,000 digits"),
        ("collective_seq_id", float("nan"), "not a finite number"),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,  # never str() a ladder: it is the attack
)
def test_a_crafted_field_refuses_its_dump_only(tmp_path, field, value, said):
    write_dumps(tmp_path, 3, _entry0(field, value))
    code, text = bounded("fr", tmp_path)
    assert code in (exit_codes.OK, exit_codes.PROBLEM_FOUND)  # ranks 0 and 2 are still compared
    assert f"nccl_trace_rank_1: {said}" in text or ("nccl_trace_rank_1: its" in text and said in text), text


def test_a_shared_group_name_and_counters_are_refused(tmp_path):
    def change(rank, data):
        if rank == 0:
            data["pg_config"]["0"]["name"] = ladder()
        if rank == 1:
            data["pg_status"]["0"]["last_started_collective"] = ladder()

    write_dumps(tmp_path, 3, change)
    code, text = bounded("fr", tmp_path)
    assert f"nccl_trace_rank_0: {EXPANDS}" in text and f"nccl_trace_rank_1: {EXPANDS}" in text

    def small(rank, data):
        if rank == 0:
            data["pg_config"]["0"]["name"] = ["a"]
        if rank == 1:
            data["pg_status"]["0"]["last_started_collective"] = [1, 2]

    write_dumps(tmp_path, 3, small)
    code, text = bounded("fr", tmp_path)
    assert "nccl_trace_rank_0: its field `pg_config['0'].name` is a list" in text
    assert "nccl_trace_rank_1: its field `pg_status['0'].last_started_collective` is a list" in text


def test_a_rank_past_the_limit_is_refused_with_the_flag(tmp_path):
    write_dumps(tmp_path, 2, lambda rank, data: data.update(rank=10**9) if rank == 1 else None)
    code, text = bounded("fr", tmp_path)
    assert "its rank, 1000000000, is past the largest rank accepted" in text and "--limit rank=" in text
    (tmp_path / "nccl_trace_rank_1").unlink()
    (tmp_path / "nccl_trace_rank_1000000000").write_bytes((tmp_path / "nccl_trace_rank_0").read_bytes())
    code, text = bounded("fr", tmp_path)
    assert "the rank in its file name, 1,000,000,000, is past the largest rank accepted" in text


def test_a_status_counter_of_a_trillion_costs_nothing(tmp_path):
    # One rank claims to have enqueued 10^12 collectives: the walk covers what the dumps recorded.
    def change(rank, data):
        if rank == 1:
            data["pg_status"]["0"]["last_enqueued_collective"] = 10**12

    write_dumps(tmp_path, 2, change)
    code, text = bounded("fr", "--json", tmp_path, timeout=60)
    assert code in (exit_codes.OK, exit_codes.PROBLEM_FOUND)
    json.loads(text[: text.rindex("}") + 1])


def _with_readonly_buffer(data: dict) -> bytes:
    """A protocol-5 pickle whose first profiling_name is a read-only view of a bytearray (BYTEARRAY8,
    then READONLY_BUFFER): the memoryview that outlived its bytearray in earlier readers."""
    data = copy.deepcopy(data)
    data["entries"][0]["profiling_name"] = bytearray(b"nccl:all_reduce")
    raw = pickle.dumps(data, protocol=5)
    at = raw.index(b"\x96" + (15).to_bytes(8, "little") + b"nccl:all_reduce") + 9 + 15
    return raw[:at] + b"\x98" + raw[at:]


def test_buffers_in_dumps_end_cleanly_under_dev_mode(tmp_path):
    # Enough dumps to load on worker processes; run with the checks of python -X dev.
    write_dumps(tmp_path, 60)
    crafted = _with_readonly_buffer(safe_load_file(str(tmp_path / "nccl_trace_rank_7")))
    (tmp_path / "nccl_trace_rank_7").write_bytes(crafted)
    for args in (["fr", tmp_path], ["diagnose", tmp_path], ["report", "--html", tmp_path / "p.html", tmp_path]):
        code, text = bounded(*args, flags=("-X", "dev"))
        assert code in (exit_codes.OK, exit_codes.PROBLEM_FOUND), text[-2000:]
        assert "exported buffers" not in text and "SystemError" not in text
    code, text = bounded("fr", tmp_path, flags=("-X", "dev"))
    assert "nccl_trace_rank_7: its field `entries[0].profiling_name` is a memoryview" in text
    code, text = bounded("fr", tmp_path / "nccl_trace_rank_7", flags=("-X", "dev"))
    assert code == exit_codes.BAD_INPUT and "memoryview" in text


def test_json_dump_nested_past_any_parser_is_refused(tmp_path):
    for rank in (1, 2, 3):
        (tmp_path / f"fr_dump_json_rank_{rank}").write_bytes(
            (FIXTURES / f"fr/size_json_4r/fr_dump_json_rank_{rank}").read_bytes()
        )
    nested = "[" * 200_000 + "]" * 200_000
    (tmp_path / "fr_dump_json_rank_0").write_text('{"version": "2.10", "entries": ' + nested + "}")
    code, text = bounded("fr", tmp_path)
    assert "fr_dump_json_rank_0: the JSON is malformed or truncated" in text or "nested too deep" in text


# ------------------------------------------------------------------------------------------------- traces


def _trace(events_json: str) -> str:
    return '{"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": [' + events_json + "]}"


def test_nan_times_in_a_trace_are_said_and_json_stays_strict(tmp_path):
    good = '{"ph": "X", "cat": "kernel", "name": "ampere_sgemm", "ts": 10, "dur": 5, "args": {}}'
    bad = '{"ph": "X", "cat": "kernel", "name": "ampere_sgemm", "ts": NaN, "dur": Infinity, "args": {}}'
    path = tmp_path / "trace_rank0.json"
    path.write_text(_trace(",".join([good, bad, bad])))
    code, text = bounded("trace", "--json", path)
    verdict = json.loads(text[: text.rindex("}") + 1], parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    said = " ".join(verdict.get("problems", []))
    assert "2 complete events have a time stamp or duration that is not a finite number" in said


def test_a_trace_integer_of_thousands_of_digits_is_refused(tmp_path):
    path = tmp_path / "trace_rank0.json"
    path.write_text(_trace('{"ph": "X", "cat": "kernel", "name": "k", "ts": ' + "9" * 5000 + ', "dur": 1}'))
    code, text = bounded("trace", path)
    assert code == exit_codes.BAD_INPUT and "integer of thousands of digits" in text


def test_the_json_encoder_writes_null_for_nan():
    assert json.loads(json_text({"a": float("nan"), "b": [float("inf"), 1.5]})) == {"a": None, "b": [None, 1.5]}


# ---------------------------------------------------------------------------------------------- log rules


def test_every_rule_pattern_runs_in_linear_time():
    for rule in default_rules():
        for pattern in (*rule.patterns, *rule.unless):
            assert is_linear(pattern), f"{rule.id}: {pattern.pattern}"


def test_adversarial_lines_for_every_rule_are_diagnosed_without_backtracking(tmp_path):
    # For each rule: its example, then 16 KB lines that repeat its anchors and the characters its
    # variable parts take: what made a backtracking engine take minutes on twenty lines.
    lines = []
    for rule in default_rules():
        for anchor in rule.anchors:
            lines.append(f"[rank1]: {'a-b.c:' * 2700}{anchor}")
            lines.append(f"[rank1]: {(anchor + ' ') * (16384 // (len(anchor) + 1))}")
            lines.append(f"[rank1]: {anchor}{' 0x1f' * 3000}")
    lines.append(OOM_LINE.strip())
    (tmp_path / "rank1.log").write_text("\n".join(lines) + "\n")
    code, text = bounded("triage", "--json", tmp_path / "rank1.log", timeout=120)
    assert code == exit_codes.PROBLEM_FOUND


def test_a_rule_with_a_lookaround_is_refused_with_the_way_to_say_it(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "site.toml").write_text(
        '[[rule]]\nid = "site.custom"\ncategory = "usage"\ntitle = "t"\nrole = "primary"\ncause = "c"\n'
        'source = "s"\npatterns = [\'(?<!not )my error: \\d+\']\nexamples = ["my error: 3"]\n'
        '[[rule.actions]]\ntitle = "fix it"\n'
    )
    log = tmp_path / "rank0.log"
    log.write_text("my error: 3\n")
    code, text = bounded("triage", "--rules-dir", rules, log)
    assert code != exit_codes.OK
    assert "negative lookahead or lookbehind" in text and "`unless`" in text


def test_a_malformed_limit_is_a_usage_error(tmp_path):
    log = tmp_path / "rank0.log"
    log.write_text(OOM_LINE)
    code, text = bounded("triage", "--limit", "bytes=lots", log)
    assert code == exit_codes.USAGE and "is not a number" in text
    code, text = bounded("triage", "--limit", "speed=3", log)
    assert code == exit_codes.USAGE and "NAME one of bytes, stream-bytes" in text


def test_a_streamed_snapshot_past_the_item_and_depth_limits_is_refused(tmp_path):
    head = b"\x80\x04}\x94(\x8c\x08segments\x94]\x94("
    many = tmp_path / "many.pickle"
    many.write_bytes(head + b"\x8c\x01x\x94" * 300_000)  # 300,000 memoized strings
    code, text = bounded("memory", "--limit", "items=100000", many)
    assert code == exit_codes.BAD_INPUT and "more than 100,000 values to refer back to" in text
    assert "--limit items=" in text
    deep = tmp_path / "deep.pickle"
    deep.write_bytes(head + b"(" * 5000)
    code, text = bounded("memory", "--limit", "depth=1000", deep)
    assert code == exit_codes.BAD_INPUT and "nests containers more than 1,000 deep" in text


# ------------------------------------------------------------- shapes that crash or stall the C unpickler


def _splice(data: dict, field: str, fragment: bytes) -> bytes:
    """`data` pickled with the opcodes `fragment` (which push one value) as the value of key `field`."""
    marker = "\x00spliced\x00"
    raw = pickle.dumps({**data, field: marker}, protocol=2)
    token = b"X" + len(marker).to_bytes(4, "little") + marker.encode()
    return raw.replace(token, fragment, 1)


DEEP_KEY = b"}" + b"K\x00" + b"\x85" * 1_000_000 + b"K\x01s"  # a dict whose key is a tuple a million deep
# Memo slots of our own, past the genuine dump's.
_BASE = 1 + max(arg for op, arg, _ in pickletools.genops(pickle.dumps(GENUINE_DUMP, protocol=2)) if "PUT" in op.name)


def _laugh(levels: int = 40) -> bytes:
    """Each tuple holds the one below twice: 2^levels values as a tree, a few hundred bytes."""
    out = b"K\x00r" + _BASE.to_bytes(4, "little") + b"0"
    for i in range(levels):
        below = b"j" + (_BASE + i).to_bytes(4, "little")
        out += below + below + b"\x86r" + (_BASE + i + 1).to_bytes(4, "little") + b"0"
    return out + b"j" + (_BASE + levels).to_bytes(4, "little")


LAUGH = _laugh()


@pytest.mark.parametrize(
    "field, fragment, said",
    [
        ("version", DEEP_KEY, "nests containers more than 200 deep"),
        ("version", LAUGH, "expands to more than 50,000,000 values"),
        ("pg_status", b"}" + LAUGH + b"K\x01s", "expands to more than 50,000,000 values"),
    ],
    ids=["tuple-key-a-million-deep", "version-laugh", "laugh-as-a-key"],
)
def test_a_dump_that_would_crash_or_stall_the_unpickler_is_refused_and_its_peers_read(tmp_path, field, fragment, said):
    write_dumps(tmp_path, 3)
    (tmp_path / "nccl_trace_rank_1").write_bytes(_splice(GENUINE_DUMP, field, fragment))
    code, text = bounded("fr", tmp_path, timeout=60)
    assert code in (exit_codes.OK, exit_codes.PROBLEM_FOUND)
    assert f"nccl_trace_rank_1: it {said}" in text


@pytest.mark.parametrize("fragment", [DEEP_KEY, b"}" + LAUGH + b"K\x01s"], ids=["deep-key", "laugh-key"])
def test_a_snapshot_that_would_crash_or_stall_the_unpickler_is_refused(tmp_path, fragment):
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(_splice({"segments": [], "device_traces": []}, "allocator_settings", fragment))
    code, text = bounded("memory", path, timeout=60)
    assert code == exit_codes.BAD_INPUT
    assert "refused (raise the limit with --limit" in text
