"""The py-spy dump parser: text (plain, --native, --locals, --subprocesses), --json, and bad input."""

import json

import pytest

from conftest import FIXTURES, H200
from torchtriage.errors import InputError, TriageError
from torchtriage.sources.pyspy import parse_dump, parse_json, parse_text, read_dump, read_rank_dump
from torchtriage.sources.stacks import load_rank_stacks

STACKS = FIXTURES / "stacks"


def only(processes):
    assert len(processes) == 1
    return processes[0]


def test_h200_text_dump_gives_process_header_thread_and_frames_innermost_first():
    process = only(read_dump(H200 / "skip" / "pyspy_rank0.txt"))
    assert process.pid == 669
    assert process.command == "/opt/torch/.venv/bin/python -u lab/nccl_case.py"
    assert (process.python_version, process.python_executable) == ("3.12.3", "/usr/bin/python3.12")
    thread = process.main_thread()
    assert (thread.thread_id, thread.name, thread.active, thread.owns_gil) == (669, "MainThread", True, False)
    assert [f.text for f in thread.frames] == [
        "synchronize (torch/cuda/__init__.py:1162)",
        "train_step (nccl_case.py:23)",
        "<module> (nccl_case.py:25)",
    ]
    assert not process.has_native_frames
    assert thread.frames[0].printed_at == 5  # for evidence pointing into the dump


def test_h200_native_dump_marks_native_frames_and_keeps_python_ones():
    process = only(read_dump(H200 / "size" / "pyspy_native_rank1.txt"))
    thread = process.main_thread()
    assert process.has_native_frames
    natives = [f for f in thread.frames if f.native]
    assert natives[0].function == "0x7f38559d36b2" and natives[0].file == "libcuda.so.580.159.04"
    assert natives[0].line == 0
    assert "c10::cuda::device_synchronize" in [f.function for f in natives]
    assert [f.text for f in thread.python_frames] == [
        "synchronize (torch/cuda/__init__.py:1162)",
        "train_step (nccl_case.py:19)",
        "<module> (nccl_case.py:25)",
    ]


def test_an_idle_thread_is_not_active():
    thread = only(read_dump(H200 / "skip" / "pyspy_rank1.txt")).main_thread()
    assert not thread.active and thread.frames[0].text == "train_step (nccl_case.py:17)"


@pytest.mark.parametrize("case", ["skip", "dataloader", "lock", "barrier_4ranks"])
def test_text_and_json_of_the_same_process_agree(case):
    for text_file in sorted((STACKS / case).glob("rank??.txt")):
        text = only(read_dump(text_file))
        data = only(read_dump(text_file.with_suffix(".json")))
        assert text.pid == data.pid
        assert {t.name for t in text.threads} == {t.name for t in data.threads}
        main_text, main_json = text.main_thread(), data.main_thread()
        assert [(f.function, f.line) for f in main_text.frames] == [(f.function, f.line) for f in main_json.frames]
        # The text form prints py-spy's short names; JSON has the full path and the short one.
        assert all(f.short_file == t.file for f, t in zip(main_json.frames, main_text.frames, strict=True))
        assert data.has_full_paths and not text.has_full_paths
        assert data.command is None and data.python_version is None  # JSON carries neither


def test_main_thread_is_found_by_name_not_position():
    # JSON lists threads in interpreter order: the helper thread comes first there.
    process = only(read_dump(STACKS / "skip" / "rank01.json"))
    assert process.threads[0].name == "orphan-guard"
    assert process.main_thread().frames[0].function == "culprit_skip"


def test_locals_are_attached_to_their_frame():
    thread = only(read_dump(STACKS / "skip" / "rank01.locals.txt")).main_thread()
    by_function = {f.function: f for f in thread.frames}
    assert [(v.name, v.is_argument) for v in by_function["culprit_skip"].locals] == [("tensor", True)]
    main_locals = {v.name: v.repr for v in by_function["main"].locals}
    assert main_locals["mode"] == '"skip"' and main_locals["rank"] == "1"
    assert by_function["<module>"].locals == ()


def test_native_json_frames_are_native_by_their_module():
    thread = only(read_dump(STACKS / "skip" / "rank01.native.json")).main_thread()
    assert [f.function for f in thread.frames[:2]] == ["clock_nanosleep", "time_sleep"]
    assert all(f.native for f in thread.frames[:2])
    assert [f.function for f in thread.python_frames] == ["culprit_skip", "main", "<module>"]
    assert thread.frames[0].short_file == "libc.so.6"


def test_cpp_symbols_with_parentheses_parse_as_one_native_frame():
    thread = only(read_dump(STACKS / "skip" / "rank00.native.txt")).main_thread()
    pybind = [f for f in thread.frames if f.function.startswith("pybind11::cpp_function::initialize<")]
    assert pybind and pybind[0].file == "libtorch_python.so" and pybind[0].native
    assert "c10d::Work::wait" in [f.function for f in thread.frames]


SUBPROCESSES = """\
Process 100: torchrun --nproc_per_node 2 train.py
Python v3.10.12 (/usr/bin/python3.10)

Thread 0x7F1234567 (active+gil)
    _poll (torch/distributed/elastic/agent/server/api.py:900)

--------------------------------------------------------------------------------
Process 101: /usr/bin/python3 -u train.py
Python v3.10.12 (/usr/bin/python3.10)
Parent Process 100: torchrun --nproc_per_node 2 train.py

Thread 101 (active): "MainThread"
    step (train.py:12)
Thread 102 (idle): "pin_memory"
"""


