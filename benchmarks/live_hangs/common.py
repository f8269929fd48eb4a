"""What every job of this folder shares: start-up, the READY line, data, a small model, the end of training.

A job is started by torchrun (`torchrun --standalone --nproc_per_node N benchmarks/live_hangs/<case>.py`); it
trains a few healthy steps, prints `READY rank=<r> pid=<pid>` (one write, flushed) right before the step in
which its culprit departs, and then hangs until it is killed. A worker whose torchrun agent is gone exits within
a second, so a harness that dies leaves nothing behind.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

FEATURES = 12
HANG_TIMEOUT = timedelta(seconds=int(os.environ.get("HANG_TIMEOUT_S", "600")))


def start() -> tuple[int, int]:
    """Join the job: gloo, a long timeout (a hang must stay a hang while it is diagnosed)."""
    exit_when_orphaned()
    dist.init_process_group("gloo", timeout=HANG_TIMEOUT)
    return dist.get_rank(), dist.get_world_size()


def exit_when_orphaned() -> None:
    parent = os.getppid()
    if parent == 1:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, name="orphan-guard", daemon=True).start()


def ready(rank: int) -> None:
    sys.stdout.write(f"READY rank={rank} pid={os.getpid()}\n")
    sys.stdout.flush()


def culprit(default: int) -> int:
    value = os.environ.get("CULPRIT")
    return default if value in (None, "") else int(value)


class Samples(torch.utils.data.Dataset):
    """`n` samples of one linear relation, drawn from `seed`: a rank's shard."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, FEATURES, generator=gen)
        self.y = self.x @ torch.linspace(-1, 1, FEATURES).unsqueeze(1) + 0.1 * torch.randn(n, 1, generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def finish() -> None:
    """The end of training every rank reaches when nothing hangs."""
    dist.barrier()
    print(f"UNHUNG rank={dist.get_rank()}", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's threads now and then abort the interpreter's teardown
