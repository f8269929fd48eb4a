"""Shared scaffolding for the injected-failure jobs in this directory.

Each job is a tiny data-parallel trainer on CPU/gloo: a linear model whose gradients
are all-reduced every step, printing one line per step per rank. The jobs differ only
in the one bug they inject, so everything else lives here.
"""

import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

FEATURES = 16
BATCH = 32


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def exit_when_orphaned() -> None:
    """Exit within a second of the launcher's death: a job the tests leave hanging never outlives them. A
    launcher that died before this ran (a slow import under load) left the worker to init: it exits at once.
    (Under pytest, which adopts orphans, such a worker is killed with its test module: tests/leftovers.py.)"""
    parent = os.getppid()
    if parent == 1:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, name="orphan-guard", daemon=True).start()


def init(timeout_s: int = 10) -> tuple[int, int]:
    # Short timeout: a hang in these jobs is a bug being demonstrated, not slowness.
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def make_model(lr: float = 0.05) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)  # same initial weights on every rank, as DDP would broadcast
    model = torch.nn.Linear(FEATURES, 1)
    return model, torch.optim.SGD(model.parameters(), lr=lr)


def batches(rank: int, num_batches: int):
    # Per-rank data (like a DistributedSampler shard) from one shared linear relation.
    gen = torch.Generator().manual_seed(1000 + rank)
    true_w = torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1)
    for _ in range(num_batches):
        x = torch.randn(BATCH, FEATURES, generator=gen)
        yield x, x @ true_w + 0.1 * torch.randn(BATCH, 1, generator=gen)


def all_reduce_grads(model: torch.nn.Module, world_size: int) -> torch.Tensor:
    # One flat buffer and one collective per step, the way DDP buckets gradients.
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for p in model.parameters():
        n = p.grad.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n
    return flat


def log_step(rank: int, step: int, loss: torch.Tensor, grad: torch.Tensor, t0: float) -> None:
    ms = (time.perf_counter() - t0) * 1000
    print(
        f"rank {rank} | step {step} | loss: {loss.item():.4f} | grad_norm: {grad.norm().item():.4f} | {ms:.1f} ms",
        flush=True,
    )


def finish() -> None:
    dist.barrier()
    dist.destroy_process_group()
    # Leave without the interpreter's teardown: gloo's threads in torch 2.13 (CPU) now and then abort it
    # ("terminate called without an active exception", exit -6) after everything the tests read was written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
