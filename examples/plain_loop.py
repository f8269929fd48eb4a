"""A plain PyTorch training loop with torchtriage's opt-in helpers. Runs on CPU (gloo) or GPUs (NCCL):

    torchrun --standalone --nproc_per_node 2 examples/plain_loop.py          # CPU, gloo
    INJECT_NAN_STEP=5 torchrun --standalone --nproc_per_node 2 examples/plain_loop.py

The three-line opt-in: `init_distributed()` (timeouts + flight recorder), `NonFiniteGuard(opt)` in place
of `opt.step()`, and `profile_steps(...)` / `phase(...)` for a few profiled steps. `INJECT_NAN_STEP` puts
a NaN into rank 1's gradient at that step: every rank skips the update, rank 0 logs it, and the logged
window reports `loss: nan` when no update was applied in it.
"""

import logging
import os

import torch
import torch.distributed as dist

import torchtriage
from torchtriage import NonFiniteGuard, log_cuda_memory, phase, profile_steps

try:  # the consistency/setup helpers (torchtriage.runtime.consensus / setup)
    from torchtriage import assert_rank_uniform, init_distributed
except ImportError:  # an older torchtriage: plain setup, no consistency check
    assert_rank_uniform = None

    def init_distributed(backend=None):
        if "RANK" in os.environ:
            dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"))


STEPS = int(os.environ.get("STEPS", "20"))
LOG_EVERY = int(os.environ.get("LOG_EVERY", "5"))
INJECT_NAN_STEP = int(os.environ.get("INJECT_NAN_STEP", "0"))
OUT = os.environ.get("OUT", "torchtriage-artifacts")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    init_distributed()
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else "cpu"
    torchtriage.install_oom_attribution()  # an OOM on this rank says it is the primary failure

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = NonFiniteGuard(opt, max_grad_norm=1.0, max_consecutive_nonfinite_steps=8)
    gen = torch.Generator().manual_seed(1000 + rank)

    with profile_steps(f"{OUT}/profiler", wait=2, warmup=1, active=3, ranks="0") as prof:
        for step in range(1, STEPS + 1):
            with phase("data"):
                x = torch.randn(16, 32, generator=gen).to(device)
                y = x[:, :1] * 2.0
                sample_ids = [rank * 10_000 + step * 16 + i for i in range(16)]
            if step == 1 and assert_rank_uniform is not None:
                # Every rank must hold the same batch shape; a mismatch would hang the all-reduce.
                assert_rank_uniform(tuple(x.shape), label="batch shape")
            with phase("forward_backward"):
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
            if step == INJECT_NAN_STEP and rank == min(1, world - 1):
                next(model.parameters()).grad.view(-1)[0] = float("nan")
            with phase("optimizer"):
                guard.step(loss=loss, batch_index=step, sample_ids=sample_ids)
                opt.zero_grad(set_to_none=True)
            prof.step()
            if step % LOG_EVERY == 0 and rank == 0:
                w = guard.log_window()
                print(
                    f"step {step} | loss: {w['loss']:.4f} | grad_norm: {w['grad_norm']:.4f} "
                    f"| nonfinite_steps_skipped: {w['nonfinite_steps_skipped']}",
                    flush=True,
                )
    log_cuda_memory("end of training")  # {} on CPU
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
