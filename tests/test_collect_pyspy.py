"""The py-spy runner and the `dump` verb around it, driven by a stand-in py-spy (a shell script named
by TORCHTRIAGE_PY_SPY) against plain Python processes: concurrency, failures named, timeouts and Ctrl-C
leaving no py-spy behind, py-spy missing. The real py-spy on a real hung job is in test_collect_live.py."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchtriage import exit_codes
from torchtriage.collect.pyspy import PY_SPY_ENV, find_py_spy, reason_from_stderr
from torchtriage.errors import EnvironmentProblem

SRC = Path(__file__).resolve().parent.parent / "src"

# Stand-in for py-spy: records its pid, then behaves as FAKE_MODE says for the pid it is pointed at.
FAKE = """#!/bin/sh
[ "$1" = --version ] && { echo "py-spy 0.0-fake"; exit 0; }
target=$3
echo $$ >> "$FAKE_DIR/pids"
case "$FAKE_MODE" in
  hang) exec sleep 600 ;;
  rendezvous)
    # Succeeds only if every rank's py-spy runs at the same time (the runner is concurrent).
    touch "$FAKE_DIR/started.$target"
    i=0
    while [ "$(ls "$FAKE_DIR" | grep -c '^started\\.')" -lt "$FAKE_RANKS" ]; do
      i=$((i + 1)); [ $i -gt 200 ] && { echo "Error: alone" >&2; exit 1; }; sleep 0.05
    done ;;
  deny)
    if [ "$target" = "$FAKE_DENY" ]; then
      printf 'Permission Denied: Try running again with elevated permissions\\n\\nStack backtrace:\\n  0: x\\n' >&2
      exit 1
    fi ;;
esac
case "$*" in
  *--json*) echo '[]' ;;
  *) echo "Process $target: python fake.py" ;;
