"""Profile a few training steps on chosen ranks and leave traces that `torchtriage trace` and Perfetto read.

- `profile_steps(...)`: a context manager for plain loops; call `.step()` once per training step.
  A schedule (skip `wait` steps, `warmup` steps, record `active` steps, `repeat` times) keeps the
  profiler off for all other steps. Each selected rank writes
  `<output_dir>/<label>-rankNN.trace.json.gz` (with `repeat` ≠ 1: `<label>-cycleN-rankNN…`), a Chrome
  trace with `ProfilerStep#N` ranges and the user's `phase(...)` ranges; the top ops (key_averages)
  are logged and written next to it as `.top_ops.txt`; with `memory_snapshot=True` and CUDA, the
  active window's allocation history as `mem-<label>-rankNN.pickle`.
- `TorchProfilerCallback`: the same for the Hugging Face `Trainer` (a `TrainerCallback`; transformers
  is imported only when the callback is created).
- `phase("data")`: a labelled range (`torch.profiler.record_function`) that shows up in the trace.
- `record_flamegraphs(...)`: py-spy flame graphs of this rank, sampled from a background thread while
  training goes on — the in-process twin of `torchtriage record`.

Ranks are chosen with "0" (default), "all", or a list such as "0,8"; unselected ranks do nothing at
all (no barrier: that would deadlock against ranks that skip). Every exporter is guarded: a profiler
fault logs a warning and switches the profiler off, it never stops training.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from torchtriage.runtime.memory import artifacts_dir, parse_ranks, rank_selected, rank_tag

logger = logging.getLogger("torchtriage.profiler")

PROFILER_SUBDIR = "profiler"
FLAMEGRAPH_SUBDIR = "flamegraphs"
TRACE_SUFFIX = ".trace.json.gz"
TOP_OPS_ROWS = 25


def phase(name: str):
    """A labelled range in the profiler trace (`with phase("data"): ...`); near-free when not profiling."""
    import torch

    return torch.profiler.record_function(name)


class _Off:
    """What unselected ranks get: the same interface, doing nothing."""

    enabled = False
    written: list[Path] = []

    def step(self) -> None:
        pass

    def start(self):
        return self

    def stop(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


class StepProfiler:
    """torch.profiler on a schedule, with guarded exports. Use through `profile_steps` or the HF callback."""

    enabled = True

    def __init__(
        self,
        output_dir: str | os.PathLike | None = None,
        *,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        record_shapes: bool = True,
        profile_memory: bool = False,
        with_stack: bool = False,
        memory_snapshot: bool = False,
        label: str = "trace",
        top_ops: int = TOP_OPS_ROWS,
        cuda: bool | None = None,
    ):
        self.output_dir = artifacts_dir(output_dir, PROFILER_SUBDIR)
        self.wait, self.warmup, self.active, self.repeat = int(wait), int(warmup), int(active), int(repeat)
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.memory_snapshot = memory_snapshot
        self.label = label
        self.top_ops = top_ops
        self._cuda = cuda
        self.written: list[Path] = []
        self._prof = None
        self._cycle = 0
        self._recording_memory = False
        self._steps = 0

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> StepProfiler:
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile, schedule

            if self._cuda is None:
                self._cuda = torch.cuda.is_available()
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda else [])
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._prof = profile(
                activities=activities,
                schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=self.repeat),
                on_trace_ready=self._on_trace_ready,
                record_shapes=self.record_shapes,
                profile_memory=self.profile_memory,
                with_stack=self.with_stack,
            )
            self._prof.__enter__()
        except Exception as err:  # noqa: BLE001
            self._fail("could not start the profiler", err)
        return self

    def step(self) -> None:
        """Mark the end of a training step (call once per step, on every selected rank)."""
        if self._prof is None:
            return
        self._steps += 1
        try:
            self._prof.step()
        except Exception as err:  # noqa: BLE001
            self._fail("profiler step failed", err)
            return
        if self.memory_snapshot and self._cuda and not self._recording_memory:
            self._maybe_start_memory_history()

    def stop(self) -> None:
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        try:
            prof.__exit__(None, None, None)  # exports a window cut short by the end of training
        except Exception as err:  # noqa: BLE001
            self._warn("profiler stop failed", err)
        self._stop_memory_history(dump=True)
        if self.written:
            logger.info("[%s] torchtriage profiler wrote: %s", rank_tag(), ", ".join(str(p) for p in self.written))

    def __enter__(self) -> StepProfiler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- exports --------------------------------------------------------------------------------
    def _prefix(self) -> str:
        cycle = f"-cycle{self._cycle}" if self.repeat != 1 else ""
        return f"{self.label}{cycle}-{rank_tag()}"

    def _on_trace_ready(self, prof) -> None:
        self._cycle += 1
        prefix = self.output_dir / self._prefix()
        trace = Path(f"{prefix}{TRACE_SUFFIX}")
        try:
            prof.export_chrome_trace(str(trace))
            self._keep(trace)
        except Exception as err:  # noqa: BLE001
            self._warn(f"could not export the Chrome trace {trace}", err)
        try:
            sort_by = "self_cuda_time_total" if self._cuda else "self_cpu_time_total"
            table = prof.key_averages().table(sort_by=sort_by, row_limit=self.top_ops)
            top = Path(f"{prefix}.top_ops.txt")
            top.write_text(table + "\n")
            self._keep(top)
            logger.info("[%s] top ops of profiler window %d:\n%s", rank_tag(), self._cycle, table)
        except Exception as err:  # noqa: BLE001
            self._warn("could not build the top-ops table", err)
        self._stop_memory_history(dump=True)

    def _keep(self, path: Path) -> None:
        if path.exists() and path.stat().st_size == 0:
            path.unlink()
            logger.warning("torchtriage profiler: %s was empty and was removed", path)
        elif path.exists():
            self.written.append(path)

    # -- memory snapshot of the active window ---------------------------------------------------
    def _maybe_start_memory_history(self) -> None:
        from torch.profiler import ProfilerAction

        action = getattr(self._prof, "current_action", None)
        if action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            try:
                import torch

                torch.cuda.memory._record_memory_history(max_entries=100_000)
                self._recording_memory = True
            except Exception as err:  # noqa: BLE001
                self._warn("could not start CUDA memory history", err)
                self.memory_snapshot = False

    def _stop_memory_history(self, dump: bool) -> None:
        if not self._recording_memory:
            return
        self._recording_memory = False
        from torchtriage.runtime.memory import dump_snapshot

        if dump:
            written = dump_snapshot(self.output_dir / f"mem-{self._prefix()}.pickle")
            if written is not None:
                self.written.append(written)
        try:
            import torch

            torch.cuda.memory._record_memory_history(enabled=None)
        except Exception as err:  # noqa: BLE001
            self._warn("could not stop CUDA memory history", err)

    # -- faults ---------------------------------------------------------------------------------
    def _warn(self, what: str, err: BaseException) -> None:
        logger.warning("[%s] torchtriage profiler: %s: %s: %s", rank_tag(), what, type(err).__name__, err)

    def _fail(self, what: str, err: BaseException) -> None:
        self._warn(what + "; profiling is off for the rest of the run, training continues", err)
        prof, self._prof = self._prof, None
        if prof is not None:
            with contextlib.suppress(Exception):
                prof.__exit__(None, None, None)


def profile_steps(
    output_dir: str | os.PathLike | None = None,
    *,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    repeat: int = 1,
    ranks: str | int | None = "0",
    record_shapes: bool = True,
    profile_memory: bool = False,
    with_stack: bool = False,
    memory_snapshot: bool = False,
    label: str = "trace",
    top_ops: int = TOP_OPS_ROWS,
) -> StepProfiler | _Off:
    """Profile steps of a plain training loop on the selected ranks::

        with profile_steps("traces", wait=5, warmup=1, active=3, ranks="all") as prof:
            for batch in loader:
                with phase("forward_backward"):
                    ...
                prof.step()

    Returns a context manager whose `.step()` marks each step; `.written` lists the files written.
    On unselected ranks it does nothing.
    """
    parse_ranks(ranks)  # a malformed spec is a usage error on every rank, before training starts
    if not rank_selected(ranks):
        return _Off()
    return StepProfiler(
        output_dir,
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=repeat,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
        memory_snapshot=memory_snapshot,
        label=label,
        top_ops=top_ops,
    )


# -- Hugging Face Trainer ---------------------------------------------------------------------
class TorchProfilerCallback:
    """A Hugging Face `TrainerCallback` that profiles steps on the selected ranks (see `profile_steps`).

    `trainer = Trainer(..., callbacks=[TorchProfilerCallback("traces", wait=5, active=3, ranks="all")])`

    transformers is imported when the callback is created, not when torchtriage is imported; the
    instance is a real `transformers.TrainerCallback`.
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        from torchtriage.runtime.framework import framework_instance

        return framework_instance(
            cls,
            ("transformers:TrainerCallback",),
            "Hugging Face transformers (pip install transformers); "
            "for a plain loop use torchtriage.profile_steps instead",
        )

    def __init__(
        self,
        output_dir: str | os.PathLike | None = None,
        *,
        wait: int = 5,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        ranks: str | int | None = "0",
        record_shapes: bool = True,
        profile_memory: bool = False,
        with_stack: bool = False,
        memory_snapshot: bool = False,
        label: str = "trace",
    ):
        parse_ranks(ranks)
        self.ranks = ranks
        self._options = dict(
            wait=wait,
            warmup=warmup,
            active=active,
            repeat=repeat,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
            memory_snapshot=memory_snapshot,
            label=label,
        )
        self.output_dir = output_dir
        self.profiler: StepProfiler | _Off | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if self.profiler is None:
            # The Trainer initialises the process group before training starts: the rank is known now.
            self.profiler = profile_steps(self.output_dir, ranks=self.ranks, **self._options).start()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.profiler is not None:
            self.profiler.step()
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.profiler is not None:
            self.profiler.stop()
        return control


