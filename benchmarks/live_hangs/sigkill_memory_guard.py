"""DDP, and a memory guard thread in every rank that SIGKILLs its own process when its resident memory grows
past a budget (as a container's OOM killer would, but from inside the job). At a checkpoint the culprit copies
its state into a large staging buffer, its memory passes the budget, and the guard kills it while its peers
wait in the next step's gradient all-reduce.

2 ranks; culprit: CULPRIT (default 1).
"""

import os
import signal
import threading
import time

import torch
import torch.nn.functional as F
from common import FEATURES, culprit, finish, ready, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

HEADROOM_MB = 150


def resident_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def guard_memory(budget_mb: float) -> None:
    def watch() -> None:
        while True:
            if resident_mb() > budget_mb:
                os.kill(os.getpid(), signal.SIGKILL)  # [sigkill_memory_guard] departure
            time.sleep(0.1)

    threading.Thread(target=watch, name="memory-guard", daemon=True).start()


def stage_checkpoint(model: nn.Module, copies: int) -> list[torch.Tensor]:
    staging = [torch.ones(2**20 * 16) for _ in range(copies)]  # [sigkill_memory_guard] departure
    staging.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    return staging


def main() -> None:
    rank, world = start()
    killed_rank = culprit(1)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    guard_memory(resident_mb() + HEADROOM_MB)
    for step in range(6):
        if step == 3:
            ready(rank)
        x = torch.randn(16, FEATURES, generator=gen)
        loss = F.mse_loss(model(x), x[:, :1])
        loss.backward()  # [sigkill_memory_guard] victim waits
        opt.step()
        opt.zero_grad()
        if step == 3:
            # The culprit stages four copies (it also stages the optimizer state); the others one.
            staging = stage_checkpoint(model.module, 4 if rank == killed_rank else 1)
            time.sleep(0.5)
            del staging
    finish()


if __name__ == "__main__":
    main()
