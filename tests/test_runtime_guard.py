"""NonFiniteGuard: single-process behaviour, and real torchrun + gloo jobs (tests/jobs/runtime_guard_job.py)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torchtriage.runtime.guard import NonFiniteGuard, NonFiniteStepsError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "jobs" / "runtime_guard_job.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def run_job(mode: str, tmp_path: Path, ranks: int = 2) -> dict[str, list[dict]]:
    done = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node", str(ranks), str(JOB)],
        env={**os.environ, "GUARD_MODE": mode, "GUARD_OUT": str(tmp_path), "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines: dict[str, list[dict]] = {"STEP": [], "RAISED": [], "DONE": []}
    for path in sorted(tmp_path.glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            kind, _, payload = line.partition(" ")
            lines[kind].append(json.loads(payload))
    lines["stderr"] = done.stderr  # type: ignore[assignment]
    return lines


def by_step(lines, step):
    return {r["rank"]: r for r in lines["STEP"] if r["step"] == step}


# -- single process ---------------------------------------------------------------------------
def make(**kwargs):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt, NonFiniteGuard(opt, **kwargs)


def backward(model, poison=False):
    model.zero_grad()
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    if poison:
        model.weight.grad[0, 0] = float("nan")
    return loss


def test_finite_step_is_applied_and_norm_matches_torch():
    model, opt, guard = make()
    backward(model)
    expected = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item()
    before = model.weight.detach().clone()
    outcome = guard.step()
    assert outcome.applied and math.isclose(outcome.grad_norm, expected, rel_tol=1e-5)
    assert not torch.equal(before, model.weight)


def test_nonfinite_step_is_skipped_counted_and_grads_zeroed(caplog):
    model, opt, guard = make()
    backward(model, poison=True)
    before = model.weight.detach().clone()
    with caplog.at_level("WARNING", logger="torchtriage.guard"):
        outcome = guard.step(batch_index=7, sample_ids=torch.tensor([70, 71]))
    assert not outcome.applied and math.isnan(outcome.grad_norm)
    assert torch.equal(before, model.weight)
    assert all(p.grad is None for p in model.parameters())
    assert guard.nonfinite_steps_skipped == 1
    assert guard.skipped_batches[-1].ranks[0]["sample_ids"] == [70, 71]
    assert guard.skipped_batches[-1].ranks[0]["batch_index"] == 7
    assert "at step 1: the update is skipped" in caplog.text and "nonfinite_steps_skipped=1" in caplog.text


def test_log_window_reports_nan_loss_only_when_no_step_was_applied():
    model, opt, guard = make()
    guard.step(loss=backward(model, poison=True))
    window = guard.log_window()
    assert math.isnan(window["loss"]) and window["steps_applied_in_window"] == 0
    assert window["steps_skipped_in_window"] == 1 and window["nonfinite_steps_skipped"] == 1
    loss = backward(model)
    guard.step(loss=loss)
    guard.step(loss=backward(model, poison=True))  # the skipped step's loss is left out
    window = guard.log_window()
    assert math.isclose(window["loss"], loss.item(), rel_tol=1e-6)
    assert (window["steps_applied_in_window"], window["steps_skipped_in_window"]) == (1, 1)


def test_consecutive_limit_raises_and_applied_step_resets_the_count():
    model, opt, guard = make(max_consecutive_nonfinite_steps=2)
    backward(model, poison=True)
    guard.step()
    backward(model)
    assert guard.step().applied and guard.consecutive_nonfinite_steps == 0
    backward(model, poison=True)
    guard.step()
    backward(model, poison=True)
    with pytest.raises(NonFiniteStepsError, match="2 consecutive non-finite steps"):
        guard.step()


def test_nonfinite_weights_raise_even_with_finite_gradients():
    model, opt, guard = make(check_weights_every=1)
    with torch.no_grad():
        model.bias[0] = float("inf")
    model.zero_grad()
    model.weight.grad = torch.ones_like(model.weight)  # finite gradients: only the weights are broken
    model.bias.grad = torch.ones_like(model.bias)
    with pytest.raises(NonFiniteStepsError, match="weights themselves are non-finite"):
        guard.step()


def test_grad_scaler_skips_once_and_lowers_the_scale():
    model, opt, _ = make()
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    guard = NonFiniteGuard(opt, scaler=scaler)
    calls = []
    opt.register_step_post_hook(lambda *_: calls.append(1))
    model.zero_grad()
    scaler.scale(model(torch.randn(8, 4)).pow(2).mean()).backward()
    model.weight.grad[0, 0] = float("inf")
    before = model.weight.detach().clone()
    outcome = guard.step()
    assert not outcome.applied and calls == [] and torch.equal(before, model.weight)
    assert scaler.get_scale() == 128.0 and guard.nonfinite_steps_skipped == 1
    model.zero_grad()
    loss = model(torch.randn(8, 4)).pow(2).mean()
    scaler.scale(loss).backward()
    true_norm = torch.nn.utils.get_total_norm([p.grad / 128.0 for p in model.parameters()]).item()
    outcome = guard.step()
    assert outcome.applied and calls == [1]
    assert math.isclose(outcome.grad_norm, true_norm, rel_tol=1e-5)  # the norm of the unscaled gradients


def test_clip_uses_the_agreed_norm():
    model, opt, guard = make(max_grad_norm=0.05)
    backward(model)
    norm_before = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item()
    grads = {}
    opt.register_step_pre_hook(
        lambda *_: grads.update(norm=torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item())
    )
    outcome = guard.step()
    assert outcome.clipped and math.isclose(outcome.grad_norm, norm_before, rel_tol=1e-5)
    assert grads["norm"] == pytest.approx(0.05, rel=1e-3)


def test_blocking_false_skips_inside_the_fused_optimizer_and_accounts_a_step_later():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    guard = NonFiniteGuard(opt, blocking=False)
    backward(model)
    assert guard.step().applied
    backward(model, poison=True)
    before, steps_before = model.weight.detach().clone(), opt.state[model.weight]["step"].item()
    outcome = guard.step(batch_index=7)
    assert torch.equal(before, model.weight) and opt.state[model.weight]["step"].item() == steps_before
    assert not outcome.applied and math.isnan(outcome.grad_norm)
    assert guard.nonfinite_steps_skipped == 0  # the host reads the decision when the next step begins
    backward(model)
    assert guard.step().applied
    assert guard.nonfinite_steps_skipped == 1 and guard.applied_steps == 1
    record = guard.skipped_batches[-1]
    assert record.step == 2 and record.ranks[0]["batch_index"] == 7 and record.culprit_ranks == [0]
    guard.flush()
    assert guard.applied_steps == 2 and not torch.equal(before, model.weight)


def test_blocking_false_needs_an_optimizer_that_can_skip_on_the_device():
    model = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match="fused=True"):
        NonFiniteGuard(torch.optim.AdamW(model.parameters()), blocking=False)


def test_blocking_false_with_a_grad_scaler_skips_once_and_lowers_the_scale():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    guard = NonFiniteGuard(opt, scaler=scaler, blocking=False)
    scaler.scale(model(torch.randn(8, 4)).pow(2).mean()).backward()
    model.weight.grad[0, 0] = float("inf")
    before = model.weight.detach().clone()
    assert not guard.step().applied
    assert torch.equal(before, model.weight) and scaler.get_scale() == 128.0
    model.zero_grad()
    scaler.scale(model(torch.randn(8, 4)).pow(2).mean()).backward()
    assert guard.step().applied and opt.state[model.weight]["step"].item() == 1
    assert guard.nonfinite_steps_skipped == 1


def guard_ops_per_step(layers: int) -> list[str]:
    """The device ops one finite `guard.step()` runs before it hands over to the optimizer."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names, self.counting = [], True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if self.counting and not str(func).startswith("profiler."):  # the optimizer's step marker
                self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(layers)])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = NonFiniteGuard(opt, check_weights_every=0)
    model(torch.randn(3, 4)).pow(2).mean().backward()
    ops = Ops()
    opt.register_step_pre_hook(lambda *_: setattr(ops, "counting", False))
    with ops:
        assert guard.step().applied
    return ops.names


