"""Σx² of a model's gradients or weights in fp32, on the device, without gathering a sharded tensor.

`NonFiniteGuard` decides each step from the global gradient norm; this computes the sums it agrees on:

- plain tensors (DDP, one process): one fused norm pass per (device, dtype) list, the kernel
  `clip_grad_norm_` uses, then one dot;
- DTensor shards (FSDP2, tensor parallel): each rank sums its own shard and the sums are all-reduced over
  the mesh dimensions the tensor is sharded on (`DTensor.full_tensor` would materialise every parameter).

Each sum comes with `own`, this rank's part before any collective mixed in other ranks' values: it is
non-finite exactly when this rank's own values are, which names the culprit rank on a skip. Nothing is read
on the host here.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("torchtriage.guard")


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


class SumsOfSquares:
    """The sums of one fixed list of parameters (whether any is a DTensor is decided once: a parameter stays
    what it is, so the step's hot path inspects no tensor)."""

    def __init__(self, parameters: list) -> None:
        self.parameters = parameters
        self._groups: list[list] | None = None
        self._warned_partial = False

    def device(self):
        import torch

        for p in self.parameters:
            return p.to_local().device if hasattr(p, "to_local") else p.device
        return torch.device("cpu")

    def of_grads(self):
        """(stage_sum, own) of the gradients."""
        groups = self._plain_groups()
        if groups is None:
            return self._sum_of_squares([p.grad for p in self.parameters if p.grad is not None])
        own = self._plain_sum([[p.grad for p in group if p.grad is not None] for group in groups])
        return own, own  # plain tensors: no collective between this rank's values and the stage's

    def of_weights(self):
        """This rank's own Σx² of the weights: per-shard finiteness is enough, so no reduction over the mesh."""
        groups = self._plain_groups()
        if groups is None:
            return self._sum_of_squares([p.detach() for p in self.parameters], reduce_shards=False)[1]
        return self._plain_sum(groups)

    def _plain_groups(self) -> list[list] | None:
        """The parameters by (device, dtype) when none is a DTensor, else None."""
        if self._groups is None:
            if any(hasattr(p, "placements") for p in self.parameters):
                self._groups = []
            else:
                by_kind: dict = {}
                for p in self.parameters:
                    by_kind.setdefault((p.device, p.dtype), []).append(p)
                self._groups = list(by_kind.values())
        return self._groups or None

    def _plain_sum(self, lists: list[list]):
        """Σx² in fp32 over plain tensors, one fused pass per (device, dtype) list; a device tensor."""
        import torch

        total = None
        for tensors in lists:
            if tensors:
                part = sum_of_squares_on_device(tensors)
                total = part if total is None else total + part.to(total.device)
        return total if total is not None else torch.zeros((), dtype=torch.float32, device=self.device())

    def _sum_of_squares(self, tensors: list, *, reduce_shards: bool = True):
        """(stage_sum, own): Σx² over `tensors`, DTensor shards summed over their mesh."""
        plain, sharded = [], {}
        for t in tensors:
            placements = getattr(t, "placements", None)
            if placements is None or not hasattr(t, "to_local"):
                plain.append(t)
                continue
            shard_dims = self._shard_dims(placements)
            key = (id(t.device_mesh), tuple(shard_dims))
            sharded.setdefault(key, (t.device_mesh, tuple(shard_dims), []))[2].append(t.to_local())
        device = self.device()
        own = self._plain_sum(_by_device(plain)).to(device)
        total = own
        dist = _dist()
        for mesh, shard_dims, locals_ in sharded.values():
            part = self._plain_sum(_by_device(locals_)).to(device)
            own = own + part  # before the reduction below, which writes into `part`
            if reduce_shards and dist is not None:
                for dim in shard_dims:
                    dist.all_reduce(part, op=dist.ReduceOp.SUM, group=mesh.get_group(dim))
            total = total + part
        return total, own

    def _shard_dims(self, placements) -> list[int]:
        """The mesh dimensions a tensor's values are split over (Shard, or Partial: not yet reduced)."""
        dims = []
        for dim, placement in enumerate(placements):
            if placement.is_shard() or placement.is_partial():
                if placement.is_partial() and not self._warned_partial:
                    self._warned_partial = True
                    logger.warning(
                        "torchtriage NonFiniteGuard: a gradient still has a Partial (unreduced) placement at "
                        "the optimizer step; its norm is approximated by the sum over its shards. Reduce the "
                        "gradients before guard.step()."
                    )
                dims.append(dim)
        return dims


def _by_device(tensors: list) -> list[list]:
    by_device: dict = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t)
    return list(by_device.values())


def sum_of_squares_on_device(tensors: list):
    """Σx² in fp32 of tensors on one device: the fused norm pass `clip_grad_norm_` uses, then one dot."""
    import torch

    try:
        norms = torch._foreach_norm(tensors, 2.0, dtype=torch.float32)
    except (RuntimeError, TypeError):  # an old torch or an unsupported layout: the slow way
        norms = [torch.linalg.vector_norm(t, dtype=torch.float32) for t in tensors]
    stacked = torch.stack(norms)
    return torch.dot(stacked, stacked)
