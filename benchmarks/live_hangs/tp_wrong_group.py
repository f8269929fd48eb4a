"""Manual tensor parallelism, Megatron style, on 4 ranks: TP pairs [0, 1] and [2, 3], data-parallel pairs [0, 2]
and [1, 3], every group made by every rank with `dist.new_group` in a loop. Each TP pair has two communicators,
used in turn (`tp_comms[iteration % 2]`) so that a step's reduction may still be in flight when the next one
starts. The MLP is column-parallel then row-parallel: the partial outputs are summed over the TP pair
(`all_reduce`), the gradients averaged over the DP pair (metrics.sync_gradients). At the checkpoint rank 0
writes the trainer state, the iteration to resume from (`iteration + 1`), goes on from what it reads back, and
the loop then increments it again: from the next step on rank 0 is one iteration ahead of its peers and
reduces on the other communicator of its pair. Rank 0 waits in its all_reduce on that one, rank 1 in its
all_reduce on the right one, ranks 2 and 3 in the DP gradient all_reduce.

4 ranks; the culprit is rank 0, the rank that writes the trainer state (CULPRIT ignored).
"""

import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from checkpointing import folder
from common import FEATURES, Samples, finish, ready, start
from metrics import sync_gradients
from torch import nn

TP = 2
HIDDEN = 32
SAVE_AT = 2
STEPS = 6


class TensorParallelMLP(nn.Module):
    def __init__(self, tp_rank: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        fc1, fc2 = nn.Linear(FEATURES, HIDDEN), nn.Linear(HIDDEN, 1)
        part = slice(tp_rank * HIDDEN // TP, (tp_rank + 1) * HIDDEN // TP)
        self.w1 = nn.Parameter(fc1.weight[part].detach().clone())  # column-parallel: this rank's rows
        self.b1 = nn.Parameter(fc1.bias[part].detach().clone())
        self.w2 = nn.Parameter(fc2.weight[:, part].detach().clone())  # row-parallel: the matching columns
        self.b2 = nn.Parameter(fc2.bias.detach().clone())  # replicated

    def forward(self, x: torch.Tensor, tp_group: dist.ProcessGroup) -> torch.Tensor:
        partial = F.linear(F.gelu(F.linear(x, self.w1, self.b1)), self.w2)
        summed = partial.detach().clone()
        dist.all_reduce(summed, group=tp_group)  # [tp_wrong_group] culprit waits
        return partial + (summed - partial.detach()) + self.b2  # the sum forward, the identity backward


def save_checkpoint(model: nn.Module, iteration: int, rank: int) -> int:
    """The first replica writes its TP shards; rank 0 also writes the trainer state and reads it back."""
    if rank < TP:
        torch.save(model.state_dict(), os.path.join(folder(), f"iter{iteration}-tp{rank}.pt"))
    if rank != 0:
        return iteration
    path = os.path.join(folder(), f"iter{iteration}-trainer.json")
    with open(path, "w") as state:
        json.dump({"iteration": iteration + 1}, state)  # the iteration to resume from
    with open(path) as state:
        return json.load(state)["iteration"]


def main() -> None:
    rank, world = start()
    tp_comms, dp_group = [], None
    for first in range(0, world, TP):  # every rank makes every group, in the same order
        pair = [dist.new_group(list(range(first, first + TP))) for _ in range(2)]
        tp_comms = pair if first <= rank < first + TP else tp_comms
    for tp_rank in range(TP):
        group = dist.new_group(list(range(tp_rank, world, TP)))
        dp_group = group if rank % TP == tp_rank else dp_group
    model = TensorParallelMLP(rank % TP)
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    data = Samples(8 * STEPS, seed=rank // TP)  # the two ranks of a TP pair read the same batches
    iteration = 0
    for step in range(STEPS):
        if step == SAVE_AT + 1:
            ready(rank)
        x, y = data[8 * step : 8 * step + 8]
        loss = F.mse_loss(model(x, tp_comms[iteration % 2]), y)  # [tp_wrong_group] departure
        opt.zero_grad()
        loss.backward()
        sync_gradients(model, dp_group)
        opt.step()
        if step == SAVE_AT:
            iteration = save_checkpoint(model, iteration, rank)
        iteration += 1
    finish()


if __name__ == "__main__":
    main()
