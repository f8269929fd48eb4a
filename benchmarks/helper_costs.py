"""What the always-on helpers cost per training step: paired, interleaved ratios with 95% intervals.

Run (one process; one GPU when CUDA is available):

    python benchmarks/helper_costs.py                  # 92M-parameter GPT, batch sized for ~18 ms steps
    python benchmarks/helper_costs.py --cpu            # a small model on the CPU (under two minutes)
    python benchmarks/helper_costs.py --explain        # also the pieces of the guard's cost
    python benchmarks/helper_costs.py --base HEAD~1    # also another commit's guard, side by side
    python benchmarks/helper_costs.py --json out.json  # the numbers ($OUT/helper_costs.json when OUT is set)

The GPU default keeps the device the bottleneck (a few hundred kernel launches a step), so the host's
jitter stays out of the numbers. A model whose steps are bound by kernel launches (`--blocks 12 --dim
256 --seq 256 --batch 8`) shows the host-side costs in full, but on a virtual machine its blocks of
steps vary by up to 10% (seen on an H100 host), so the intervals are wide.

Every mode is timed against the plain loop (`loss.backward(); optimizer.step()`; for the clipping modes, the
plain loop that clips) of the same model in the same process: in each round, for every mode (in a shuffled
order), one block of `--steps` steps of the plain loop and one with the helper, the order within the pair
alternating from round to round (AB, BA, ...), so warm-up and drift fall on both sides. A block's time is the
wall time between two device synchronisations on a GPU; on the CPU, the process's CPU time on one thread
(`--threads`), since on a shared host wall time measures the neighbours. Per mode: the median of the pairs'
ratios (helper / plain) with a 95% bootstrap interval, and what that is in microseconds per step. `plain`
against itself is the noise. Rounds stop at `--pairs` or after `--max-seconds`, whichever is first.

The optimizer is AdamW with `fused=True` (what `blocking=False` needs) in every mode. Modes:

- monitor:             `StepMonitor(run folder, window=--window, step_on="optimizer")`, as `torchtriage
                       run --monitor` starts it, files written;
- guard:               `NonFiniteGuard(optimizer).step(loss=loss, batch_index=i)`: the default, which
                       reads the agreed norm on the host before it steps;
- guard-blocks:        the same with `model=, locate=True, watch="blocks"` and `replay=`;
- nonblocking:         `NonFiniteGuard(optimizer, blocking=False)`: decided on the device, read a step
                       later;
- nonblocking-locate:  the same with `model=, locate=True` and `replay=` (nothing runs until a skip);
- nonblocking-blocks:  and `watch="blocks"`: a device-side sum per block output;
- guard-clip:          `NonFiniteGuard(optimizer, max_grad_norm=1.0)`, timed against the plain loop that
                       clips (`clip_grad_norm_(parameters, 1.0, foreach=True)`): what the guard costs a job
                       that clips its gradients, since it clips with the norm it computed;
- nonblocking-clip:    the same with `blocking=False`;
- with --explain, the pieces of the blocking guard: `norm` (its fused norm pass, no host read) and
  `read` (one device-to-host read of a gradient element after the backward, nothing else);
- with --base/--base-src, `guard@base`: another tree's `NonFiniteGuard`, default arguments.

Then what a skipped step costs with `locate=True`: an inf is written into one gradient after the
backward (a fault the replays cannot reproduce, so they check every op of the forward and the
backward, the slowest case) and the guard's step, with its two replays, is timed against a plain step.

Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import logging
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from nonfinite_overhead import build, loss_of
from runtime_overhead import bootstrap_median

CLIP = 1.0
GUARDS = {
    "guard": {},
    "guard-blocks": {"locate": True, "watch": "blocks"},
    "nonblocking": {"blocking": False},
    "nonblocking-locate": {"blocking": False, "locate": True},
    "nonblocking-blocks": {"blocking": False, "locate": True, "watch": "blocks"},
    "guard-clip": {"max_grad_norm": CLIP},
    "nonblocking-clip": {"blocking": False, "max_grad_norm": CLIP},
}
# A job that clips its gradients already pays for the norm pass: a guard given max_grad_norm= clips with the
# norm it computed, so the clipping modes are timed against the plain loop that calls clip_grad_norm_.
BASELINE = {"guard-clip": "clip", "nonblocking-clip": "clip"}
MODES = ("plain", "monitor", *GUARDS)
EXPLAIN = ("norm", "read")


class Loop:
    """One model, one optimizer, and the step each mode takes (the model trains on through every block)."""

    def __init__(self, args, base_guard):
        import torch

        self.torch = torch
        self.args = args
        self.model, self.tokens, self.device = build(args)
        self.dtype = getattr(torch, args.dtype)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-5, fused=True)
        self.index = 0
        self.folder = tempfile.mkdtemp(prefix="helper-costs-")
        self.guards = self._guards(base_guard)
        self.monitor = None
        self.clock = time.perf_counter if self.device.type == "cuda" else time.process_time

    def _guards(self, base_guard) -> dict:
        from torchtriage import NonFiniteGuard

        guards = {}
        for mode, options in GUARDS.items():
            watched = {"model": self.model, "report_dir": self.folder} if options.get("locate") else {}
            guards[mode] = NonFiniteGuard(self.optimizer, **options, **watched)
            if guards[mode].block_flags is not None:  # armed for its own blocks only (see `armed`)
                guards[mode].block_flags.remove()
                guards[mode].block_flags = None
        if base_guard is not None:
            guards["guard@base"] = base_guard(self.optimizer)
        return guards

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    @contextlib.contextmanager
    def armed(self, mode: str):
        """What a mode switches on around its block, outside the timed steps."""
        if mode == "monitor":
            from torchtriage import StepMonitor

            if self.monitor is None:  # one monitor across its blocks: its windows run on as in a job
                self.monitor = StepMonitor(self.folder, window=self.args.window, step_on="optimizer")
            self.monitor.start()
        watched = GUARDS.get(mode, {}).get("watch") is not None
        if watched:
            from torchtriage.runtime.block_flags import BlockFlags

            self.guards[mode].block_flags = BlockFlags(self.model)
        try:
            yield
        finally:
            if mode == "monitor":
                self.monitor.close()
            elif watched:
                self.guards[mode].block_flags.remove()
                self.guards[mode].block_flags = None

    def step(self, mode: str) -> None:
        self.index += 1
        self.optimizer.zero_grad(set_to_none=True)
        loss = loss_of(self.model, self.tokens, self.dtype)
        loss.backward()
        guard = self.guards.get(mode)
        if guard is None:
            self._plain_end(mode)
            return
        replay = (lambda: loss_of(self.model, self.tokens, self.dtype)) if guard.locate else None
        guard.step(loss=loss, batch_index=self.index, replay=replay)

    def _plain_end(self, mode: str) -> None:
        if mode == "clip":
            self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP, foreach=True)
        elif mode == "norm":
            self.guards["guard"]._grad_sums()
        elif mode == "read":
            first = next(p for p in self.model.parameters() if p.grad is not None)
            first.grad.flatten()[0].item()
        self.optimizer.step()

    def block(self, mode: str, steps: int) -> float:
        """Seconds per step of `steps` steps of `mode`, between two device synchronisations."""
        with self.armed(mode):
            gc.collect()  # the collector runs between blocks, not at random inside one (as timeit does)
            gc.disable()
            self.sync()
            began = self.clock()
            try:
                for _ in range(steps):
                    self.step(mode)
                self.sync()
                return (self.clock() - began) / steps
            finally:
                gc.enable()


def plain_step_seconds(args) -> float:
    loop = Loop(args, None)
    loop.block("plain", 3)  # warm-up: the optimizer's state, the allocator, the kernels' first launch
    return min(loop.block("plain", 5) for _ in range(2))


def size_batch(args) -> None:
    """Double the batch until a plain step takes --target-ms, then interpolate between the last two."""
    if args.batch:
        return
    args.batch, previous = 1, None
    while True:
        seconds = plain_step_seconds(args)
        if seconds * 1000 >= args.target_ms or args.batch >= args.max_batch:
            break
        previous = (args.batch, seconds)
        args.batch *= 2
    if previous is not None and seconds > previous[1]:
        low_batch, low_seconds = previous
        share = (args.target_ms / 1000 - low_seconds) / (seconds - low_seconds)
        args.batch = max(1, round(low_batch + share * (args.batch - low_batch)))


def load_base_guard(src: Path):
    """`NonFiniteGuard` from another tree's guard.py, loaded beside this tree's package."""
    path = Path(src) / "torchtriage" / "runtime" / "guard.py"
    spec = importlib.util.spec_from_file_location("torchtriage_base_guard", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.NonFiniteGuard


def measure(args, loop: Loop, modes: list[str]) -> dict[str, list[float]]:
    """Per mode, the ratios (mode / its baseline, the plain loop unless BASELINE says) of `--pairs` interleaved
    pairs of blocks."""
    rng = random.Random(0)
    baselines = sorted({BASELINE.get(mode, "plain") for mode in modes} | {"plain"})
    for mode in [*baselines, *modes]:  # warm-up: each mode's first block allocates and compiles
        loop.block(mode, args.steps)
    ratios: dict[str, list[float]] = {mode: [] for mode in modes}
    plain_times: list[float] = []
    deadline = time.perf_counter() + args.max_seconds
    for round_index in range(args.pairs):
        if round_index >= 4 and time.perf_counter() > deadline:
            break
        order = list(modes)
        rng.shuffle(order)
        for mode in order:
            baseline = BASELINE.get(mode, "plain")
            if round_index % 2 == 0:
                base, helped = loop.block(baseline, args.steps), loop.block(mode, args.steps)
            else:
                helped, base = loop.block(mode, args.steps), loop.block(baseline, args.steps)
            ratios[mode].append(helped / base)
            if baseline == "plain" or not any(BASELINE.get(m, "plain") == "plain" for m in modes):
                plain_times.append(base)  # the step time a ratio turns into microseconds
    ratios["_plain_seconds"] = plain_times
    return ratios


def skipped_step_seconds(loop: Loop, repeats: int = 2) -> dict:
    """Seconds of a guarded step that is skipped and replayed twice (`locate=True`), the slowest case."""
    from torchtriage import NonFiniteGuard

    guard = NonFiniteGuard(loop.optimizer, model=loop.model, locate=True, report_dir=loop.folder)
    times, suspect = [], None
    for _ in range(repeats):
        loop.optimizer.zero_grad(set_to_none=True)
        loss = loss_of(loop.model, loop.tokens, loop.dtype)
        loss.backward()
        first = next(p for p in loop.model.parameters() if p.grad is not None)
        first.grad.view(-1)[0] = float("inf")
        loop.sync()
        began = loop.clock()
        outcome = guard.step(loss=loss, replay=lambda: loss_of(loop.model, loop.tokens, loop.dtype))
        loop.sync()
        times.append(loop.clock() - began)
        if outcome.applied:
            raise SystemExit("the planted inf was not caught: the guard applied the step")
        suspect = guard.skipped_batches[-1].suspect
    return {"seconds": statistics.median(times), "suspect": suspect}


def summary(ratios: list[float], step_seconds: float) -> dict:
    mid, low, high = bootstrap_median(ratios)
    return {
        "ratio": mid,
        "ci95": [low, high],
        "us_per_step": (mid - 1) * step_seconds * 1e6,
        "pairs": len(ratios),
        "ratios": ratios,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (a small model) even with CUDA")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--explain", action="store_true", help="also time the guard's pieces alone")
    parser.add_argument("--target-ms", type=float, default=None, help="plain step time to size the batch for")
    parser.add_argument("--batch", type=int, default=None, help="fix the batch instead of sizing it")
    parser.add_argument("--max-batch", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=None, help="transformer blocks (6 GPU, 4 CPU)")
    parser.add_argument("--dim", type=int, default=None, help="model width (1024 GPU, 128 CPU)")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=None, help="sequence length (1024 GPU, 64 CPU)")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary (8192 GPU, 1024 CPU)")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="autocast (bf16 GPU)")
    parser.add_argument("--steps", type=int, default=None, help="steps per block (20 GPU, 8 CPU)")
    parser.add_argument("--pairs", type=int, default=None, help="pairs of blocks per mode (30 GPU, 16 CPU)")
    parser.add_argument("--max-seconds", type=float, default=None, help="stop the rounds after (240 GPU, 80 CPU)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (the CPU run only)")
    parser.add_argument("--window", type=int, default=10, help="the monitor's window, in steps")
    parser.add_argument("--base", help="also time the guard of this git revision (a temporary worktree)")
    parser.add_argument("--base-src", type=Path, help="also time the guard of this src folder")
    parser.add_argument("--json", help="write the results here (default: $OUT/helper_costs.json when OUT is set)")
    args = parser.parse_args()
    import torch

    gpu = torch.cuda.is_available() and not args.cpu
    args.cpu = not gpu
    for name, on_gpu, on_cpu in (
        ("target_ms", 18.0, 20.0),
        ("blocks", 6, 4),
        ("dim", 1024, 128),
        ("seq", 1024, 64),
        ("vocab", 8192, 1024),
        ("dtype", "bfloat16", "float32"),
        ("steps", 20, 8),
        ("pairs", 30, 16),
        ("max_seconds", 220.0, 80.0),
    ):
        if getattr(args, name) is None:
            setattr(args, name, on_gpu if gpu else on_cpu)
    args.plant = 0  # build() reads it; nothing is planted here
    if not gpu:
        torch.set_num_threads(args.threads)
    logging.getLogger("torchtriage").setLevel(logging.ERROR)  # the monitor's decisions on this one process
    modes = [m for m in args.modes.split(",") if m and m != "plain"] + ["plain"] * ("plain" in args.modes)
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; the modes are {', '.join(MODES)}")
    if args.explain:
        modes += list(EXPLAIN)
    began = time.perf_counter()
    with contextlib.ExitStack() as stack:
        base_guard = None
        if args.base or args.base_src:
            from base_tree import base_src

            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            src = stack.enter_context(base_src(args.base or "HEAD", tmp, args.base_src))
            base_guard = load_base_guard(src)
            modes.append("guard@base")
        size_batch(args)
        loop = Loop(args, base_guard)
        raw = measure(args, loop, modes)
        skipped = skipped_step_seconds(loop)
    step_seconds = statistics.median(raw.pop("_plain_seconds"))
    params = sum(p.numel() for p in loop.model.parameters())
    result = {
        "device": torch.cuda.get_device_name() if gpu else f"cpu ({torch.get_num_threads()} thread(s), CPU time)",
        "torch": torch.__version__,
        "model": f"{args.blocks} blocks, d={args.dim}, seq {args.seq}, batch {args.batch}, {args.dtype}, "
        f"{params / 1e6:.1f}M parameters, AdamW",
        "plain_step_ms": step_seconds * 1000,
        "steps_per_block": args.steps,
        "seconds": time.perf_counter() - began,
        "modes": {mode: summary(values, step_seconds) for mode, values in raw.items()},
        "skipped_step": {**skipped, "ratio": skipped["seconds"] / step_seconds},
    }
    report(result)
    target = args.json or (os.path.join(os.environ["OUT"], "helper_costs.json") if os.environ.get("OUT") else None)
    if target:
        with open(target, "w") as out:
            json.dump(result, out, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v)


def report(result: dict) -> None:
    print(f"{result['model']} on {result['device']}, torch {result['torch']}")
    print(
        f"plain step {result['plain_step_ms']:.2f} ms; blocks of {result['steps_per_block']} steps; "
        f"{result['seconds']:.0f} s in all"
    )
    print(f"  {'mode':<20} {'ratio':>7}  {'95% interval':<17} {'per step':>10}  pairs  against")
    for mode, row in result["modes"].items():
        low, high = row["ci95"]
        print(
            f"  {mode:<20} x{row['ratio']:.4f}  [{low:.4f}, {high:.4f}]  {row['us_per_step']:+8.0f} us  "
            f"{row['pairs']:>5}  {BASELINE.get(mode, 'plain')}"
        )
    skipped = result["skipped_step"]
    print(
        f"a skipped step with locate=True (two replays, nothing reproduced): {skipped['seconds']:.2f} s, "
        f"x{skipped['ratio']:.0f} a plain step (suspect: {skipped['suspect']})"
    )


if __name__ == "__main__":
    main()
