"""DDP training with a guard that skips a batch whose loss is not finite (`if not torch.isfinite(loss):
continue`), placed before `loss.backward()`. One record of the culprit's shard is corrupt (a feature parsed as
inf): on that step the culprit alone skips its backward, and with it DDP's gradient all-reduce. Nothing hangs
there: on gloo each later all-reduce of the culprit pairs with its peers' previous one (one bucket, the same
size every step), so the epoch runs on one exchange out of step. At the end of the epoch the culprit reaches
the all_gather of the per-rank epoch losses while its peers are in the epoch's last backward: the culprit waits
in the all_gather, its peers in the gradient all-reduce of that backward.

3 ranks; culprit: CULPRIT (default 1), whose shard holds the corrupt record.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import FEATURES, Samples, culprit, finish, ready, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

BATCH = 8
BAD_STEP = 3  # the corrupt record sits in this batch of the culprit's shard
EPOCHS = 2


def load_shard(rank: int, bad_rank: int) -> torch.utils.data.Dataset:
    shard = Samples(64, seed=20 + rank)
    if rank == bad_rank:
        shard.x[BAD_STEP * BATCH + 5, 3] = float("inf")  # a malformed field, parsed as inf
    return shard


def main() -> None:
    rank, world = start()
    bad_rank = culprit(1)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(FEATURES, 32), nn.GELU(), nn.Linear(32, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(load_shard(rank, bad_rank), batch_size=BATCH)
    for epoch in range(EPOCHS):
        total, batches, skipped = torch.zeros(1), 0, 0
        for step, (x, y) in enumerate(loader):
            if epoch == 0 and step == BAD_STEP:
                ready(rank)
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(x), y)
            if not torch.isfinite(loss):
                skipped += 1
                continue  # [nan_loss_skip_ddp] departure
            loss.backward()  # [nan_loss_skip_ddp] victim waits
            opt.step()
            total += loss.detach()
            batches += 1
        epoch_losses = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(epoch_losses, total / max(batches, 1))  # [nan_loss_skip_ddp] culprit waits
        if rank == 0:
            print(f"epoch {epoch}: losses {[round(t.item(), 4) for t in epoch_losses]}", flush=True)
    finish()


if __name__ == "__main__":
    main()
