"""What finding a NaN's origin costs, and what the usual answer names instead, side by side in one run.

Run (one process; CUDA when available, else CPU):

    python benchmarks/nonfinite_overhead.py                    # 12 blocks, d=256, sequence 128, batch 8
    python benchmarks/nonfinite_overhead.py --blocks 12 --dim 1024 --seq 1024 --batch 8 --dtype bfloat16
    python benchmarks/nonfinite_overhead.py --json out.json

A GPT-style transformer (pre-norm blocks: attention through SDPA, a GELU MLP) trains with AdamW. Step
times are taken in blocks of `--steps` steps, the configurations interleaved in ABBA order so none
always runs first or warmer, and each configuration's time is the median of its blocks (CUDA events
around the block on a GPU; wall time on the CPU):

- guard:          `NonFiniteGuard.step()` (the baseline every other row is divided by);
- guard+locate:   `NonFiniteGuard(model=..., locate=True)` with `replay=`: nothing is replayed while
                  steps are finite, so this must be 1.00;
- guard+blocks:   `watch="blocks"`: a device-side flag per block output and per output gradient;
- detect_anomaly: the guard's step inside `torch.autograd.detect_anomaly()`, what users reach for.

Then a NaN is planted in layer `--plant` (its MLP's first weight scaled to overflow) and both answers
are asked where it came from: anomaly mode names the first backward function that returned NaN;
`locate_nonfinite` names the module, op and phase. Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time


def build(args):
    import torch

    class Block(torch.nn.Module):
        def __init__(self, dim: int, heads: int):
            super().__init__()
            self.heads = heads
            self.norm1 = torch.nn.LayerNorm(dim)
            self.qkv = torch.nn.Linear(dim, 3 * dim)
            self.out = torch.nn.Linear(dim, dim)
            self.norm2 = torch.nn.LayerNorm(dim)
            self.mlp = torch.nn.Sequential(
                torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)
            )

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
            a = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.norm2(x))

    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(args.vocab, args.dim)
            self.layers = torch.nn.ModuleList([Block(args.dim, args.heads) for _ in range(args.blocks)])
            self.norm = torch.nn.LayerNorm(args.dim)
            self.head = torch.nn.Linear(args.dim, args.vocab)

        def forward(self, tokens):
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x))

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    model = GPT().to(device)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
    return model, tokens, device


def loss_of(model, tokens, dtype):
    import torch

    with torch.autocast(tokens.device.type, dtype=dtype, enabled=dtype != torch.float32):
        logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())


class Config:
    """One way to run the step. Its optimizer lives across blocks (its state is allocated once); its
    guard is made per block, so that the block flags' hooks are on only while this config runs."""

    def __init__(self, name, net, tokens, dtype, **guard_kwargs):
        import torch

        self.name = name
        self.model, self.tokens, self.dtype = net, tokens, dtype
        self.optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
        self.anomaly = guard_kwargs.pop("anomaly", False)
        self.guard_kwargs = guard_kwargs
        self.locate = bool(guard_kwargs.get("locate"))
        self.guard = None

    def __enter__(self):
        from torchtriage import NonFiniteGuard

        self.guard = NonFiniteGuard(self.optimizer, check_weights_every=0, **self.guard_kwargs)
        return self

    def __exit__(self, *exc):
        if self.guard.block_flags is not None:
            self.guard.block_flags.remove()

    def step(self):
        import contextlib

        import torch

        context = torch.autograd.detect_anomaly(check_nan=True) if self.anomaly else contextlib.nullcontext()
        with context:
            self.optimizer.zero_grad(set_to_none=True)
            loss = loss_of(self.model, self.tokens, self.dtype)
            loss.backward()
            replay = (lambda: loss_of(self.model, self.tokens, self.dtype)) if self.locate else None
            return self.guard.step(loss=loss, replay=replay)


