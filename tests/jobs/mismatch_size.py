"""Job: ranks all_reduce gradient buffers of different sizes.

The injected bug is a model built differently on one rank (a rank-dependent config:
here one extra output unit on the culprit), so its flattened gradient buffer has a
different length from its peers'. Collectives require identical shapes on every rank;
this records what gloo does when they differ.

Environment: CULPRIT (default 1).
"""

import time

import _common as C
import torch


def build_model(rank: int, culprit: int) -> torch.nn.Module:
    torch.manual_seed(0)
    out_features = 2 if rank == culprit else 1  # the injected bug
    return torch.nn.Linear(C.FEATURES, out_features)


def main() -> None:
    culprit = C.env_int("CULPRIT", 1)
    rank, world_size = C.init()
    model = build_model(rank, culprit)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step, (x, y) in enumerate(C.batches(rank, 4), start=1):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y.expand(-1, model.out_features))
        loss.backward()
        grad = C.all_reduce_grads(model, world_size)
        opt.step()
        C.log_step(rank, step, loss, grad, t0)
    C.finish()


if __name__ == "__main__":
    main()
