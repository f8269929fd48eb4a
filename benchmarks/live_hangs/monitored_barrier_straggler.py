"""DDP training over a rank's list of pre-tokenised shards, one per epoch, from the start again once the list is
done; at each epoch's end a rank caches the next epoch's shard (`ShardCache.refill`, under a lock, as the cache
is meant to be shared with a prefetch thread), then the ranks meet in `dist.monitored_barrier(timeout=...,
wait_all_ranks=True)`, which names the ranks that do not arrive in time. `refill` takes the lock by hand and
returns early, still holding it, when the next shard is cached already. One shard of the culprit failed to
upload, so its list is one short and wraps around an epoch early: at the end of the next-to-last epoch it
returns holding the lock, at the end of the last one it blocks in `lock.acquire()` and never reaches the
barrier. Rank 0's monitored_barrier raises after its timeout (1 s), naming the culprit, rank 2's fails too;
torchrun then stops the job, the culprit included. The job ends.

3 ranks; culprit: CULPRIT (default 1), whose shard list is short.
"""

import threading
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import FEATURES, Samples, culprit, finish, ready, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

SHARDS = 12
EPOCHS = 4
BARRIER_TIMEOUT = timedelta(seconds=1)


class ShardCache:
    def __init__(self, shards: list[int]) -> None:
        self.shards = shards
        self.lock = threading.Lock()
        self.loaded: dict[int, Samples] = {}

    def shard(self, epoch: int) -> int:
        return self.shards[epoch % len(self.shards)]

    def refill(self, epoch: int) -> None:
        """Cache the next epoch's shard."""
        self.lock.acquire()  # [monitored_barrier_straggler] departure
        shard = self.shard(epoch + 1)
        if shard in self.loaded:
            return  # cached already
        self.loaded[shard] = Samples(32, seed=shard)
        self.lock.release()


def main() -> None:
    rank, world = start()
    missing = {culprit(1) + world}  # the culprit's second shard never made it to the bucket
    cache = ShardCache([i for i in range(rank, SHARDS, world) if i not in missing])
    cache.loaded[cache.shard(0)] = Samples(32, seed=cache.shard(0))
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(EPOCHS):
        for x, y in torch.utils.data.DataLoader(cache.loaded[cache.shard(epoch)], batch_size=8):
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if epoch == EPOCHS - 1:
            ready(rank)
        cache.refill(epoch)
        dist.monitored_barrier(timeout=BARRIER_TIMEOUT, wait_all_ranks=True)
    finish()


if __name__ == "__main__":
    main()
