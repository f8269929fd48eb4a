"""What TORCH_NCCL_ENABLE_TIMING=1 costs a training job on NCCL (GPUs only; nothing here runs in CI).

With it, ProcessGroupNCCL records a start event before each collective, and the flight recorder can tell a
rank whose GPU never began a collective ("scheduled") from peers that began it and wait inside it
("started"): the one reading that names a rank whose device stopped before a collective (a kernel that
never ends, a wedged GPU) while every rank's Python waits alike. `torchtriage run` turns it on only if that
is nearly free; this script measures it.

    python benchmarks/nccl_timing_cost.py                 # 2 ranks (sharing GPUs if there are fewer)
    python benchmarks/nccl_timing_cost.py --ranks 8 --timed-blocks 24

One torchrun job; each rank holds two process groups over the same ranks, made alike except that the second
is made with TORCH_NCCL_ENABLE_TIMING=1 (ProcessGroupNCCL reads it when a group is constructed). Timed
blocks alternate between them in ABBA order, in the same processes, so the ratio is not a comparison of two
jobs. Two workloads:

- `ops`: a burst of small all-reduces (host-bound: the worst case), reported as microseconds per collective;
- `ddp`: DDP training steps of a small GPT with small buckets (many all-reduces per step), one DDP copy of
  the model per group, reported as the step-time ratio.

Each block's time is the slowest rank's; the ratio is the median of paired (timing / plain) ratios with a 95%
bootstrap interval.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from runtime_overhead import bootstrap_median

RESULT_PREFIX = "NCCL_TIMING_COST "


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from nonfinite_overhead import build, loss_of
    from torch.nn.parallel import DistributedDataParallel as DDP

    local = int(os.environ["LOCAL_RANK"])
    if local >= torch.cuda.device_count():
        os.environ["NCCL_HOSTID"] = f"timing-cost-rank-{os.environ['RANK']}"  # a GPU shared: another host to NCCL
    torch.cuda.set_device(local % torch.cuda.device_count())
    os.environ.pop("TORCH_NCCL_ENABLE_TIMING", None)
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    ranks = list(range(dist.get_world_size()))
    groups = {}
    # Which group (and DDP copy) is made first is a confound of its own (memory placement, communicator
    # set-up): --timing-first swaps it, and a cost is real only if it holds in both orders.
    for name in ("timing", "plain") if args.timing_first else ("plain", "timing"):
        if name == "timing":
            os.environ["TORCH_NCCL_ENABLE_TIMING"] = "1"
        groups[name] = dist.new_group(ranks)
        os.environ.pop("TORCH_NCCL_ENABLE_TIMING", None)

    small = torch.ones(256, device="cuda")

    def ops_block(group) -> float:
        start = time.perf_counter()
        for _ in range(args.ops):
            dist.all_reduce(small, group=group)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    tokens = build(args)[1]
    models = {
        name: DDP(build(args)[0], process_group=group, bucket_cap_mb=args.bucket_mb) for name, group in groups.items()
    }
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=1e-4) for name, m in models.items()}

    def ddp_block(name: str) -> float:
        net, opt = models[name], optimizers[name]
        start = time.perf_counter()
        for _ in range(args.steps):
            loss_of(net, tokens, torch.bfloat16).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    def slowest(seconds: float) -> float:
        value = torch.tensor([seconds], device="cuda")
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return float(value.item())

    for name in groups:  # warm up both arms
        ops_block(groups[name])
        ddp_block(name)
    times: dict[str, dict[str, list[float]]] = {"ops": {"plain": [], "timing": []}, "ddp": {"plain": [], "timing": []}}
    order = ["plain", "timing", "timing", "plain"]
    for block in range(args.timed_blocks):
        name = order[block % 4]
        times["ops"][name].append(slowest(ops_block(groups[name])))
        times["ddp"][name].append(slowest(ddp_block(name)))
    if dist.get_rank() == 0:
        print(RESULT_PREFIX + json.dumps({"times": times}), flush=True)
    dist.destroy_process_group()


def report(result: dict, args: argparse.Namespace) -> None:
    times = result["times"]
    ops = times["ops"]
    extra_us = [(t - p) / args.ops * 1e6 for p, t in zip(ops["plain"], ops["timing"], strict=True)]
    plain_us = statistics.median(ops["plain"]) / args.ops * 1e6
    med, lo, hi = bootstrap_median(extra_us)
    print(f"small all-reduce burst ({args.ops} per block): plain {plain_us:.1f} us per collective;")
    print(f"  timing adds {med:+.2f} us per collective [95% CI {lo:+.2f}, {hi:+.2f}]")
    ddp = times["ddp"]
    ratios = [t / p for p, t in zip(ddp["plain"], ddp["timing"], strict=True)]
    med, lo, hi = bootstrap_median(ratios)
    step_ms = statistics.median(ddp["plain"]) / args.steps * 1e3
    print(f"DDP steps (bucket_cap_mb={args.bucket_mb}, {step_ms:.1f} ms per step plain):")
    print(f"  timing x{med:.4f} [95% CI {lo:.4f}, {hi:.4f}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, default=2, help="torchrun processes")
    parser.add_argument("--timed-blocks", type=int, default=16, help="timed blocks (a multiple of 4: ABBA)")
    parser.add_argument("--ops", type=int, default=2000, help="all-reduces per `ops` block")
    parser.add_argument("--steps", type=int, default=20, help="DDP steps per `ddp` block")
    parser.add_argument("--bucket-mb", type=float, default=1.0)
    parser.add_argument("--timing-first", action="store_true", help="make the timed group and its model first")
    parser.add_argument("--blocks", type=int, default=8, help="the model's transformer blocks")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--json", help="also write the raw times here")
    args = parser.parse_args()
    args.cpu = False  # nonfinite_overhead.build() reads it
    if args.worker:
        worker(args)
        return
    torchrun = Path(sys.executable).parent / "torchrun"
    command = [str(torchrun) if torchrun.exists() else "torchrun", "--standalone", "--nproc_per_node", str(args.ranks)]
    command += [__file__, "--worker", *sys.argv[1:]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-4000:])
        sys.exit(f"the torchrun job failed (exit {done.returncode})")
    result = json.loads(lines[-1][len(RESULT_PREFIX) :])
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    report(result, args)


if __name__ == "__main__":
    main()
