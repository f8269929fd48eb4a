"""The step monitor: the straggler decision on data, StepMonitor in one process, and real torchrun + gloo
jobs (in code, under `torchtriage run --monitor`, as Hugging Face and Lightning callbacks)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchtriage.runtime import straggler as S

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "tests" / "jobs"


def even(ranks=4, wall=0.100, data=0.002, forward=0.030, gpu=None, jitter=0.001):
    return {
        r: {"wall": wall, "data": data + jitter * (r % 2), "forward": forward + jitter * ((r + 1) % 2), "gpu": gpu}
        for r in range(ranks)
    }


# -- the decision, on data ----------------------------------------------------------------------------


def test_an_even_job_names_nobody():
    assert S.stragglers(even()) == []
    assert S.stragglers(even(ranks=2)) == []
    assert S.stragglers({0: even()[0]}) == []


def test_a_slow_data_rank_is_named_with_its_reason_and_excess():
    stats = even()
    stats[2]["data"] = 0.045
    (found,) = S.stragglers(stats)
    assert (found["rank"], found["reason"]) == (2, "data")
    assert found["excess"] == pytest.approx(0.045 - 0.0025, abs=1e-3)


def test_longer_compute_is_compute_on_a_cpu_job_and_launch_with_a_gpu():
    stats = even()
    stats[1]["forward"] = 0.070
    assert [(d["rank"], d["reason"]) for d in S.stragglers(stats)] == [(1, "compute")]
    gpu = even(gpu=0.050)
    gpu[1]["forward"] = 0.070  # the CPU takes longer to hand out the work; the device's time is even
    assert [(d["rank"], d["reason"]) for d in S.stragglers(gpu)] == [(1, "launch")]
    device = even(gpu=0.050)
    device[3]["gpu"] = 0.080  # the device itself is slower
    assert [(d["rank"], d["reason"]) for d in S.stragglers(device)] == [(3, "compute")]
    starved = even(gpu=0.050)
    starved[2]["forward"], starved[2]["gpu"] = 0.060, 0.080  # its device waited for its CPU
    assert [(d["rank"], d["reason"]) for d in S.stragglers(starved)] == [(2, "launch")]


def test_each_rank_gets_its_own_reason():
    stats = even(ranks=6)
    stats[0]["gpu"] = 0.050  # only rank 0 reported a device time (its events were read first)
    stats[0]["forward"] = stats[5]["forward"] = 0.080
    found = {d["rank"]: d["reason"] for d in S.stragglers(stats)}
    assert found == {0: "launch", 5: "compute"}


def test_the_margin_is_robust_to_noisy_peers():
    stats = {r: {"wall": 0.1, "data": 0.002, "forward": 0.030 + 0.004 * (r % 4), "gpu": None} for r in range(16)}
    assert S.stragglers(stats) == []  # a spread of 12 ms among the peers is noise, not a straggler
    stats[7]["forward"] = 0.060
    assert [d["rank"] for d in S.stragglers(stats)] == [7]


def test_communication_needs_history_and_persistence_needs_three_windows():
    decider = S.Decider()
    for window in range(3):
        assert decider.window(window * 10 + 1, window * 10 + 10, even()) == []
    slow = even(wall=0.160)  # every rank waits 60 ms longer outside its own work
    assert decider.window(31, 40, slow) == []  # one window against the job's past may be a blip
    (first,) = decider.window(41, 50, slow)
    assert (first["rank"], first["reason"], first["persistent"]) == (None, "communication", False)
    assert "communication is slow on every rank" in first["line"]
    stats = even()
    stats[1]["data"] = 0.05
    marks = [decider.window(51 + 10 * w, 60 + 10 * w, stats)[0]["persistent"] for w in range(3)]
    assert marks == [False, False, True]


def test_a_decision_carries_the_sentence_rank_0_logs():
    stats = even()
    stats[3]["data"] = 0.041
    (decision,) = S.Decider().window(101, 150, stats)
    assert decision["schema"] == "torchtriage.straggler/1" and decision["rank"] == 3
    assert decision["line"].startswith("torchtriage StepMonitor: steps 101-150: rank 3 is the straggler (data)")


def test_a_cut_record_is_said_and_never_read_as_a_log_that_stops(tmp_path):
    stats = even()
    stats[3]["data"] = 0.041
    (decision,) = S.Decider().window(101, 150, stats)
    record = json.dumps(decision)
    records = tmp_path / "monitor" / "stragglers.jsonl"
    records.parent.mkdir()
    for cut in (60, len(record) // 2, len(record) - 2):  # in the schema, in the sentence, after it
        records.write_text(record[:cut])
        done = subprocess.run(
            [sys.executable, "-m", "torchtriage", "diagnose", str(tmp_path)], capture_output=True, text=True
        )
        assert done.returncode == 3 and "cut off before its end" in done.stderr and "Traceback" not in done.stderr
    records.write_text(record + "\n" + record[: len(record) // 2])
    done = subprocess.run(
        [sys.executable, "-m", "torchtriage", "diagnose", "--json", str(tmp_path)], capture_output=True, text=True
    )
    verdict = json.loads(done.stdout)
    assert done.returncode == 1 and verdict["category"] == "straggler" and verdict["culprit_ranks"] == [3]
    assert any("its last record is cut off" in problem for problem in verdict["problems"])


def test_the_report_reads_the_monitor_files_and_skips_bad_lines(tmp_path):
    from torchtriage.report.html import monitor_section
    from torchtriage.sources.monitor_windows import read_monitor

    folder = tmp_path / "monitor"
    folder.mkdir()
    window = {"schema": "torchtriage.monitor/1", "first_step": 1, "last_step": 10, "step_ms_p50": 50.0, "data_ms": 1.0}
    for rank in (0, 1):
        lines = [
            json.dumps(window | {"rank": rank}),
            json.dumps(window | {"rank": rank, "first_step": 11, "last_step": 20}),
        ]
        (folder / f"steps-rank{rank}.jsonl").write_text("\n".join(lines) + "\n{cut off")
    stats = even(ranks=2)
    stats[1]["data"] = 0.04
    (decision,) = S.Decider().window(11, 20, stats)
    (folder / "stragglers.jsonl").write_text(json.dumps(decision) + "\n")
    records = read_monitor(tmp_path)
    assert sorted(records.windows) == [0, 1] and [w["last_step"] for w in records.windows[1]] == [10, 20]
    assert len(records.problems) == 2 and "skipped" in records.problems[0]
    html = monitor_section(records.windows, records.decisions)
    assert html.count("<polyline") == 2 and html.count("<circle") == 1 and "class=culprit" in html
    assert read_monitor(tmp_path / "elsewhere") is None


# -- StepMonitor in one process ------------------------------------------------------------------------

torch = pytest.importorskip("torch")

from torchtriage import StepMonitor  # noqa: E402


class SlowRead(torch.utils.data.Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.randn(8), torch.randn(1)


def test_one_process_measures_data_forward_backward_and_writes_windows(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowRead(), batch_size=2)  # 2 reads of 4 ms per batch
    original_next = torch.utils.data.dataloader._BaseDataLoaderIter.__next__
    original_backward = torch.autograd.backward
    with StepMonitor(tmp_path, window=5, samples_per_step=2) as monitor:
        for step, (x, y) in enumerate(loader, start=1):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            monitor.step()
            if step == 10:
                break
    lines = [json.loads(line) for line in (tmp_path / "monitor" / "steps-rank0.jsonl").read_text().splitlines()]
    assert [(w["first_step"], w["last_step"]) for w in lines] == [(1, 5), (6, 10)]
    for window in lines:
        assert 7.0 < window["data_ms"] < 30.0  # two 4 ms reads
        assert window["forward_ms"] < window["data_ms"] and window["backward_ms"] > 0
        assert window["samples_per_s"] > 0 and window["mfu"] is None
        assert 0 < window["outside_own_ms"] < window["step_ms_p50"]
    assert monitor.decisions == []  # one rank: nobody to compare with
    # nothing is left wrapped
    assert torch.utils.data.dataloader._BaseDataLoaderIter.__next__ is original_next
    assert torch.autograd.backward is original_backward


def test_optimizer_steps_are_the_steps_when_asked(tmp_path):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = StepMonitor(tmp_path, window=4, step_on="optimizer").start()
    for _ in range(8):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    monitor.close()
    assert monitor.steps == 8
    assert len((tmp_path / "monitor" / "steps-rank0.jsonl").read_text().splitlines()) == 2
    opt.step()
    assert monitor.steps == 8  # closed: the hook is gone


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="step_on"):
        StepMonitor(step_on="epoch")
    with pytest.raises(ValueError, match="window"):
        StepMonitor(window=1)


# -- real jobs -------------------------------------------------------------------------------------------

TORCHRUN = Path(sys.executable).parent / "torchrun"


def run_job(tmp_path: Path, ranks: int = 2, under_run: bool = False, script: str = "monitor_job.py", **env):
    command = [str(TORCHRUN), "--standalone", "--nproc_per_node", str(ranks), str(JOBS / script)]
    if under_run:
        command = [sys.executable, "-m", "torchtriage", "run", "--monitor", "--monitor-window", env.get("WINDOW", "10")]
        command += ["--out", str(tmp_path), "--", str(TORCHRUN), "--standalone", "--nproc_per_node", str(ranks)]
        command += [str(JOBS / script)]
        env["MONITOR_IN"] = "run"
    done = subprocess.run(
        command,
        env={**os.environ, "MONITOR_OUT": str(tmp_path), "PYTHONUNBUFFERED": "1", **env},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finals = {}
    for rank in range(ranks):
        line = (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()[-1]
        finals[rank] = json.loads(line.partition(" ")[2])["decisions"]
    return finals, done.stdout + done.stderr


def windows_of(tmp_path: Path, rank: int) -> list[tuple[int, int]]:
    lines = (tmp_path / "monitor" / f"steps-rank{rank}.jsonl").read_text().splitlines()
    return [(w["first_step"], w["last_step"]) for w in map(json.loads, lines)]


def named(decisions) -> set[tuple[int | None, str]]:
    return {(d["rank"], d["reason"]) for d in decisions}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["data", "compute"])
def test_a_slow_rank_is_named_within_two_windows_and_every_rank_decides_the_same(tmp_path, mode):
    finals, output = run_job(tmp_path, MONITOR_MODE=mode, STEPS="60", WINDOW="10", SLOW_FROM="25")
    assert finals[0] == finals[1]  # every rank reached the same windows and decided the same
    assert windows_of(tmp_path, 0) == windows_of(tmp_path, 1) == [(i, i + 9) for i in range(1, 60, 10)]
    decisions = finals[0]
    assert named(decisions) == {(1, mode)}
    assert min(d["step"] for d in decisions) <= 40  # the slowdown starts at step 25: within two windows
    assert all(d["first_step"] > 10 for d in decisions)  # nothing named before it began
    assert decisions[-1]["persistent"]
    assert f"rank 1 is the straggler ({mode})" in output
    recorded = [json.loads(line) for line in (tmp_path / "monitor" / "stragglers.jsonl").read_text().splitlines()]
    assert recorded == decisions
    verdict = subprocess.run(
        [sys.executable, "-m", "torchtriage", "triage", "--json", str(tmp_path / "monitor")],
        capture_output=True,
        text=True,
    )
    found = json.loads(verdict.stdout)
    assert found["category"] == "straggler" and found["culprit_ranks"] == [1]
    assert found["findings"][0]["kind"] == "straggler.monitor"
    page = tmp_path / "report.html"
    subprocess.run(
        [sys.executable, "-m", "torchtriage", "report", str(tmp_path), "--html", str(page)], capture_output=True
    )
    html = page.read_text()
    assert "Step monitor: step time by rank" in html and html.count("<polyline") >= 2
    assert html.count("<circle") == len(decisions)  # every decision marked on the chart
    assert f"rank 1 is the straggler ({mode})" in html


@pytest.mark.slow
def test_a_slower_link_for_every_rank_is_communication(tmp_path):
    finals, _ = run_job(tmp_path, MONITOR_MODE="comm", STEPS="70", WINDOW="10", SLOW_FROM="41")
    assert finals[0] == finals[1]
    assert named(finals[0]) == {(None, "communication")}
    assert min(d["step"] for d in finals[0]) in (50, 60)  # within two windows of the slowdown at step 41


@pytest.mark.slow
def test_an_even_job_of_500_steps_names_nobody(tmp_path):
    finals, _ = run_job(tmp_path, MONITOR_MODE="even", STEPS="500", WINDOW="50")
    assert finals[0] == finals[1] == []
    assert len(windows_of(tmp_path, 1)) == 10
    assert not (tmp_path / "monitor" / "stragglers.jsonl").exists()


@pytest.mark.slow
def test_four_ranks_under_run_monitor_with_no_code_change(tmp_path):
    finals, _ = run_job(
        tmp_path, ranks=4, under_run=True, MONITOR_MODE="compute", SLOW_RANK="2", STEPS="40", WINDOW="10"
    )
    assert all(finals[r] == finals[0] for r in range(4))
    assert named(finals[0]) == {(2, "compute")}
    assert all(windows_of(tmp_path, r) == [(1, 10), (11, 20), (21, 30), (31, 40)] for r in range(4))


@pytest.mark.slow
@pytest.mark.parametrize("framework, library", [("hf", "transformers"), ("lightning", "lightning")])
def test_hugging_face_and_lightning_callbacks(tmp_path, framework, library):
    pytest.importorskip(library)
    if framework == "hf":
        pytest.importorskip("accelerate")
    finals, _ = run_job(tmp_path, script="monitor_frameworks.py", FRAMEWORK=framework, STEPS="30", WINDOW="10")
    assert finals[0] == finals[1]
    assert named(finals[0]) == {(1, "data")}


def test_a_folder_that_cannot_be_written_is_said_once_not_once_per_window(tmp_path, caplog):
    # A full disk or a file where the folder should be: the monitor runs on, and says so once, not once per window
    # per rank (30,000 lines an hour at 16 ranks).
    (tmp_path / "monitor").write_text("a file where the monitor's folder would go")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with caplog.at_level("WARNING", logger="torchtriage"):
        with StepMonitor(tmp_path, window=2, step_on="optimizer"):
            for _ in range(12):
                model(torch.randn(2, 4)).sum().backward()
                opt.step()
    said = [r.getMessage() for r in caplog.records if "could not write" in r.getMessage()]
    assert len(said) == 1 and "further write errors are not logged" in said[0], said
