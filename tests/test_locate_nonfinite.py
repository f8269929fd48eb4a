"""locate_nonfinite, BlockFlags and compare_attention on real models in one process (CPU)."""

import math

import pytest

torch = pytest.importorskip("torch")

from torchtriage import compare_attention, format_attention_report, locate_nonfinite  # noqa: E402
from torchtriage.runtime.block_flags import BlockFlags, pick_blocks  # noqa: E402

FEATURES = 8


class Exp(torch.nn.Module):
    def forward(self, x):
        return torch.exp(x)


class RootOfSquares(torch.nn.Module):
    """sqrt(h²) is |h|, finite forward; at h == 0 its backward divides by zero."""

    def forward(self, x):
        return torch.sqrt(x * x)


class Block(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.fc = torch.nn.Linear(FEATURES, FEATURES)
        self.act = act

    def forward(self, x):
        return x + self.act(self.fc(x))


class Net(torch.nn.Module):
    def __init__(self, acts=None, checkpoint=False):
        super().__init__()
        acts = acts or [torch.nn.Tanh(), torch.nn.Tanh(), Exp(), torch.nn.Tanh()]
        self.layers = torch.nn.ModuleList([Block(a) for a in acts])
        self.norm = torch.nn.BatchNorm1d(FEATURES)
        self.head = torch.nn.Linear(FEATURES, 1)
        self.checkpoint = checkpoint

    def forward(self, x):
        for layer in self.layers:
            x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False) if self.checkpoint else layer(x)
        return self.head(self.norm(x))


def make(**kwargs):
    torch.manual_seed(0)
    return Net(**kwargs)


def batch(bad_row=None, scale=300.0):
    x = torch.randn(6, FEATURES, generator=torch.Generator().manual_seed(1))
    if bad_row is not None:
        x[bad_row] = x[bad_row].abs() * scale
    return x


def test_exp_overflow_on_one_sample_names_the_module_op_and_row():
    model = make()
    with torch.no_grad():
        model.layers[2].fc.weight.copy_(torch.eye(FEATURES))
    x = batch(bad_row=4)
    origin = locate_nonfinite(model, lambda: model(x).pow(2).mean())
    assert origin["phase"] == "forward"
    assert origin["module"] == "layers.2.act" and origin["op"] == "aten.exp"
    assert origin["inputs_finite"] is True and origin["input_max_abs"] > 88.7  # exp(88.7) is fp32's limit
    assert origin["dtype"] == "float32" and origin["shape"] == [6, FEATURES]
    assert origin["values"]["rows"] == [4] and origin["values"]["posinf"] > 0
    assert "layers.2.act" in origin["detail"] and "rows [4] of 6" in origin["detail"]


def test_a_finite_step_returns_none_and_changes_nothing():
    model = make()
    x = batch()
    model(x).sum().backward()
    grads = [p.grad for p in model.parameters()]
    grad_values = [g.clone() for g in grads]
    stats = model.norm.running_mean.clone(), model.norm.num_batches_tracked.clone()
    rng = torch.get_rng_state()
    assert locate_nonfinite(model, lambda: torch.nn.functional.dropout(model(x), 0.5).mean()) is None
    assert all(p.grad is g for p, g in zip(model.parameters(), grads, strict=True))
    assert all(torch.equal(p.grad, v) for p, v in zip(model.parameters(), grad_values, strict=True))
    assert torch.equal(model.norm.running_mean, stats[0]) and torch.equal(model.norm.num_batches_tracked, stats[1])
    assert torch.equal(torch.get_rng_state(), rng)


def _leftovers():
    from torch.nn.modules import module as module_mod
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return (
        len(module_mod._global_forward_pre_hooks),
        len(module_mod._global_forward_hooks),
        len(_get_current_dispatch_mode_stack()),
        len(_get_current_function_mode_stack()),
    )


def test_nothing_is_left_behind_when_the_closure_raises():
    model = make()
    before = _leftovers()
    weights = [p.detach().clone() for p in model.parameters()]

    def closure():
        model(batch())
        raise KeyError("the loop's own bug")

    with pytest.raises(KeyError, match="the loop's own bug"):
        locate_nonfinite(model, closure)
    assert _leftovers() == before
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True))


def test_the_batch_itself_is_phase_input():
    model = make()
    x = batch()
    x[2, 3] = float("nan")
    origin = locate_nonfinite(model, lambda: model(x).mean())
    assert origin["phase"] == "input" and origin["inputs_finite"] is False
    assert origin["module"] == "layers.0.fc" and origin["values"]["rows"] == [2]


