"""DDP, and a sharded checkpoint at a step drawn at random (the same draw on every rank: the seed is the job's)
by a helper module (checkpointing.save_sharded): each rank writes its shard, then the helper returns on every
rank but 0 *before* the barrier meant to hold rank 0 until every shard is written. Rank 0 waits in the barrier,
the others in the next step's gradient all-reduce.

3 ranks; the culprit is rank 0, the one rank in the barrier (CULPRIT ignored).
"""

import os
import random

import torch
from checkpointing import save_sharded
from common import FEATURES, finish, ready, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    rank, world = start()
    save_at = random.Random(int(os.environ.get("SEED", "5"))).randint(2, 5)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 4), nn.Tanh(), nn.Linear(4, 1)))
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    for step in range(save_at + 3):
        x = torch.randn(8, FEATURES, generator=gen)
        loss = model(x).pow(2).mean()
        loss.backward()  # [random_step_ckpt_barrier] victim waits
        opt.step()
        opt.zero_grad()
        if step == save_at:
            ready(rank)
            save_sharded(model.module, step)
    finish()


if __name__ == "__main__":
    main()