# -- py-spy flame graphs of this rank ---------------------------------------------------------
class FlamegraphRecording:
    """A py-spy recording of this process, by `torchtriage record` in a process of its own; `wait()`
    returns its folder. `result` is that command's summary (its `summary.json`), once it has ended."""

    def __init__(self, duration: int, rate: int, output_dir: Path, native: bool, nonblocking: bool, idle: bool):
        self.result: dict | None = None
        self.error: BaseException | None = None
        flags = [f for f, on in (("--native", native), ("--nonblocking", nonblocking), ("--idle", idle)) if on]
        self._command = [
            sys.executable, "-m", "torchtriage", "record", "--pid", str(os.getpid()), "--duration", str(duration),
            "--rate", str(rate), "--out", str(output_dir), "--json", *flags,
        ]  # fmt: skip
        # Started here, in the caller's thread: in a background thread a busy training loop holding the GIL
        # could delay the start of the recording by seconds. A thread only waits for it to end, and then
        # withdraws the permission to trace this process.
        self._tracer_allowed = contextlib.ExitStack()
        self._tracer_allowed.enter_context(_allow_child_tracer())
        try:
            self._process = subprocess.Popen(self._command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except BaseException:
            self._tracer_allowed.close()
            raise
        self._thread = threading.Thread(target=self._collect, name="torchtriage-flamegraph", daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        try:
            with self._tracer_allowed:
                out, err = self._process.communicate()
            self.result = json.loads(out) if out.strip() else None
            if self._process.returncode != 0 or self.result is None or not self.result.get("ok"):
                reason = err.decode(errors="replace").strip()[-300:] or (self.result or {}).get("processes")
                logger.warning("[%s] torchtriage flame graph failed: %s", rank_tag(), reason)
            else:
                logger.info("[%s] torchtriage flame graphs written to %s", rank_tag(), self.result["folder"])
        except BaseException as err:  # noqa: BLE001 - a diagnostic thread must never take training down
            self.error = err
            logger.warning("[%s] torchtriage flame graph failed: %s: %s", rank_tag(), type(err).__name__, err)

    def wait(self, timeout: float | None = None) -> Path | None:
        """Wait for the recording to finish; the folder with the .svg and .speedscope.json, or None."""
        self._thread.join(timeout)
        return None if self.result is None else Path(self.result["folder"])

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()


@contextlib.contextmanager
def _allow_child_tracer():
    """Under Yama ptrace_scope=1 a process may only be traced by its ancestors; py-spy is our child.

    PR_SET_PTRACER lets it attach for the recording; it is reset afterwards.
    """
    scope = Path("/proc/sys/kernel/yama/ptrace_scope")
    try:
        needed = scope.read_text().strip() == "1"
    except OSError:
        needed = False
    libc = None
    if needed:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_ptracer, pr_set_ptracer_any = 0x59616D61, ctypes.c_ulong(-1)
            libc.prctl(pr_set_ptracer, pr_set_ptracer_any, 0, 0, 0)
        except Exception:  # noqa: BLE001
            libc = None
    try:
        yield
    finally:
        if libc is not None:
            with contextlib.suppress(Exception):
                libc.prctl(0x59616D61, 0, 0, 0, 0)


def record_flamegraphs(
    output_dir: str | os.PathLike | None = None,
    *,
    duration: int = 30,
    rate: int = 100,
    ranks: str | int | None = "0",
    native: bool = False,
    nonblocking: bool = False,
    idle: bool = False,
) -> FlamegraphRecording | None:
    """Record py-spy flame graphs (SVG + speedscope) of this rank for `duration` seconds, in the background.

    Returns at once with a `FlamegraphRecording` (`.wait()` gives the folder), or None on unselected
    ranks. py-spy must run as a separate process (it samples this one through ptrace); `torchtriage
    record --pid <this process>` runs it, so the files and `summary.json` are the same. Failures
    (py-spy missing, ptrace not permitted) are logged as warnings, never raised.
    """
    parse_ranks(ranks)
    if not rank_selected(ranks):
        return None
    folder = artifacts_dir(output_dir, FLAMEGRAPH_SUBDIR)
    return FlamegraphRecording(int(duration), int(rate), folder, native, nonblocking, idle)


def read_chrome_trace(path: str | os.PathLike) -> dict:
    """Load a `.trace.json.gz` (or plain `.json`) Chrome trace written by the profiler."""
    import json

    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return json.load(handle)
