"""An always-on step monitor: where each rank spends its step, and which rank holds the others back.

    monitor = StepMonitor("runs/monitor", window=50, tokens_per_step=batch * seq).start()
    for batch in loader:
        ...
        optimizer.step()
        monitor.step()            # or let `torchtriage run --monitor` do all of this with no code

Per step and rank, with no host-device synchronisation on the hot path:

- `wall`: from one step boundary to the next;
- `data`: time blocked in a DataLoader iterator's `__next__` (the iterator class is wrapped);
- `forward`: host time from the forward's start to the first backward (`torch.autograd.backward` is
  wrapped): the work itself on a CPU job, its launch on a GPU. The forward starts at the batch's arrival
  (the return of the last `__next__` before the first backward) or, later, at the end of DDP's
  pre-forward (`DistributedDataParallel._pre_forward` is wrapped), whose buffer broadcast waits for every
  rank; without either, at the step's start, less its data wait;
- `backward`, `optimizer`: the backward call (with DDP, it holds the wait for the other ranks'
  gradients) and the optimizer's step (global optimizer step hooks);
- `gpu`: on CUDA, the device's forward, between two CUDA events: one recorded at the forward's start,
  which completes once the device has done all before (so it holds neither the data wait nor the
  previous step nor a wait for a peer), one at the first backward; `gpu_step`: from the first to one at
  the step's end; `host_paced`: whether the device's forward was done by the time the host had launched
  the backward (`Event.query`, never a wait): the device waited for its host. Events come from a pool, on
  sampled steps (at least five a window, at most one step in five: each costs a few driver calls), read a
  few steps later once done;
- tokens/s and samples/s when told the tokens or batch size, MFU when also told the model's flops per
  token (or given the model: 6 × parameters, dense transformers) and the device's peak flops;
  peak allocated and reserved CUDA memory (the allocator's counters: no synchronisation).

Every `window` steps each rank writes one line of `DIR/monitor/steps-rank{R}.jsonl` (`step_phases`: each
phase's median, its spread and its count), and the ranks exchange those numbers: one asynchronous
all-gather per window on a gloo group of the monitor's own, made by every rank when the monitor starts
after the job's process group, or right after `init_process_group`. Every rank reaches each boundary at
the same optimizer-step count (data parallelism needs the same number of optimizer steps on every rank
anyway), so the group's collectives are issued in the same order everywhere and cannot desynchronise the
job; none of them is waited for: the result is read in a later step once it has arrived, so no rank that
is ahead ever blocks. Then every rank decides the same (`straggler`), and rank 0 appends the decision to
`DIR/monitor/stragglers.jsonl` and logs one line that `triage` reads (rules `straggler.monitor*`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import statistics
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from torchtriage.protocol import MONITOR_SUBDIR, MONITOR_WINDOW_ENV, RUN_DIR_ENV
from torchtriage.runtime import step_phases, straggler

logger = logging.getLogger("torchtriage.monitor")

DEFAULT_WINDOW = 50
SCHEMA = "torchtriage.monitor/2"
_GIB = 1024**3
GPU_SAMPLE_EVERY = 5  # at most one step in five carries CUDA events ...
GPU_SAMPLES_PER_WINDOW = 5  # ... and at least five steps of each window do, for the window's median


class _Clock:
    """What the current step has spent so far, fed by the wrapped DataLoader, backward and optimizer."""

    def __init__(self):
        self.reset(time.perf_counter())

    def reset(self, now: float) -> None:
        self.start = now
        self.data = 0.0
        self.data_before_backward = 0.0
        self.forward_from: float | None = None  # the batch's arrival or DDP's pre-forward end, the later
        self.backward = 0.0
        self.backward_start: float | None = None
        self.backward_ended = False
        self.optimizer = 0.0
        self.optimizer_start: float | None = None
        self.backward_event = None
        self.host_paced: bool | None = None


_ACTIVE: list[StepMonitor] = []  # the monitors the wrapped functions report to (usually one)
_PATCH_LOCK = threading.Lock()
_ORIGINALS: dict[str, Any] = {}


def _install_patches() -> None:
    """Wrap the DataLoader iterator, autograd's backward and the optimizer step hooks, once per process."""
    import torch
    from torch.utils.data import dataloader

    with _PATCH_LOCK:
        if _ORIGINALS:
            return
        iterator = dataloader._BaseDataLoaderIter
        original_next = iterator.__next__
        original_backward = torch.autograd.backward

        def timed_next(self):
            began = time.perf_counter()
            arrived = False
            try:
                batch = original_next(self)
                arrived = True
                return batch
            finally:
                now = time.perf_counter()
                for monitor in _ACTIVE:
                    monitor._data_waited(now - began, now if arrived else None)

        def timed_backward(*args, **kwargs):
            began = time.perf_counter()
            for monitor in _ACTIVE:
                monitor._backward_starts(began)
            try:
                return original_backward(*args, **kwargs)
            finally:
                spent = time.perf_counter() - began
                for monitor in _ACTIVE:
                    monitor._backward_ends(spent)

        def before_optimizer(optimizer, args, kwargs):
            now = time.perf_counter()
            for monitor in _ACTIVE:
                monitor._clock.optimizer_start = now

        def after_optimizer(optimizer, args, kwargs):
            now = time.perf_counter()
            for monitor in list(_ACTIVE):
                if monitor._clock.optimizer_start is not None:
                    monitor._clock.optimizer += now - monitor._clock.optimizer_start
                    monitor._clock.optimizer_start = None
                if monitor.step_on == "optimizer":
                    monitor.step()

        _ORIGINALS["next"] = original_next
        _ORIGINALS["backward"] = original_backward
        iterator.__next__ = timed_next
        torch.autograd.backward = timed_backward
        _wrap_ddp_pre_forward(torch)
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        _ORIGINALS["hooks"] = (
            register_optimizer_step_pre_hook(before_optimizer),
            register_optimizer_step_post_hook(after_optimizer),
        )
        _wrap_init_process_group(torch)


