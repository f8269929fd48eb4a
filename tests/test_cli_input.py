"""Bad input gets one clear message and the documented exit code, never a traceback."""

import gzip
import json
import os
import pickle

from conftest import H200, run_cli, triage_json
from torchtriage import exit_codes
from torchtriage.model import SCHEMA

OOM = H200 / "oom.log"


def assert_clean_failure(done, code):
    err = done.stderr.decode()
    assert done.returncode == code, err
    assert "Traceback" not in err
    return err


def test_verdict_json_has_the_versioned_keys():
    code, verdict = triage_json(OOM)
    assert code == exit_codes.PROBLEM_FOUND
    assert verdict["schema"] == SCHEMA
    for key in ("category", "culprit_ranks", "summary", "findings", "actions", "facts"):
        assert key in verdict
    for finding in verdict["findings"]:
        assert {"kind", "ranks", "message", "evidence"} <= finding.keys()
        for ev in finding["evidence"]:
            assert {"source", "file", "line", "rank", "text"} <= ev.keys()
    for action in verdict["actions"]:
        assert {"rule", "title", "detail"} <= action.keys()


def test_missing_path_is_a_bad_input(tmp_path):
    err = assert_clean_failure(run_cli("triage", tmp_path / "nope.log"), exit_codes.BAD_INPUT)
    assert "no such file" in err


def test_empty_and_binary_files_are_named_and_skipped(tmp_path):
    (tmp_path / "empty.log").write_bytes(b"")
    (tmp_path / "core.bin").write_bytes(bytes(range(256)) * 40)
    err = assert_clean_failure(run_cli("triage", tmp_path), exit_codes.BAD_INPUT)
    assert "empty.log: the file is empty" in err
    assert "core.bin: binary data" in err


def test_a_log_with_an_unwritten_stretch_is_read_around_it(tmp_path):
    # A node that crashes while its log sits on a shared file system leaves the file's size recorded and its
    # last blocks unwritten: a run of NUL bytes, then whatever other writers (the launcher, the scheduler)
    # appended. It is a log with a hole, not binary data; the hole ends the line written before it.
    steps = b"".join(b"[rank0]:step %d loss 2.%03d\n" % (i, i) for i in range(40))
    hole = steps + b"[rank0]:step 40 lo" + b"\x00" * 8192 + OOM.read_bytes()
    (tmp_path / "rank0.log").write_bytes(hole)
    code, verdict = triage_json(tmp_path / "rank0.log")
    assert code == exit_codes.PROBLEM_FOUND and verdict["category"] == "oom", verdict["summary"]
    # A hole at the head of the file, text after it in the head: still a log.
    (tmp_path / "head.log").write_bytes(b"\x00" * 2048 + OOM.read_bytes())
    assert triage_json(tmp_path / "head.log")[1]["category"] == "oom"
    # A stray NUL a program printed on one line (a C string's terminator written with it): a log, read whole.
    (tmp_path / "stray.log").write_bytes(steps + b"[rank0]: caf\xe9 \x00\n" + OOM.read_bytes())
    assert triage_json(tmp_path / "stray.log")[1]["category"] == "oom"
    # NUL bytes among control bytes (a binary format's fields), or nothing but NULs: binary data, not read.
    (tmp_path / "fields.bin").write_bytes(b"ELF\x02\x01\x00\x00\x03\x00>\x00\x01\x00\x00\x00" * 300)
    (tmp_path / "zeros.log").write_bytes(b"\x00" * 10000)
    for name in ("fields.bin", "zeros.log"):
        err = assert_clean_failure(run_cli("triage", tmp_path / name), exit_codes.BAD_INPUT)
        assert "binary data" in err, err


def test_a_hostile_pickle_is_never_loaded(tmp_path):
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps(Exploit()))
    err = assert_clean_failure(run_cli("triage", tmp_path), exit_codes.BAD_INPUT)
    assert "a pickle, not a log" in err and "torchtriage fr" in err
    assert not marker.exists()


def test_bad_files_beside_good_ones_do_not_stop_the_analysis(tmp_path):
    (tmp_path / "rank1.log").write_bytes(b"")
    (tmp_path / "rank0.log").write_bytes(OOM.read_bytes())
    code, verdict = triage_json(tmp_path)
    assert code == exit_codes.PROBLEM_FOUND
    assert verdict["category"] == "oom"
    assert any("rank1.log" in problem for problem in verdict["problems"])


def test_unreadable_file(tmp_path):
    path = tmp_path / "secret.log"
    path.write_text("RuntimeError: x\n")
    path.chmod(0)
    if os.access(path, os.R_OK):  # root reads anything; the check is meaningless then
        path.chmod(0o600)
        return
    err = assert_clean_failure(run_cli("triage", path), exit_codes.BAD_INPUT)
    assert "secret.log" in err


def test_gzip_stdin_non_utf8_and_megabyte_lines(tmp_path):
    noisy = b"\xff\xfe garbage \x80\x81\n" + b"x" * (3 << 20) + b"\n" + OOM.read_bytes()
    (tmp_path / "rank2.log.gz").write_bytes(gzip.compress(noisy))
    code, verdict = triage_json(tmp_path / "rank2.log.gz")
    assert (code, verdict["category"]) == (exit_codes.PROBLEM_FOUND, "oom")
    code, verdict = triage_json("-", stdin=noisy)
    assert (code, verdict["category"]) == (exit_codes.PROBLEM_FOUND, "oom")


def test_truncated_gzip_still_gives_what_it_could(tmp_path):
    data = gzip.compress(OOM.read_bytes() + b"step 1\n" * 50_000)
    (tmp_path / "cut.log.gz").write_bytes(data[: len(data) // 2])
    code, verdict = triage_json(tmp_path / "cut.log.gz")
    assert verdict["category"] == "oom"
    assert any("reading stopped early" in p for p in verdict["problems"])


def test_a_clean_log_exits_zero(tmp_path):
    code, verdict = triage_json(H200 / "init_info" / "run.log")
    assert code == exit_codes.OK, verdict
    assert verdict["category"] == "unknown" and verdict["findings"] == []


def test_a_folder_of_thousands_of_files(tmp_path):
    for i in range(2000):
        (tmp_path / f"rank{i}.log").write_text(f"step {i} ok\n")
    (tmp_path / "rank777.log").write_bytes(OOM.read_bytes())
    code, verdict = triage_json(tmp_path)
    assert verdict["category"] == "oom"
    assert verdict["culprit_ranks"] == [777]


def test_usage_errors_exit_2():
    assert_clean_failure(run_cli("triage"), exit_codes.USAGE)
    assert_clean_failure(run_cli("explain", "no.such.rule"), exit_codes.USAGE)
    assert_clean_failure(run_cli("triage", "-", "-", stdin=b""), exit_codes.USAGE)


def test_help_documents_exit_codes():
    done = run_cli("--help")
    assert done.returncode == 0
    assert b"input unreadable or malformed" in done.stdout


def test_json_output_is_parseable_even_with_problems(tmp_path):
    (tmp_path / "a.log").write_bytes(OOM.read_bytes())
    done = run_cli("triage", "--json", tmp_path / "a.log", tmp_path / "missing.log")
    verdict = json.loads(done.stdout)
    assert any("missing.log" in p for p in verdict["problems"])
