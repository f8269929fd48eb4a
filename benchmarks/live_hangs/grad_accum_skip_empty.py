"""DDP with gradient accumulation: four micro-steps per optimizer step, the first three under `no_sync()`.
Each micro-batch is filtered (samples whose target is out of range are dropped) and the ranks exchange the
number of samples they kept (`all_gather`) to normalise the loss. On one step every sample of the culprit's
second micro-batch is out of range: it skips that micro-step (`continue`) before the exchange, so its later
exchanges pair with its peers' earlier ones, and its last micro-step's backward (DDP's gradient all-reduce,
issued from autograd hooks) meets its peers' last exchange. The culprit waits in `loss.backward()`, its peers
in the all_gather of their last micro-step.

3 ranks; culprit: CULPRIT (default 1).
"""

from contextlib import nullcontext

import torch
import torch.distributed as dist
from common import FEATURES, Samples, culprit, finish, ready, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

HEALTHY_STEPS = 2
MICRO_STEPS = 4
MICRO_BATCH = 6


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 16), nn.GELU(), nn.Linear(16, 16), nn.GELU())
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def kept_counts(n: int) -> torch.Tensor:
    counts = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, torch.tensor([float(n)]))  # [grad_accum_skip_empty] victim waits
    return torch.cat(counts)


def train_step(model: nn.Module, opt, micro_batches, step: int, rank: int, bad_rank: int) -> None:
    for micro, (x, y) in enumerate(micro_batches):
        sync = micro == MICRO_STEPS - 1
        with nullcontext() if sync else model.no_sync():
            if step == HEALTHY_STEPS and rank == bad_rank and micro == 1:
                y = y + 100.0  # a corrupt micro-batch: every target out of range
            keep = y.abs().squeeze(1) < 50
            x, y = x[keep], y[keep]
            if len(x) == 0:
                continue  # [grad_accum_skip_empty] departure
            counts = kept_counts(len(x))
            loss = ((model(x) - y) ** 2).sum() / counts.sum()
            loss.backward()  # [grad_accum_skip_empty] culprit waits
    opt.step()
    opt.zero_grad(set_to_none=True)


def main() -> None:
    rank, world = start()
    bad_rank = culprit(1)
    torch.manual_seed(0)
    model = DDP(Regressor())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = Samples(MICRO_BATCH * MICRO_STEPS * (HEALTHY_STEPS + 2), seed=10 + rank)
    loader = torch.utils.data.DataLoader(data, batch_size=MICRO_BATCH)
    batches = iter(loader)
    for step in range(HEALTHY_STEPS + 2):
        if step == HEALTHY_STEPS:
            ready(rank)
        train_step(model, opt, [next(batches) for _ in range(MICRO_STEPS)], step, rank, bad_rank)
    finish()


if __name__ == "__main__":
    main()
