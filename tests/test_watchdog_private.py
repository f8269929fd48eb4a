"""What the hang watchdog writes is private: every folder 0700, every file 0600, whatever the job's umask.

The stacks show the values the ranks hold (a token read from the environment, a path), and a run folder often
lies in /tmp, which every user of the node reads. A real `torchtriage run` of a torchrun + gloo job
(tests/jobs/harm_job.py) that stalls twice, under umask 022: the faulthandler backstop each rank opens when
armed, the stacks, flight-recorder dumps and verdict of each stall, and the earlier stall's files kept aside.
"""

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parent))

from hung_job import clean_environment, torchrun_command  # noqa: E402
from live_job import Job  # noqa: E402

JOB = Path(__file__).parent / "jobs" / "harm_job.py"
pytestmark = pytest.mark.slow


def modes(folder: Path) -> dict[str, int]:
    """The permission bits of `folder` and of everything below it, by path relative to its parent."""
    found = {folder.name: stat.S_IMODE(folder.lstat().st_mode)}
    for path in folder.rglob("*"):
        found[str(path.relative_to(folder.parent))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def wait_for_episode(verdict_file: Path, episode: int, job: Job, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.proc.poll() is None:
        try:
            if json.loads(verdict_file.read_text())["facts"]["watchdog"]["episode"] == episode:
                return
        except (OSError, ValueError, KeyError):
            pass  # not there yet, or being replaced
        time.sleep(0.5)
    raise AssertionError(f"no verdict of stall {episode}\n{''.join(job.lines)[-3000:]}")


def test_every_file_and_folder_the_watchdog_writes_is_private(tmp_path):
    # Rank 0 pauses 8 s once (stall 1), the job moves again, then rank 1 hangs for good (stall 2): the first
    # stall's files go to hang/.earlier/<time>/.
    run_dir = tmp_path / "run"
    umask_022 = ["sh", "-c", 'umask 022 && exec "$@"', "sh"]
    command = [
        *umask_022, sys.executable, "-m", "torchtriage", "run", "--out", str(run_dir), "--stall-seconds", "3", "--",
        *torchrun_command(2, JOB),
    ]  # fmt: skip
    env = clean_environment(HARM_MODE="stall_then_hang", HARM_SECONDS="6", HARM_PAUSE="8")
    job = Job(command, env, ranks=2, log=tmp_path / "console.log")
    try:
        wait_for_episode(run_dir / "hang" / "verdict.json", 2, job)
        found = modes(run_dir / "hang")
    finally:
        job.kill()
    # what each kind of file is there, so that the modes below are the modes of real evidence
    names = {Path(p).name for p in found}
    backstops = {"faulthandler-backstop-rank0.txt", "faulthandler-backstop-rank1.txt"}
    assert backstops | {"rank00.txt", "rank01.txt", "verdict.json"} <= names
    assert any(p.startswith("hang/.earlier/") and p.endswith("/rank00.txt") for p in found), sorted(found)
    folders = {p for p in found if (run_dir / p).is_dir()}
    assert {p: f"{m:04o}" for p, m in found.items() if m != (0o700 if p in folders else 0o600)} == {}
    assert os.stat(run_dir).st_mode & 0o077 == 0  # `run` made the run folder private


def test_a_request_made_before_any_rank_made_the_hang_folder_makes_it_private(tmp_path):
    """`diagnose --pid` may ask for fresh dumps before a rank has made `hang/`: the folder it makes is 0700, as the
    ranks would have made it, whatever the umask."""
    from torchtriage.protocol import write_request

    folder = tmp_path / "run" / "hang"
    old = os.umask(0o022)
    try:
        write_request(folder, "token1")
    finally:
        os.umask(old)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
