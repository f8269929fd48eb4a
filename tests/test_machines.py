"""The culprit's machine: every verdict names the host, pid (and GPU) of its culprit where a source says it, and
says so when none does. The job is real: torchrun + gloo under `torchtriage run`, rank 1 hanging."""

from __future__ import annotations

import json
import shutil
import stat
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, run_cli
from hung_job import TORCHRUN, HungJob
from torchtriage.protocol import IDENTITY_SCHEMA, TEST_HOSTNAME_ENV
from torchtriage.sources.identity import read_identity

PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")


def _wait_for(path: Path, job: HungJob, seconds: float = 120) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared:\n" + "".join(job.output[-30:])
        time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed")
@pytest.mark.skipif(not Path(PY_SPY).exists(), reason="py-spy is not installed")
def test_every_verdict_of_a_hung_job_names_the_culprits_host_and_pid(tmp_path):
    # The ranks record where they run; the test names their machine "node-b" (a test-only override of the host
    # name), so that the verdict is seen to take the host from the rank's record, not from where it was read.
    out = tmp_path / "run"
    run = [sys.executable, "-m", "torchtriage", "run", "--out", str(out), "--stall-seconds", "3", "--"]
    with HungJob(mode="skip", culprit=1, prefix=run, env={TEST_HOSTNAME_ENV: "node-b"}) as job:
        record = out / "identity" / "rank1.json"
        assert stat.S_IMODE(record.stat().st_mode) == 0o600  # private, like everything in the run folder
        # Live: the capture reads host and pid from the processes it finds.
        pids = [arg for rank in sorted(job.ready) for arg in ("--pid", job.ready[rank])]
        live = run_cli("diagnose", *pids, "--out", tmp_path / "live", "--json")
        assert live.stdout, live.stderr.decode()
        verdict = json.loads(live.stdout)
        assert verdict["culprit_ranks"] == [1]
        (machine,) = verdict["culprit_machines"]
        assert machine["pid"] == job.ready[1] and machine["rank"] == 1
        assert "capture" in machine["sources"] and "identity" in machine["sources"]
        _wait_for(out / "hang" / "verdict.json", job)
    # Post-mortem: the run folder, in each of the three renderings.
    done = run_cli("diagnose", out, "--json")
    verdict = json.loads(done.stdout)
    assert verdict["culprit_ranks"] == [1]
    (machine,) = verdict["culprit_machines"]
    assert (machine["host"], machine["pid"], machine["local_rank"]) == ("node-b", job.ready[1], 1)
    assert machine["sources"][0] == "identity"
    text = run_cli("diagnose", out).stdout.decode()
    assert f"machine   rank 1: host node-b, pid {job.ready[1]}" in text
    page = tmp_path / "report.html"
    run_cli("report", out, "--html", page)
    assert f"machine: rank 1: host node-b, pid {job.ready[1]}" in page.read_text()


def test_a_verdict_whose_sources_place_no_rank_says_so(tmp_path):
    # A rank's traceback with no launcher report, no capture, no record: nothing read says where it ran.
    log = tmp_path / "job.log"
    log.write_text(
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/srv/job/train.py", line 12, in <module>\n'
        "[rank1]:     step()\n"
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity "
        "of 79.10 GiB of which 1.12 GiB is free.\n"
    )
    verdict = json.loads(run_cli("triage", log, "--json").stdout)
    assert verdict["culprit_ranks"] == [1]
    assert verdict["culprit_machines"] == [
        {
            "rank": 1,
            "host": None,
            "pid": None,
            "gpu_index": None,
            "gpu_uuid": None,
            "gpu_pci_bus_id": None,
            "local_rank": None,
            "attempt": None,
            "sources": [],
        }
    ]
    text = run_cli("triage", log).stdout.decode()
    assert "machine   not recorded: nothing read says where rank 1 ran" in text


def test_torchruns_failure_report_places_the_culprit_in_a_log():
    # A real torchrun job's console: its failure report names each failed child's host and pid.
    verdict = json.loads(run_cli("triage", FIXTURES / "logs" / "raise_in_rank", "--json").stdout)
    assert verdict["culprit_ranks"] == [1]
    (machine,) = verdict["culprit_machines"]
    report = (FIXTURES / "logs" / "raise_in_rank" / "run.log").read_text()
    entry = report[report.index("rank      : 1 (local_rank: 1)") :]
    pid = int(entry.split("(pid: ", 1)[1].split(")", 1)[0])
    assert (machine["host"], machine["pid"], machine["sources"]) == ("localhost", pid, ["launcher"])


@pytest.mark.parametrize(
    "record, says",
    [
        (
            {"rank": 3, "host": ["a"], "pid": "x" * 40, "gpu": {"uuid": 5}},
            {"host": None, "pid": None, "gpu_uuid": None},
        ),
        ({"rank": 3, "host": "a\nb", "pid": -4, "gpu": "GPU-1"}, {"host": None, "pid": None, "gpu_uuid": None}),
        ({"rank": 3, "host": "a17", "pid": 42, "gpu": {"index": 2, "uuid": "GPU-9"}}, {"host": "a17", "gpu_index": 2}),
    ],
)
def test_an_identity_record_from_another_machine_is_read_field_by_field(tmp_path, record, says):
    path = tmp_path / "rank3.json"
    path.write_text(json.dumps({"schema": IDENTITY_SCHEMA, **record}))
    machine = read_identity(str(path)).machine
    assert machine.rank == 3
    assert {name: getattr(machine, name) for name in says} == says


def test_a_record_without_a_rank_is_named_not_trusted(tmp_path):
    path = tmp_path / "rank3.json"
    path.write_text(json.dumps({"schema": IDENTITY_SCHEMA, "rank": "three", "host": "a17"}))
    assert read_identity(str(path)) == f"{path}: an identity record without a rank."


def test_a_post_mortem_folder_takes_the_host_from_the_launchers_report_and_the_pid_from_the_stacks():
    # A real 2-rank NCCL hang on one H200: rank 1's stack dump names its process, torchrun's report its host.
    verdict = json.loads(run_cli("diagnose", FIXTURES / "h200x2" / "skip", "--json").stdout)
    (machine,) = verdict["culprit_machines"]
    assert (machine["rank"], machine["host"], machine["pid"]) == (1, "localhost", 670)
    assert machine["sources"] == ["stacks", "launcher"]
