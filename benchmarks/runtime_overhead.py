"""What the always-on runtime helpers cost per training step: HangWatchdog, NonFiniteGuard, init_distributed.

Run (the script launches its own torchrun jobs; on CPU with gloo, on GPUs with NCCL):

    python benchmarks/runtime_overhead.py                      # 2 ranks, gloo on CPU
    python benchmarks/runtime_overhead.py --nproc 8            # 8 GPUs, NCCL, when CUDA is available
    python benchmarks/runtime_overhead.py --jobs 4 --blocks 16 --steps 40

A small transformer (DDP, AdamW) trains for `--blocks` blocks of `--steps` steps in each job. Blocks
alternate, in ABBA order so neither kind always runs first or warmer, between

- plain:   `loss.backward(); optimizer.step()`, no watchdog thread;
- helpers: a running `HangWatchdog` fed `progress()` each step, and `NonFiniteGuard.step()` instead of
  `optimizer.step()` (global grad norm, one all-reduce of two floats, one device-to-host copy).

A block's time is the slowest rank's; the per-step overhead is the median of the paired (helpers / plain)
ratios, with a 95% bootstrap interval as its noise. The jobs alternate between a process group made by
`init_distributed()` (flight recorder armed: TORCH_FR_BUFFER_SIZE=20000, dump on timeout) and one made
by a plain `init_process_group`; comparing their plain blocks gives the cost of the armed setup (a
cross-process comparison, so noisier). Finally the pieces of the guard's cost are timed alone on rank 0
(the all-reduce of two floats, the norm pass) to say what dominates. Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULT_PREFIX = "RUNTIME_OVERHEAD_RESULT "


# -- the worker: one torchrun job ---------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from torchtriage import HangWatchdog, NonFiniteGuard, init_distributed

    cuda = torch.cuda.is_available() and not args.cpu
    backend = "nccl" if cuda else "gloo"
    if args.setup == "helpers":
        init_distributed(backend)
    else:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend, device_id=torch.device("cuda", local_rank) if cuda else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(args.dim, args.heads, 4 * args.dim, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False).to(device)
    head = torch.nn.Linear(args.dim, 1).to(device)
    net = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(model, head))
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
    guard = NonFiniteGuard(optimizer)
    x = torch.randn(args.batch, args.seq, args.dim, device=device, generator=None)
    target = torch.randn(args.batch, args.seq, 1, device=device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
    hang_dir = Path(tempfile.gettempdir()) / f"tt-overhead-{os.getpid()}"  # written to only on a stall

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def block(kind: str) -> float:
        watchdog = HangWatchdog(stall_seconds=600, out_dir=hang_dir).start() if kind == "helpers" else None
        dist.barrier()
        sync()
        started = time.perf_counter()
        for _ in range(args.steps):
            with autocast:
                loss = torch.nn.functional.mse_loss(net(x).float(), target)
            loss.backward()
            if watchdog is None:
                optimizer.step()
            else:
                guard.step()
                watchdog.progress()
            optimizer.zero_grad(set_to_none=True)
        sync()
        elapsed = (time.perf_counter() - started) / args.steps
        if watchdog is not None:
            watchdog.stop()
        return elapsed

    for _ in range(args.warmup):
        block("plain")
        block("helpers")
    times: dict[str, list[float]] = {"plain": [], "helpers": []}
    for index in range(args.blocks):
        order = ("plain", "helpers") if index % 4 in (0, 3) else ("helpers", "plain")  # ABBA
        for kind in order:
            times[kind].append(block(kind))
    # A step is as slow as its slowest rank.
    for kind in times:
        local = torch.tensor(times[kind], dtype=torch.float64, device=device)
        dist.all_reduce(local, op=dist.ReduceOp.MAX)
        times[kind] = local.tolist()

    pieces = guard_pieces(net, guard, device, sync, args.steps * 4)
    dist.barrier()
    if rank == 0:
        params = sum(p.numel() for p in net.parameters())
        result = {
            "setup": args.setup,
            "world": world,
            "backend": backend,
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "params": params,
            "threads": torch.get_num_threads(),
            "times": times,
            "pieces": pieces,
        }
        print(RESULT_PREFIX + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    shutil.rmtree(hang_dir, ignore_errors=True)


def guard_pieces(net, guard, device, sync, iterations: int) -> dict[str, float]:
    """Seconds per call of what NonFiniteGuard.step adds, each piece alone (every rank runs them together)."""
    import torch
    import torch.distributed as dist

    for p in net.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)

    def timed(fn) -> float:
        for _ in range(10):
            fn()
        sync()
        dist.barrier()
        started = time.perf_counter()
        for _ in range(iterations):
            fn()
        sync()
        return (time.perf_counter() - started) / iterations

    pair = torch.zeros(2, dtype=torch.float32, device=device)
    return {
        "norm pass over the gradients": timed(lambda: guard._squares.of_grads()),
        "all-reduce of two floats": timed(lambda: dist.all_reduce(pair)),
        "device-to-host copy of two floats": timed(lambda: pair.tolist()),
    }


# -- the driver ---------------------------------------------------------------------------------
def bootstrap_median(values: list[float], rounds: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(rounds))
    return statistics.median(values), medians[int(0.025 * rounds)], medians[int(0.975 * rounds)]


def percent(value: float) -> str:
    return f"{value * 100:+.2f}%"


def launch(args: argparse.Namespace, setup: str) -> dict:
    torchrun = Path(sys.executable).parent / "torchrun"
    command = [
        str(torchrun) if torchrun.exists() else "torchrun",
        "--standalone",
        "--nproc_per_node",
        str(args.nproc),
        __file__,
        "--worker",
        "--setup",
        setup,
        *args.forward,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.job_timeout)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    raise SystemExit(f"the {setup} job failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--setup", choices=("helpers", "plain"), default="helpers", help=argparse.SUPPRESS)
    parser.add_argument("--nproc", type=int, default=None, help="ranks per job (default: GPUs, or 2 on CPU)")
    parser.add_argument("--jobs", type=int, default=4, help="torchrun jobs, alternating the two setups")
    parser.add_argument("--blocks", type=int, default=12, help="blocks per kind per job")
    parser.add_argument("--steps", type=int, default=None, help="steps per block (default: 50 GPU, 20 CPU)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up block pairs per job")
    parser.add_argument("--cpu", action="store_true", help="use gloo on CPU even where CUDA is available")
    parser.add_argument("--dim", type=int, default=None, help="model width (default: 1024 GPU, 128 CPU)")
    parser.add_argument("--layers", type=int, default=None, help="encoder layers (default: 8 GPU, 2 CPU)")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default: 512 GPU, 64 CPU)")
    parser.add_argument("--batch", type=int, default=None, help="batch per rank (default: 8)")
    parser.add_argument("--job-timeout", type=float, default=900)
    args = parser.parse_args()

    import torch

    gpu = torch.cuda.is_available() and not args.cpu
    args.steps = args.steps or (50 if gpu else 20)
    args.dim = args.dim or (1024 if gpu else 128)
    args.layers = args.layers or (8 if gpu else 2)
    args.seq = args.seq or (512 if gpu else 64)
    args.batch = args.batch or 8
    if args.worker:
        worker(args)
        return
    args.nproc = args.nproc or (torch.cuda.device_count() if gpu else 2)
    args.forward = (
        [f"--{name}={getattr(args, name)}" for name in ("blocks", "steps", "warmup", "dim", "layers", "heads", "seq")]
        + [f"--batch={args.batch}"]
        + (["--cpu"] if args.cpu else [])
    )

    results = []
    for index in range(args.jobs):
        setup = ("helpers", "plain")[index % 2] if index % 4 < 2 else ("plain", "helpers")[index % 2]
        results.append(launch(args, setup))
        print(f"job {index + 1}/{args.jobs} ({setup}) done", file=sys.stderr, flush=True)

    first = results[0]
    print(
        f"{first['world']} ranks, {first['backend']} on {first['device']}, {first['threads']} threads/rank; "
        f"transformer {args.layers}x{args.dim}, seq {args.seq}, batch {args.batch}/rank, "
        f"{first['params'] / 1e6:.1f}M params; {args.jobs} jobs x {args.blocks} block pairs x {args.steps} steps"
    )
    plain_all = [t for r in results for t in r["times"]["plain"]]
    step = statistics.median(plain_all)
    print(f"step time, plain: {step * 1e3:.2f} ms (median of {len(plain_all)} blocks)")

    ratios = [h / p - 1 for r in results for p, h in zip(r["times"]["plain"], r["times"]["helpers"], strict=True)]
    mid, low, high = bootstrap_median(ratios)
    print(
        f"guard + watchdog vs plain step (paired blocks, same job): {percent(mid)} "
        f"(95% CI {percent(low)} .. {percent(high)}, {len(ratios)} pairs)"
    )
    # The noise floor: the same comparison between neighbouring plain blocks (an A/A test).
    aa = [b / a - 1 for r in results for a, b in zip(r["times"]["plain"][::2], r["times"]["plain"][1::2], strict=False)]
    if aa:
        aa_mid, aa_low, aa_high = bootstrap_median(aa)
        print(f"noise floor, plain vs plain blocks: {percent(aa_mid)} (95% CI {percent(aa_low)} .. {percent(aa_high)})")

    by_setup = {s: [t for r in results if r["setup"] == s for t in r["times"]["plain"]] for s in ("helpers", "plain")}
    if by_setup["helpers"] and by_setup["plain"]:
        armed = statistics.median(by_setup["helpers"]) / statistics.median(by_setup["plain"]) - 1
        print(f"init_distributed (flight recorder armed) vs plain init_process_group, plain steps: {percent(armed)} "
              "(across separate jobs: compare with the noise floor)")  # fmt: skip
        helpers_all = [t for r in results if r["setup"] == "helpers" for t in r["times"]["helpers"]]
        total = statistics.median(helpers_all) / statistics.median(by_setup["plain"]) - 1
        print(f"all helpers (init_distributed + guard + watchdog) vs none: {percent(total)}")

    pieces = first["pieces"]
    print("what the guard adds per step, each piece timed alone (rank 0):")
    for name, seconds in pieces.items():
        print(f"  {name:34s} {seconds * 1e6:9.1f} us  ({seconds / step * 100:.3f}% of a plain step)")


if __name__ == "__main__":
    main()
