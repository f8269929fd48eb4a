"""DDP with `ZeroRedundancyOptimizer` (Adam states sharded over the ranks; each `step()` updates the rank's own
partition, then broadcasts every partition from its owner so that all ranks hold the new weights) and a
loss-spike guard: a step whose loss is far above the running mean is skipped (`continue` before
`optimizer.step()`), as one would skip a bad batch on one GPU. The guard looks at the rank's own loss, never
agreed: on one step a corrupt batch makes only the culprit's loss spike. It skips `step()`, so it skips the
partition broadcasts, and goes on to the next step, whose backward (DDP's gradient all-reduce) meets its peers'
broadcasts. The culprit waits in `loss.backward()`, its peers in the optimizer's broadcasts inside `step()`.

3 ranks; culprit: CULPRIT (default 2).
"""

import torch
import torch.nn.functional as F
from common import FEATURES, Samples, culprit, finish, ready, start
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 8
SPIKE_STEP = 4
SPIKE_FACTOR = 10.0


def main() -> None:
    rank, world = start()
    bad_rank = culprit(2)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    model = DDP(net)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    loader = torch.utils.data.DataLoader(Samples(16 * STEPS, seed=rank), batch_size=16)
    running = None
    for step, (x, y) in enumerate(loader):
        if step == SPIKE_STEP:
            ready(rank)
            if rank == bad_rank:
                y = y * 50.0  # a corrupt batch: labels in the wrong unit
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()  # [zero_redundancy_step_skip] culprit waits
        if running is not None and loss.item() > SPIKE_FACTOR * running:
            continue  # [zero_redundancy_step_skip] departure
        opt.step()  # [zero_redundancy_step_skip] victim waits
        running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
    finish()


if __name__ == "__main__":
    main()
