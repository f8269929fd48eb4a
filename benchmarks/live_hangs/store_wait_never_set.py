"""DDP, and rank 0 keeps the best weights (checkpointing.save_if_best) and publishes their path in the job's
store; every step the other ranks wait for that path (`store.wait` on a PrefixStore over the default store) to
load the weights for their EMA. The publication sits inside `if loss < best:`: on the first step whose loss is
no better, rank 0 publishes nothing and goes on to the next step's gradient all-reduce, while its peers wait
in `store.wait` for a key that is never set.

3 ranks; the culprit is rank 0 (CULPRIT ignored).
"""

import torch
import torch.nn.functional as F
from checkpointing import checkpoint_store, save_if_best, wait_for_best
from common import FEATURES, finish, ready, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

# The loss rank 0 sees at each step: better, better, better, then worse.
LOSSES = [1.0, 0.8, 0.7, 0.75, 0.6]


def main() -> None:
    rank, world = start()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(FEATURES, 8), nn.ReLU(), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    store = checkpoint_store()
    best = float("inf")
    gen = torch.Generator().manual_seed(rank)
    for step, reported in enumerate(LOSSES):
        if step == 3:
            ready(rank)
        x = torch.randn(16, FEATURES, generator=gen)
        loss = F.mse_loss(model(x), x[:, :1])
        loss.backward()  # [store_wait_never_set] culprit waits
        opt.step()
        opt.zero_grad()
        if rank == 0:
            best = save_if_best(model.module, step, reported, best, store)
        else:
            wait_for_best(step, store)
    finish()


if __name__ == "__main__":
    main()
