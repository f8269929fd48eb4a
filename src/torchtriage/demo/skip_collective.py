"""Demo job: one rank skips a collective, so its peers hang until gloo's timeout fires.

Run as::

    torchrun --nproc_per_node 2 skip_collective.py

The injected bug is the classic uneven-shards desync: every rank trains a tiny linear
model and all-reduces its gradients each step, but the culprit rank's data shard is
shorter, so at step ``TORCHTRIAGE_DEMO_STEP`` it leaves the training loop and goes to
the end-of-epoch barrier while the other ranks enter that step's gradient all_reduce.
Nobody ever matches them, so the waiting ranks fail with gloo's timeout.

Environment:
    TORCHTRIAGE_DEMO_TIMEOUT_S  process-group timeout in seconds (default 10)
    TORCHTRIAGE_DEMO_CULPRIT    rank whose shard runs out early (default 1)
    TORCHTRIAGE_DEMO_STEP       1-based step whose all_reduce the culprit skips (default 3)

Only torch is needed; it runs on CPU with the gloo backend.
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

FEATURES = 16
BATCH = 32
LR = 0.05
# Peers get a few steps beyond the culprit's last one so that the skipped step is
# really in the middle of their epoch, not at its end.
EXTRA_STEPS = 3
# The culprit does end-of-epoch work before its barrier. Keeping it busy for a moment
# makes the order of events deterministic: the peers, already blocked in the
# all_reduce, always hit the timeout before the culprit's barrier could.
END_OF_EPOCH_WORK_S = 1.0


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def make_shard(rank: int, num_batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    # Each rank draws different data, like a DistributedSampler would give it, from
    # the same underlying linear relation so that training actually converges.
    gen = torch.Generator().manual_seed(1000 + rank)
    true_w = torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1)
    shard = []
    for _ in range(num_batches):
        x = torch.randn(BATCH, FEATURES, generator=gen)
        y = x @ true_w + 0.1 * torch.randn(BATCH, 1, generator=gen)
        shard.append((x, y))
    return shard


def sync_gradients(model: torch.nn.Module, world_size: int) -> torch.Tensor:
    # One flat buffer and one collective per step, the way DDP buckets gradients.
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= world_size
    offset = 0
    for p in model.parameters():
        n = p.grad.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n
    return flat


def main() -> None:
    timeout_s = env_int("TORCHTRIAGE_DEMO_TIMEOUT_S", 10)
    culprit = env_int("TORCHTRIAGE_DEMO_CULPRIT", 1)
    skip_step = env_int("TORCHTRIAGE_DEMO_STEP", 3)

    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if not 0 <= culprit < world_size or skip_step < 1:
        raise SystemExit(f"need 0 <= culprit < {world_size} and step >= 1")

    # The bug: the culprit's shard holds only the batches before the skipped step.
    num_batches = skip_step - 1 if rank == culprit else skip_step + EXTRA_STEPS
    shard = make_shard(rank, num_batches)

    torch.manual_seed(0)  # identical initial weights on every rank, as DDP would broadcast
    model = torch.nn.Linear(FEATURES, 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    for step, (x, y) in enumerate(shard, start=1):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        grad = sync_gradients(model, world_size)
        opt.step()
        ms = (time.perf_counter() - t0) * 1000
        print(
            f"rank {rank} | step {step} | loss: {loss.item():.4f} | grad_norm: {grad.norm().item():.4f} | {ms:.1f} ms",
            flush=True,
        )

    with torch.no_grad():
        eval_loss = sum(torch.nn.functional.mse_loss(model(x), y).item() for x, y in shard)
    print(
        f"rank {rank} | epoch done after {len(shard)} steps | eval loss: {eval_loss / max(len(shard), 1):.4f}",
        flush=True,
    )
    time.sleep(END_OF_EPOCH_WORK_S)
    dist.barrier()  # wait for every rank to finish the epoch
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