def test_a_non_finite_weight_or_optimizer_state_is_phase_parameters():
    model = make()
    with torch.no_grad():
        model.layers[1].fc.weight[0, 0] = float("inf")
    origin = locate_nonfinite(model, lambda: model(batch()).mean())
    assert origin["phase"] == "parameters" and origin["parameter"] == "layers.1.fc.weight"
    assert origin["module"] == "layers.1.fc" and origin["op"] is None

    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(batch()).mean().backward()
    opt.step()
    opt.state[model.head.bias]["momentum_buffer"].fill_(float("nan"))
    origin = locate_nonfinite(model, lambda: model(batch()).mean(), optimizer=opt)
    assert origin["phase"] == "parameters" and origin["parameter"] == "head.bias"
    assert "momentum_buffer" in origin["detail"]


def test_log_of_zero_in_a_loss_module_outside_the_model():
    class LikelihoodLoss(torch.nn.Module):
        def forward(self, output, target):
            rate = torch.nn.functional.softplus(output + target)
            return (rate - torch.log(rate)).mean()

    model, loss_fn = make(), LikelihoodLoss()
    target = torch.zeros(6, 1)
    target[3] = -1000.0  # softplus(-1000) underflows to exactly 0
    origin = locate_nonfinite(model, lambda: loss_fn(model(batch()), target))
    assert origin["phase"] == "forward" and origin["op"] == "aten.log"
    assert origin["module"] is None and origin["module_type"] == "LikelihoodLoss"
    assert origin["inputs_finite"] is True and origin["values"]["neginf"] == 1
    assert "outside the model" in origin["detail"]


def test_division_by_a_zero_norm():
    class Normalize(torch.nn.Module):
        def forward(self, x):
            return x / x.norm(dim=-1, keepdim=True)

    model = torch.nn.Sequential(Normalize(), torch.nn.Linear(FEATURES, 1))
    x = batch()
    x[1] = 0.0
    origin = locate_nonfinite(model, lambda: model(x).mean())
    assert (origin["phase"], origin["module"], origin["op"]) == ("forward", "0", "aten.div")
    assert origin["values"]["nan"] == FEATURES and origin["values"]["rows"] == [1]


def test_an_origin_in_the_backward_names_the_forward_module_and_autograd_node():
    model = make(acts=[torch.nn.Tanh(), RootOfSquares(), torch.nn.Tanh()])
    with torch.no_grad():
        model.layers[1].fc.weight.zero_()
        model.layers[1].fc.bias.zero_()  # h == 0 everywhere: sqrt's backward is 0/0
    origin = locate_nonfinite(model, lambda: model(batch()).mean())
    assert origin["phase"] == "backward"
    assert origin["module"] == "layers.1.act" and origin["autograd_node"] == "SqrtBackward0"
    assert origin["inputs_finite"] is True


@pytest.mark.parametrize("checkpoint", [False, True])
def test_activation_checkpointing_finds_the_same_origin(checkpoint):
    model = make(checkpoint=checkpoint)
    with torch.no_grad():
        model.layers[2].fc.weight.copy_(torch.eye(FEATURES))
    x = batch(bad_row=4)
    origin = locate_nonfinite(model, lambda: model(x).mean())
    assert (origin["phase"], origin["module"], origin["op"]) == ("forward", "layers.2.act", "aten.exp")

    backward = make(acts=[torch.nn.Tanh(), RootOfSquares()], checkpoint=checkpoint)
    with torch.no_grad():
        backward.layers[1].fc.weight.zero_()
        backward.layers[1].fc.bias.zero_()
    origin = locate_nonfinite(backward, lambda: backward(batch()).mean())
    assert (origin["phase"], origin["module"]) == ("backward", "layers.1.act")  # not the recomputed forward


def test_fp16_overflow_under_autocast():
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, FEATURES), torch.nn.Linear(FEATURES, 1))
    with torch.no_grad():
        model[0].weight.fill_(1000.0)
    x = torch.full((2, FEATURES), 10.0)  # 8 × 10 × 1000 = 80000 > fp16's 65504, finite in fp32

    def closure():
        with torch.autocast("cpu", dtype=torch.float16):
            return model(x).float().mean()

    origin = locate_nonfinite(model, closure)
    assert (origin["phase"], origin["module"], origin["dtype"]) == ("forward", "0", "float16")
    assert origin["op"] == "aten.addmm" and origin["inputs_finite"] is True
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()  # the same op in fp32 is finite: the precision is the cause


def test_bf16_overflow_under_autocast():
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, FEATURES), Exp())
    x = torch.full((2, FEATURES), 50.0)
    with torch.no_grad():
        model[0].weight.fill_(1.0)
        model[0].bias.zero_()

    def closure():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x).float().mean()

    origin = locate_nonfinite(model, closure)
    assert (origin["module"], origin["op"], origin["dtype"]) == ("1", "aten.exp", "bfloat16")


