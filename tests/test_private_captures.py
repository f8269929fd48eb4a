"""Captures stay private: py-spy's --locals show the values a rank holds (here a token read from the environment),
so every folder a capture makes is 0700 and every file it writes 0600, whatever the umask; a folder the user
names is left as it is, and said when other users can read it. Real processes, the real py-spy, the real CLI."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from hung_job import clean_environment
from torchtriage import exit_codes
from torchtriage.collect.kubernetes import _extract
from torchtriage.protocol import write_private, write_whole

ROOT = Path(__file__).resolve().parent.parent
SECRET = "tok-9f8e7d6c5b4a"
# A process holding a token in a local variable, as a rank that read it from the environment would.
HOLDER = """
import os, time
def serve():
    token = os.environ["API_TOKEN"]
    print("READY", flush=True)
    time.sleep(600)
serve()
"""
NOBODY = 65534


@pytest.fixture(scope="module")
def holder():
    if shutil.which("py-spy") is None and not (Path(sys.executable).parent / "py-spy").exists():
        pytest.skip("py-spy is not installed")
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER], env=clean_environment(API_TOKEN=SECRET), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "READY"
    time.sleep(0.2)  # from print to time.sleep: the token is in a frame by then
    yield proc.pid
    proc.kill()
    proc.wait()


def cli(*args: str, umask: int = 0o022, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, under the umask given (022: the usual default, which makes files 0644)."""
    return subprocess.run(
        [sys.executable, "-m", "torchtriage", *args], cwd=ROOT, env=env or clean_environment(), capture_output=True,
        text=True, timeout=120, umask=umask,
    )  # fmt: skip


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def modes_below(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): mode(p) for p in sorted(folder.rglob("*"))}


def assert_private(folder: Path) -> None:
    """The folder and everything below it: folders 0700, files 0600."""
    assert mode(folder) == 0o700, oct(mode(folder))
    for name, bits in modes_below(folder).items():
        wanted = 0o700 if (folder / name).is_dir() else 0o600
        assert bits == wanted, f"{name}: {bits:04o}"


def only_capture(out: Path) -> Path:
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return folder


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_dump_writes_private_files_in_private_folders_whatever_the_umask(tmp_path, holder, umask):
    out = tmp_path / "made" / "by" / "dump"  # three folders the capture makes
    done = cli("dump", "--pid", str(holder), "--out", str(out), umask=umask)
    assert done.returncode == exit_codes.OK, done.stdout + done.stderr
    for made in (tmp_path / "made", tmp_path / "made" / "by", out):
        assert mode(made) == 0o700, f"{made}: {mode(made):04o}"
    capture = only_capture(out)
    assert_private(capture)
    names = set(modes_below(capture))
    assert {f"pid{holder}.txt", f"pid{holder}.json", "summary.json"} <= names
    # Why it matters: the JSON dump holds the locals, the token among them.
    assert SECRET in (capture / f"pid{holder}.json").read_text()


def test_diagnose_pid_and_its_verdict_files_are_private(tmp_path, holder):
    out, verdict = tmp_path / "captures", tmp_path / "verdict"
    done = cli("diagnose", "--pid", str(holder), "--out", str(out), "--write-verdict", str(verdict))
    assert done.returncode in (exit_codes.OK, exit_codes.PROBLEM_FOUND), done.stdout + done.stderr
    assert mode(out) == 0o700
    assert_private(only_capture(out))
    assert_private(verdict)
    assert {"verdict.json", "verdict.txt"} <= set(modes_below(verdict))


def test_record_files_are_private_too(tmp_path, holder):
    # py-spy writes the flame graph and the profile itself: under our umask of 077.
    done = cli("record", "--pid", str(holder), "--duration", "1", "--idle", "--out", str(tmp_path / "flames"))
    assert done.returncode == exit_codes.OK, done.stdout + done.stderr
    capture = only_capture(tmp_path / "flames")
    assert_private(capture)
    assert {f"pid{holder}.svg", f"pid{holder}.speedscope.json"} <= set(modes_below(capture))


