"""Job: one rank raises a ValueError from a shape check deep in user code at step K.

The culprit's batch at step K arrives with too few features (think: a truncated
record), and the model's input validation rejects it. The exception kills that rank;
its peer, blocked in the step's all_reduce, is collateral. ``main`` is wrapped in
torchrun's ``@record`` (as torchtitan and others do) so the launcher's summary carries
the culprit's traceback.

Environment: CULPRIT (default 1), STEP (1-based, default 3).
"""

import time

import _common as C
import torch
from torch.distributed.elastic.multiprocessing.errors import record


def check_features(x: torch.Tensor, expected: int) -> None:
    if x.shape[-1] != expected:
        raise ValueError(f"expected input with {expected} features, got shape {tuple(x.shape)}")


def forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    check_features(x, model.in_features)
    return model(x)


def train_step(model, opt, x, y, world_size):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(forward(model, x), y)
    loss.backward()
    grad = C.all_reduce_grads(model, world_size)
    opt.step()
    return loss, grad


@record
def main() -> None:
    culprit, bad_step = C.env_int("CULPRIT", 1), C.env_int("STEP", 3)
    rank, world_size = C.init()
    model, opt = C.make_model()
    for step, (x, y) in enumerate(C.batches(rank, bad_step + 2), start=1):
        if rank == culprit and step == bad_step:
            x = x[:, :12]  # the injected bug: a malformed batch on one rank only
        t0 = time.perf_counter()
        loss, grad = train_step(model, opt, x, y, world_size)
        C.log_step(rank, step, loss, grad, t0)
    C.finish()


if __name__ == "__main__":
    main()
