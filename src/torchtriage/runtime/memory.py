"""CUDA memory evidence from inside training: allocation history snapshots, memory lines, OOM attribution.

- `cuda_memory_history(...)` records every allocation with its Python stack while the block runs and
  writes `<label>-rankNN.pickle`, the format of https://pytorch.org/memory_viz and
  `torchtriage memory`. Without CUDA, or on a rank not selected, it does nothing.
- `log_cuda_memory(tag)` logs and returns allocated / reserved memory and their peaks, in GiB.
- `install_oom_attribution()` (process-wide, through `sys.excepthook`) or `with oom_attribution():`
  (around a step): when *this* rank raises `torch.OutOfMemoryError`, it logs one line that says this
  rank is the primary failure and that the NCCL / cuBLAS / timeout errors of its peers are collateral,
  and writes a snapshot when history is being recorded. Every rank that OOMs says so itself, so the
  line is in the failing rank's own log, where triage looks for it:

      torchtriage: rank 3 is the PRIMARY FAILURE: torch.OutOfMemoryError: CUDA out of memory. Tried to ...

- `check_memory_margin()` warns once per process when the peak allocated memory crosses 92% of the
  device (also called by `log_cuda_memory` and `oom_attribution`).

Nothing here raises into training: a failed dump or a missing CUDA only logs a warning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

logger = logging.getLogger("torchtriage.memory")

GIB = 1024**3
MEMORY_MARGIN_FRACTION = 0.92
ARTIFACTS_ENV = "TORCHTRIAGE_ARTIFACTS_DIR"  # where helpers write when no output_dir is given
DEFAULT_ARTIFACTS_DIR = "torchtriage-artifacts"
MEMORY_SUBDIR = "memory"
PRIMARY_FAILURE_MARK = "is the PRIMARY FAILURE"

# Set while cuda_memory_history records on this rank: (output_dir, label) for the OOM snapshot.
_history: tuple[Path, str] | None = None
_margin_warned = False
_previous_excepthook = None


# -- ranks ------------------------------------------------------------------------------------
def current_rank() -> int:
    """The global rank: the process group's if initialised, else the launcher's RANK, else 0."""
    if "torch" in sys.modules:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.get_rank()
        except Exception:  # noqa: BLE001
            pass
    value = os.environ.get("RANK", "")
    return int(value) if value.isdigit() else 0


def current_world_size() -> int:
    if "torch" in sys.modules:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.get_world_size()
        except Exception:  # noqa: BLE001
            pass
    value = os.environ.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() else 1


def rank_tag(rank: int | None = None, world_size: int | None = None) -> str:
    """`rank03`: zero-padded to at least two digits, more when the world needs them (`rank0127`)."""
    rank = current_rank() if rank is None else rank
    world_size = current_world_size() if world_size is None else world_size
    width = max(2, len(str(max(world_size - 1, 0))))
    return f"rank{rank:0{width}d}"


def parse_ranks(spec: str | int | None) -> set[int] | None:
    """A rank selection: None/"" → {0}; an int or "3" → {3}; "0,8" → {0, 8}; "all" → None (every rank)."""
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return {0}
    if isinstance(spec, int):
        return {spec}
    if spec.strip().lower() == "all":
        return None
    try:
        return {int(part) for part in spec.split(",") if part.strip()}
    except ValueError:
        raise ValueError(
            f"ranks={spec!r}: expected 'all', a rank, or ranks separated by commas such as '0,8'"
        ) from None


def rank_selected(spec: str | int | None, rank: int | None = None) -> bool:
    selected = parse_ranks(spec)
    return selected is None or (current_rank() if rank is None else rank) in selected


def artifacts_dir(output_dir: str | os.PathLike | None, subdir: str) -> Path:
    if output_dir is not None:
        return Path(output_dir)
    return Path(os.environ.get(ARTIFACTS_ENV) or DEFAULT_ARTIFACTS_DIR) / subdir


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


# -- history snapshots ------------------------------------------------------------------------
def dump_snapshot(path: str | os.PathLike) -> Path | None:
    """Write the recorded allocation history to `path`; warn and return None if that fails."""
    try:
        import torch

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(path))
        return path
    except Exception as err:  # noqa: BLE001 - evidence is best effort, training goes on
        logger.warning(
            "torchtriage: could not write the CUDA memory snapshot %s: %s: %s", path, type(err).__name__, err
        )
        return None


@contextlib.contextmanager
def cuda_memory_history(
    output_dir: str | os.PathLike | None = None,
    *,
    ranks: str | int | None = "0",
    max_entries: int = 100_000,
    label: str = "snapshot",
):
    """Record CUDA allocation history while the block runs, then write `<output_dir>/<label>-rankNN.pickle`.

    Yields the path the snapshot will be written to, or None when nothing is recorded (no CUDA, or
    this rank is not in `ranks`). The snapshot is written on exit, also when the block raised — an
    OOM inside the block leaves the allocations that filled the GPU in it. Open it at
    https://pytorch.org/memory_viz or with `torchtriage memory`.
    """
    global _history
    if not _cuda_available() or not rank_selected(ranks) or _history is not None:
        yield None
        return
    import torch

    path = artifacts_dir(output_dir, MEMORY_SUBDIR) / f"{label}-{rank_tag()}.pickle"
    try:
        torch.cuda.memory._record_memory_history(max_entries=max_entries)
    except Exception as err:  # noqa: BLE001
        logger.warning("torchtriage: could not start CUDA memory history: %s: %s", type(err).__name__, err)
        yield None
        return
    _history = (path.parent, label)
    try:
        yield path
    finally:
        _history = None
        written = dump_snapshot(path)
        if written is not None:
            logger.info(
                "[%s] CUDA memory snapshot written to %s (open at https://pytorch.org/memory_viz)", rank_tag(), written
            )
        try:
            torch.cuda.memory._record_memory_history(enabled=None)
        except Exception as err:  # noqa: BLE001
            logger.warning("torchtriage: could not stop CUDA memory history: %s: %s", type(err).__name__, err)


# -- memory lines -----------------------------------------------------------------------------
def log_cuda_memory(tag: str = "", *, level: int = logging.INFO) -> dict[str, float]:
    """Log and return allocated, reserved and their peaks (GiB) on this rank's device; {} without CUDA.

    The peaks are not reset; call `torch.cuda.reset_peak_memory_stats()` for per-phase peaks.
    """
    if not _cuda_available():
        return {}
    try:
        import torch

        stats = {
            "allocated_gib": torch.cuda.memory_allocated() / GIB,
            "reserved_gib": torch.cuda.memory_reserved() / GIB,
            "max_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
            "max_reserved_gib": torch.cuda.max_memory_reserved() / GIB,
        }
    except Exception as err:  # noqa: BLE001
        logger.warning("torchtriage: could not read CUDA memory statistics: %s: %s", type(err).__name__, err)
        return {}
    logger.log(
        level,
        "[%s] memory%s: allocated %.2f GiB, reserved %.2f GiB, peak allocated %.2f GiB, peak reserved %.2f GiB",
        rank_tag(),
        f" {tag}" if tag else "",
        stats["allocated_gib"],
        stats["reserved_gib"],
        stats["max_allocated_gib"],
        stats["max_reserved_gib"],
    )
    check_memory_margin()
    return {key: round(value, 3) for key, value in stats.items()}


def check_memory_margin(threshold: float = MEMORY_MARGIN_FRACTION) -> bool:
    """Warn (once per process) when this rank's peak allocated memory reached `threshold` of the device.

    Returns whether the peak is over the threshold. Reads host-side counters only: no device sync.
    """
    global _margin_warned
    if not _cuda_available():
        return False
    try:
        import torch

        peak = torch.cuda.max_memory_allocated()
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    except Exception:  # noqa: BLE001
        return False
    over = total > 0 and peak >= threshold * total
    if over and not _margin_warned:
        _margin_warned = True
        logger.warning(
            "[%s] torchtriage: peak allocated memory %.2f GiB is %.0f%% of the device's %.2f GiB (margin %.2f GiB): "
            "the next longer batch can run out of memory. Lower the per-device batch (more gradient "
            "accumulation), shorten max length, enable activation checkpointing, or shard more.",
            rank_tag(),
            peak / GIB,
            100 * peak / total,
            total / GIB,
            (total - peak) / GIB,
        )
    return over


# -- OOM attribution --------------------------------------------------------------------------
# The allocator refuses 2**60 bytes or more before asking the GPU: a size computed from garbage (an object
# collective that read a peer's other collective as sizes), not a full GPU (knowledge rule oom.impossible_size).
_IMPOSSIBLE_SIZE = "Tried to allocate more than 1EB"


def _is_oom(exc: BaseException | None) -> bool:
    """A GPU that ran out of memory: torch's OutOfMemoryError, unless the size asked for was impossible."""
    if exc is None or "torch" not in sys.modules:
        return False
    import torch

    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return oom is not None and isinstance(exc, oom) and _IMPOSSIBLE_SIZE not in str(exc)