def _wrap_ddp_pre_forward(torch) -> None:
    """The forward starts once DDP's pre-forward is done: it broadcasts the module's buffers from rank 0 (by
    default, on every forward of a module that has buffers), a collective that waits for every rank: a rank
    that waits there for a slower one is not computing."""
    ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
    original = getattr(ddp, "_pre_forward", None)
    if original is None:
        return

    @functools.wraps(original)
    def pre_forward(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        finally:
            now = time.perf_counter()
            for monitor in _ACTIVE:
                monitor._forward_starts(now)

    _ORIGINALS["ddp_pre_forward"] = original
    ddp._pre_forward = pre_forward


def _wrap_init_process_group(torch) -> None:
    """Make each monitor's group right after the job's own default group, on every rank at that point.

    A group is made by a collective of every rank: made lazily at a window's end, it hangs a job whose ranks
    reach that end at different times, or only some of them (a rank that takes no optimizer step)."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return
    c10d = dist.distributed_c10d
    original_init = c10d.init_process_group

    @functools.wraps(original_init)
    def init_process_group(*args, **kwargs):
        result = original_init(*args, **kwargs)
        for monitor in list(_ACTIVE):
            monitor._make_group()
        return result

    _ORIGINALS["init"] = original_init
    c10d.init_process_group = dist.init_process_group = init_process_group


def _remove_patches() -> None:
    import torch
    from torch.utils.data import dataloader

    with _PATCH_LOCK:
        if not _ORIGINALS or _ACTIVE:
            return
        dataloader._BaseDataLoaderIter.__next__ = _ORIGINALS.pop("next")
        torch.autograd.backward = _ORIGINALS.pop("backward")
        if "ddp_pre_forward" in _ORIGINALS:
            torch.nn.parallel.DistributedDataParallel._pre_forward = _ORIGINALS.pop("ddp_pre_forward")
        for handle in _ORIGINALS.pop("hooks"):
            handle.remove()
        if "init" in _ORIGINALS:
            torch.distributed.distributed_c10d.init_process_group = _ORIGINALS["init"]
            torch.distributed.init_process_group = _ORIGINALS.pop("init")


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


class StepMonitor:
    """Per-step timings on every rank, a line per window, and the straggler with its reason.

    Args:
        out_dir: the run folder; files go to `out_dir/monitor/` (default: the run folder of
            `torchtriage run`; none: nothing is written, decisions are still logged).
        window: steps per window (one exchange between the ranks per window).
        step_on: "manual" (call `monitor.step()`) or "optimizer" (every optimizer step is a step).
        tokens_per_step, samples_per_step: this rank's tokens and samples per step (or pass
            `tokens=`/`samples=` to `step()`), for throughput and MFU.
        flops_per_token: the model's training flops per token (default with `model`: 6 × parameters).
        peak_flops: the device's peak flops per second, for MFU.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike | None = None,
        *,
        window: int = DEFAULT_WINDOW,
        step_on: str = "manual",
        tokens_per_step: float | None = None,
        samples_per_step: float | None = None,
        flops_per_token: float | None = None,
        model=None,
        peak_flops: float | None = None,
    ):
        if step_on not in ("manual", "optimizer"):
            raise ValueError("StepMonitor: step_on is 'manual' or 'optimizer'")
        if window < 2:
            raise ValueError("StepMonitor: window must be at least 2 steps")
        out_dir = out_dir if out_dir is not None else os.environ.get(RUN_DIR_ENV) or None
        self.out_dir = None if out_dir is None else Path(out_dir) / MONITOR_SUBDIR
        self.window = int(window)
        self.step_on = step_on
        self.tokens_per_step = tokens_per_step
        self.samples_per_step = samples_per_step
        if flops_per_token is None and model is not None:
            flops_per_token = 6.0 * sum(p.numel() for p in model.parameters())
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.steps = 0
        self.decisions: list[dict[str, Any]] = []  # every decision so far, the same on every rank
        self._clock = _Clock()
        self._rows: list[dict[str, Any]] = []
        self._events: deque = deque()  # (row, start, backward or None, end event) waiting for the device
        self._start_event = None
        self._sample_every = max(1, min(GPU_SAMPLE_EVERY, self.window // GPU_SAMPLES_PER_WINDOW))
        self._thread = threading.get_ident()  # the training loop's: a batch fetched elsewhere is no step's start
        self._pending: deque = deque()  # (first, last, work, gathered) exchanges not read yet
        self._decider = straggler.Decider()
        self._group = None  # the exchange's gloo group; False: it could not be made
        self._write_failed = False
        self._started = False
        self._cuda_module = None
        self._free_events: list = []

    # -- life ---------------------------------------------------------------------------------------
    def start(self) -> StepMonitor:
        if not self._started:
            _install_patches()
            _ACTIVE.append(self)
            self._started = True
            dist = self._dist()
            if dist is not None and dist.is_initialized():
                self._make_group()  # started after the job's group: every rank starts its monitor at one point
            self._thread = threading.get_ident()
            self._clock.reset(time.perf_counter())
            self._record_start_event()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop measuring; wait (bounded) for the exchanges in flight and decide on them."""
        if not self._started:
            return
        _ACTIVE.remove(self)
        _remove_patches()
        self._started = False
        deadline = time.monotonic() + timeout
        while self._pending and time.monotonic() < deadline:
            if not self._read_exchanges():
                time.sleep(0.01)

    def __enter__(self) -> StepMonitor:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the rank ------------------------------------------------------------------------------------
    @staticmethod
    def _dist():
        import torch.distributed as dist

        return dist if dist.is_available() and dist.is_initialized() else None

    def _rank(self) -> int:
        dist = self._dist()
        if dist is not None:
            return dist.get_rank()
        value = os.environ.get("RANK", "")
        return int(value) if value.isdigit() else 0

    # -- measuring ------------------------------------------------------------------------------------
    def _cuda(self):
        """torch.cuda once the program has initialised CUDA (a cheap flag; is_available asks the driver)."""
        if self._cuda_module is None:
            import torch

            if torch.cuda.is_initialized():
                self._cuda_module = torch.cuda
        return self._cuda_module

    def _event(self):
        """A timing event from the pool (creating one per step costs a driver call each)."""
        if self._free_events:
            return self._free_events.pop()
        return self._cuda().Event(enable_timing=True)

    def _record_start_event(self) -> None:
        # Each event costs a driver call or two (record, query, elapsed): sampled steps only. Recorded at the
        # step's boundary, and again where its forward starts (_forward_starts), if it does.
        if self._cuda() is None or self.steps % self._sample_every:
            self._start_event = None
            return
        self._start_event = self._event()
        self._start_event.record()

    def _data_waited(self, spent: float, arrived_at: float | None) -> None:
        self._clock.data += spent
        if self._clock.backward_start is None:
            self._clock.data_before_backward += spent
            if arrived_at is not None:
                self._forward_starts(arrived_at)

    def _forward_starts(self, now: float) -> None:
        """A batch arrived, or DDP's pre-forward collectives are done: the forward starts here, unless a later
        one comes before the first backward."""
        if self._clock.backward_start is None and threading.get_ident() == self._thread:
            self._clock.forward_from = now
            if self._start_event is not None:
                self._start_event.record()  # completes once the device has done all before: this step's start

    def _backward_starts(self, now: float) -> None:
        if self._clock.backward_start is not None:
            return
        self._clock.backward_start = now
        if self._start_event is not None:
            self._clock.backward_event = self._event()
            self._clock.backward_event.record()

    def _backward_ends(self, spent: float) -> None:
        clock = self._clock
        clock.backward += spent
        if not clock.backward_ended:
            clock.backward_ended = True
            if clock.backward_event is not None:
                # Done already: the device finished the forward before the host had launched the backward,
                # so the device waited for its host. Not done: the host was ahead. (A query, never a wait.)
                clock.host_paced = clock.backward_event.query()

    def step(self, tokens: float | None = None, samples: float | None = None) -> None:
        """End of a step: record what it spent; at a window's end, write and exchange."""
        if not self._started:
            self.start()
        now = time.perf_counter()
        clock = self._clock
        ahead = clock.backward_start if clock.backward_start is not None else now
        if clock.forward_from is not None:
            forward = ahead - clock.forward_from
        else:  # no batch from a DataLoader before the backward: from the step's start, less its data wait
            forward = max(0.0, ahead - clock.start - clock.data_before_backward)
        wall = now - clock.start
        row = {
            "wall": wall,
            "data": clock.data,
            "forward": forward,
            "outside": max(0.0, wall - clock.data - forward),
            "backward": clock.backward,
            "optimizer": clock.optimizer,
            "gpu": None,
            "gpu_step": None,
            "host_paced": clock.host_paced,
            "tokens": tokens if tokens is not None else self.tokens_per_step,
            "samples": samples if samples is not None else self.samples_per_step,
        }
        if self._start_event is not None:
            end = self._event()
            end.record()
            self._events.append((row, self._start_event, clock.backward_event, end))
        self._rows.append(row)
        self.steps += 1
        clock.reset(now)
        self._record_start_event()
        window_ends = self.steps % self.window == 0
        if window_ends or self.steps % GPU_SAMPLE_EVERY == 0:  # a query is a driver call: now and then only
            self._read_events()
        self._read_exchanges()
        if window_ends:
            self._end_window()

    def _read_events(self) -> None:
        while self._events and self._events[0][3].query():  # the end is done, so is all before it
            row, start, backward, end = self._events.popleft()
            if backward is not None:
                row["gpu"] = start.elapsed_time(backward) / 1000.0
                self._free_events.append(backward)
            row["gpu_step"] = start.elapsed_time(end) / 1000.0
            self._free_events += (start, end)

    # -- windows --------------------------------------------------------------------------------------
    def _end_window(self) -> None:
        first, last = self.steps - self.window + 1, self.steps
        rows, self._rows = self._rows, []
        summary = self._summary(rows, first, last)
        self._write(f"steps-rank{self._rank()}.jsonl", summary)
        self._exchange(first, last, summary)

    def _summary(self, rows: list[dict[str, Any]], first: int, last: int) -> dict[str, Any]:
        walls = [r["wall"] for r in rows]
        total = sum(walls)

        def ms(key):
            value = _median(r[key] for r in rows)
            return None if value is None else round(value * 1000, 3)

        tokens = sum(r["tokens"] for r in rows if r["tokens"] is not None) if rows[0]["tokens"] is not None else None
        samples = (
            sum(r["samples"] for r in rows if r["samples"] is not None) if rows[0]["samples"] is not None else None
        )
        tokens_per_s = tokens / total if tokens is not None and total > 0 else None
        summary = {"schema": SCHEMA, "rank": self._rank(), "first_step": first, "last_step": last}
        summary |= step_phases.window_record(rows)  # what the decision reads, exchanged as written
        summary |= {
            "step_ms_max": round(max(walls) * 1000, 3),
            "backward_ms": ms("backward"),
            "optimizer_ms": ms("optimizer"),
            "gpu_step_ms": ms("gpu_step"),
            "tokens_per_s": tokens_per_s,
            "samples_per_s": samples / total if samples is not None and total > 0 else None,
            "mfu": (
                tokens_per_s * self.flops_per_token / self.peak_flops
                if tokens_per_s and self.flops_per_token and self.peak_flops
                else None
            ),
        }
        cuda = self._cuda()
        if cuda is not None:
            summary["peak_allocated_gib"] = round(cuda.max_memory_allocated() / _GIB, 3)
            summary["peak_reserved_gib"] = round(cuda.max_memory_reserved() / _GIB, 3)
        return summary

    def _exchange(self, first: int, last: int, summary: dict[str, Any]) -> None:
        dist = self._dist()
        if dist is None or dist.get_world_size() < 2:
            self._decide(first, last, {self._rank(): step_phases.decision_input(summary)})
            return
        if not self._group:
            return  # no group of its own (made at start only): no rank can decide for the job alone
        import torch

        world = dist.get_world_size()
        payload = torch.tensor(step_phases.exchanged(summary), dtype=torch.float64)
        gathered = torch.zeros(world * len(step_phases.EXCHANGED), dtype=torch.float64)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
        work = gather(gathered, payload, group=self._group, async_op=True)
        self._pending.append((first, last, work, gathered))

    def _read_exchanges(self) -> bool:
        read = False
        while self._pending and self._pending[0][2].is_completed():
            first, last, work, gathered = self._pending.popleft()
            work.wait()  # completed: returns at once, and raises what the exchange raised
            values = gathered.view(-1, len(step_phases.EXCHANGED)).tolist()
            stats = {rank: step_phases.from_exchanged(row) for rank, row in enumerate(values)}
            self._decide(first, last, stats)
            read = True
        return read

    def _decide(self, first: int, last: int, stats: dict[int, dict[str, float | None]]) -> None:
        decisions = self._decider.window(first, last, stats)
        self.decisions.extend(decisions)
        if self._rank() != 0:
            return
        for decision in decisions:
            logger.warning("%s", straggler.log_line(decision))
            self._write("stragglers.jsonl", decision)

    def _write(self, name: str, record: dict[str, Any]) -> None:
        if self.out_dir is None:
            return
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with open(self.out_dir / name, "a", encoding="utf-8") as out:
                out.write(json.dumps(record) + "\n")
        except OSError as error:
            if not self._write_failed:  # once: a full disk would otherwise log a line per window per rank
                logger.warning(
                    "torchtriage StepMonitor: could not write %s/%s: %s; further write errors are not logged",
                    self.out_dir, name, error,
                )  # fmt: skip
            self._write_failed = True

    def _make_group(self) -> None:
        """The monitor's own gloo group, made by every rank at the same point of the job (see
        _wrap_init_process_group); False when it cannot be made, and the monitor then decides per rank."""
        dist = self._dist()
        if self._group is not None or dist is None or not dist.is_initialized() or dist.get_world_size() < 2:
            return
        try:
            self._group = dist.new_group(backend="gloo")
        except Exception as error:  # noqa: BLE001 - the job runs on; windows are then decided per rank
            logger.warning("torchtriage StepMonitor: no group for the exchange (%s); each rank decides alone", error)
            self._group = False


def start_from_environment() -> StepMonitor | None:
    """Under `torchtriage run --monitor`: a monitor on every optimizer step, writing to the run folder."""
    value = os.environ.get(MONITOR_WINDOW_ENV, "")
    if not value:
        return None
    try:
        window = int(value)
    except ValueError:
        logger.warning(
            "torchtriage: %s=%r is not a number of steps; the step monitor uses %d",
            MONITOR_WINDOW_ENV,
            value,
            DEFAULT_WINDOW,
        )
        window = DEFAULT_WINDOW
    monitor = StepMonitor(os.environ.get(RUN_DIR_ENV), window=window, step_on="optimizer").start()
    import atexit

    atexit.register(monitor.close, 5.0)
    return monitor


# -- Hugging Face Trainer and Lightning ----------------------------------------------------------
class StepMonitorCallback:
    """A Hugging Face `TrainerCallback` running a `StepMonitor` on every optimizer step of the Trainer.

    `Trainer(..., callbacks=[StepMonitorCallback("runs/monitor", window=50)])`; samples per step
    default to the Trainer's per-device batch size times its gradient accumulation.
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        from torchtriage.runtime.framework import framework_instance

        return framework_instance(cls, ("transformers:TrainerCallback",), "Hugging Face transformers")

    def __init__(self, output_dir: str | os.PathLike | None = None, **options: Any):
        self.output_dir = output_dir
        self.options = options
        self.monitor: StepMonitor | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if self.monitor is None:
            options = dict(self.options)
            options.setdefault(
                "samples_per_step", args.per_device_train_batch_size * max(1, args.gradient_accumulation_steps)
            )
            self.monitor = StepMonitor(self.output_dir, step_on="optimizer", **options).start()
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.monitor is not None:
            self.monitor.close()
        return control


class LightningStepMonitor:
    """A Lightning `Callback` running a `StepMonitor` on every optimizer step of the fit.

    `L.Trainer(..., callbacks=[LightningStepMonitor("runs/monitor", window=50)])`.
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        from torchtriage.runtime.framework import framework_instance

        return framework_instance(
            cls, ("lightning.pytorch:Callback", "pytorch_lightning:Callback"), "Lightning (pip install lightning)"
        )

    def __init__(self, output_dir: str | os.PathLike | None = None, **options: Any):
        self.output_dir = output_dir
        self.options = options
        self.monitor: StepMonitor | None = None

    def on_fit_start(self, trainer, pl_module):
        if self.monitor is None:
            self.monitor = StepMonitor(self.output_dir, step_on="optimizer", **self.options).start()

    def on_fit_end(self, trainer, pl_module):
        if self.monitor is not None:
            self.monitor.close()