def test_a_folder_the_user_names_is_left_as_it_is_and_said_when_others_can_read_it(tmp_path, holder):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    done = cli("dump", "--pid", str(holder), "--out", str(shared))
    assert done.returncode == exit_codes.OK, done.stdout + done.stderr
    assert mode(shared) == 0o755  # not the capture's to change
    assert f"{shared} is readable by other users (mode 0755)" in done.stdout
    assert_private(only_capture(shared))

    own = tmp_path / "own"
    own.mkdir()
    own.chmod(0o700)
    done = cli("dump", "--pid", str(holder), "--out", str(own))
    assert done.returncode == exit_codes.OK and "readable by other users" not in done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="reading as another user needs root to switch to it")
def test_another_user_cannot_read_a_capture_made_in_a_folder_open_to_all(holder):
    shared = Path(tempfile.mkdtemp(prefix="torchtriage-shared-"))
    try:
        shared.chmod(0o755)  # a project folder every user of the node can list
        control = shared / "notes.txt"
        control.write_text("readable\n")
        control.chmod(0o644)
        done = cli("dump", "--pid", str(holder), "--out", str(shared))
        assert done.returncode == exit_codes.OK, done.stdout + done.stderr
        locals_file = only_capture(shared) / f"pid{holder}.json"

        def read_as_nobody(path: Path) -> subprocess.CompletedProcess:
            return subprocess.run(["cat", str(path)], user=NOBODY, group=NOBODY, extra_groups=[],
                                  capture_output=True, text=True, timeout=30)  # fmt: skip

        assert read_as_nobody(control).returncode == 0  # the other user reaches the folder: the check can fail
        denied = read_as_nobody(locals_file)
        assert denied.returncode != 0 and SECRET not in denied.stdout and "Permission denied" in denied.stderr
    finally:
        shutil.rmtree(shared)


def test_the_default_folder_is_the_users_own_and_private(tmp_path, holder):
    env = clean_environment(TMPDIR=str(tmp_path))
    done = cli("dump", "--pid", str(holder), env=env)
    assert done.returncode == exit_codes.OK, done.stdout + done.stderr
    default = tmp_path / f"torchtriage-{os.getuid()}"
    assert_private(default)


def test_a_default_folder_someone_put_a_symlink_at_is_refused(tmp_path, holder):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / f"torchtriage-{os.getuid()}").symlink_to(elsewhere)
    done = cli("dump", "--pid", str(holder), env=clean_environment(TMPDIR=str(tmp_path)))
    assert done.returncode == exit_codes.ENVIRONMENT and "Traceback" not in done.stderr
    assert "is a symlink; remove it, or choose another folder with --out" in done.stderr
    assert list(elsewhere.iterdir()) == []


def test_a_symlink_planted_at_a_files_name_is_never_followed(tmp_path):
    target = tmp_path / "target"
    target.write_text("untouched\n")
    planted = tmp_path / "rank00.json"
    planted.symlink_to(target)
    with pytest.raises(FileExistsError):
        write_private(planted, SECRET)
    assert target.read_text() == "untouched\n"


def test_write_whole_replaces_a_readable_file_with_a_private_one(tmp_path):
    verdict = tmp_path / "verdict.json"
    verdict.write_text("{}\n")
    verdict.chmod(0o644)
    previous = os.umask(0o022)
    try:
        write_whole(verdict, '{"culprit_ranks": [1]}\n')
    finally:
        os.umask(previous)
    assert mode(verdict) == 0o600 and json.loads(verdict.read_text()) == {"culprit_ranks": [1]}
    assert [p.name for p in tmp_path.iterdir()] == ["verdict.json"]  # no partial file left


def test_a_pods_archive_lands_private_whatever_modes_it_carries(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (("rank00.json", SECRET.encode()), ("fr/nccl_trace_rank_0", b"dump")):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        folder = tarfile.TarInfo("fr")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
    into = tmp_path / "pods" / "trainer-0"
    assert _extract(buffer.getvalue(), into) == []
    assert_private(tmp_path / "pods")
