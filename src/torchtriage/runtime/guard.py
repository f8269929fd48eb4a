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

With `blocking=False` (and an optimizer made with `fused=True`) no step waits for the device: the
non-finite flag of the agreed norm goes to the optimizer's fused kernel (`found_inf`, the contract
`GradScaler` uses), which skips the update on every rank alike, and the host reads the numbers when
the next step begins (`pending_step`). The count, the warning, the record, the replays and the errors
then come one step later, and `guard.step()` returns a `DeferredStepOutcome`, whose fields wait for
the device when read.

Where the value was born (`model=`, `locate=True`, and `guard.step(..., replay=closure)` where
`closure()` recomputes the loss of the same batch): on a skipped step — agreed, so every rank takes
the same path — every rank replays the batch twice under `locate_nonfinite`, the ranks gather their
origins, and every rank decides the same suspect: the data, the numerics or the hardware
(`nonfinite_verdict`). Under DDP the replay runs inside `no_sync()`, so each rank's gradients are its
own; FSDP2's collectives still run, on every rank together. Rank 0 appends the record to
`report_dir/nonfinite.jsonl` (the run folder under `torchtriage run`) and logs one line that `triage`
reads. `watch="blocks"` adds a device-side sum per top-level block output (`block_flags`), read only
on a skip, which names the block on the step itself.

