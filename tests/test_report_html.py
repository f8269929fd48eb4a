"""`torchtriage report DIR --html FILE`: real run folders in, one self-contained page out, rendered by Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from torchtriage import exit_codes
from torchtriage.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
SKIP = FIXTURES / "h200x2" / "skip"  # logs, FR dumps, py-spy dumps; rank 1 never joined seq 4
BARRIER = FIXTURES / "h200x2_live" / "barrier"  # live captures and run/hang; rank 1 called a different collective
RUNTIME = FIXTURES / "h200x2_runtime"  # profiler/ (GPU traces) and memory/ (snapshots, one at an OOM)

# Loads from the network: any src/href (or CSS url()) that points at http(s) or a protocol-relative URL.
_REMOTE = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)


def _report(folder: Path, out: Path, capsys) -> tuple[int, str]:
    code = main(["report", str(folder), "--html", str(out)])
    capsys.readouterr()
    return code, out.read_text(encoding="utf-8")


def _assert_self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert not _REMOTE.search(page), _REMOTE.search(page).group(0)
    assert "<script" not in page.lower()
    assert "<link" not in page.lower()


def test_hang_folder_has_verdict_stacks_and_fr_table(tmp_path, capsys):
    code, page = _report(SKIP, tmp_path / "r.html", capsys)
    assert code == exit_codes.PROBLEM_FOUND
    _assert_self_contained(page)
    assert "culprit rank 1" in page
    assert '<tr class="culprit"><td>1 (culprit)</td>' in page  # per-rank state table
    assert "Flight recorder" in page and "never enqueued" in page  # rank 1 has no seq 4
    assert "nccl_case.py:17" in page  # where rank 1 sleeps
    assert "missing — no profiler trace" in page and "missing — no CUDA memory snapshot" in page


def test_live_barrier_folder(tmp_path, capsys):
    code, page = _report(BARRIER, tmp_path / "r.html", capsys)
    assert code == exit_codes.PROBLEM_FOUND
    _assert_self_contained(page)
    assert "culprit rank 1" in page and "all_reduce_barrier" in page


def test_runtime_folder_has_trace_and_memory_sections(tmp_path, capsys):
    code, page = _report(RUNTIME, tmp_path / "r.html", capsys)
    assert code == exit_codes.PROBLEM_FOUND  # the straggler in the traces, the OOM in a snapshot
    _assert_self_contained(page)
    assert "Profiler traces" in page and "straggler" in page
    assert "CUDA memory snapshots" in page and "Allocation timeline" in page and "OOM" in page
    assert "missing — no py-spy dumps found" in page


def test_hostile_strings_are_escaped(tmp_path, capsys):
    run = tmp_path / "run<i>x"  # the folder name is shown too
    run.mkdir()
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    (run / "rank0.log").write_text(
        f"[rank0]: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB {hostile}\n", encoding="utf-8"
    )
    code, page = _report(run, tmp_path / "r.html", capsys)
    assert code in (exit_codes.OK, exit_codes.PROBLEM_FOUND)
    assert "<script" not in page and "<img" not in page and "<i>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "run&lt;i&gt;x" in page


def test_nothing_readable_and_usage(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty), "--html", str(tmp_path / "r.html")]) == exit_codes.BAD_INPUT
    assert not (tmp_path / "r.html").exists()
    assert main(["report", str(tmp_path / "missing"), "--html", str(tmp_path / "r.html")]) == exit_codes.BAD_INPUT
    assert main(["report", str(SKIP), "--html", str(tmp_path)]) == exit_codes.USAGE
    capsys.readouterr()


def test_the_page_is_not_read_back_as_a_log(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(SKIP, run)
    first = _report(run, run / "report.html", capsys)[1]
    second = _report(run, run / "report.html", capsys)[1]
    assert "report.html" not in first and "report.html" not in second


def _chromium() -> str | None:
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.mark.skipif(_chromium() is None, reason="no chromium binary (apt-get install chromium): no screenshot test")
@pytest.mark.parametrize("folder", [SKIP, RUNTIME], ids=["hang", "runtime"])
def test_renders_in_headless_chromium(tmp_path, capsys, folder):
    html = tmp_path / "report.html"
    _report(folder, html, capsys)
    png = tmp_path / "report.png"
    result = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--hide-scrollbars",
            f"--screenshot={png}",
            "--window-size=1280,2000",
            html.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 30_000  # a blank page is a few KB; this one has text, tables and plots
