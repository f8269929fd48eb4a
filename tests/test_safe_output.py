"""Text from the inputs never reaches the terminal as control characters, nor the HTML page as markup."""

import json

from conftest import run_cli
from torchtriage import exit_codes
from torchtriage.report.safe_text import visible, visible_copy

# Terminal sequences: OSC 52 (write the clipboard) and clear the screen. The log reader drops them, as it
# drops colour codes.
SEQUENCES = "\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2J"
# Lone controls the reader keeps: a bell, a C1 control (NEL), a bidi override. (A log's carriage returns
# and newlines end its lines, so they reach the output only through names: see the file-name test.)
LONE = "\x07\x85\u202e"
HOSTILE = SEQUENCES + LONE


def oom_log(folder: str) -> str:
    # PyTorch's CUDACachingAllocator message, raised in a file under `folder`: the path is the job's to name.
    return (
        "[rank3]: Traceback (most recent call last):\n"
        f'[rank3]:   File "/job/{folder}/train.py", line 42, in step\n'
        "[rank3]:     loss = model(batch)\n"
        "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
        "capacity of 79.10 GiB of which 1.12 GiB is free. Process 811 has 77.98 GiB memory in use. "
        "Of the allocated memory 75.00 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but "
        "unallocated.\n"
    )


def test_visible_escapes_controls_and_keeps_tabs():
    assert visible("a\tb") == "a\tb"
    assert visible(HOSTILE) == "\\x1b]52;c;ZWNobyBwd25lZA==\\x07\\x1b[2J\\x07\\x85\\u202e"
    assert visible("a\rb\nc") == "a\\rb\\nc"
    assert visible("\x85\x9b31m") == "\\x85\\x9b31m"  # C1: NEL and the one-byte CSI
    assert visible("plain ünïcode ✓") == "plain ünïcode ✓"


def test_visible_copy_reaches_nested_verdict_strings():
    copy = visible_copy({"k\x1b": [("a\x07", 1)], "n": None})
    assert copy == {"k\\x1b": [("a\\x07", 1)], "n": None}


def test_a_hostile_log_line_is_shown_escaped(tmp_path):
    log = tmp_path / "rank3.log"
    log.write_text(oom_log(HOSTILE))
    done = run_cli("triage", log)
    out = done.stdout.decode()
    assert done.returncode == exit_codes.PROBLEM_FOUND, done.stderr.decode()
    assert "/job/\\x07\\x85\\u202e/train.py" in out
    for raw in ("\x1b", "\x07", "\x85", "\u202e"):
        assert raw not in out


def test_a_hostile_file_name_is_shown_escaped(tmp_path):
    log = tmp_path / "rank3\x1b[31m\nconfidence: high.log"
    log.write_text(oom_log("src"))
    done = run_cli("triage", tmp_path)
    out = done.stdout.decode()
    assert done.returncode == exit_codes.PROBLEM_FOUND, done.stderr.decode()
    assert "rank3\\x1b[31m\\nconfidence: high.log" in out
    assert "\x1b" not in out
    assert "\nconfidence: high.log" not in out


def test_an_unreadable_hostile_name_in_an_error_is_escaped(tmp_path):
    done = run_cli("triage", tmp_path / "gone\x1b]0;owned\x07.log")
    err = done.stderr.decode()
    assert done.returncode == exit_codes.BAD_INPUT
    assert "gone\\x1b]0;owned\\x07.log" in err
    assert "\x1b" not in err


def test_json_keeps_the_exact_text(tmp_path):
    log = tmp_path / "rank3.log"
    log.write_text(oom_log(HOSTILE))
    done = run_cli("triage", "--json", log)
    assert "\x1b" not in done.stdout.decode()  # the encoder escapes it...
    verdict = json.loads(done.stdout)
    assert f"/job/{LONE}/train.py" in verdict["summary"]  # ...and a program reading it gets the text as read


def test_html_shows_markup_from_a_log_as_text(tmp_path):
    log = tmp_path / "rank3.log"
    log.write_text(oom_log("<script>alert(1)</script><img src=x onerror=alert(2)>"))
    page = tmp_path / "report.html"
    done = run_cli("report", "--html", page, tmp_path)
    assert done.returncode == exit_codes.PROBLEM_FOUND, done.stderr.decode()
    html = page.read_text()
    assert "CUDA out of memory" in html
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;" in html