def test_a_finite_step_costs_a_fixed_handful_of_device_ops():
    # One fused norm pass over every gradient, one combination and one read: on a GPU each op is a
    # kernel launch or a wait, so neither their number nor the model's size may add per-tensor work.
    small, large = guard_ops_per_step(2), guard_ops_per_step(40)
    assert small == large, (small, large)
    assert len(small) <= 4, small


def test_importing_torchtriage_does_not_import_torch():
    code = "import sys, torchtriage; torchtriage.__getattr__; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- real torchrun + gloo jobs ----------------------------------------------------------------
@pytest.mark.slow
def test_inf_on_one_rank_makes_every_rank_skip(tmp_path):
    lines = run_job("inject_inf", tmp_path)
    step2, step3, step5 = by_step(lines, 2), by_step(lines, 3), by_step(lines, 5)
    assert set(step3) == {0, 1}
    for rank in (0, 1):
        assert step3[rank]["applied"] is False and step3[rank]["changed"] is False
        assert step3[rank]["digest"] == step2[rank]["digest"]  # weights unchanged on every rank
        assert step3[rank]["skipped"] == 1 and step3[rank]["grads_zeroed"] is True
    assert step3[0]["local_norm_before"] is not None  # rank 0's own gradients were finite: it still skipped
    assert step5[0]["digest"] == step5[1]["digest"]  # replicas never forked
    assert step5[0]["applied"] and step5[1]["applied"]
    done = {d["rank"]: d for d in lines["DONE"]}
    assert done[0]["skipped"] == done[1]["skipped"] == 1
    record = done[0]["records"][0]
    assert record["step"] == 3 and record["culprits"] == [1]
    assert record["ranks"]["1"]["sample_ids"] == [1003, 1004]
    warnings = [line for line in lines["stderr"].splitlines() if "the update is skipped" in line]
    assert len(warnings) == 1 and "at step 3" in warnings[0]  # once per event, on rank 0 only