def test_a_compiled_model_is_replayed_eagerly():
    model = make()
    with torch.no_grad():
        model.layers[2].fc.weight.copy_(torch.eye(FEATURES))
    compiled = torch.compile(model, backend="aot_eager")
    x = batch(bad_row=4)
    compiled(batch())  # compiled once, as in training
    origin = locate_nonfinite(compiled, lambda: compiled(x).mean())
    assert (origin["module"], origin["op"]) == ("layers.2.act", "aten.exp")
    assert origin["compiled"] is True and "replayed eagerly" in origin["detail"]
    assert _leftovers() == (0, 0, 0, 0)


def test_without_backward_only_the_forward_is_checked():
    model = make(acts=[RootOfSquares()])
    with torch.no_grad():
        model.layers[0].fc.weight.zero_()
        model.layers[0].fc.bias.zero_()
    assert locate_nonfinite(model, lambda: model(batch()).mean(), backward=False) is None
    assert locate_nonfinite(model, lambda: model(batch()).mean())["phase"] == "backward"


# -- block flags --------------------------------------------------------------------------------------


def test_pick_blocks_takes_the_largest_module_list():
    assert [name for name, _ in pick_blocks(make())] == ["layers.0", "layers.1", "layers.2", "layers.3"]
    assert [name for name, _ in pick_blocks(torch.nn.Linear(2, 2))] == []
    assert [name for name, _ in pick_blocks(make(), ["head"])] == ["head"]
    with pytest.raises(ValueError, match="does not have"):
        pick_blocks(make(), ["nope"])


def test_block_flags_name_the_forward_block_and_reset_per_step():
    model = make()
    with torch.no_grad():
        model.layers[2].fc.weight.copy_(torch.eye(FEATURES))
    flags = BlockFlags(model)
    model(batch()).mean().backward()
    assert flags.read() is None
    flags.reset()
    model(batch(bad_row=4)).mean().backward()
    assert flags.read() == {"phase": "forward", "block": "layers.2", "index": 2}
    flags.remove()
    assert all(not m._forward_hooks for m in model.modules())


def _flags_after_step(flags, model):
    model(batch()).mean().backward()
    found = flags.read()
    flags.remove()
    return found


def test_block_flags_place_a_backward_origin_and_one_after_the_blocks():
    model = make(acts=[torch.nn.Tanh(), RootOfSquares(), torch.nn.Tanh()])
    with torch.no_grad():
        model.layers[1].fc.weight.zero_()
        model.layers[1].fc.bias.zero_()
    assert _flags_after_step(BlockFlags(model), model) is None  # forward outputs only, by default
    flags = BlockFlags(model, gradients=True)
    model(batch()).mean().backward()
    assert flags.read() == {"phase": "backward", "block": "layers.1", "index": 1}
    flags.reset()
    healthy = make()
    flags = BlockFlags(healthy, gradients=True)
    (healthy(batch()).mean() * torch.tensor(float("inf"))).backward()
    assert flags.read()["block"].startswith("after the last block")


# -- the attention probe ------------------------------------------------------------------------------


def test_compare_attention_on_cpu():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 32, generator=gen) for _ in range(3))
    report = compare_attention(q, k, v, is_causal=True)
    by_name = {entry["backend"]: entry for entry in report["backends"]}
    assert set(by_name) == {"math", "flash", "efficient", "cudnn"}
    assert by_name["math"]["available"] and by_name["math"]["max_rel_error"] < 1e-5
    assert by_name["math"]["grad"]["q"]["max_rel_error"] < 1e-4 and by_name["math"]["nonfinite"] == 0
    assert not by_name["cudnn"]["available"] and by_name["cudnn"]["reason"]
    low = compare_attention(*(t.to(torch.bfloat16) for t in (q, k, v)), is_causal=True)
    low_math = next(e for e in low["backends"] if e["backend"] == "math")
    assert low_math["max_rel_error"] > 100 * by_name["math"]["max_rel_error"]  # bf16 is much coarser
    text = format_attention_report(report)
    assert "math" in text and "unavailable" in text and "worst:" in text


def test_compare_attention_counts_non_finite_outputs():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 8, 16, generator=gen) for _ in range(3))
    k[0, 0, 3, 0] = float("inf")
    report = compare_attention(q, k, v, backward=False)
    math_entry = next(e for e in report["backends"] if e["backend"] == "math")
    assert math_entry["nonfinite"] > 0 and report["reference_nonfinite"] > 0
    assert "non-finite" in report["worst"]
    assert not math.isnan(math_entry["max_abs_error"])
