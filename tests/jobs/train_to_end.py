"""Job: healthy data-parallel training that runs to its end and exits 0.

Every rank trains STEPS steps (default 6), printing one line per step, and leaves: its last line is a step like any
other, with no word saying the job is done, so its log alone cannot tell a finished job from a stopped one.

Environment: STEPS.
"""

import time

import _common as C


def main() -> None:
    rank, world_size = C.init()
    model, opt = C.make_model()
    for step, (x, y) in enumerate(C.batches(rank, C.env_int("STEPS", 6)), start=1):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        grad = C.all_reduce_grads(model, world_size)
        opt.step()
        C.log_step(rank, step, loss, grad, t0)
    C.finish()


if __name__ == "__main__":
    main()
