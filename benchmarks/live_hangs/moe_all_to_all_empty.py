"""A mixture-of-experts layer with expert parallelism, one expert per rank (as torchtitan's MoE does it): the
router picks an expert for each token, the ranks exchange how many tokens each sends to each expert
(`all_to_all_single` of the counts), then the tokens themselves (`all_to_all_single_autograd` with those split
sizes), run their expert, and send the outputs back the same way. Padding tokens are filtered out first, and
the layer returns at once when nothing is left (`if tokens.numel() == 0: return tokens`). On one step the
culprit's batch is all padding: it skips both all-to-alls, and waits in the all_reduce of the shared (router
and projection) gradients; its peers wait in the all-to-all of the counts.

4 ranks; culprit: CULPRIT (default 2).
"""

import torch
import torch.distributed as dist
from common import FEATURES, culprit, finish, ready, start
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd

SEQ = 24
STEPS = 6
EMPTY_STEP = 3  # the culprit's batch at this step holds padding only


class ExpertParallelMoE(nn.Module):
    def __init__(self, world: int) -> None:
        super().__init__()
        self.world = world
        self.router = nn.Linear(FEATURES, world)  # replicated
        self.expert = nn.Sequential(nn.Linear(FEATURES, 32), nn.GELU(), nn.Linear(32, FEATURES))  # this rank's

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.numel() == 0:
            return tokens  # [moe_all_to_all_empty] departure
        weight, expert = self.router(tokens).softmax(-1).max(-1)
        order = expert.argsort()
        send = torch.bincount(expert, minlength=self.world)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)  # [moe_all_to_all_empty] victim waits
        routed = all_to_all_single_autograd(tokens[order], recv.tolist(), send.tolist(), dist.group.WORLD)
        out = all_to_all_single_autograd(self.expert(routed), send.tolist(), recv.tolist(), dist.group.WORLD)
        return tokens + weight.unsqueeze(1) * out[order.argsort()]


def batch(rank: int, step: int, empty_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(SEQ, FEATURES, generator=gen)
    length = 0 if (rank == empty_rank and step == EMPTY_STEP) else int(torch.randint(8, SEQ, (1,), generator=gen))
    keep = torch.arange(SEQ) < length  # the padding mask
    return x[keep], x[keep].roll(1, dims=1)


def main() -> None:
    rank, world = start()
    empty_rank = culprit(2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, FEATURES), ExpertParallelMoE(world), nn.Linear(FEATURES, FEATURES))
    expert = {id(p) for p in model[1].expert.parameters()}
    shared = [p for p in model.parameters() if id(p) not in expert]
    torch.manual_seed(rank)
    model[1].expert.apply(lambda m: m.reset_parameters() if isinstance(m, nn.Linear) else None)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(STEPS):
        if step == EMPTY_STEP:
            ready(rank)
        tokens, targets = batch(rank, step, empty_rank)
        loss = ((model(tokens) - targets) ** 2).sum() / max(len(tokens), 1)
        loss.backward()
        grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in shared])
        dist.all_reduce(grads)  # [moe_all_to_all_empty] culprit waits
        offset = 0
        for p in shared:
            p.grad = grads[offset : offset + p.numel()].view_as(p) / world
            offset += p.numel()
        opt.step()
        opt.zero_grad(set_to_none=True)
    finish()


if __name__ == "__main__":
    main()
