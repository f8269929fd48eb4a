"""The step monitor: the straggler decision on data, StepMonitor in one process, and real torchrun + gloo
jobs (in code, under `torchtriage run --monitor`, as Hugging Face and Lightning callbacks)."""

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchtriage.runtime import step_phases
from torchtriage.runtime import straggler as S

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "tests" / "jobs"


def window(wall=0.100, data=0.002, forward=0.030, gpu=None, paced=None, spread=0.0005, steps=10):
    """One rank's window as the decision reads it (seconds): medians, one step's spread, counts."""
    own = gpu if gpu is not None else forward
    return {
        "wall": wall, "wall_sd": 4 * spread, "steps": steps,
        "data": data, "data_sd": spread, "forward": forward, "forward_sd": spread,
        "outside": wall - data - own, "outside_sd": spread,
        "gpu": gpu, "gpu_sd": None if gpu is None else spread, "gpu_n": 5.0 if gpu is not None else 0.0,
        "host_paced": paced,
    }  # fmt: skip


def play(windows, ranks=2, seed=0, jitter=0.0005, **slow):
    """Windows of an even job through one Decider, every value of every rank a little off window to window;
    `slow` maps (rank, key) -> (first window, seconds added). Returns every decision."""
    rng = random.Random(seed)
    decider, decisions = S.Decider(), []
    for w in range(1, windows + 1):
        stats = {}
        for rank in range(ranks):
            values = window(**slow.get("base", {}))
            for key in ("data", "forward", "gpu", "wall"):
                if values[key] is not None:
                    values[key] += rng.gauss(0.0, jitter)
            for (who, key), (first, added) in slow.get("added", {}).items():
                if who in (rank, None) and w >= first:
                    values[key] += added
            stats[rank] = values
        decisions += decider.window(10 * w - 9, 10 * w, stats)
    return decisions


def named(decisions) -> list[tuple]:
    return sorted({(d["kind"], d["rank"], d["reason"]) for d in decisions}, key=str)


def test_nothing_is_named_before_the_jobs_noise_is_known_then_the_slow_rank_is():
    decisions = play(7, ranks=4, added={(2, "data"): (1, 0.040)})
    # Three windows teach the job's noise, the fourth is judged, and a rank must stand out two windows in a row.
    assert [d["step"] for d in decisions] == [50, 60, 70]
    assert named(decisions) == [("straggler", 2, "data")]
    assert [d["persistent"] for d in decisions] == [False, True, True]
    assert play(7, ranks=4) == []


def test_the_margin_is_the_jobs_own_noise_not_a_share_of_the_step():
    # A quiet job of 320 ms steps: 6 ms more of device forward on one rank (its forward twice) is named.
    quiet = {"wall": 0.320, "gpu": 0.012, "paced": 0.0, "spread": 0.0002}
    decisions = play(8, base=quiet, jitter=0.0002, added={(1, "gpu"): (1, 0.006)})
    assert named(decisions) == [("straggler", 1, "compute")]
    # A job whose ranks' forwards move 3 ms apart from window to window (a loaded host) names nobody for 6 ms.
    for seed in range(5):
        assert play(20, seed=seed, jitter=0.003, base={"spread": 0.002}) == []


def test_a_rank_that_waits_for_a_slower_peer_is_never_named():
    # GPU, rank 1's batches 30 ms late; rank 0 waits for it on its host, in its forward (a loop that reads its
    # loss every tenth step). Its device's forward, from the batch's arrival, is as long as rank 1's.
    gpu = {"gpu": 0.040, "forward": 0.005, "paced": 0.0}
    decisions = play(8, base=gpu, added={(1, "data"): (1, 0.030), (0, "forward"): (1, 0.030)})
    assert named(decisions) == [("straggler", 1, "data")]


def test_a_device_forward_that_waited_for_its_host_is_launch_and_otherwise_compute():
    gpu = {"gpu": 0.040, "forward": 0.005}
    launch = play(8, base=gpu | {"paced": 1.0}, added={(1, "gpu"): (1, 0.020), (1, "forward"): (1, 0.020)})
    assert named(launch) == [("straggler", 1, "launch")]
    compute = play(8, base=gpu | {"paced": 0.0}, added={(1, "gpu"): (1, 0.020), (1, "forward"): (1, 0.020)})
    assert named(compute) == [("straggler", 1, "compute")]
    # Its device waited for a host no slower than the others' (hosts that drift apart): nobody's fault.
    assert play(8, base=gpu | {"paced": 1.0}, added={(1, "gpu"): (1, 0.020)}) == []


