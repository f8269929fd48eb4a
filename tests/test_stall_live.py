"""The stall layer on the console of a real hung torchrun + gloo job that someone stopped with Ctrl-C.

The job is tests/jobs/hang.py (HANG_MODE=skip: rank 1 sleeps while rank 0 waits in all_reduce), its
workers' output prefixed by torchrun (`--tee 3`). SIGINT goes to the agent, as a terminal's Ctrl-C does;
the agent passes it on to its workers. Rank 1, asleep in Python, raises KeyboardInterrupt at once and
exits; rank 0's all_reduce then fails (its peer closed the connection) and is interrupted while the
failure is handled, inside c10d's collective wrapper. Everything is killed in a finally block.
"""

import os
import signal
import subprocess
import threading
import time

import pytest

from conftest import triage_json
from hung_job import HANG, TORCHRUN, job_environment

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed")]


def _kill(proc, pids):
    for pid in [*pids, proc.pid]:
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def test_a_real_job_interrupted_with_ctrl_c_names_the_rank_that_was_in_no_collective(tmp_path):
    command = [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", "--tee", "3", str(HANG)]
    proc = subprocess.Popen(
        command,
        env=job_environment("skip", 1),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output: list[str] = []
    pids: list[int] = []
    ready, interrupted = threading.Event(), threading.Event()
    ended: set[str] = set()  # the ranks whose traceback has ended (its last line: KeyboardInterrupt)

    def read():
        for line in proc.stdout:
            output.append(line)
            if "READY rank=" in line:
                pids.append(int(line.rsplit("pid=", 1)[1]))
                if len(pids) == 2:
                    ready.set()
            if line.rstrip().endswith("KeyboardInterrupt") and line.startswith("[default"):
                ended.add(line.split("]", 1)[0])
                if len(ended) == 2:  # both tracebacks whole, however slowly a loaded machine prints them
                    interrupted.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(180), "the job never got ready:\n" + "".join(output[-30:])
        time.sleep(1)  # let rank 0 block in all_reduce
        os.kill(proc.pid, signal.SIGINT)  # Ctrl-C reaches the agent
        assert interrupted.wait(120), "not every rank printed its KeyboardInterrupt:\n" + "".join(output[-30:])
    finally:
        _kill(proc, pids)
    log = tmp_path / "console.log"
    log.write_text("".join(output))
    code, verdict = triage_json(log)
    assert (verdict["category"], verdict["culprit_ranks"]) == ("hang", [1]), verdict["summary"]
    kinds = [f["kind"] for f in verdict["findings"]]
    assert kinds[0] == "hang.interrupted" and "stacks.not_in_collective" in kinds
    assert verdict["confidence"] == "medium"  # stacks printed on the way out, not a live dump of every rank
    assert "culprit_skip" in verdict["summary"] and "peer_all_reduce" in verdict["summary"]
