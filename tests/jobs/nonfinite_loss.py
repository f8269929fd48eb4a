"""Job: training diverges; the loss overflows to inf and then nan.

Nothing crashes: the learning-rate warmup ramps past the stability limit of plain SGD
on this problem, the weights grow geometrically, and the loss overflows to inf and
later turns nan. Gradients are synchronised, so every rank diverges together; only rank
0 prints, one line per step in a common trainer format. The job exits 0.

Environment: STEPS (default 32), PEAK_LR (default 16.0), WARMUP (default 10).
"""

import os
import time

import _common as C
import torch


def main() -> None:
    steps, warmup = C.env_int("STEPS", 32), C.env_int("WARMUP", 10)
    peak_lr = float(os.environ.get("PEAK_LR", "16.0"))
    rank, world_size = C.init()
    model, opt = C.make_model()
    for step, (x, y) in enumerate(C.batches(rank, steps), start=1):
        lr = peak_lr * min(1.0, step / warmup)  # the injected bug: a peak lr far too high
        for group in opt.param_groups:
            group["lr"] = lr
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        grad = C.all_reduce_grads(model, world_size)
        opt.step()
        if rank == 0:
            ms = (time.perf_counter() - t0) * 1000
            print(
                f"step {step} | loss: {loss.item():.4g} | grad_norm: {grad.norm().item():.4g}"
                f" | lr: {lr:.3g} | {ms:.1f} ms",
                flush=True,
            )
    if rank == 0:
        print(f"training finished after {steps} steps", flush=True)
    C.finish()


if __name__ == "__main__":
    main()
