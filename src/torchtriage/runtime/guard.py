"""Skip optimizer steps whose gradients are not finite — on every rank at once — and say which batch it was.

`NonFiniteGuard` replaces `optimizer.step()` in a training loop::

    guard = NonFiniteGuard(optimizer, max_grad_norm=1.0)
    for index, batch in enumerate(loader):
        loss = model(batch).mean()
        loss.backward()
        outcome = guard.step(loss=loss, batch_index=index, sample_ids=batch["id"])
        optimizer.zero_grad(set_to_none=True)

Each step it computes the global gradient norm and agrees on it across ranks, so the decision to skip
is the same everywhere (a rank that alone skipped would silently fork the model replicas):

- plain tensors (DDP, or a single process): the gradients are already averaged, so the local norm is
  the global one; the agreement still runs, because one rank may hold a non-finite value the others
  do not (a faulty GPU, a hook that ran after the reduction);
- DTensor gradients (FSDP2, tensor parallel): each rank squares and sums its own shard, the sums are
  all-reduced over the mesh dimensions the gradient is sharded on; the full gradient is never
  gathered (`DTensor.full_tensor` would materialise every parameter on every rank);
- pipeline stages own different parameters: pass `pipeline_group=` and the stage sums are added over it.

When the norm is non-finite the update is skipped on every rank, the gradients are zeroed, rank 0
logs one warning per event ("... the update is skipped ...") and `nonfinite_steps_skipped` counts
it. What the step was told about its batch (`batch_index`, `sample_ids`) is gathered from every rank
and kept in `skipped_batches`, so the bad batch can be found and replayed. After
`max_consecutive_nonfinite_steps` skips in a row, or when the weights themselves are non-finite,
`NonFiniteStepsError` is raised on every rank: the run diverged and skipping cannot save it.

With AMP's `GradScaler` (pass `scaler=`), the guard unscales the gradients first (so the norm and the
clipping see true values), makes the scaler's found-inf flag agree across ranks, and lets
`scaler.step`/`scaler.update` skip the step and lower the scale — the step is skipped once, by the
scaler, and counted once. Gradient clipping (`max_grad_norm=`) uses the same agreed norm.

Cost when nothing is wrong: one pass over the gradients (what `clip_grad_norm_` does anyway), one
all-reduce of two floats, and one device-to-host copy of them per step.
"""

from __future__ import annotations

import logging
import math
import os
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("torchtriage.guard")

DEFAULT_MAX_CONSECUTIVE_NONFINITE_STEPS = 16
DEFAULT_CHECK_WEIGHTS_EVERY = 100
_SKIPPED_BATCHES_KEPT = 1000
_SAMPLE_IDS_SHOWN = 16


class NonFiniteStepsError(RuntimeError):
    """Raised on every rank when skipping non-finite steps can no longer save the run."""


@dataclass
class StepOutcome:
    """What `NonFiniteGuard.step` did: `applied` is the same on every rank."""

    step: int
    applied: bool
    grad_norm: float  # the agreed global norm before clipping (after unscaling with a GradScaler)
    clipped: bool = False


@dataclass
class SkippedBatch:
    """One skipped step and what the training loop said about its batch, on every rank."""

    step: int
    grad_norm: float
    # rank -> {"batch_index": ..., "sample_ids": ..., "local_nonfinite": bool}
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def culprit_ranks(self) -> list[int]:
        """Ranks whose own gradients were non-finite before the agreement."""
        return sorted(rank for rank, info in self.ranks.items() if info.get("local_nonfinite"))


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _short(value: Any) -> Any:
    """A loggable, picklable form of what the loop passed as sample ids."""
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [v if isinstance(v, (int, float, str)) else repr(v) for v in value]
    return value if isinstance(value, (int, float, str)) else repr(value)


