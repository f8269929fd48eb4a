"""`torchtriage run`'s folder: made private (0700: the ranks' stacks show the values they hold), and checked
writable before the job starts, since a folder the ranks cannot write to loses the evidence of the very hang it is
there for. Read-only and full folders are real: a mode, a read-only bind mount, a small tmpfs filled up."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hung_job import clean_environment
from torchtriage import exit_codes

ROOT = Path(__file__).resolve().parent.parent


def run(out: Path, marker: Path, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`torchtriage run --out OUT -- python -c ...`: the job leaves `marker` when it starts."""
    job = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    return subprocess.run(
        [*prefix, sys.executable, "-m", "torchtriage", "run", "--out", str(out), "--", *job], cwd=ROOT,
        env=clean_environment(), capture_output=True, text=True, timeout=120, umask=0o022,
    )  # fmt: skip


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def in_mount_namespace(setup: str) -> tuple[str, ...] | None:
    """A prefix that runs a command in a mount namespace of its own after `setup` (a shell line that mounts), or
    None where this process may not make one (unprivileged, no unshare)."""
    if shutil.which("unshare") is None:
        return None
    prefix = ("unshare", "--mount", "sh", "-c", f'{setup} && exec "$@"', "sh")
    probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
    return prefix if probe.returncode == 0 else None


def test_run_makes_its_folder_private_and_leaves_no_probe_behind(tmp_path):
    out = tmp_path / "made" / "by-run"
    done = run(out, tmp_path / "started")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "started").exists()
    assert mode(tmp_path / "made") == 0o700 and mode(out) == 0o700
    assert not [p.name for p in out.iterdir() if "probe" in p.name]


def test_a_folder_the_user_names_is_left_as_it_is_and_said_when_others_can_read_it(tmp_path):
    out = tmp_path / "shared"
    out.mkdir()
    out.chmod(0o755)
    done = run(out, tmp_path / "started")
    assert done.returncode == 0, done.stderr
    assert mode(out) == 0o755 and f"{out} is readable by other users (mode 0755)" in done.stderr


def as_bound_by_modes(folder: Path) -> tuple[str, ...] | None:
    """A prefix under which file modes bind: none for a user; for root (which writes whatever a mode says), root
    without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, where setpriv can drop them. None when modes cannot bind."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        return None
    prefix = ("setpriv", "--bounding-set=-dac_override,-dac_read_search")
    probe = subprocess.run([*prefix, "touch", str(folder / "probe")], capture_output=True, timeout=30)
    return prefix if probe.returncode != 0 else None


def test_a_folder_without_write_permission_is_refused_before_the_job_starts(tmp_path):
    out = tmp_path / "read-only"
    out.mkdir()
    out.chmod(0o500)
    prefix = as_bound_by_modes(out)
    if prefix is None:
        out.chmod(0o700)
        pytest.skip("running as root, and its capabilities cannot be dropped here: modes do not bind")
    try:
        done = run(out, tmp_path / "started", prefix)
    finally:
        out.chmod(0o700)
    assert done.returncode == exit_codes.ENVIRONMENT and "Traceback" not in done.stderr
    assert f"--out {out} is not writable by this user" in done.stderr and "the job was not started" in done.stderr
    assert not (tmp_path / "started").exists()


def test_a_folder_on_a_read_only_file_system_is_refused_before_the_job_starts(tmp_path):
    out = tmp_path / "mounted"
    out.mkdir()
    prefix = in_mount_namespace(f"mount --bind {out} {out} && mount -o remount,bind,ro {out}")
    if prefix is None:
        pytest.skip("no mount namespace can be made here")
    done = run(out, tmp_path / "started", prefix)
    assert done.returncode == exit_codes.ENVIRONMENT and "Traceback" not in done.stderr
    assert f"--out {out} is on a read-only file system" in done.stderr
    assert not (tmp_path / "started").exists()


def test_a_full_folder_is_refused_before_the_job_starts(tmp_path):
    out = tmp_path / "full"
    out.mkdir()
    # A 64 KiB tmpfs filled up: an empty file can still be made there, a block of data cannot.
    prefix = in_mount_namespace(
        f"mount -t tmpfs -o size=64k tmpfs {out} && {{ head -c 1048576 /dev/zero > {out}/fill; true; }}"
    )
    if prefix is None:
        pytest.skip("no mount namespace can be made here")
    done = run(out, tmp_path / "started", prefix)
    assert done.returncode == exit_codes.ENVIRONMENT and "Traceback" not in done.stderr
    assert f"--out {out} has no space left" in done.stderr
    assert not (tmp_path / "started").exists()
