"""Training utilities the jobs import from a module of their own, as a project's `utils/` would hold them."""

from __future__ import annotations

import torch
import torch.distributed as dist


def mean_over(values: list[torch.Tensor], group: dist.ProcessGroup) -> float | None:
    """The mean of every rank's values in `group`, for logging; None when there is nothing to report."""
    if not values:
        return None  # [mesh2d_seq_parallel_pad] departure
    local = torch.stack([torch.cat(values).sum(), torch.tensor(float(sum(len(v) for v in values)))])
    parts = [torch.zeros(2) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local, group=group)  # [mesh2d_seq_parallel_pad] victim waits
    total = torch.stack(parts).sum(0)
    return (total[0] / total[1].clamp(min=1)).item()


def sync_gradients(model: torch.nn.Module, *groups: dist.ProcessGroup) -> None:
    """Average the gradients over each group in turn (the sequence-parallel group, then the data-parallel one)."""
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    for group in groups:
        dist.all_reduce(flat, group=group)
        flat /= dist.get_world_size(group)
    offset = 0
    for p in model.parameters():
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


def gather_predictions(predictions: list[float]) -> list[float] | None:
    """Every rank's predictions, on every rank; None when this rank's evaluation produced none."""
    if not predictions:
        return None  # [gather_object_eval] departure
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, predictions)  # [gather_object_eval] victim waits
    return [p for part in gathered for p in part]