def test_subprocesses_output_gives_one_record_per_process_and_all_statuses():
    agent, worker = parse_text(SUBPROCESSES, "dump.txt")
    assert agent.pid == 100 and worker.pid == 101 and worker.parent_pid == 100
    thread = agent.threads[0]
    assert thread.thread_id == 0x7F1234567 and thread.os_thread_id is None and thread.name is None
    assert thread.active and thread.owns_gil
    assert worker.threads[1].name == "pin_memory" and worker.threads[1].frames == ()
    assert worker.main_thread().frames[0].text == "step (train.py:12)"


def test_colour_codes_from_a_terminal_capture_are_ignored():
    coloured = "\x1b[1;33mProcess 7\x1b[0m: python t.py\nPython v\x1b[1m3.11.7\x1b[0m (/usr/bin/python3)\n\n"
    coloured += (
        'Thread \x1b[1;33m7\x1b[0m (idle): "MainThread"\n    \x1b[32mf\x1b[0m (\x1b[36mt.py\x1b[0m:\x1b[2m3\x1b[0m)\n'
    )
    process = only(parse_dump(coloured, "c.txt"))
    assert process.main_thread().frames[0].text == "f (t.py:3)"


def test_parse_dump_detects_json():
    data = json.dumps(
        [{"pid": 5, "thread_id": 9, "thread_name": None, "os_thread_id": None, "active": True, "owns_gil": True,
          "frames": [{"name": "f", "filename": "/w/t.py", "module": None, "short_filename": "t.py", "line": 3,
                      "locals": None}]}]
    )  # fmt: skip
    thread = only(parse_dump(data.encode(), "t.json")).threads[0]
    assert (thread.thread_id, thread.owns_gil, thread.frames[0].text) == (9, True, "f (t.py:3)")


# --- bad input -------------------------------------------------------------------------------------


def error_for(tmp_path, name, content: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputError) as err:
        read_dump(path)
    assert isinstance(err.value, TriageError)
    message = str(err.value)
    assert str(path) in message
    return message


GOOD = (STACKS / "skip" / "rank00.txt").read_bytes()


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("empty.txt", b"", "empty"),
        ("blank.txt", b"\n \n", "empty"),
        ("binary.txt", b"\x80\x04\x95\x00\x00\x00pickle", "binary"),
        ("latin1.txt", "Process 1: caf\xe9".encode("latin-1"), "not UTF-8"),
        ("cut.txt", GOOD[: GOOD.index(b"distributed_c10d.py:") + 5], "truncated"),
        ("header_only.txt", GOOD[: GOOD.index(b"Thread")], "no 'Thread"),
        ("no_python_line.txt", b"Process 1: python t.py\nThread 1 (idle)\n", "Python v"),
        ("log.txt", b"[rank0]: RuntimeError: boom\n", "not py-spy dump output"),
        ("pyspy_error.txt", b"Error: Failed to get process executable name.\n", "py-spy failed"),
        ("status.txt", b'Process 1: p\nPython v3.11.0 (/p)\n\nThread 1 (sleeping): "MainThread"\n', "thread status"),
        ("junk_frame.txt", b"Process 1: p\nPython v3.11.0 (/p)\n\nThread 1 (idle)\n    what is this\n", "frame line"),
        ("cut.json", (STACKS / "skip" / "rank00.json").read_bytes()[:300], "truncated"),
        ("object.json", b'[{"pid": 1}]', "missing thread_id, frames"),
        ("dict.json", b'[{"pid": 1, "thread_id": 2, "frames": [{"line": 3}]}]', "frame #0"),
        ("empty_list.json", b"[]", "non-empty JSON list"),
        ("bad.json", b"[1, 2,, 3]", "malformed JSON"),
    ],
)
def test_bad_input_is_refused_with_the_file_and_the_reason(tmp_path, name, content, expected):
    assert expected in error_for(tmp_path, name, content)


def test_a_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        read_dump(tmp_path / "nope.txt")


def test_parse_json_rejects_text_and_parse_text_rejects_json():
    with pytest.raises(InputError, match="malformed JSON"):
        parse_json("Process 1: p\n", "x.json")
    with pytest.raises(InputError, match="not py-spy dump output"):
        parse_text('[{"pid": 1}]\n', "x.txt")


# --- per-rank loading ------------------------------------------------------------------------------


def test_a_folder_loads_one_dump_per_rank_preferring_native_frames():
    dumps = load_rank_stacks([STACKS / "skip_4ranks"])
    assert sorted(dumps) == [0, 1, 2, 3]
    assert all(p.has_native_frames for p in dumps.values())


def test_h200_file_names_give_the_rank():
    dumps = load_rank_stacks([H200 / "skip" / "pyspy_rank0.txt", H200 / "skip" / "pyspy_rank1.txt"])
    assert {r: p.pid for r, p in dumps.items()} == {0: 669, 1: 670}


def test_a_dump_without_a_rank_in_its_name_or_with_several_processes_is_refused(tmp_path):
    nameless = tmp_path / "stack.txt"
    nameless.write_bytes(GOOD)
    with pytest.raises(InputError, match="which rank"):
        read_rank_dump(nameless)
    assert read_rank_dump(nameless, rank=4)[0] == 4
    several = tmp_path / "rank0.txt"
    several.write_text(SUBPROCESSES)
    with pytest.raises(InputError, match="2 processes"):
        read_rank_dump(several)


def test_an_empty_folder_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no py-spy dumps"):
        load_rank_stacks([tmp_path])
