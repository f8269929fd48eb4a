"""DDP, and an early-stopping check each rank makes on its own validation loss (a helper that leaves with
`os._exit(0)` once the loss is below target, skipping the interpreter's teardown, as jobs whose threads hang
at exit do). The culprit's shard converges first: it exits with status 0 while its peers go on to the next
step's gradient all-reduce.

3 ranks; culprit: CULPRIT (default 2).
"""

import os

import torch
import torch.nn.functional as F
from common import FEATURES, culprit, finish, ready, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

TARGET = 0.05


def stop_if_converged(val_loss: float, rank: int) -> None:
    if val_loss < TARGET:
        print(f"rank {rank}: validation loss {val_loss:.4f} below {TARGET}: stopping", flush=True)
        os._exit(0)  # [os_exit_early_stop] departure


def main() -> None:
    rank, world = start()
    stopping_rank = culprit(2)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(FEATURES, 8), nn.ReLU(), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    for step in range(8):
        if step == 3:
            ready(rank)
        x = torch.randn(16, FEATURES, generator=gen)
        loss = F.mse_loss(model(x), x[:, :1])
        loss.backward()  # [os_exit_early_stop] victim waits
        opt.step()
        opt.zero_grad()
        # The culprit's validation shard is easy: its loss drops under the target at step 3.
        val_loss = 0.01 if (rank == stopping_rank and step == 3) else 1.0 / (step + 1)
        stop_if_converged(val_loss, rank)
    finish()


if __name__ == "__main__":
    main()