class NonFiniteGuard:
    """Wraps `optimizer.step()`: skips non-finite updates on every rank and raises when the run diverged.

    Args:
        optimizer: the optimizer whose step is guarded.
        parameters: the parameters whose gradients make the norm (default: the optimizer's).
        scaler: an AMP `GradScaler`; the guard unscales, agrees on its inf flag and lets it skip.
        max_grad_norm: clip to this global norm (using the agreed norm) before the update.
        max_consecutive_nonfinite_steps: raise after this many skipped steps in a row (0: never).
        group: the process group that must agree (default: the whole world).
        pipeline_group: the group of pipeline stages whose gradient norms add up (default: none).
        check_weights_every: also check that the weights are finite every N applied steps (0: only
            when a step is non-finite, which is when broken weights show up). Costs one pass over the
            weights and one all-reduce.
    """

    def __init__(
        self,
        optimizer,
        parameters: Iterable | None = None,
        *,
        scaler=None,
        max_grad_norm: float | None = None,
        max_consecutive_nonfinite_steps: int = DEFAULT_MAX_CONSECUTIVE_NONFINITE_STEPS,
        group=None,
        pipeline_group=None,
        check_weights_every: int = DEFAULT_CHECK_WEIGHTS_EVERY,
    ):
        self.optimizer = optimizer
        if parameters is None:
            parameters = [p for g in optimizer.param_groups for p in g["params"]]
        self.parameters = list(parameters)
        self.scaler = scaler
        self.max_grad_norm = max_grad_norm
        self.max_consecutive_nonfinite_steps = int(max_consecutive_nonfinite_steps)
        self.group = group
        self.pipeline_group = pipeline_group
        self.check_weights_every = int(check_weights_every)
        self.step_count = 0  # guarded steps so far, applied or not
        self.applied_steps = 0
        self.nonfinite_steps_skipped = 0
        self.consecutive_nonfinite_steps = 0
        self.last_applied_step: int | None = None
        self.last_grad_norm: float = float("nan")
        self.skipped_batches: deque[SkippedBatch] = deque(maxlen=_SKIPPED_BATCHES_KEPT)
        self._window_loss_sum = None
        self._window_applied = 0
        self._window_skipped = 0
        self._warned_partial = False

    # -- the rank -----------------------------------------------------------------------------
    def _rank(self) -> int:
        dist = _dist()
        if dist is not None:
            return dist.get_rank()
        value = os.environ.get("RANK", "")
        return int(value) if value.isdigit() else 0

    # -- norms --------------------------------------------------------------------------------
    def _device(self):
        import torch

        for p in self.parameters:
            return p.to_local().device if hasattr(p, "to_local") else p.device
        return torch.device("cpu")

    def _sum_of_squares(self, tensors: list, *, reduce_shards: bool = True):
        """Σ x² over `tensors` for this pipeline stage, in fp32; DTensor shards summed over their mesh.

        Returns (stage_sum, local_nonfinite): the second says whether this rank's own values (before
        any collective) were non-finite, which names the culprit rank in the skip record.
        """
        import torch

        device = self._device()
        plain, sharded = [], {}
        for t in tensors:
            placements = getattr(t, "placements", None)
            if placements is None or not hasattr(t, "to_local"):
                plain.append(t)
                continue
            shard_dims = []
            for dim, placement in enumerate(placements):
                if placement.is_shard() or placement.is_partial():
                    if placement.is_partial() and not self._warned_partial:
                        self._warned_partial = True
                        logger.warning(
                            "torchtriage NonFiniteGuard: a gradient still has a Partial (unreduced) placement at "
                            "the optimizer step; its norm is approximated by the sum over its shards. Reduce the "
                            "gradients before guard.step()."
                        )
                    shard_dims.append(dim)
            key = (id(t.device_mesh), tuple(shard_dims))
            sharded.setdefault(key, (t.device_mesh, tuple(shard_dims), []))[2].append(t.to_local())
        local = torch.zeros((), dtype=torch.float32, device=device)
        if plain:
            local = local + self._local_sq(plain)
        local_flags = [~torch.isfinite(local)]  # taken before any collective mixes in other ranks' values
        dist = _dist()
        total = local
        for mesh, shard_dims, locals_ in sharded.values():
            part = self._local_sq(locals_).to(device)
            local_flags.append(~torch.isfinite(part))
            if reduce_shards and dist is not None:
                for dim in shard_dims:
                    dist.all_reduce(part, op=dist.ReduceOp.SUM, group=mesh.get_group(dim))
            total = total + part
        if self.pipeline_group is not None and dist is not None:
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.pipeline_group)
        local_flag = torch.stack(local_flags).any()
        return total, local_flag

    @staticmethod
    def _local_sq(tensors: list):
        import torch

        by_device: dict = {}
        for t in tensors:
            by_device.setdefault(t.device, []).append(t)
        total = None
        for device_tensors in by_device.values():
            try:
                norms = torch._foreach_norm(device_tensors, 2, dtype=torch.float32)
            except (RuntimeError, TypeError):  # an old torch or an unsupported layout: the slow way
                norms = [torch.linalg.vector_norm(t.float()) for t in device_tensors]
            part = torch.stack([n.float() for n in norms]).square().sum()
            total = part if total is None else total + part.to(total.device)
        return total

    def _agree(self, stage_sum, local_flag):
        """One all-reduce (MAX) of [finite sum or 0, any non-finite] over `group`: the same answer everywhere."""
        import torch

        finite = torch.isfinite(stage_sum)
        packed = torch.stack(
            [torch.where(finite, stage_sum, torch.zeros_like(stage_sum)), (~finite | local_flag).float()]
        )
        dist = _dist()
        if dist is not None:
            dist.all_reduce(packed, op=dist.ReduceOp.MAX, group=self.group)
        sum_sq, nonfinite = packed.tolist()  # the one host sync of the step: the decision needs it
        return (float("nan") if nonfinite else math.sqrt(sum_sq)), bool(nonfinite)

    def grad_norm(self) -> float:
        """The global gradient norm, agreed across ranks (nan when any rank's gradients are non-finite)."""
        grads = [p.grad for p in self.parameters if p.grad is not None]
        stage_sum, local_flag = self._sum_of_squares(grads)
        return self._agree(stage_sum, local_flag)[0]

    def weights_finite(self) -> bool:
        """Whether every weight on every rank is finite (a collective: call it on every rank)."""
        stage_sum, local_flag = self._sum_of_squares([p.detach() for p in self.parameters], reduce_shards=False)
        del stage_sum  # only finiteness matters, and per-shard finiteness is enough for that
        packed = local_flag.float().reshape(1)
        dist = _dist()
        if dist is not None:
            dist.all_reduce(packed, op=dist.ReduceOp.MAX, group=self.group)
        return not bool(packed.item())

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip the gradients to `max_norm` using the agreed global norm; returns the norm before clipping."""
        norm = self.grad_norm()
        if math.isfinite(norm):
            self._clip(norm, max_norm)
        return norm

    def _clip(self, norm: float, max_norm: float) -> bool:
        import torch

        coef = max_norm / (norm + 1e-6)
        if coef >= 1.0:
            return False
        grads = [p.grad for p in self.parameters if p.grad is not None]
        try:
            torch._foreach_mul_(grads, coef)
        except (RuntimeError, TypeError):
            for g in grads:
                g.mul_(coef)
        return True

    # -- the step -----------------------------------------------------------------------------
    def _unscale(self) -> None:
        states = getattr(self.scaler, "_per_optimizer_states", None)
        state = states.get(id(self.optimizer)) if isinstance(states, dict) else None
        stage = state.get("stage") if state else None
        if stage is not None and getattr(stage, "name", "") in ("UNSCALED", "STEPPED"):
            return  # the loop already unscaled (for its own clipping): unscaling twice would raise
        self.scaler.unscale_(self.optimizer)

    def _force_scaler_skip(self) -> None:
        # GradScaler's own found-inf flags are per rank; make this rank's say "inf" too, so that
        # scaler.step() skips and scaler.update() lowers the scale identically everywhere.
        state = getattr(self.scaler, "_per_optimizer_states", {}).get(id(self.optimizer), {})
        flags = state.get("found_inf_per_device", {})
        for flag in flags.values():
            flag.fill_(1.0)
        if not flags:  # nothing recorded (no gradients on this rank): skip ourselves
            raise _ScalerUnavailable

    def step(
        self,
        closure=None,
        *,
        loss=None,
        batch_index: Any = None,
        sample_ids: Any = None,
        step: int | None = None,
    ) -> StepOutcome:
        """Apply the optimizer step if the agreed global gradient norm is finite; otherwise skip it everywhere.

        `loss` (optional) feeds the logging window (`log_window`); `batch_index` and `sample_ids`
        are recorded if the step is skipped; `step` overrides the guard's own step counter in messages.
        Raises `NonFiniteStepsError` on every rank after too many consecutive skips or on non-finite weights.
        """
        self.step_count += 1
        step_number = self.step_count if step is None else int(step)
        if self.scaler is not None and self.scaler.is_enabled():
            self._unscale()
        grads = [p.grad for p in self.parameters if p.grad is not None]
        stage_sum, local_flag = self._sum_of_squares(grads)
        norm, nonfinite = self._agree(stage_sum, local_flag)
        self.last_grad_norm = norm
        if nonfinite:
            self._skip(step_number, norm, bool(local_flag.item()), batch_index, sample_ids)
            return StepOutcome(step_number, applied=False, grad_norm=norm)
        clipped = self.max_grad_norm is not None and self._clip(norm, float(self.max_grad_norm))
        if self.scaler is not None and self.scaler.is_enabled():
            self.scaler.step(self.optimizer, *(() if closure is None else (closure,)))
            self.scaler.update()
        elif closure is None:
            self.optimizer.step()
        else:
            self.optimizer.step(closure)
        self.applied_steps += 1
        self.consecutive_nonfinite_steps = 0
        self.last_applied_step = step_number
        self._window_add_loss(loss)
        if self.check_weights_every > 0 and (
            self.applied_steps == 1 or self.applied_steps % self.check_weights_every == 0
        ):
            self._raise_if_weights_nonfinite(step_number)
        return StepOutcome(step_number, applied=True, grad_norm=norm, clipped=bool(clipped))

    def _skip(self, step_number: int, norm: float, local_nonfinite: bool, batch_index, sample_ids) -> None:
        self.nonfinite_steps_skipped += 1
        self.consecutive_nonfinite_steps += 1
        self._window_skipped += 1
        scaler_used = False
        if self.scaler is not None and self.scaler.is_enabled():
            try:
                self._force_scaler_skip()
                self.scaler.step(self.optimizer)  # skips: found_inf is set on every rank
                self.scaler.update()  # lowers the scale identically everywhere
                scaler_used = True
            except _ScalerUnavailable:
                pass
        self.optimizer.zero_grad(set_to_none=True)
        record = self._record(step_number, norm, local_nonfinite, batch_index, sample_ids)
        rank = self._rank()
        if rank == 0:
            scale = ""
            if scaler_used:
                scale = f"; GradScaler skipped it and lowered the scale to {self.scaler.get_scale():g}"
            where = ""
            if record.culprit_ranks:
                shown = {r: record.ranks[r] for r in record.culprit_ranks[:8]}
                where = f"; non-finite gradients on rank(s) {record.culprit_ranks}, their batches: {shown}"
            elif batch_index is not None or sample_ids is not None:
                where = f"; batch_index={batch_index!r}, sample_ids={_short(sample_ids)!r}"
            logger.warning(
                "torchtriage NonFiniteGuard: non-finite global grad norm at step %d: the update is skipped on "
                "every rank (nonfinite_steps_skipped=%d, consecutive %d of max_consecutive_nonfinite_steps=%d)%s%s",
                step_number,
                self.nonfinite_steps_skipped,
                self.consecutive_nonfinite_steps,
                self.max_consecutive_nonfinite_steps,
                scale,
                where,
            )
        self._raise_if_weights_nonfinite(step_number)
        limit = self.max_consecutive_nonfinite_steps
        if limit > 0 and self.consecutive_nonfinite_steps >= limit:
            since = "the start" if self.last_applied_step is None else f"step {self.last_applied_step}"
            raise NonFiniteStepsError(
                f"{self.consecutive_nonfinite_steps} consecutive non-finite steps "
                f"(max_consecutive_nonfinite_steps={limit}); weights are unchanged since {since}. "
                "The run diverged: lower the learning rate or lengthen warm-up, check the batches in "
                "guard.skipped_batches, and resume from the last good checkpoint."
            )

    def _record(self, step_number, norm, local_nonfinite, batch_index, sample_ids) -> SkippedBatch:
        mine = {
            "batch_index": _short(batch_index),
            "sample_ids": _short(sample_ids),
            "local_nonfinite": local_nonfinite,
        }
        if isinstance(mine["sample_ids"], list) and len(mine["sample_ids"]) > 4 * _SAMPLE_IDS_SHOWN:
            mine["sample_ids"] = mine["sample_ids"][: 4 * _SAMPLE_IDS_SHOWN] + ["..."]
        rank = self._rank()
        gathered = {rank: mine}
        dist = _dist()
        if dist is not None:
            # Every rank takes this branch (the skip is agreed), so this rare gather cannot desynchronise.
            gathered = dict(_gather_objects((rank, mine), self.group, self._device()))
        record = SkippedBatch(step=step_number, grad_norm=norm, ranks=gathered)
        self.skipped_batches.append(record)
        return record

    def _raise_if_weights_nonfinite(self, step_number: int) -> None:
        if not self.weights_finite():
            raise NonFiniteStepsError(
                f"the weights themselves are non-finite at step {step_number} (on at least one rank): skipping "
                "steps cannot repair them. Resume from the last good checkpoint; a non-finite update was "
                "applied before the guard ran, or the checkpoint loaded was already broken."
            )

    # -- logging ------------------------------------------------------------------------------
    def _window_add_loss(self, loss) -> None:
        self._window_applied += 1
        if loss is None:
            return
        value = loss.detach().float() if hasattr(loss, "detach") else float(loss)
        self._window_loss_sum = value if self._window_loss_sum is None else self._window_loss_sum + value

    def log_window(self) -> dict[str, float | int]:
        """Metrics for a logging window (the steps since the last call), then start a new window.

        `loss` is the mean loss of the steps whose update was *applied* in the window. When every step
        of the window was skipped, no update happened and there is no loss to report: it is `nan`.
        So `loss: nan` next to `nonfinite_steps_skipped` in a log means "the guard skipped these
        updates and the weights are intact", not "the model is broken"; the loss of skipped steps
        is left out because it is often finite while the gradients are not.
        """
        loss = float("nan")
        if self._window_applied and self._window_loss_sum is not None:
            total = self._window_loss_sum
            loss = (float(total.item()) if hasattr(total, "item") else float(total)) / self._window_applied
        metrics = {
            "loss": loss,
            "grad_norm": self.last_grad_norm,
            "nonfinite_steps_skipped": self.nonfinite_steps_skipped,
            "steps_skipped_in_window": self._window_skipped,
            "steps_applied_in_window": self._window_applied,
        }
        self._window_loss_sum, self._window_applied, self._window_skipped = None, 0, 0
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {
            "step_count": self.step_count,
            "applied_steps": self.applied_steps,
            "nonfinite_steps_skipped": self.nonfinite_steps_skipped,
            "consecutive_nonfinite_steps": self.consecutive_nonfinite_steps,
            "last_applied_step": self.last_applied_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            if key in self.state_dict():
                setattr(self, key, value)


class _ScalerUnavailable(Exception):
    pass


def _gather_objects(obj: Any, group, device) -> list:
    """`all_gather_object` without numpy (which torch's version needs): pickle → bytes tensors → gather."""
    import pickle

    import torch

    dist = _dist()
    payload = torch.tensor(list(pickle.dumps(obj)), dtype=torch.uint8, device=device)
    world = dist.get_world_size(group)
    size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    chunks = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(chunks, padded, group=group)
    # Our own plain tuples of str/int/float/bool/None/list/dict, from our own ranks in this job.
    return [pickle.loads(bytes(c[: int(n.item())].tolist())) for c, n in zip(chunks, sizes, strict=True)]
