"""DDP with hard-example mining: at the end of every epoch rank 0 ranks its own samples by loss and sends the
indices of the hardest ones to every rank (`dist.broadcast_object_list`), which replay them in the next epoch.
Rank 0 calls the broadcast inside its mining helper, after an early return for "nothing mined" (no sample above
the loss threshold: why send an empty list?); the other ranks call it unconditionally, to receive. Once the
model is good enough, rank 0 mines nothing: it returns before the broadcast and goes on to the next epoch,
whose first backward (DDP's gradient all-reduce) meets its peers' broadcast of the object sizes. The culprit
waits in `loss.backward()`, its peers in `broadcast_object_list`.

3 ranks; the culprit is rank 0, the miner (CULPRIT ignored).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import FEATURES, Samples, finish, ready, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

EPOCHS = 20
HARD_LOSS = 0.5
READY_EPOCH = 10  # rank 0 first mines nothing at the end of this epoch


def share_hard_examples(model: nn.Module, data: Samples, rank: int) -> list[int]:
    box: list = [None]
    if rank == 0:
        with torch.no_grad():
            losses = ((model(data.x) - data.y) ** 2).squeeze(1)
        hard = (losses > HARD_LOSS).nonzero().squeeze(1).tolist()
        if not hard:
            return []  # [rpc_or_object_list_deadlock] departure
        box[0] = hard
    dist.broadcast_object_list(box, src=0)  # [rpc_or_object_list_deadlock] victim waits
    return box[0]


def main() -> None:
    rank, world = start()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = Samples(64, seed=rank)
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
    hard: list[int] = []
    for epoch in range(EPOCHS):
        if epoch == READY_EPOCH:
            ready(rank)
        batches = list(loader) + ([data[hard[: len(data)]]] if hard else [])
        for x, y in batches:
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()  # [rpc_or_object_list_deadlock] culprit waits
            opt.step()
        hard = share_hard_examples(model.module, data, rank)
    finish()


if __name__ == "__main__":
    main()
