"""Job: profile_steps under torchrun + gloo. PROFILE_RANKS selects the ranks, PROFILE_OUT the folder.

Each step has labelled phases `data`, `forward_backward` and `grad_sync` (a real gloo all_reduce).
"""

import os

import _common as C
import torch

from torchtriage import phase, profile_steps


def main() -> None:
    rank, world = C.init(timeout_s=30)
    model, opt = C.make_model()
    with profile_steps(
        os.environ["PROFILE_OUT"], wait=1, warmup=1, active=2, ranks=os.environ["PROFILE_RANKS"]
    ) as prof:
        batches = C.batches(rank, 6)
        for _ in range(6):
            with phase("data"):
                x, y = next(batches)
            with phase("forward_backward"):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
            with phase("grad_sync"):
                C.all_reduce_grads(model, world)
            opt.step()
            prof.step()
    print(f"DONE rank={rank} written={len(prof.written)}", flush=True)
    C.finish()


if __name__ == "__main__":
    main()