def report_oom(exc: BaseException) -> str | None:
    """Log that this rank's OOM is the primary failure (once per exception); returns the line, or None."""
    if not _is_oom(exc) or getattr(exc, "_torchtriage_reported", False):
        return None
    try:
        exc._torchtriage_reported = True  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        pass
    rank = current_rank()
    first_line = (str(exc).strip().splitlines() or [""])[0]
    line = (
        f"torchtriage: rank {rank} {PRIMARY_FAILURE_MARK}: torch.OutOfMemoryError: {first_line} -- "
        "NCCL, cuBLAS, collective-timeout and 'peer closed connection' errors on the other ranks are "
        "collateral damage of this OOM: fix the memory of this rank first."
    )
    logger.error(line)
    try:
        log_cuda_memory("at OOM", level=logging.ERROR)
    except Exception:  # noqa: BLE001
        pass
    if _history is not None:
        directory, label = _history
        written = dump_snapshot(directory / f"oom-{label}-{rank_tag()}.pickle")
        if written is not None:
            logger.error("[%s] torchtriage: memory snapshot at the OOM written to %s", rank_tag(), written)
    return line


@contextlib.contextmanager
def oom_attribution():
    """Around a training step: an OOM raised inside is attributed (see `report_oom`) and re-raised."""
    try:
        yield
    except BaseException as exc:
        try:
            report_oom(exc)
        except Exception:  # noqa: BLE001
            pass
        raise
    else:
        check_memory_margin()


def install_oom_attribution() -> None:
    """Attribute an uncaught OOM in this process (wraps `sys.excepthook`; idempotent)."""
    global _previous_excepthook
    if _previous_excepthook is not None:
        return
    _previous_excepthook = sys.excepthook

    def hook(exc_type, exc, tb):
        try:
            report_oom(exc)
        except Exception:  # noqa: BLE001
            pass
        _previous_excepthook(exc_type, exc, tb)

    sys.excepthook = hook


def uninstall_oom_attribution() -> None:
    global _previous_excepthook
    if _previous_excepthook is not None:
        sys.excepthook = _previous_excepthook
        _previous_excepthook = None
