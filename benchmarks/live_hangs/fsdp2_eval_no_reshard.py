"""FSDP2 (`fully_shard(..., reshard_after_forward=False)` on each residual block, then on the root) and an
evaluation pass under torch.no_grad that each rank schedules by the number of training samples *it* has seen.
The training set is split unevenly (20, 20 and 18 samples; batches of 8): the culprit's epochs end on a
shorter batch, so its count reaches the evaluation threshold one step after its peers'. On that step its peers
evaluate: the all-gathers of the eval forward, then the all_reduce of the eval loss on a group of its own (a gloo
group for CPU metrics, as NCCL jobs make). The culprit trains on: its forward's all-gathers pair with its peers'
eval all-gathers, and its backward's reduce-scatters wait for peers that wait in the metrics group's all_reduce,
which the culprit never joins.

3 ranks; the culprit is rank 2, whose shard is the short one (CULPRIT ignored).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import FEATURES, Samples, finish, ready, start
from torch import nn
from torch.distributed.fsdp import fully_shard

SHARDS = (20, 20, 18)
EVAL_EVERY = 40  # training samples between evaluations
STEPS = 9
WIDTH = 24


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.ff = nn.Linear(WIDTH, WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.ff(self.norm(h)).relu()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, WIDTH)
        self.layers = nn.ModuleList(Residual() for _ in range(3))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


@torch.no_grad()
def eval_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, group: dist.ProcessGroup) -> float:
    loss = F.mse_loss(model(x), y).reshape(1)
    dist.all_reduce(loss, group=group)
    return loss.item() / dist.get_world_size()


def main() -> None:
    rank, world = start()
    torch.manual_seed(0)
    model = Net()
    for layer in model.layers:
        fully_shard(layer, reshard_after_forward=False)
    fully_shard(model, reshard_after_forward=False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    metrics_group = dist.new_group(backend="gloo")
    loader = torch.utils.data.DataLoader(Samples(SHARDS[rank], seed=rank), batch_size=8)
    val_x, val_y = Samples(16, seed=123)[:]
    seen, next_eval, step = 0, EVAL_EVERY, 0
    while step < STEPS:
        for x, y in loader:
            loss = F.mse_loss(model(x), y)  # [fsdp2_eval_no_reshard] culprit waits
            loss.backward()  # [fsdp2_eval_no_reshard] culprit waits
            opt.step()
            opt.zero_grad()
            seen += len(x)
            step += 1
            if step == 5:
                ready(rank)  # the step before the first evaluation
            if seen >= next_eval:  # [fsdp2_eval_no_reshard] departure
                eval_loss(model, val_x, val_y, metrics_group)
                next_eval += EVAL_EVERY
    finish()


if __name__ == "__main__":
    main()