esac
"""


@pytest.fixture
def fake_py_spy(tmp_path):
    path = tmp_path / "bin" / "py-spy"
    path.parent.mkdir()
    path.write_text(FAKE)
    path.chmod(0o755)
    return path


@pytest.fixture
def sleepers():
    """Two idle Python processes to point `--pid` at (never signalled by torchtriage)."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]) for _ in range(2)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def start_cli(args, env_extra, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(SRC), **env_extra}
    return subprocess.Popen(
        [sys.executable, "-m", "torchtriage", *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def fake_env(fake, tmp_path, mode, **extra):
    return {
        PY_SPY_ENV: str(fake),
        "FAKE_DIR": str(tmp_path),
        "FAKE_MODE": mode,
        **{k: str(v) for k, v in extra.items()},
    }


def pid_args(procs):
    return [arg for p in procs for arg in ("--pid", p.pid)]


def alive(pid):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for_lines(path, n, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().split()) >= n:
            return [int(x) for x in path.read_text().split()]
        time.sleep(0.05)
    raise AssertionError(f"{path} never had {n} lines")


def only_folder(out):
    (folder,) = out.iterdir()
    return folder


def test_every_rank_is_captured_concurrently(tmp_path, fake_py_spy, sleepers):
    out = tmp_path / "out"
    proc = start_cli(
        ["dump", "--json", "--out", out, *pid_args(sleepers)],
        fake_env(fake_py_spy, tmp_path, "rendezvous", FAKE_RANKS=2),
    )
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == exit_codes.OK, stderr
    summary = json.loads(stdout)
    assert [p["ok"] for p in summary["processes"]] == [True, True]
    folder = only_folder(out)
    for p in sleepers:
        assert (folder / f"pid{p.pid}.txt").read_text() == f"Process {p.pid}: python fake.py\n"
        assert json.loads((folder / f"pid{p.pid}.json").read_text()) == []
    assert json.loads((folder / "summary.json").read_text()) == summary


def test_a_failed_attach_is_named_with_py_spys_reason_and_the_others_are_captured(tmp_path, fake_py_spy, sleepers):
    denied, fine = sleepers
    out = tmp_path / "out"
    env = fake_env(fake_py_spy, tmp_path, "deny", FAKE_DENY=denied.pid)
    proc = start_cli(["dump", "--out", out, *pid_args(sleepers)], env)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == exit_codes.PROBLEM_FOUND, stderr
    failure_lines = [line for line in stdout.splitlines() if "Permission Denied" in line]
    assert len(failure_lines) == 1 and f"pid {denied.pid}" in failure_lines[0]
    assert f"pid {fine.pid}" not in failure_lines[0] and "Stack backtrace" not in stdout
    assert "--cap-add=SYS_PTRACE" in failure_lines[0]
    folder = only_folder(out)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [f"pid{fine.pid}.txt", f"pid{fine.pid}.json", "summary.json"]
    )
    summary = json.loads((folder / "summary.json").read_text())
    by_pid = {p["pid"]: p for p in summary["processes"]}
    assert by_pid[denied.pid]["ok"] is False and by_pid[denied.pid]["files"] == []
    assert by_pid[fine.pid]["ok"] is True and summary["ok"] is False


def test_a_py_spy_past_its_timeout_is_killed_and_the_rank_left_alone(tmp_path, fake_py_spy, sleepers):
    proc = start_cli(
        ["dump", "--timeout", 1, "--out", tmp_path / "out", *pid_args(sleepers)],
        fake_env(fake_py_spy, tmp_path, "hang"),
    )
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == exit_codes.PROBLEM_FOUND, stderr
    assert stdout.count("did not finish within 1 s") == 2
    for pid in wait_for_lines(tmp_path / "pids", 2):
        assert not alive(pid), f"py-spy stand-in {pid} survived"
    assert all(p.poll() is None for p in sleepers)  # the targets were never signalled


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_kills_every_py_spy_and_keeps_a_summary(tmp_path, fake_py_spy, sleepers, sig):
    out = tmp_path / "out"
    proc = start_cli(
        ["dump", "--timeout", 300, "--out", out, *pid_args(sleepers)], fake_env(fake_py_spy, tmp_path, "hang")
    )
    try:
        fakes = wait_for_lines(tmp_path / "pids", 2)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stdout
    for pid in fakes:
        assert not alive(pid), f"py-spy stand-in {pid} survived the interrupt"
    assert all(p.poll() is None for p in sleepers)
    summary = json.loads((only_folder(out) / "summary.json").read_text())
    assert summary["interrupted"] is True and not any(p["ok"] for p in summary["processes"])


def test_a_dead_pid_is_a_usage_error_naming_it(tmp_path, fake_py_spy):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    proc = start_cli(["dump", "--pid", gone.pid, "--out", tmp_path], fake_env(fake_py_spy, tmp_path, "ok"))
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == exit_codes.USAGE
    assert f"--pid {gone.pid}: no such process" in stderr and "Traceback" not in stderr
    assert not any(tmp_path.glob("*-*/summary.json"))


def test_py_spy_missing_exits_4_with_the_install_hint(tmp_path, sleepers):
    # No py-spy on PATH, none named, and a Python whose bin dir holds none.
    env = {k: v for k, v in os.environ.items() if k != PY_SPY_ENV}
    env.update(PATH=str(tmp_path / "empty"), PYTHONPATH=str(SRC))
    probe = (
        f"import sys; sys.executable = {str(tmp_path / 'bin' / 'python')!r}; "
        f"from torchtriage.cli import main; raise SystemExit(main(['dump', '--pid', '{sleepers[0].pid}']))"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == exit_codes.ENVIRONMENT, done.stderr
    assert "py-spy is not installed" in done.stderr and "pip install py-spy" in done.stderr


def test_find_py_spy_looks_at_the_variable_then_path_then_beside_python(tmp_path, monkeypatch, fake_py_spy):
    monkeypatch.delenv(PY_SPY_ENV, raising=False)
    monkeypatch.setenv("PATH", str(fake_py_spy.parent))
    assert find_py_spy() == str(fake_py_spy)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "executable", str(fake_py_spy.parent / "python"))
    assert find_py_spy() == str(fake_py_spy)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "elsewhere" / "python"))
    with pytest.raises(EnvironmentProblem, match="pip install py-spy"):
        find_py_spy()
    monkeypatch.setenv(PY_SPY_ENV, str(fake_py_spy))
    assert find_py_spy() == str(fake_py_spy)
    monkeypatch.setenv(PY_SPY_ENV, str(tmp_path / "nope"))
    with pytest.raises(EnvironmentProblem, match="not an executable file"):
        find_py_spy()


def test_reason_from_stderr_drops_the_rust_backtrace():
    stderr = (
        "Error: Failed to get process executable name. Check that the process is running.\n\nCaused by:\n"
        "    0: No such file or directory (os error 2)\n\nStack backtrace:\n   0: anyhow::error\n"
    )
    assert reason_from_stderr(stderr) == (
        "Error: Failed to get process executable name. Check that the process is running. Caused by: "
        "0: No such file or directory (os error 2)"
    )
    assert reason_from_stderr("") == "py-spy printed no reason"


def test_bad_numbers_are_usage_errors(cli):
    assert cli("dump", "--timeout", "0").returncode == exit_codes.USAGE
    assert cli("record", "--duration", "0").returncode == exit_codes.USAGE
    assert cli("record", "--rate", "0").returncode == exit_codes.USAGE
