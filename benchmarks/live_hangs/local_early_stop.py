"""DDP training with early stopping on the validation loss, decided by each rank on its own validation shard
(`if val_loss < TARGET: break`), then the final checkpoint: a barrier, then rank 0 writes the weights. The
decision is never agreed across ranks (no all_reduce of the validation loss): the culprit's shard, the clean
one, falls below the target first. The culprit leaves the epoch loop and waits in the checkpoint's barrier;
its peers go on to the next epoch and wait in its first backward (DDP's gradient all-reduce).

3 ranks; culprit: CULPRIT (default 2), whose validation shard has clean labels.
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from checkpointing import folder
from common import FEATURES, Samples, culprit, finish, ready, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

TARGET = 0.1
MAX_EPOCHS = 20
STOP_EPOCH = 6  # the culprit's validation loss first falls below TARGET at the end of this epoch


def validation_shard(rank: int, clean_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = Samples(32, seed=100 + rank)[:]
    if rank != clean_rank:  # the crowd-labelled shards
        y = y + 0.7 * torch.randn(y.shape, generator=torch.Generator().manual_seed(rank))
    return x, y


def save_final(model: nn.Module, rank: int) -> None:
    dist.barrier()  # [local_early_stop] culprit waits
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(folder(), "final.pt"))


def main() -> None:
    rank, world = start()
    clean_rank = culprit(2)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    loader = torch.utils.data.DataLoader(Samples(64, seed=rank), batch_size=16, shuffle=True)
    val_x, val_y = validation_shard(rank, clean_rank)
    for epoch in range(MAX_EPOCHS):
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()  # [local_early_stop] victim waits
            opt.step()
        if epoch == STOP_EPOCH:
            ready(rank)
        with torch.no_grad():
            val_loss = F.mse_loss(model.module(val_x), val_y).item()
        if val_loss < TARGET:
            break  # [local_early_stop] departure
    save_final(model.module, rank)
    finish()


if __name__ == "__main__":
    main()
