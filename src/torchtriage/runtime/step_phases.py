"""What one rank's window of steps says of each phase of its step (pure: no torch).

The step monitor keeps one row per step (seconds); at a window's end this module reduces the rows to the
numbers the straggler decision reads, written in the rank's window record and exchanged between the ranks
as they are written, so that a recorded window replays into the very decision the job made:

    wall         the step's wall time, boundary to boundary (the window's mean is written beside it:
                 the job's throughput; the decision reads the median, which a rank's hiccup or the one
                 step in ten that reads the loss leaves alone)
    data         the wait in the data iterator's `__next__`
    forward      host time from the batch's arrival (the last `__next__` before the first backward) to
                 the first backward: the forward's compute on a CPU job, its launch on a GPU
    outside      wall - data - forward: the collectives' wait, the backward, the optimizer
    gpu          the device's forward, from a CUDA event recorded at the batch's arrival (it completes
                 once the device has finished the step before) to one recorded at the first backward:
                 it holds the forward's kernels and any gap the host left the device, and nothing of the
                 data wait, of the previous step or of the peers (sampled steps)
    host_paced   the share of those sampled steps whose device forward had finished by the time the host
                 had launched the backward: the device waited for the host, not the host for the device

Each phase is a window median with the robust spread of one step's value (the scaled median absolute
deviation) and the number of steps it holds, so that the decision can tell how far a median moves by
chance.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MAD_SCALE = 1.4826  # median absolute deviation -> standard deviation, for normal noise
MEDIAN_SE = math.sqrt(math.pi / 2)  # a median's standard error is this times a mean's, for normal noise

# decision-input name -> the window record's field (milliseconds, or a count or share)
FIELDS = {
    "wall": "step_ms_p50",
    "wall_sd": "step_ms_sd",
    "steps": "steps",
    "data": "data_ms",
    "data_sd": "data_ms_sd",
    "forward": "forward_ms",
    "forward_sd": "forward_ms_sd",
    "outside": "outside_own_ms",
    "outside_sd": "outside_own_ms_sd",
    "gpu": "gpu_forward_ms",
    "gpu_sd": "gpu_forward_ms_sd",
    "gpu_n": "gpu_samples",
    "host_paced": "gpu_host_paced",
}
EXCHANGED = tuple(FIELDS.values())  # the order of the numbers each rank sends
_IN_SECONDS = {"wall", "wall_sd", "data", "data_sd", "forward", "forward_sd", "outside", "outside_sd", "gpu", "gpu_sd"}


def robust_spread(values: Sequence[float]) -> float:
    """The scaled median absolute deviation: one value's standard deviation, unmoved by a few outliers."""
    if len(values) < 2:
        return 0.0
    centre = statistics.median(values)
    return MAD_SCALE * statistics.median(abs(v - centre) for v in values)


def median_error(spread: float, count: float) -> float:
    """How far the median of `count` values of this spread moves by chance (one standard error)."""
    return MEDIAN_SE * spread / math.sqrt(count) if count else 0.0


def _present(rows: Iterable[Mapping[str, Any]], key: str) -> list[float]:
    return [r[key] for r in rows if r.get(key) is not None]


def window_record(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The decision's fields of one window's rows, in the record's units (ms, rounded to the microsecond)."""
    stats: dict[str, float | None] = {"steps": float(len(rows))}
    for key in ("wall", "data", "forward", "outside", "gpu"):
        values = _present(rows, key)
        stats[key] = statistics.median(values) if values else None
        stats[f"{key}_sd"] = robust_spread(values) if values else None
    stats["gpu_n"] = float(len(_present(rows, "gpu")))
    paced = _present(rows, "host_paced")
    stats["host_paced"] = sum(1.0 for p in paced if p) / len(paced) if paced else None
    walls = _present(rows, "wall")
    record = {
        FIELDS["wall"]: _to_record("wall", stats["wall"]),
        "step_ms_mean": _to_record("wall", sum(walls) / len(walls)),
    }
    return record | {field: _to_record(key, stats[key]) for key, field in FIELDS.items()}


def _to_record(key: str, value: float | None) -> float | None:
    if value is None:
        return None
    return round(value * 1000, 3) if key in _IN_SECONDS else round(value, 4)


def decision_input(record: Mapping[str, Any]) -> dict[str, float | None]:
    """A window record (or the numbers exchanged for it) as the decision reads it: seconds, shares, counts."""
    out: dict[str, float | None] = {}
    for key, field in FIELDS.items():
        value = record.get(field)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 or not math.isfinite(value):
            out[key] = None
        else:
            out[key] = value / 1000.0 if key in _IN_SECONDS else float(value)
    return out


def exchanged(record: Mapping[str, Any]) -> list[float]:
    """The numbers one rank sends for its window, in EXCHANGED order (-1: not measured)."""
    return [-1.0 if record.get(f) is None else float(record[f]) for f in EXCHANGED]


def from_exchanged(values: Sequence[float]) -> dict[str, float | None]:
    """One rank's exchanged numbers back into the decision's input."""
    return decision_input({f: (None if v < 0 else v) for f, v in zip(EXCHANGED, values, strict=True)})
