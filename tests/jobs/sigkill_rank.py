"""Job: one rank is SIGKILLed at step K, as the host's OOM killer would do it.

SIGKILL cannot be caught, so the culprit leaves no Python traceback at all; the only
first-hand evidence is torchrun's "Signal 9 (SIGKILL)" line. Its peer, blocked in the
step's all_reduce, fails as collateral.

Environment: CULPRIT (default 1), STEP (1-based, default 3).
"""

import os
import signal
import time

import _common as C
import torch


def main() -> None:
    culprit, kill_step = C.env_int("CULPRIT", 1), C.env_int("STEP", 3)
    rank, world_size = C.init()
    model, opt = C.make_model()
    for step, (x, y) in enumerate(C.batches(rank, kill_step + 2), start=1):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if rank == culprit and step == kill_step:
            # Die between backward and the gradient all_reduce, so the peer is
            # already waiting on this rank when it disappears.
            os.kill(os.getpid(), signal.SIGKILL)
        grad = C.all_reduce_grads(model, world_size)
        opt.step()
        C.log_step(rank, step, loss, grad, t0)
    C.finish()


if __name__ == "__main__":
    main()
