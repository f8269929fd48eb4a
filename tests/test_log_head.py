"""A log is said to start mid-message only when its first line is the cut-off rest of a message.

Triage warns that what came before a log's first line (the first failure, perhaps) is missing when the log begins
inside a message: a paste that starts at a traceback's frame, a file cut inside a word or a sentence. A log that
begins with a whole record gets no such warning, however its first word is spelled: `torchtriage run`'s console,
the ranks' logs torchrun keeps, NCCL's lines (the host's name first), a launcher's tagged line.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from conftest import triage_json

sys.path.insert(0, str(Path(__file__).parent))

from test_run_exit import JOBS, armed, run_to_end  # noqa: E402

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the jobs need torch")

# A failure after the first line: every log below has one, so triage reasons over its records and says what it
# could not read.
FAILURE = [
    "Traceback (most recent call last):",
    '  File "/work/train.py", line 88, in <module>',
    "ValueError: expected input with 16 features, got shape (8, 12)",
]

# First lines that begin a record, written from their formats.
WHOLE = {
    # NCCL's debug.cc: "%s:%d:%d [%d] NCCL INFO " (host name, pid, tid, device), and its WARN form
    "nccl info": "node-07:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.7<0>",
    "nccl warn": "node-07:1234:1290 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.8<39411> "
    "failed : Connection refused",
    # Slurm's srun: "srun: error: %s: task %d: Exited with exit code %d"
    "srun": "srun: error: node-07: task 3: Exited with exit code 1",
    # a training loop's step line, as the test jobs print it (tests/jobs/_common.py)
    "step line": "rank 0 | step 1 | loss: 0.2500 | grad_norm: 0.1000 | 12.3 ms",
    # tqdm's bar with no description pads its percentage: "{percentage:3.0f}%|"
    "tqdm": "  0%|          | 0/1000 [00:00<?, ?it/s]",
}

# First lines that are the rest of a message, as a paste or a cut file leaves them.
CUT = {
    # inside ProcessGroupNCCL's "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=%d, OpType=%s,
    # NumelIn=%d, NumelOut=%d, Timeout(ms)=%d) ran for %d milliseconds before timing out."
    "inside a timeout": "n=1, NumelOut=1, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.",
    # inside the caching allocator's "CUDA out of memory. Tried to allocate %s. GPU %d has ..."
    "inside a word": "ory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.10 GiB",
    "inside a short word": "e it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.",
    # a traceback's frame without its "Traceback (most recent call last):"
    "frame": '  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1751, in _call_impl',
    # c10::Error's backtrace without the message above it
    "c10 frame": "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f3a6b2cbf86 in "
    "/opt/venv/lib/python3.11/site-packages/torch/lib/libc10.so)",
    # the failed collective's stack, without ProcessGroupNCCL's "Stack trace of the failed collective:"
    "collective's stack": "#0 all_reduce from /opt/venv/lib/python3.11/site-packages/torch/distributed/"
    "distributed_c10d.py:2696",
    # a host's tag (pdsh, DeepSpeed's launcher) over a traceback's source line
    "tagged source line": 'node-07:     "__main__", mod_spec)',
}


def said_cut(verdict: dict) -> bool:
    return bool(verdict["facts"].get("cut_at_start")) or "starts mid-message" in json.dumps(verdict)


@pytest.mark.parametrize("name", WHOLE)
def test_a_log_that_begins_with_a_whole_record_is_not_said_to_start_mid_message(tmp_path, name):
    path = tmp_path / "rank0.log"
    path.write_text("\n".join([WHOLE[name], *FAILURE]) + "\n")
    code, verdict = triage_json(path)
    assert code == 1 and "ValueError" in verdict["summary"], verdict["summary"]
    assert not said_cut(verdict), verdict["problems"]


@pytest.mark.parametrize("name", CUT)
def test_a_log_that_begins_with_the_rest_of_a_message_says_so(tmp_path, name):
    path = tmp_path / "rank0.log"
    path.write_text("\n".join([CUT[name], *FAILURE]) + "\n")
    code, verdict = triage_json(path)
    assert code == 1 and said_cut(verdict), verdict["summary"]
    assert any("starts mid-message" in problem for problem in verdict["problems"]), verdict["problems"]


def test_blank_lines_and_a_launchers_empty_prefix_before_the_first_line_are_skipped(tmp_path):
    # "[default0]:" alone is torchrun's --tee prefix on an empty line: the first line that carries something is
    # the frame after it.
    path = tmp_path / "rank0.log"
    path.write_text("\n\n[default0]:\n" + "\n".join([f"[default0]:{CUT['frame']}", *FAILURE]) + "\n")
    code, verdict = triage_json(path)
    assert said_cut(verdict), verdict["problems"]


@pytest.mark.slow
@needs_torch
def test_a_failed_jobs_console_and_rank_logs_are_not_said_to_start_mid_message(tmp_path):
    # A real job under `torchtriage run`: its console begins "torchtriage run: diagnostics in ...", the ranks' logs
    # torchrun keeps begin "rank 0 | step 1 | ...". Rank 1 raises at step 3.
    run_dir, console = tmp_path / "run", tmp_path / "console.log"
    command = armed(run_dir, JOBS / "raise_in_rank.py", ranks_to=run_dir / "ranks")
    assert run_to_end(command, console, CULPRIT="1") == 1, console.read_text()[-3000:]
    assert console.read_text().startswith("torchtriage run: diagnostics in ")
    logs = sorted((run_dir / "ranks").rglob("stdout.log"))
    assert logs and all(log.read_text().startswith(f"rank {log.parent.name} | step 1 ") for log in logs), logs
    for given in (console, run_dir):
        code, verdict = triage_json(given)
        assert code == 1 and verdict["culprit_ranks"] == [1], (given, verdict["summary"])
        assert not said_cut(verdict), (given, verdict["problems"])