def test_a_slowdown_every_rank_shares_is_the_whole_job_never_a_rank():
    compute = play(9, added={(None, "forward"): (6, 0.015), (None, "wall"): (6, 0.045)})
    assert named(compute) == [("job", None, "compute")]
    assert compute[0]["step"] <= 80 and ": the whole job slowed (compute): every rank computes" in compute[0]["line"]
    data = play(9, added={(None, "data"): (6, 0.030), (None, "wall"): (6, 0.030)})
    assert named(data) == [("job", None, "data")]
    links = play(9, added={(None, "wall"): (6, 0.040)})  # every rank waits longer, none works longer
    assert named(links) == [("job", None, "communication")]
    assert "communication is slow on every rank" in links[0]["line"]
    # The job slowed by one rank's forward too small to stand out of the ranks' noise: neither the job's
    # compute nor its communication.
    assert play(9, jitter=0.004, added={(1, "forward"): (6, 0.008), (None, "wall"): (6, 0.008)}) == []


def test_one_decision_per_window_for_the_rank_that_holds_the_job_back_most():
    decisions = play(8, ranks=8, added={(1, "data"): (1, 0.040), (3, "data"): (1, 0.020)})
    assert [d["step"] for d in decisions] == [50, 60, 70, 80]
    assert named(decisions) == [("straggler", 1, "data")]


def test_a_decision_carries_the_sentence_rank_0_logs():
    (decision, *_) = play(6, ranks=4, added={(3, "data"): (1, 0.041)})
    assert decision["schema"] == "torchtriage.straggler/2" and decision["rank"] == 3 and decision["kind"] == "straggler"
    assert decision["measured"] == "data_ms" and 0 < decision["margin_ms"] < decision["excess_ms"]
    assert decision["line"].startswith("torchtriage StepMonitor: steps 41-50: rank 3 is the straggler (data)")


def test_a_window_record_replays_into_what_was_exchanged():
    rows = [{"wall": 0.1, "data": 0.002, "forward": 0.03, "outside": 0.068, "gpu": None, "host_paced": None}] * 9
    rows = rows + [{"wall": 2.0, "data": 1.9, "forward": 0.03, "outside": 0.07, "gpu": 0.05, "host_paced": True}]
    record = step_phases.window_record(rows)
    assert record["step_ms_p50"] == 100.0 and record["step_ms_mean"] == 290.0  # one hiccup: the median holds
    assert record["data_ms"] == 2.0 and record["gpu_samples"] == 1 and record["gpu_host_paced"] == 1.0
    assert step_phases.decision_input(record) == step_phases.from_exchanged(step_phases.exchanged(record))


def test_a_cut_record_is_said_and_never_read_as_a_log_that_stops(tmp_path):
    (decision,) = play(5, ranks=4, added={(3, "data"): (1, 0.041)})
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
    window = {"schema": "torchtriage.monitor/2", "first_step": 31, "last_step": 40, "step_ms_p50": 50.0, "data_ms": 1.0}
    for rank in (0, 1):
        lines = [
            json.dumps(window | {"rank": rank}),
            json.dumps(window | {"rank": rank, "first_step": 41, "last_step": 50}),
        ]
        (folder / f"steps-rank{rank}.jsonl").write_text("\n".join(lines) + "\n{cut off")
    (decision,) = play(5, added={(1, "data"): (1, 0.04)})
    (folder / "stragglers.jsonl").write_text(json.dumps(decision) + "\n")
    records = read_monitor(tmp_path)
    assert sorted(records.windows) == [0, 1] and [w["last_step"] for w in records.windows[1]] == [40, 50]
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
        time.sleep(0.025)  # long beside a tiny model's forward, even on a machine whose cores are busy
        return torch.randn(8), torch.randn(1)


