"""A guarded step decided on the device and read by the host a step later (`NonFiniteGuard(blocking=False)`).

Reading the agreed gradient norm on the host as soon as it is computed is a wait for the device on
every step: the device finishes the backward, then idles while the host launches the optimizer and
the next forward, which on a GPU costs more than the norm itself. With `blocking=False` the decision
stays on the device: the norm's non-finite flag goes to the optimizer's fused kernel (`found_inf`,
the contract `GradScaler` uses), which skips the update on every rank alike, since every rank holds
the same agreed number. The numbers are copied to pinned host memory behind an event and read when
the next step begins, by which time the device is long past them, so nothing waits.
"""

from __future__ import annotations

import math
from typing import Any


class PendingStep:
    """One step's agreed Σx² and this rank's own, on their way to the host, and what the step was told."""

    def __init__(
        self,
        step: int,
        values,
        *,
        batch_index: Any = None,
        sample_ids: Any = None,
        loss: Any = None,
        replay: Any = None,
        blocks: Any = None,
    ):
        self.step = step
        self.batch_index = batch_index
        self.sample_ids = sample_ids
        self.loss = loss
        self.replay = replay
        self.blocks = blocks
        self._values = values
        self._event = None
        self._numbers: tuple[float, float] | None = None
        if values.device.type == "cuda":
            import torch

            host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            host.copy_(values, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
            self._values = host

    def numbers(self) -> tuple[float, float]:
        """(agreed Σx², own Σx²): waits only for this step's copy, never for the work queued after it."""
        if self._numbers is None:
            if self._event is not None:
                self._event.synchronize()
            agreed, own = self._values.tolist()
            self._numbers = (agreed, own)
        return self._numbers

    @property
    def applied(self) -> bool:
        return math.isfinite(self.numbers()[0])

    @property
    def grad_norm(self) -> float:
        agreed = self.numbers()[0]
        return math.sqrt(agreed) if math.isfinite(agreed) else float("nan")


class DeferredStepOutcome:
    """What `NonFiniteGuard.step` did with `blocking=False`: the same fields as `StepOutcome`.

    The step was applied or skipped on the device already; reading `applied`, `grad_norm` or
    `clipped` waits for the device to reach the end of that step. The guard itself reads them when
    the next step begins, without waiting.
    """

    def __init__(self, pending: PendingStep, max_grad_norm: float | None):
        self._pending = pending
        self._max_grad_norm = max_grad_norm

    @property
    def step(self) -> int:
        return self._pending.step

    @property
    def applied(self) -> bool:
        return self._pending.applied

    @property
    def grad_norm(self) -> float:
        return self._pending.grad_norm

    @property
    def clipped(self) -> bool:
        if self._max_grad_norm is None or not self.applied:
            return False
        return self._max_grad_norm / (self.grad_norm + 1e-6) < 1.0  # the test `_clip` makes

    def __repr__(self) -> str:
        return (
            f"DeferredStepOutcome(step={self.step}, applied={self.applied}, grad_norm={self.grad_norm}, "
            f"clipped={self.clipped})"
        )
