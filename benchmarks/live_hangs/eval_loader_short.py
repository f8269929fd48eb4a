"""DDP training, then an evaluation pass under torch.no_grad fed by a DataLoader over each rank's own shard of
the validation set, split by hand (`range(rank, n, world)`): the shards differ in length by one sample, and
with batch_size 4 the culprit's loader yields one batch fewer. Each eval batch's correct count is summed across
ranks (`all_reduce`); the culprit leaves the eval loop one batch early and waits in the `all_gather` of the
per-rank eval losses after it, while its peers wait in the all_reduce of their last batch.

3 ranks; the culprit is rank 2 (26 validation samples: ranks 0 and 1 hold 9, rank 2 holds 8).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import FEATURES, Samples, finish, ready, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

TRAIN_STEPS = 3
VAL_SAMPLES = 3 * 8 + 2  # ranks 0 and 1 hold 9 samples (3 batches of 4, the last of 1), rank 2 holds 8 (2 batches)


def evaluate(model: nn.Module, loader: torch.utils.data.DataLoader, world: int) -> list[torch.Tensor]:
    model.eval()
    total, correct = torch.zeros(1), torch.zeros(1)
    with torch.no_grad():
        for x, y in loader:  # [eval_loader_short] departure
            pred = model(x)
            hits = ((pred - y).abs() < 0.5).float().sum().reshape(1)
            dist.all_reduce(hits)
            correct += hits
            total += F.mse_loss(pred, y, reduction="sum")
    losses = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(losses, total)  # [eval_loader_short] culprit waits
    model.train()
    return losses


def main() -> None:
    rank, world = start()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(FEATURES, 24), nn.Tanh(), nn.Linear(24, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train = torch.utils.data.DataLoader(Samples(64, seed=rank), batch_size=16, shuffle=True)
    val_set = Samples(VAL_SAMPLES, seed=99)
    val_shard = torch.utils.data.Subset(val_set, range(rank, VAL_SAMPLES, world))
    val = torch.utils.data.DataLoader(val_shard, batch_size=4)
    for step, (x, y) in enumerate(train):
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step + 1 == TRAIN_STEPS:
            break
    ready(rank)
    evaluate(model.module, val, world)
    finish()


if __name__ == "__main__":
    main()
