"""FSDP1 (`FullyShardedDataParallel`, one unit per block and one at the root) with gradient accumulation: four
micro-steps per optimizer step, the first three under `model.no_sync()`, the last one reduce-scatters the
accumulated gradients. Each micro-batch is cleaned first (samples with a missing feature, NaN, are dropped) and
the ranks all_reduce the number of samples they kept, to normalise the loss by the global count. On one step the
culprit's second micro-batch is all NaN (a corrupt shard file): it skips that micro-step (`continue`) before the
count exchange, so from then on its collectives pair off by one with its peers' (FSDP1 all-gathers the
parameters in every micro-step's forward, under no_sync too): its last micro-step's backward, FSDP's
reduce-scatter issued from an autograd hook, is posted while its peers all-gather in a forward. The culprit waits
in `loss.backward()` (reduce_scatter), its peers in the FSDP forward's all_gather.

3 ranks; culprit: CULPRIT (default 0).
"""

from contextlib import nullcontext

import torch
import torch.distributed as dist
from common import FEATURES, Samples, culprit, finish, ready, start
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

HEALTHY_STEPS = 2
MICRO_STEPS = 4
MICRO_BATCH = 6


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ff = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.ff(h)


def global_count(n: int) -> torch.Tensor:
    count = torch.tensor([float(n)])
    dist.all_reduce(count)
    return count


def train_step(model: nn.Module, opt, micro_batches, step: int, rank: int, bad_rank: int) -> None:
    for micro, (x, y) in enumerate(micro_batches):
        with nullcontext() if micro == MICRO_STEPS - 1 else model.no_sync():
            if step == HEALTHY_STEPS and rank == bad_rank and micro == 1:
                x = torch.full_like(x, float("nan"))  # a corrupt micro-batch
            keep = ~x.isnan().any(dim=1)
            x, y = x[keep], y[keep]
            if len(x) == 0:
                continue  # [fsdp1_no_sync_mismatch] departure
            out = model(x)  # [fsdp1_no_sync_mismatch] victim waits
            loss = ((out - y) ** 2).sum() / global_count(len(x))
            loss.backward()  # [fsdp1_no_sync_mismatch] culprit waits
    opt.step()
    opt.zero_grad(set_to_none=True)


def main() -> None:
    rank, world = start()
    bad_rank = culprit(0)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(FEATURES, 16), Block(16), Block(16), nn.Linear(16, 1))
    model = FSDP(net, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = Samples(MICRO_BATCH * MICRO_STEPS * (HEALTHY_STEPS + 2), seed=20 + rank)
    batches = iter(torch.utils.data.DataLoader(data, batch_size=MICRO_BATCH))
    for step in range(HEALTHY_STEPS + 2):
        if step == HEALTHY_STEPS:
            ready(rank)
        train_step(model, opt, [next(batches) for _ in range(MICRO_STEPS)], step, rank, bad_rank)
    finish()


if __name__ == "__main__":
    main()
