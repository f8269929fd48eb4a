"""The non-finite locator's CUDA paths on one GPU: locate_nonfinite, NonFiniteGuard(locate=True, watch="blocks"),
a torch.compile'd (inductor) model replayed eagerly, GradScaler overflows, and compare_attention's backends.

Run on a machine with a GPU, from the repository root:
    PYTHONPATH=src python tests/gpu/check_nonfinite.py [--json OUT.json]
Prints one PASS/FAIL line per check and the attention probe's tables; exits 1 if any check failed.
"""

import argparse
import json
import sys

import torch

from torchtriage import NonFiniteGuard, compare_attention, format_attention_report, locate_nonfinite

failed: list[str] = []
results: dict = {"checks": {}, "attention": []}
DEVICE = torch.device("cuda")
FEATURES = 64


def check(name, ok, detail=""):
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}", flush=True)
    results["checks"][name] = {"ok": bool(ok), "detail": str(detail)[:400]}
    if not ok:
        failed.append(name)


class Exp(torch.nn.Module):
    def forward(self, x):
        return torch.exp(x)


class RootOfSquares(torch.nn.Module):
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
    def __init__(self, acts):
        super().__init__()
        self.layers = torch.nn.ModuleList([Block(a) for a in acts])
        self.head = torch.nn.Linear(FEATURES, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def net(*acts):
    torch.manual_seed(0)
    return Net(acts).to(DEVICE)


def batch(bad_row=None):
    x = torch.randn(16, FEATURES, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    if bad_row is not None:
        x[bad_row] = x[bad_row].abs() * 300
    return x


def exp_model():
    model = net(torch.nn.Tanh(), torch.nn.Tanh(), Exp())
    with torch.no_grad():
        model.layers[2].fc.weight.copy_(torch.eye(FEATURES, device=DEVICE))
    return model


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    results["device"] = torch.cuda.get_device_name()
    results["torch"] = torch.__version__

    model = exp_model()
    found = locate_nonfinite(model, lambda: model(batch(bad_row=9)).mean())
    check(
        "cuda_forward_exp_one_sample",
        found
        and (found["phase"], found["module"], found["op"]) == ("forward", "layers.2.act", "aten.exp")
        and found["values"]["rows"] == [9],
        found and found["detail"],
    )

    model = net(torch.nn.Tanh(), RootOfSquares())
    with torch.no_grad():
        model.layers[1].fc.weight.zero_()
        model.layers[1].fc.bias.zero_()
    found = locate_nonfinite(model, lambda: model(batch()).mean())
    check(
        "cuda_backward_sqrt_of_zero",
        found
        and (found["phase"], found["module"], found.get("autograd_node"))
        == ("backward", "layers.1.act", "SqrtBackward0"),
        found and found["detail"],
    )

    model = net(torch.nn.Tanh(), Exp())
    with torch.no_grad():
        model.layers[1].fc.weight.copy_(torch.eye(FEATURES, device=DEVICE) * 4.0)

    def fp16_closure():
        with torch.autocast("cuda", dtype=torch.float16):
            return model(batch() * 4).float().mean()  # exp of ~16-60: inf in fp16 (max 65504), finite in fp32

    found = locate_nonfinite(model, fp16_closure)
    # CUDA's autocast runs exp in fp32 (its fp32 list), so exp is finite; the head's linear then casts
    # its input to fp16, and that cast is where the value overflows. (CPU autocast keeps exp in fp16.)
    check(
        "cuda_fp16_autocast_overflow",
        found
        and (found["module"], found["op"], found["dtype"], found["inputs_finite"])
        == ("head", "aten._to_copy", "float16", True),
        found and found["detail"],
    )

    model = exp_model()
    compiled = torch.compile(model)  # inductor: Triton kernels, no per-op location of its own
    compiled(batch())
    found = locate_nonfinite(compiled, lambda: compiled(batch(bad_row=3)).mean())
    check(
        "cuda_inductor_compiled_replayed_eagerly",
        found and (found["module"], found["op"], found["compiled"]) == ("layers.2.act", "aten.exp", True),
        found and found["detail"],
    )

    model = exp_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    guard = NonFiniteGuard(opt, model=model, locate=True, watch="blocks")
    x = batch(bad_row=5)
    opt.zero_grad()
    loss = model(x).mean()
    loss.backward()
    outcome = guard.step(loss=loss, sample_ids=list(range(100, 116)), replay=lambda: model(x).mean())
    record = guard.skipped_batches[-1] if guard.skipped_batches else None
    info = record.ranks[0] if record else {}
    check(
        "cuda_guard_locate_and_block_flags",
        not outcome.applied
        and record.suspect == "data"
        and info["origin"]["module"] == "layers.2.act"
        and info["blocks"]["block"] == "layers.2",
        record and (record.suspect, record.evidence, info.get("blocks")),
    )

    model = exp_model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**24)
    guard = NonFiniteGuard(opt, scaler=scaler, model=model, locate=True)
    x = batch()

    def scaled_closure():
        with torch.autocast("cuda", dtype=torch.float16):
            return model(x).float().mean()  # finite; its gradients times 2**24 overflow fp16

    opt.zero_grad()
    loss = scaled_closure()
    scaler.scale(loss).backward()
    outcome = guard.step(loss=loss, replay=scaled_closure)
    record = guard.skipped_batches[-1] if guard.skipped_batches else None
    check(
        "cuda_grad_scaler_overflow_is_not_an_origin",
        not outcome.applied and record is not None and record.suspect == "loss_scale",
        (outcome.applied, record and record.suspect, scaler.get_scale()),
    )

    torch.manual_seed(0)
    for head_dim in (64, 128, 256):
        for dtype in (torch.bfloat16, torch.float16):
            q, k, v = (torch.randn(4, 16, 1024, head_dim, device=DEVICE, dtype=dtype) for _ in range(3))
            report = compare_attention(q, k, v, is_causal=True)
            print(format_attention_report(report), flush=True)
            results["attention"].append(report)
            available = [e for e in report["backends"] if e["available"]]
            check(
                f"attention_probe_d{head_dim}_{str(dtype).removeprefix('torch.')}",
                len(available) >= 2 and all(e["nonfinite"] == 0 for e in available),
                [(e["backend"], round(e["max_rel_error"], 5)) for e in available],
            )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