def test_one_process_measures_data_forward_backward_and_writes_windows(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowRead(), batch_size=2)  # 2 reads of 25 ms per batch
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
        assert 49.0 < window["data_ms"] < 500.0  # two 25 ms reads, counted as the data wait
        # the reads are not in the forward: a tiny model's forward is short beside them
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


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["data", "compute"])
def test_a_slow_rank_is_named_within_two_windows_and_every_rank_decides_the_same(tmp_path, mode):
    finals, output = run_job(tmp_path, MONITOR_MODE=mode, STEPS="70", WINDOW="10", SLOW_FROM="41")
    assert finals[0] == finals[1]  # every rank reached the same windows and decided the same
    assert windows_of(tmp_path, 0) == windows_of(tmp_path, 1) == [(i, i + 9) for i in range(1, 70, 10)]
    decisions = finals[0]
    assert named(decisions) == [("straggler", 1, mode)]  # and never the rank that waits for it
    assert min(d["step"] for d in decisions) <= 60  # the slowdown starts at step 41: within two windows
    assert all(d["first_step"] > 40 for d in decisions)  # nothing named before it began
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
    assert named(finals[0]) == [("job", None, "communication")]
    assert min(d["step"] for d in finals[0]) == 60  # within two windows of the slowdown at step 41


@pytest.mark.slow
def test_an_even_job_of_500_steps_names_nobody(tmp_path):
    # No rank holds the others back. Where other work on the host slows the whole job for a while (a loaded
    # machine), a window may say so of the job, as it should; it never names a rank.
    finals, _ = run_job(tmp_path, MONITOR_MODE="even", STEPS="500", WINDOW="50")
    assert finals[0] == finals[1]
    assert [d["line"] for d in finals[0] if d["rank"] is not None or d["kind"] != "job"] == []
    assert len(windows_of(tmp_path, 1)) == 10


# A host that other work keeps busy by fits and starts: each core runs a loop that spins and sleeps by turns.
BURST = """import random, sys, time
r = random.Random(int(sys.argv[1]))
while True:
    ends = time.time() + r.uniform(0.05, 0.5)
    while time.time() < ends:
        pass
    time.sleep(r.uniform(0.05, 0.5))
"""
TINY_GPT = {"DEVICE": "cpu", "LAYERS": "2", "WIDTH": "64", "SEQ": "32", "BATCH": "4", "VOCAB": "256"}


@pytest.mark.slow
def test_an_even_job_on_a_busy_host_names_no_rank(tmp_path):
    # Each rank's forward is slower whenever the load lands on its core, more in one window, less in the next:
    # noise, not a straggler. No rank holds the others back, so none may be named, in any window.
    burners = [subprocess.Popen([sys.executable, "-c", BURST, str(core)]) for core in range(os.cpu_count() or 2)]
    try:
        finals, _ = run_job(
            tmp_path, under_run=True, script="monitor_gpu_job.py", MONITOR_CASE="even", STEPS="150", WINDOW="10",
            **TINY_GPT,
        )  # fmt: skip
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert finals[0] == finals[1]
    assert [d["line"] for d in finals[0] if d["rank"] is not None] == []


@pytest.mark.slow
def test_a_rank_that_waits_in_ddps_buffer_broadcast_is_not_named(tmp_path):
    # A GPT-style model with a buffer (its causal mask): DDP broadcasts the buffers from rank 0 at every
    # forward, a collective in which rank 0 waits for rank 1, whose batches come 30 ms late. That wait is
    # rank 0's forward on its clock, not its compute.
    finals, _ = run_job(
        tmp_path, under_run=True, script="monitor_gpu_job.py", MONITOR_CASE="data", STEPS="60", WINDOW="10", **TINY_GPT
    )
    assert finals[0] == finals[1]
    assert named(finals[0]) == [("straggler", 1, "data")]


@pytest.mark.slow
def test_four_ranks_under_run_monitor_with_no_code_change(tmp_path):
    finals, _ = run_job(
        tmp_path, ranks=4, under_run=True, MONITOR_MODE="compute", SLOW_RANK="2", STEPS="60", WINDOW="10"
    )
    assert all(finals[r] == finals[0] for r in range(4))
    assert named(finals[0]) == [("straggler", 2, "compute")]
    assert all(windows_of(tmp_path, r) == [(i, i + 9) for i in range(1, 60, 10)] for r in range(4))


@pytest.mark.slow
@pytest.mark.parametrize("framework, library", [("hf", "transformers"), ("lightning", "lightning")])
def test_hugging_face_and_lightning_callbacks(tmp_path, framework, library):
    pytest.importorskip(library)
    if framework == "hf":
        pytest.importorskip("accelerate")
    finals, _ = run_job(tmp_path, script="monitor_frameworks.py", FRAMEWORK=framework, STEPS="60", WINDOW="10")
    assert finals[0] == finals[1]
    assert named(finals[0]) == [("straggler", 1, "data")]


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
