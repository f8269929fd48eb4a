"""torch.distributed.pipelining, two stages (PipelineStage + ScheduleGPipe, 2 micro-batches). Each stage builds
its own DataLoader over the same 40 samples: the first stage feeds the inputs and asks for `drop_last=True`
(its micro-batches must split evenly), the last stage feeds the targets and keeps the default. The first stage
runs out of batches one step early, leaves the epoch loop and waits in the broadcast of the epoch's mean loss
that the last stage sends when its epoch ends; the last stage waits in the schedule's receive of the
activations of a batch the first stage never sends.

2 ranks; the culprit is the first stage, rank 0 (CULPRIT ignored).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import FEATURES, Samples, finish, ready, start
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

SAMPLES = 40
BATCH = 12


def build_stage(rank: int, world: int) -> tuple[nn.Module, ScheduleGPipe]:
    torch.manual_seed(0)
    parts = [
        nn.Sequential(nn.Linear(FEATURES, 32), nn.SiLU(), nn.Linear(32, 32)),
        nn.Sequential(nn.SiLU(), nn.Linear(32, 1)),
    ]
    module = parts[rank]
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    return module, ScheduleGPipe(stage, n_microbatches=2, loss_fn=F.mse_loss)


def main() -> None:
    rank, world = start()
    if world != 2:
        raise SystemExit("two pipeline stages: run on 2 ranks")
    module, schedule = build_stage(rank, world)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    first = rank == 0
    loader = torch.utils.data.DataLoader(Samples(SAMPLES, seed=7), batch_size=BATCH, drop_last=first)
    epoch_loss = torch.zeros(1)
    for step, (x, y) in enumerate(loader):  # [pipeline_gpipe_short_data] departure
        if step == 2:
            ready(rank)
        if first:
            schedule.step(x)
        else:
            losses: list[torch.Tensor] = []
            schedule.step(target=y, losses=losses)  # [pipeline_gpipe_short_data] victim waits
            epoch_loss += torch.stack(losses).mean().detach()
        opt.step()
        opt.zero_grad()
    dist.broadcast(epoch_loss, src=world - 1)  # [pipeline_gpipe_short_data] culprit waits
    finish()


if __name__ == "__main__":
    main()
