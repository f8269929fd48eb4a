"""Decentralised data-parallel training (gossip SGD over a time-varying ring, as stochastic gradient push does
it): no all-reduce of gradients; after each local step every rank sends its weights `hop` ranks ahead and
averages its own with those it receives from `hop` ranks behind (`dist.batch_isend_irecv`), the hop growing
from 1 to 2 every few steps so that the weights mix faster. The receive peer is computed with a C-style
wrap-around (`rank - hop if rank >= hop else world - hop`, meant as `(rank - hop) % world`): right for every
rank while the hop is 1, and for rank 0 always, but once the hop is 2 rank 1 gets 2 instead of 3. The culprit
waits for weights from rank 2, which sends to rank 0; rank 3 waits in its send to the culprit; ranks 0 and 2
exchange with each other and wait in the all_reduce of the logged loss.

4 ranks; the culprit is rank 1 (CULPRIT ignored).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import FEATURES, Samples, finish, ready, start
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

HOPS = (1, 2)
PHASE = 3  # steps per hop
STEPS = 8


def ring_peers(rank: int, world: int, step: int) -> tuple[int, int]:
    hop = HOPS[(step // PHASE) % len(HOPS)]
    send_to = (rank + hop) % world
    recv_from = rank - hop if rank >= hop else world - hop  # [ring_wrong_peer] departure
    return send_to, recv_from


@torch.no_grad()
def gossip_average(model: nn.Module, rank: int, world: int, step: int) -> None:
    mine = parameters_to_vector(model.parameters())
    theirs = torch.empty_like(mine)
    send_to, recv_from = ring_peers(rank, world, step)
    ops = [dist.P2POp(dist.isend, mine, send_to), dist.P2POp(dist.irecv, theirs, recv_from)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()  # [ring_wrong_peer] culprit waits
    vector_to_parameters((mine + theirs) / 2, model.parameters())


def main() -> None:
    rank, world = start()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = torch.utils.data.DataLoader(Samples(16 * STEPS, seed=rank), batch_size=16, shuffle=True)
    history = []
    for step, (x, y) in enumerate(loader):
        if step == PHASE:
            ready(rank)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        gossip_average(model, rank, world, step)
        logged = loss.detach().reshape(1)
        dist.all_reduce(logged)  # [ring_wrong_peer] victim waits
        history.append(logged.item() / world)
    finish()


if __name__ == "__main__":
    main()
