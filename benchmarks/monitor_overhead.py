"""What the step monitor costs per training step, monitor on against off, side by side in one job.

Run (the script launches its own torchrun job):

    python benchmarks/monitor_overhead.py                  # 2 ranks, gloo on CPU, steps of >= 100 ms
    python benchmarks/monitor_overhead.py --nproc 1        # one GPU when CUDA is available (a real model)
    python benchmarks/monitor_overhead.py --blocks 16 --steps 20 --window 10

A DDP model trains in blocks of `--steps` steps. Blocks alternate in ABBA order between the monitor
off and on (`StepMonitor(...).start()` before the block, `close()` after, window `--window`, so each
"on" block holds its exchanges and decisions); a block's time is its slowest rank's. The overhead is
the median of the paired (on / off) ratios, with the spread of those ratios as its noise. Nothing here
runs in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULT_PREFIX = "MONITOR_OVERHEAD_RESULT "


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from torchtriage import StepMonitor

    cuda = torch.cuda.is_available() and not args.cpu
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    width = args.width
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*layers).to(device), device_ids=[device.index] if cuda else None
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.utils.data.TensorDataset(torch.randn(4096, width), torch.randn(4096, width))
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True)
    batches = iter(loader)

    def step() -> None:
        nonlocal batches
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()

    def block(monitored: bool) -> float:
        monitor = StepMonitor(args.out, window=args.window, step_on="optimizer").start() if monitored else None
        if cuda:
            torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(args.steps):
            step()
        if cuda:
            torch.cuda.synchronize()
        spent = time.perf_counter() - began
        if monitor is not None:
            monitor.close()
        slowest = torch.tensor([spent], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return float(slowest.item()) / args.steps

    for _ in range(3):  # warm-up
        step()
    off, on = [], []
    for index in range(args.blocks):
        monitored = index % 4 in (1, 2)  # ABBA: off, on, on, off, ...
        (on if monitored else off).append(block(monitored))
    direct = direct_cost(args, StepMonitor, device)
    if rank == 0:
        ratios = [b / a for a, b in zip(off, on, strict=False)]
        print(
            RESULT_PREFIX
            + json.dumps(
                {
                    "device": torch.cuda.get_device_name() if cuda else "cpu",
                    "ranks": dist.get_world_size(),
                    "step_ms_off": statistics.median(off) * 1000,
                    "step_ms_on": statistics.median(on) * 1000,
                    "overhead": statistics.median(ratios) - 1,
                    "direct_us_per_step": direct * 1e6,
                    "ratios": ratios,
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()


def direct_cost(args, StepMonitor, device) -> float:
    """The monitor's own time per step, alone: its step boundary, the wrapped `__next__` and backward.

    A loop of empty steps through the same wrappers, with and without the monitor: the difference is
    what each training step pays, without the noise of the training around it.
    """
    import torch

    x = torch.ones(4, device=device, requires_grad=True)
    loader = torch.utils.data.DataLoader(range(10**6), batch_size=1)

    def loop(monitor, n: int) -> float:
        batches = iter(loader)
        began = time.perf_counter()
        for _ in range(n):
            next(batches)
            (x * 2).sum().backward()
            if monitor is not None:
                monitor.step()
        return (time.perf_counter() - began) / n

    n = 2000
    plain = min(loop(None, n) for _ in range(3))
    monitor = StepMonitor(None, window=args.window).start()
    monitored = min(loop(monitor, n) for _ in range(3))
    monitor.close()
    return max(0.0, monitored - plain)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20, help="steps per block")
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    torchrun = Path(sys.executable).parent / "torchrun"
    with tempfile.TemporaryDirectory() as out:
        options = [
            f"--{name}={getattr(args, name)}" for name in ("blocks", "steps", "window", "width", "layers", "batch")
        ]
        done = subprocess.run(
            [str(torchrun), "--standalone", "--nproc_per_node", str(args.nproc), __file__, "--worker", "--out", out]
            + options
            + (["--cpu"] if args.cpu else []),
            capture_output=True,
            text=True,
        )
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith(RESULT_PREFIX)), None)
    if line is None:
        print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
        sys.exit(1)
    result = json.loads(line[len(RESULT_PREFIX) :])
    spread = statistics.pstdev(result["ratios"]) if len(result["ratios"]) > 1 else 0.0
    share = result["direct_us_per_step"] / 10 / result["step_ms_off"]  # us over ms, in percent
    print(
        f"{result['ranks']} rank(s) on {result['device']}: step {result['step_ms_off']:.1f} ms off, "
        f"{result['step_ms_on']:.1f} ms on: overhead {result['overhead'] * 100:+.2f}% "
        f"(paired ratios' spread {spread * 100:.2f}%); the monitor's own cost: "
        f"{result['direct_us_per_step']:.1f} us per step = {share:.3f}% of the step"
    )


if __name__ == "__main__":
    main()
