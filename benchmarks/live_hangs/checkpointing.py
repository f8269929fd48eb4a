"""Checkpoint helpers the jobs import from a module of their own, as a project's `utils/` would hold them."""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist


def folder() -> str:
    path = os.environ.get("CKPT_DIR") or tempfile.mkdtemp(prefix="live_hangs_ckpt_")
    os.makedirs(path, exist_ok=True)
    return path


def checkpoint_store() -> dist.Store:
    return dist.PrefixStore("ckpt", dist.distributed_c10d._get_default_store())


def save_if_best(model: torch.nn.Module, step: int, loss: float, best: float, store: dist.Store) -> float:
    """Rank 0 keeps the best weights and tells the others where they are (they load them for their EMA)."""
    if loss < best:  # [store_wait_never_set] departure
        path = os.path.join(folder(), f"best-{step}.pt")
        torch.save(model.state_dict(), path)
        store.set(f"best/{step}", path)
        return loss
    return best


def wait_for_best(step: int, store: dist.Store) -> str:
    store.wait([f"best/{step}"], timedelta(seconds=600))  # [store_wait_never_set] victim waits
    return store.get(f"best/{step}").decode()


def save_sharded(model: torch.nn.Module, step: int) -> None:
    """Each rank writes its shard; rank 0 then writes the index, once every shard is on disk."""
    rank = dist.get_rank()
    shard = {k: v for i, (k, v) in enumerate(model.state_dict().items()) if i % dist.get_world_size() == rank}
    torch.save(shard, os.path.join(folder(), f"step{step}-shard{rank}.pt"))
    if rank != 0:
        return
    dist.barrier()  # [random_step_ckpt_barrier] departure
    with open(os.path.join(folder(), f"step{step}-index.txt"), "w") as index:
        index.write(f"{dist.get_world_size()} shards\n")
