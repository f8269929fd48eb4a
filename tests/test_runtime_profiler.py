"""profile_steps, phase and TorchProfilerCallback on CPU; multi-rank traces from a real torchrun + gloo job."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torchtriage.runtime.profiler import phase, profile_steps, read_chrome_trace  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "jobs" / "runtime_profile_job.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def event_names(path: Path) -> set[str]:
    trace = read_chrome_trace(path)
    assert isinstance(trace["traceEvents"], list)
    return {e.get("name", "") for e in trace["traceEvents"]}


def train(prof, steps: int) -> None:
    model = torch.nn.Linear(8, 1)
    for _ in range(steps):
        with phase("data"):
            x = torch.randn(4, 8)
        with phase("forward_backward"):
            model(x).sum().backward()
        prof.step()


def test_profile_steps_writes_a_chrome_trace_with_steps_and_phases(tmp_path):
    with profile_steps(tmp_path, wait=1, warmup=1, active=2) as prof:
        train(prof, 6)
    trace = tmp_path / "trace-rank00.trace.json.gz"
    assert trace in prof.written and (tmp_path / "trace-rank00.top_ops.txt").read_text().strip()
    names = event_names(trace)
    steps = {n for n in names if n.startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#2", "ProfilerStep#3"}  # only the active window
    assert {"data", "forward_backward"} <= names


def test_repeat_writes_one_trace_per_cycle(tmp_path):
    with profile_steps(tmp_path, wait=0, warmup=1, active=1, repeat=2, label="cyc") as prof:
        train(prof, 6)
    assert sorted(p.name for p in tmp_path.glob("*.trace.json.gz")) == [
        "cyc-cycle1-rank00.trace.json.gz",
        "cyc-cycle2-rank00.trace.json.gz",
    ]


def test_unselected_rank_does_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with profile_steps(tmp_path / "p", ranks="0,8") as prof:
        train(prof, 4)
    assert not prof.enabled and not (tmp_path / "p").exists()


def test_bad_rank_spec_is_refused():
    with pytest.raises(ValueError, match="ranks="):
        profile_steps(ranks="zero")


def test_a_failing_exporter_only_warns(tmp_path, monkeypatch, caplog):
    def broken(self, path, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", broken)
    with caplog.at_level("WARNING", logger="torchtriage.profiler"):
        with profile_steps(tmp_path, wait=0, warmup=1, active=1) as prof:
            train(prof, 4)
    assert "could not export the Chrome trace" in caplog.text and "disk full" in caplog.text
    assert not list(tmp_path.glob("*.trace.json.gz"))


def test_callback_needs_transformers_only_when_created():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["transformers"] = None  # as if not installed
        from torchtriage import TorchProfilerCallback
        try:
            TorchProfilerCallback()
        except ImportError as err:
            print("IMPORT-ERROR", err)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "IMPORT-ERROR TorchProfilerCallback needs Hugging Face transformers" in done.stdout, done.stderr


def test_callback_lifecycle_with_a_stand_in_trainer_callback(tmp_path):
    # The Trainer calls on_train_begin, on_step_end per step, on_train_end; a stand-in base class
    # replaces transformers.TrainerCallback so the lifecycle is tested where transformers is absent.
    code = textwrap.dedent(
        f"""
        import sys, types
        fake = types.ModuleType("transformers")
        class TrainerCallback:
            def on_log(self, args, state, control, **kw):
                return "base"
        fake.TrainerCallback = TrainerCallback
        sys.modules["transformers"] = fake
        import torch
        from torchtriage import TorchProfilerCallback
        cb = TorchProfilerCallback({str(tmp_path)!r}, wait=1, warmup=0, active=2)
        assert isinstance(cb, TrainerCallback) and isinstance(cb, TorchProfilerCallback)
        assert cb.on_log(None, None, None) == "base"
        cb.on_train_begin(None, None, "control")
        for _ in range(5):
            with torch.profiler.record_function("hf_step"):
                torch.randn(8, 8) @ torch.randn(8, 8)
            assert cb.on_step_end(None, None, "control") == "control"
        cb.on_train_end(None, None, "control")
        print("WRITTEN", [p.name for p in cb.profiler.written])
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trace-rank00.trace.json.gz" in done.stdout
    assert "hf_step" in event_names(tmp_path / "trace-rank00.trace.json.gz")


def test_callback_is_a_real_trainer_callback(tmp_path):
    pytest.importorskip("transformers")
    from transformers import TrainerCallback

    from torchtriage import TorchProfilerCallback

    cb = TorchProfilerCallback(tmp_path, wait=0, warmup=0, active=1)
    assert isinstance(cb, TrainerCallback)
    cb.on_train_begin(None, None, None)
    torch.randn(4, 4).sum()
    cb.on_step_end(None, None, None)
    cb.on_train_end(None, None, None)
    assert (tmp_path / "trace-rank00.trace.json.gz").exists()


@pytest.mark.slow
def test_callback_with_real_transformers(tmp_path):
    # examples/hf_trainer.py: a real Trainer (DDP over gloo, 2 ranks) with TorchProfilerCallback on every
    # rank and NonFiniteGuard behind the Trainer's optimizer; rank 1's gradient is poisoned at step 6.
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer needs it
    done = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(ROOT / "examples" / "hf_trainer.py")],
        env={**os.environ, "OUT": str(tmp_path), "PROFILE_RANKS": "all", "INJECT_NAN_STEP": "6", "STEPS": "12"},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    for rank in ("rank00", "rank01"):
        names = event_names(tmp_path / "profiler" / f"trace-{rank}.trace.json.gz")
        assert {"ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"} <= names, rank
        assert any("all_reduce" in n for n in names), rank  # DDP's gradient all-reduce, inside the window
        assert (tmp_path / "profiler" / f"trace-{rank}.top_ops.txt").read_text().strip()
    # The guard inside the Trainer's step: both ranks skipped step 6, and only it, and stayed identical.
    summaries = re.findall(r"rank (\d): ([^\n]*?), weights checksum (-?\d+\.\d{6})", done.stdout)
    assert sorted(rank for rank, _, _ in summaries) == ["0", "1"], output[-4000:]
    for _, summary, _ in summaries:
        assert summary == "12 guarded steps, 11 applied, nonfinite_steps_skipped=1, skipped steps [6]"
    assert len({checksum for _, _, checksum in summaries}) == 1
    assert "the update is skipped on every rank" in output and "non-finite gradients on rank(s) [1]" in output
    # Trainer.log carries the counter: 0 in the first logging window (steps 1-4), 1 after step 6.
    assert "'nonfinite_steps_skipped': 0" in done.stdout and "'nonfinite_steps_skipped': 1" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "expected"), [("all", {"rank00", "rank01"}), ("1", {"rank01"})])
def test_traces_per_selected_rank_under_torchrun(tmp_path, spec, expected):
    done = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(JOB)],
        env={**os.environ, "PROFILE_OUT": str(tmp_path), "PROFILE_RANKS": spec, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    traces = sorted(tmp_path.glob("*.trace.json.gz"))
    assert {p.name.split("-")[1].split(".")[0] for p in traces} == expected
    for trace in traces:
        names = event_names(trace)
        assert {"ProfilerStep#2", "ProfilerStep#3", "data", "forward_backward", "grad_sync"} <= names
        assert any("all_reduce" in n for n in names)
