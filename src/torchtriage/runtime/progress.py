"""What counts as progress for the hang watchdog: counters that move whenever the job does, read from a
thread of its own without waiting for the main thread.

The main thread's Python position alone misleads. A busy training loop spends most of its time inside
`loss.backward()` or a collective with the GIL released, and a watchdog thread gets the GIL mostly then:
sample after sample shows the same line while hundreds of steps pass. So progress is any of

- the main thread's stack, seen as a whole (any frame's function or line), differing from the last sample;
- the collectives issued on any process group (c10d's per-group sequence number, which every backend keeps
  and which a rank that waits never advances);
- the optimizer steps taken (a global post-step hook, one counter increment per step);
- an explicit `progress()` from the program.

A rank that waits in a collective, a store, a lock or a sleep moves none of them; a healthy loop moves
several every step.
"""

from __future__ import annotations

import sys
import threading

_STACK_DEPTH = 256  # frames compared per sample: deeper recursion is rare and its top still moves


def stack_signature(frame) -> tuple:
    """The main thread's stack as (code, line) pairs, innermost first: equal only if no frame moved."""
    signature = []
    while frame is not None and len(signature) < _STACK_DEPTH:
        signature.append((id(frame.f_code), frame.f_lineno))
        frame = frame.f_back
    return tuple(signature)


def _loaded(name: str):
    """A module the program has finished importing, or None (never imported from this thread)."""
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


class ProgressCounters:
    """The job's progress counters, each read without blocking; `reading()` is compared between samples."""

    def __init__(self) -> None:
        self.explicit = 0
        self.optimizer_steps = 0
        self._hook = None
        self._lock = threading.Lock()

    def note_progress(self) -> None:
        self.explicit += 1

    def reading(self) -> tuple[int, int, int]:
        """(explicit progress calls, optimizer steps, collectives issued on every group)."""
        self._hook_optimizer()
        return (self.explicit, self.optimizer_steps, collectives_issued())

    def close(self) -> None:
        with self._lock:
            if self._hook is not None:
                self._hook.remove()
                self._hook = None

    def _hook_optimizer(self) -> None:
        """Counts optimizer steps once the program has imported torch.optim itself."""
        if self._hook is not None:
            return
        optimizer = _loaded("torch.optim.optimizer")
        register = getattr(optimizer, "register_optimizer_step_post_hook", None)
        if register is None:
            return
        with self._lock:
            if self._hook is None:
                self._hook = register(self._count_step)

    def _count_step(self, optimizer, args, kwargs) -> None:
        self.optimizer_steps += 1


def collectives_issued() -> int:
    """The sum over the job's process groups of c10d's sequence number: how many collectives each issued.

    0 before torch.distributed is loaded and initialised. The group map is copied first: the main thread may
    create a group meanwhile."""
    if _loaded("torch") is None:
        return 0
    c10d = _loaded("torch.distributed.distributed_c10d")
    world = getattr(c10d, "_world", None)
    groups = getattr(world, "pg_map", None)
    if not groups:
        return 0
    total = 0
    for group in list(groups):
        try:
            total += int(group._get_sequence_number_for_group())
        except Exception:  # noqa: BLE001 - a group being destroyed, or a backend without the counter
            continue
    return total
