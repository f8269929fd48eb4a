"""A 2-D DeviceMesh on CPU gloo (dp=2 x sp=2: `init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "sp"))`),
sequence parallelism by hand: each rank of an "sp" group holds one half of every sequence's tokens. The loss is
normalised by the valid tokens of the whole sequence (`all_reduce` on "sp"), gradients are averaged over "sp"
then "dp" (a helper module's `sync_gradients`), and the per-token losses are logged through the helper module's
`mean_over`, which returns early, before its `all_gather` on "sp", when a rank has no valid token. On one step
the second data-parallel replica's sequence is short: the second half, rank 3's, is all padding. Rank 3 skips
the gather and waits in the next step's token count (`all_reduce` on "sp"); its sp peer, rank 2, waits in the
gather; ranks 0 and 1 wait in the data-parallel gradient all_reduce for ranks 2 and 3. Both sp groups are
named alike by DeviceMesh.

4 ranks; the culprit is rank 3 (CULPRIT ignored).
"""

import torch
import torch.distributed as dist
from common import FEATURES, finish, ready, start
from metrics import mean_over, sync_gradients
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

MAX_LEN = 16
IGNORE = -100.0
# per data-parallel replica, the length of each step's sequence; the last one of replica 1 fits in one half
LENGTHS = {0: [16, 12, 14, 11, 15], 1: [14, 13, 15, 6, 16]}
FAULTY_STEP = 3


def sequence(dp_rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * dp_rank + step)
    x = torch.randn(MAX_LEN, FEATURES, generator=gen)
    y = x.sum(1, keepdim=True).tanh()
    y[LENGTHS[dp_rank][step] :] = IGNORE  # padding
    return x, y


def main() -> None:
    rank, world = start()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "sp"))
    dp, sp = mesh.get_group("dp"), mesh.get_group("sp")
    dp_rank, sp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("sp")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 20), nn.ReLU(), nn.Linear(20, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    half = MAX_LEN // 2
    for step in range(len(LENGTHS[0])):
        if step == FAULTY_STEP:
            ready(rank)
        x, y = sequence(dp_rank, step)
        x, y = x[sp_rank * half : (sp_rank + 1) * half], y[sp_rank * half : (sp_rank + 1) * half]
        valid = y != IGNORE
        tokens = valid.sum().float().reshape(1)
        dist.all_reduce(tokens, group=sp)  # [mesh2d_seq_parallel_pad] culprit waits
        token_losses = (model(x) - y)[valid] ** 2
        (token_losses.sum() / tokens).backward()
        sync_gradients(model, sp, dp)
        opt.step()
        opt.zero_grad()
        logged = [token_losses.detach()] if valid.any() else []
        mean_over(logged, sp)
    finish()


if __name__ == "__main__":
    main()
