"""DDP training with a loss-spike guard that also keeps the learning rate in sync: after every step the ranks
broadcast the learning rate (`dist.broadcast(lr, src=leader)`) from rank 0, unless a rank saw its loss spike,
in which case that rank halves its learning rate and becomes the leader, so that everyone takes its new value.
The leader is decided by each rank on its own loss (`leader = rank if spiked else 0`) and never agreed. On one
step a corrupt batch makes the culprit's loss spike: it broadcasts as the source (src = itself) while its peers
broadcast from rank 0. Gloo's broadcast pairs the root's sends with the other ranks' receives: the two ranks
that believe they are the source wait on each other, and the third rank, which received rank 0's value, goes on
to the next step and waits in DDP's gradient all-reduce.

3 ranks; culprit: CULPRIT (default 1).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import FEATURES, Samples, culprit, finish, ready, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 8
SPIKE_STEP = 4
SPIKE_FACTOR = 10.0


def sync_lr(opt: torch.optim.Optimizer, leader: int) -> None:
    lr = torch.tensor([opt.param_groups[0]["lr"]])
    dist.broadcast(lr, src=leader)  # [broadcast_wrong_src] culprit waits
    for group in opt.param_groups:
        group["lr"] = lr.item()


def main() -> None:
    rank, world = start()
    bad_rank = culprit(1)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    loader = torch.utils.data.DataLoader(Samples(16 * STEPS, seed=rank), batch_size=16)
    running = None
    for step, (x, y) in enumerate(loader):
        if step == SPIKE_STEP:
            ready(rank)
            if rank == bad_rank:
                y = y * 50.0  # a corrupt batch: labels in the wrong unit
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()  # [broadcast_wrong_src] victim waits
        opt.step()
        spiked = running is not None and loss.item() > SPIKE_FACTOR * running
        if spiked:
            for group in opt.param_groups:
                group["lr"] /= 2
        leader = rank if spiked else 0  # [broadcast_wrong_src] departure
        sync_lr(opt, leader)
        running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
    finish()


if __name__ == "__main__":
    main()