@pytest.mark.slow
def test_a_nan_on_one_rank_makes_every_rank_skip(tmp_path):
    lines = run_job("inject_nan", tmp_path)
    step3, step5 = by_step(lines, 3), by_step(lines, 5)
    assert all(step3[rank]["applied"] is False and step3[rank]["changed"] is False for rank in (0, 1))
    assert step5[0]["digest"] == step5[1]["digest"]
    assert {d["rank"]: d["records"][0]["culprits"] for d in lines["DONE"]} == {0: [1], 1: [1]}


@pytest.mark.slow
def test_blocking_false_skips_on_every_rank_and_records_a_step_later(tmp_path):
    lines = run_job("nonblocking", tmp_path)
    step2, step3, step4, step5 = (by_step(lines, s) for s in (2, 3, 4, 5))
    for rank in (0, 1):
        assert step3[rank]["applied"] is False and step3[rank]["digest"] == step2[rank]["digest"]
        assert step3[rank]["skipped"] == 0 and step4[rank]["skipped"] == 1
    assert step5[0]["applied"] and step5[0]["digest"] == step5[1]["digest"]
    records = {d["rank"]: d["records"] for d in lines["DONE"]}
    assert all(r[0]["step"] == 3 and r[0]["culprits"] == [1] for r in records.values())


@pytest.mark.slow
def test_consecutive_nonfinite_steps_raise_on_every_rank(tmp_path):
    lines = run_job("consecutive", tmp_path)
    raised = {r["rank"]: r for r in lines["RAISED"]}
    assert set(raised) == {0, 1}
    assert all(r["step"] == 4 for r in raised.values())
    assert all("max_consecutive_nonfinite_steps=3" in r["message"] for r in raised.values())
    assert all("unchanged since step 1" in r["message"] for r in raised.values())


@pytest.mark.slow
def test_nonfinite_weights_raise_on_every_rank(tmp_path):
    lines = run_job("bad_weights", tmp_path)
    raised = {r["rank"]: r for r in lines["RAISED"]}
    assert set(raised) == {0, 1}
    assert all("weights themselves are non-finite" in r["message"] for r in raised.values())


@pytest.mark.slow
def test_grad_scaler_agrees_across_ranks_without_double_skip(tmp_path):
    lines = run_job("scaler", tmp_path)
    step3, step4 = by_step(lines, 3), by_step(lines, 4)
    for rank in (0, 1):
        assert step3[rank]["applied"] is False and step3[rank]["changed"] is False
        assert step3[rank]["scale"] == 512.0  # backed off once, identically, on both ranks
        assert step3[rank]["optimizer_steps"] == 2  # the scaler skipped the optimizer: no extra step
        assert step4[rank]["applied"] and step4[rank]["optimizer_steps"] == 3  # and only this one step
        assert step3[rank]["skipped"] == step4[rank]["skipped"] == 1
    assert step4[0]["digest"] == step4[1]["digest"]


@pytest.mark.slow
def test_clipping_across_ranks(tmp_path):
    lines = run_job("clip", tmp_path)
    for row in lines["STEP"]:
        assert row["applied"]
        assert row["grad_norm"] == pytest.approx(row["local_norm_before"], rel=1e-5)  # DDP: local = global
        assert row["clipped_norm"] == pytest.approx(0.01, rel=1e-3)
    assert by_step(lines, 5)[0]["digest"] == by_step(lines, 5)[1]["digest"]


@pytest.mark.slow
def test_dtensor_sharded_gradients(tmp_path):
    lines = run_job("dtensor", tmp_path)
    for row in lines["STEP"]:
        if row["step"] == 3:
            assert row["applied"] is False and row["changed"] is False and row["skipped"] == 1
        else:
            assert row["applied"] and row["grad_norm"] == pytest.approx(row["expected_norm"], rel=1e-5)


@pytest.mark.slow
def test_pipeline_stages_add_up(tmp_path):
    lines = run_job("pipeline", tmp_path)
    rows = by_step(lines, 1)
    assert set(rows) == {0, 1}
    for row in rows.values():
        assert row["grad_norm"] == pytest.approx(row["expected_norm"], rel=1e-5)
        assert row["grad_norm"] > row["local_norm"] * 1.01