def time_block(config, steps: int, device) -> float:
    import torch

    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(steps):
            config.step()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1000 / steps
    began = time.perf_counter()
    for _ in range(steps):
        config.step()
    return (time.perf_counter() - began) / steps


def overhead(args, model, tokens, device, dtype) -> dict:
    names = ["guard", "guard+locate", "guard+blocks", "detect_anomaly"]
    kwargs = {
        "guard": {},
        "guard+locate": {"model": model, "locate": True},
        "guard+blocks": {"model": model, "watch": "blocks"},
        "detect_anomaly": {"anomaly": True},
    }
    times: dict[str, list[float]] = {n: [] for n in names}
    configs = {name: Config(name, model, tokens, dtype, **kwargs[name]) for name in names}
    for name in names:  # warm-up: one short block each, not timed (allocates the optimizer state)
        with configs[name] as config:
            time_block(config, max(2, args.steps // 4), device)
    for block in range(args.repeats):
        order = names if block % 2 == 0 else list(reversed(names))
        for name in order:
            with configs[name] as config:
                times[name].append(time_block(config, args.steps, device))
    base = statistics.median(times["guard"])
    return {
        name: {"step_ms": statistics.median(values) * 1000, "ratio": statistics.median(values) / base}
        for name, values in times.items()
    }


def quiet_anomaly_mode() -> None:
    """Anomaly mode warns once per use, and prints the forward traceback of the op it stops at."""
    import warnings

    warnings.filterwarnings("ignore", message=".*Anomaly Detection has been enabled.*")
    warnings.filterwarnings("ignore", message=".*Error detected in.*")


def who_names_it(args, model, tokens, dtype) -> dict:
    import torch

    quiet_anomaly_mode()
    from torchtriage import locate_nonfinite

    plant = model.layers[args.plant].mlp[0]
    saved = plant.weight.detach().clone()
    with torch.no_grad():
        plant.weight.fill_(1e38)  # its output overflows to inf in any float dtype: a NaN born in layer `plant`
    try:
        anomaly = None
        try:
            with torch.autograd.detect_anomaly(check_nan=True):
                loss_of(model, tokens, dtype).backward()
        except RuntimeError as error:
            anomaly = str(error).splitlines()[0]
        model.zero_grad(set_to_none=True)
        began = time.perf_counter()
        origin = locate_nonfinite(model, lambda: loss_of(model, tokens, dtype))
        seconds = time.perf_counter() - began
    finally:
        with torch.no_grad():
            plant.weight.copy_(saved)
    return {
        "planted": f"layers.{args.plant}.mlp.0",
        "detect_anomaly": anomaly,
        "locate_nonfinite": {k: origin.get(k) for k in ("phase", "module", "op", "dtype")} if origin else None,
        "locate_seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=6, help="timed blocks per configuration")
    parser.add_argument("--plant", type=int, default=7, help="the layer whose weights overflow")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if not 0 <= args.plant < args.blocks:
        parser.error(f"--plant must name one of the {args.blocks} layers (0-{args.blocks - 1})")
    import torch

    dtype = getattr(torch, args.dtype)
    model, tokens, device = build(args)
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "model": f"{args.blocks} blocks, d={args.dim}, seq {args.seq}, batch {args.batch}, {args.dtype}",
        "overhead": overhead(args, model, tokens, device, dtype),
        "origin": who_names_it(args, model, tokens, dtype),
    }
    print(f"{result['model']} on {result['device']}")
    for name, row in result["overhead"].items():
        print(f"  {name:<15} {row['step_ms']:9.2f} ms/step   x{row['ratio']:.3f} of the guard alone")
    origin = result["origin"]
    print(f"NaN planted in {origin['planted']}:")
    print(f"  detect_anomaly names:   {origin['detect_anomaly']}")
    found = origin["locate_nonfinite"]
    print(
        f"  locate_nonfinite names: {found and (found['phase'], found['module'], found['op'], found['dtype'])} "
        f"in {origin['locate_seconds']:.2f} s"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v)


if __name__ == "__main__":
    main()