Cost when nothing is wrong, per step: one fused norm pass over the gradients (the kernel
`clip_grad_norm_` uses: one read of every gradient), a dot of the per-tensor norms and one all-reduce
of one float per group, a fixed handful of device ops whatever the model's size; and, with the
default `blocking=True`, one device-to-host read, a wait for the device after which it idles while the
host launches the optimizer, which on a GPU costs more than the norm. `locate=True` costs nothing
until a step is skipped; the skipped step then takes many steps' time, since the two replays read
every op's output on the host. `watch="blocks"` adds one reduction kernel per block output.
benchmarks/helper_costs.py measures each of these.
"""

from __future__ import annotations

import logging
import math
import os
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torchtriage.protocol import RUN_DIR_ENV
from torchtriage.runtime import nonfinite_verdict
from torchtriage.runtime.grad_norms import SumsOfSquares
from torchtriage.runtime.pending_step import DeferredStepOutcome, PendingStep

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
    # rank -> {"batch_index": ..., "sample_ids": ..., "local_nonfinite": bool, "loss_finite": bool | None,
    #          and with locate=True: "replayed", "origin", "origin_again", "replay_error"; with watch: "blocks"}
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)
    suspect: str | None = None  # data, numerics, hardware, loss_scale or undetermined (locate=True)
    evidence: str = ""

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
        model: the model the optimizer trains (needed by `locate` and `watch`).
        locate: on a skipped step, replay it (`guard.step(replay=closure)`) and find where the first
            non-finite value appeared, on every rank, and whether it is the data, numerics or hardware.
        report_dir: where rank 0 appends `nonfinite.jsonl` (default: the run folder of `torchtriage run`).
        watch: "blocks" (or a list of module names) keeps a device-side flag per block output.
        blocking: True (default): each step reads the agreed norm on the host before it steps, so
            `guard.step()` returns what it did; any optimizer. False: the decision stays on the device
            (the optimizer's fused kernel skips the update), and the host reads it when the next step
            begins, so no step waits for the device; needs an optimizer with `fused=True`.
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
        model=None,
        locate: bool = False,
        report_dir: str | os.PathLike | None = None,
        watch: str | list[str] | None = None,
        blocking: bool = True,
    ):
        if (locate or watch) and model is None:
            raise ValueError("NonFiniteGuard: locate= and watch= need model= (the model the optimizer trains)")
        if not blocking and not getattr(optimizer, "_step_supports_amp_scaling", False):
            raise ValueError(
                f"NonFiniteGuard(blocking=False) skips a step on the device, inside the optimizer's fused kernel, "
                f"and {type(optimizer).__name__} has none: use torch.optim.AdamW, Adam, SGD or Adagrad with "
                "fused=True, or blocking=True (any optimizer; one wait for the device per step)."
            )
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
        self._squares = SumsOfSquares(self.parameters)
        self.blocking = bool(blocking)
        self._pending = None  # blocking=False: the last step, read when the next one begins
        self.model = model
        self.locate = bool(locate)
        report_dir = report_dir if report_dir is not None else os.environ.get(RUN_DIR_ENV) or None
        self.report_dir = None if report_dir is None else os.fspath(report_dir)
        self.block_flags = None
        if watch is not None:
            from torchtriage.runtime.block_flags import BlockFlags

            self.block_flags = BlockFlags(model, None if watch == "blocks" else list(watch))

    # -- the rank -----------------------------------------------------------------------------
    def _rank(self) -> int:
        dist = _dist()
        if dist is not None:
            return dist.get_rank()
        value = os.environ.get("RANK", "")
        return int(value) if value.isdigit() else 0

    # -- norms --------------------------------------------------------------------------------
    def _device(self):
        return self._squares.device()

    def _grad_sums(self):
        return self._squares.of_grads()

    def _agree(self, stage_sum) -> tuple[float, bool]:
        """(norm, non-finite): the stages' sums added over `pipeline_group`, the largest over `group`.

        One all-reduce per group of one float, and one device-to-host copy: the decision to step
        needs the number on the host, the same on every rank. A NaN becomes +inf first, since a MAX
        reduction may drop a NaN but never an inf (Σx² is never negative, so +inf means non-finite).
        """
        sum_sq = self._agreed_sum(stage_sum).item()  # the one host read of the step
        if not math.isfinite(sum_sq):
            return float("nan"), True
        return math.sqrt(sum_sq), False

    def _agreed_sum(self, stage_sum):
        """The global Σx² on the device, the same on every rank (see `_agree`); nothing is read."""
        import torch

        dist = _dist()
        if dist is None:
            return stage_sum
        agreed = torch.nan_to_num(stage_sum, nan=math.inf, posinf=math.inf, neginf=math.inf)
        if self.pipeline_group is not None:
            dist.all_reduce(agreed, op=dist.ReduceOp.SUM, group=self.pipeline_group)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=self.group)
        return agreed

    def grad_norm(self) -> float:
        """The global gradient norm, agreed across ranks (nan when any rank's gradients are non-finite)."""
        return self._agree(self._grad_sums()[0])[0]

    def weights_finite(self) -> bool:
        """Whether every weight on every rank is finite (a collective: call it on every rank)."""
        import torch

        with torch.no_grad():
            own = self._squares.of_weights()
        flag = (~torch.isfinite(own)).float().reshape(1)
        dist = _dist()
        if dist is not None:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return not bool(flag.item())

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
        replay=None,
    ) -> StepOutcome | DeferredStepOutcome:
        """Apply the optimizer step if the agreed global gradient norm is finite; otherwise skip it everywhere.

        `loss` (optional) feeds the logging window (`log_window`); `batch_index` and `sample_ids`
        are recorded if the step is skipped; `step` overrides the guard's own step counter in messages.
        `replay` (with `locate=True`): a callable that recomputes the loss of the same batch, run only
        on a skipped step, on every rank, to find where the non-finite value was born.
        Raises `NonFiniteStepsError` on every rank after too many consecutive skips or on non-finite weights.

        With `blocking=False` the step is applied or skipped on the device and a `DeferredStepOutcome`
        is returned; the previous step's decision is accounted for first (counted, logged, replayed
        when skipped, and raised on), so all of the above happens one step later.
        """
        self.step_count += 1
        step_number = self.step_count if step is None else int(step)
        if not self.blocking:
            return self._step_on_device(step_number, closure, loss, batch_index, sample_ids, replay)
        if self.scaler is not None and self.scaler.is_enabled():
            self._unscale()
        stage_sum, own = self._grad_sums()
        norm, nonfinite = self._agree(stage_sum)
        self.last_grad_norm = norm
        if nonfinite:
            own_nonfinite = not math.isfinite(own.item())
            try:
                self._skip(step_number, norm, own_nonfinite, batch_index, sample_ids, loss, replay)
            finally:
                self._reset_block_flags()
            return StepOutcome(step_number, applied=False, grad_norm=norm)
        self._reset_block_flags()
        clipped = self.max_grad_norm is not None and self._clip(norm, float(self.max_grad_norm))
        if self.scaler is not None and self.scaler.is_enabled():
            self.scaler.step(self.optimizer, *(() if closure is None else (closure,)))
            self.scaler.update()
        elif closure is None:
            self.optimizer.step()
        else:
            self.optimizer.step(closure)
        self._count_applied(step_number, loss)
        return StepOutcome(step_number, applied=True, grad_norm=norm, clipped=bool(clipped))

    def _count_applied(self, step_number: int, loss) -> None:
        self.applied_steps += 1
        self.consecutive_nonfinite_steps = 0
        self.last_applied_step = step_number
        self._window_add_loss(loss)
        if self.check_weights_every > 0 and (
            self.applied_steps == 1 or self.applied_steps % self.check_weights_every == 0
        ):
            self._raise_if_weights_nonfinite(step_number)

    # -- blocking=False: decided on the device, read a step later --------------------------------
    def _step_on_device(self, step_number, closure, loss, batch_index, sample_ids, replay) -> DeferredStepOutcome:
        import torch

        self.flush()
        scaler_on = self.scaler is not None and self.scaler.is_enabled()
        if scaler_on:
            self._unscale()
        stage_sum, own = self._grad_sums()
        agreed = self._agreed_sum(stage_sum)
        found_inf = torch.isfinite(agreed).logical_not().float()  # 1.0: the fused kernel skips the update
        if self.max_grad_norm is not None:
            self._clip_on_device(agreed)
        args = () if closure is None else (closure,)
        if scaler_on:
            states = getattr(self.scaler, "_per_optimizer_states", {}).get(id(self.optimizer), {})
            for flag in states.get("found_inf_per_device", {}).values():
                flag.copy_(found_inf)  # any rank's non-finite value, so the scale is lowered alike everywhere
            self.scaler.step(self.optimizer, *args)
            self.scaler.update()
        else:
            self.optimizer.grad_scale, self.optimizer.found_inf = None, found_inf
            try:
                self.optimizer.step(*args)
            finally:
                del self.optimizer.grad_scale, self.optimizer.found_inf
        self._pending = PendingStep(
            step_number,
            torch.stack([agreed, own.to(agreed.device)]),
            batch_index=batch_index,
            sample_ids=sample_ids,
            loss=loss.detach() if isinstance(loss, torch.Tensor) else loss,
            replay=replay,
            blocks=self.block_flags.take() if self.block_flags is not None else None,
        )
        return DeferredStepOutcome(self._pending, self.max_grad_norm)

    def _clip_on_device(self, agreed_sum) -> None:
        """Clip to `max_grad_norm` with a coefficient that stays on the device (as `clip_grad_norm_` does)."""
        import torch

        coef = (float(self.max_grad_norm) / (agreed_sum.sqrt() + 1e-6)).clamp(max=1.0)
        grads = [getattr(p.grad, "_local_tensor", p.grad) for p in self.parameters if p.grad is not None]
        try:
            torch._foreach_mul_(grads, coef)
        except (RuntimeError, TypeError):
            for g in grads:
                g.mul_(coef.to(g.device))

    def flush(self) -> None:
        """Account for the last step now (`blocking=False`); otherwise the next `step()` does it first.

        When that step was skipped, this gathers its record (and replays it with `locate=True`) on
        every rank, and may raise `NonFiniteStepsError`: call it on every rank, as `step()` is.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return
        agreed, own = pending.numbers()
        if math.isfinite(agreed):
            self.last_grad_norm = math.sqrt(agreed)
            self._count_applied(pending.step, pending.loss)
            return
        self.last_grad_norm = float("nan")
        self._skip(
            pending.step,
            float("nan"),
            not math.isfinite(own),
            pending.batch_index,
            pending.sample_ids,
            pending.loss,
            pending.replay,
            blocks=pending.blocks,
            skipped_on_device=True,
        )

    def _reset_block_flags(self) -> None:
        if self.block_flags is not None:
            self.block_flags.reset()

    def _skip(
        self,
        step_number: int,
        norm: float,
        local_nonfinite: bool,
        batch_index,
        sample_ids,
        loss=None,
        replay=None,
        *,
        blocks=None,
        skipped_on_device: bool = False,
    ) -> None:
        """Count, record and report a skipped step; `skipped_on_device`: the fused kernel already skipped
        it (and the scaler lowered its scale), and the gradients now held are the next step's."""
        self.nonfinite_steps_skipped += 1
        self.consecutive_nonfinite_steps += 1
        self._window_skipped += 1
        scaler_used = skipped_on_device and self.scaler is not None and self.scaler.is_enabled()
        if self.scaler is not None and self.scaler.is_enabled() and not skipped_on_device:
            try:
                self._force_scaler_skip()
                self.scaler.step(self.optimizer)  # skips: found_inf is set on every rank
                self.scaler.update()  # lowers the scale identically everywhere
                scaler_used = True
            except _ScalerUnavailable:
                pass
        if not skipped_on_device:
            self.optimizer.zero_grad(set_to_none=True)
        found = self._find_origin(loss, replay, blocks)
        record = self._record(step_number, norm, local_nonfinite, batch_index, sample_ids, found)
        rank = self._rank()
        if rank == 0:
            scale = ""
            if scaler_used:
                scale = f"; GradScaler skipped it and lowered the scale to {self.scaler.get_scale():g}"
            where = ""
            if record.culprit_ranks:
                shown = {r: _batch_of(record.ranks[r]) for r in record.culprit_ranks[:8]}
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
            if found:
                self._report_origin(record)
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

    def _record(self, step_number, norm, local_nonfinite, batch_index, sample_ids, found=None) -> SkippedBatch:
        mine = {
            "batch_index": _short(batch_index),
            "sample_ids": _short(sample_ids),
            "local_nonfinite": local_nonfinite,
            "grads_reduced": self._reduced_before_step(),
            **(found or {}),
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
        if found:
            record.suspect, record.evidence = nonfinite_verdict.judge(
                gathered, scaler=found.get("scaler", False), sharded_weights=self._sharded_weights()
            )
        self.skipped_batches.append(record)
        return record

    # -- where the value was born ---------------------------------------------------------------
    def _reduced_before_step(self) -> bool:
        """Whether the gradients the guard sees were already reduced across ranks (DDP's all-reduce,
        FSDP2's reduce-scatter): then they name no rank unless some ranks' differ from the others'."""
        if self.model is None:
            return False
        if self._ddp() is not None:
            return True
        return any(hasattr(m, "set_requires_gradient_sync") for m in self.model.modules())

    def _ddp(self):
        from torchtriage.runtime.locate import peel_wrappers

        wrappers = peel_wrappers(self.model)[1]
        return next((module for name, module in wrappers if name == "DistributedDataParallel"), None)

    def _sharded_weights(self) -> bool:
        return any(hasattr(p, "placements") for p in self.parameters)

    def _find_origin(self, loss, replay, blocks=None) -> dict[str, Any] | None:
        """This rank's evidence for the skipped step: its loss, its block flags and two replays' origins.

        Every rank gets here together (the skip is agreed), so the replays' collectives (FSDP2's
        all-gathers) meet; a replay that raises is caught and reported, never left to one rank.
        """
        if not (self.locate or self.block_flags is not None):
            return None
        import torch

        found: dict[str, Any] = {"scaler": self.scaler is not None and self.scaler.is_enabled()}
        if isinstance(loss, torch.Tensor):
            found["loss_finite"] = bool(torch.isfinite(loss.detach()).all().item())
        if self.block_flags is not None:
            found["blocks"] = {"block": None} | (self.block_flags.read(blocks) or {})
        if self.locate and replay is not None:
            found["replayed"] = True
            try:
                with self._local_replay():
                    found["origin"] = self._locate_once(replay)
                    found["origin_again"] = self._locate_once(replay)
            except Exception as error:  # noqa: BLE001 - reported in the record, never left to one rank
                found["replay_error"] = f"{type(error).__name__}: {error}"[:300]
        return found

    def _locate_once(self, replay):
        from torchtriage.runtime.locate import locate_nonfinite

        return locate_nonfinite(self.model, replay, optimizer=self.optimizer)

    def _local_replay(self):
        """DDP without its all-reduce, so that each rank's gradients are its own.

        FSDP2 keeps its reduce-scatter: with gradient sync off it would accumulate the replay's
        unsharded gradients inside its own state, into the next real step. Every rank replays
        together, so its collectives meet, and the locator checks each rank's values before they
        are reduced.
        """
        import contextlib

        ddp = self._ddp()
        return ddp.no_sync() if ddp is not None else contextlib.nullcontext()

    def _report_origin(self, record: SkippedBatch) -> None:
        entry = nonfinite_verdict.record(record.step, record.grad_norm, record.ranks, (record.suspect, record.evidence))
        logger.warning("%s", nonfinite_verdict.log_line(entry))
        if self.report_dir is None:
            return
        import json

        try:
            os.makedirs(self.report_dir, exist_ok=True)
            with open(os.path.join(self.report_dir, "nonfinite.jsonl"), "a", encoding="utf-8") as out:
                out.write(json.dumps(entry, default=repr) + "\n")
        except OSError as error:
            logger.warning("torchtriage NonFiniteGuard: could not write %s/nonfinite.jsonl: %s", self.report_dir, error)

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


def _batch_of(info: dict[str, Any]) -> dict[str, Any]:
    return {key: info.get(key) for key in ("batch_index", "sample_ids")}


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
