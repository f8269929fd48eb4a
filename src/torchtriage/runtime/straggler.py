"""Which rank holds the others back, and why: the step monitor's decision (pure: no torch).

Under data parallelism every rank's step takes the same wall time — each waits for the slowest in the
gradient all-reduce — so step times say nothing. What a rank spends *of its own* does: the time it
waits for its batch (`data`), the time it computes before its backward starts (`forward`: on a CPU
job the work itself; on a GPU the CPU time to launch it), and on a GPU the time the device spends on
the step (`gpu`). A rank that is slow in one of these makes every other rank wait in the collectives
of its backward.

Each window, from every rank's per-step medians:

- for each component and rank, the **excess** over the median of the *other* ranks; the margin is
  robust (4 × the scaled median absolute deviation of the others), and at least 5% of the median step
  time and 1 ms, so that nothing is named on an even job or on noise;
- the rank with an excess beyond the margin is the straggler, with the reason of its largest excess:
  `data`, `compute` (CPU forward time without a GPU; the device's own time with one), or `launch`
  (with a GPU: its CPU takes longer to hand the device its work; the device's forward then stretches
  with it, so a device excess that the CPU's explains by half or more is counted as launch);
- no straggler, but the time every rank spends outside its own work (waiting in collectives, the
  optimizer) grew past the same kind of margin over the job's earlier even windows, in two windows
  in a row, while no rank's own time did → `communication`: every rank waits, none computes longer;
- a decision the previous two windows also made (same rank, same reason) is `persistent`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

MAD_SCALE = 1.4826  # median absolute deviation → standard deviation, for normal noise
MAD_MULTIPLE = 4.0
MIN_FRACTION_OF_STEP = 0.05
MIN_SECONDS = 1e-3
PERSISTENT_WINDOWS = 3
HISTORY_NEEDED = 3  # earlier windows before `communication` can be judged

# component of a rank's own time -> the reason it gives when it is the excess
OWN_COMPONENTS = (("data", "data"), ("forward", "compute"), ("gpu", "compute"))


def _margin(others: Sequence[float], step: float) -> float:
    centre = statistics.median(others)
    mad = statistics.median(abs(v - centre) for v in others)
    return max(MAD_MULTIPLE * MAD_SCALE * mad, MIN_FRACTION_OF_STEP * step, MIN_SECONDS)


def _excesses(stats: Mapping[int, Mapping[str, float | None]], key: str, step: float) -> dict[int, tuple[float, float]]:
    """rank -> (excess over the others' median, the others' median), for the ranks beyond the margin."""
    values = {r: s.get(key) for r, s in stats.items() if s.get(key) is not None}
    found: dict[int, tuple[float, float]] = {}
    if len(values) < 2:
        return found
    for rank, value in values.items():
        others = [v for r, v in values.items() if r != rank]
        centre = statistics.median(others)
        if value - centre > _margin(others, step):
            found[rank] = (value - centre, centre)
    return found


def stragglers(stats: Mapping[int, Mapping[str, float | None]]) -> list[dict[str, Any]]:
    """The ranks whose own time exceeds their peers', each with its reason and excess (seconds per step)."""
    if len(stats) < 2:
        return []
    step = statistics.median(s["wall"] for s in stats.values())
    excess = {key: _excesses(stats, key, step) for key, _ in OWN_COMPONENTS}
    best: dict[int, dict[str, Any]] = {}
    for key, component_reason in OWN_COMPONENTS:
        for rank, (over, centre) in excess[key].items():
            reason = component_reason
            if key == "forward" and stats[rank].get("gpu") is not None:
                reason = "launch"  # with a GPU, CPU time before the backward is launching, not computing
            if key == "gpu" and rank in excess["forward"] and excess["forward"][rank][0] >= over / 2:
                # The device's forward took longer because the CPU handed it its work later: a starved
                # device stretches with its host. (A device that is itself slow leaves the CPU's time even.)
                continue
            if over > best.get(rank, {}).get("excess", 0.0):
                best[rank] = {
                    "rank": rank,
                    "reason": reason,
                    "component": key,
                    "excess": over,
                    "value": stats[rank][key],
                    "others": centre,
                    "step": step,
                }
    return sorted(best.values(), key=lambda b: -b["excess"])


def waiting(stats: Mapping[int, Mapping[str, float | None]]) -> float:
    """The median over ranks of the time per step outside their own work (collectives, optimizer)."""
    spent = []
    for s in stats.values():
        own = (s.get("data") or 0.0) + (s.get("forward") or 0.0)
        spent.append(max(0.0, s["wall"] - own))
    return statistics.median(spent)


def communication(history: Sequence[float], now: float, step: float) -> dict[str, Any] | None:
    """A slowdown of every rank's waiting against the job's own earlier windows."""
    if len(history) < HISTORY_NEEDED:
        return None
    centre = statistics.median(history)
    if now - centre > _margin(history, step):
        return {"rank": None, "reason": "communication", "excess": now - centre, "value": now, "others": centre}
    return None


class Decider:
    """Window after window: the decisions, their persistence, and the history `communication` needs."""

    def __init__(self):
        self.waits: list[float] = []
        self.recent: list[set[tuple[int | None, str]]] = []
        self.slow_before = False  # the previous window's waiting was already beyond the baseline

    def window(self, first: int, last: int, stats: Mapping[int, Mapping[str, float | None]]) -> list[dict]:
        found = stragglers(stats)
        now = waiting(stats) if stats else 0.0
        slow = None
        if not found and stats:
            step = statistics.median(s["wall"] for s in stats.values())
            slow = communication(self.waits, now, step)
            # Against the job's own past, not a peer, one window can be a blip on the host: two in a
            # row are a slowdown.
            if slow is not None and self.slow_before:
                found = [slow | {"step": step}]
        if not found and stats and slow is None:
            self.waits.append(now)  # only even windows make the baseline
        self.slow_before = slow is not None
        keys = {(d["rank"], d["reason"]) for d in found}
        self.recent = (self.recent + [keys])[-PERSISTENT_WINDOWS:]
        decisions = []
        for d in found:
            key = (d["rank"], d["reason"])
            persistent = len(self.recent) == PERSISTENT_WINDOWS and all(key in w for w in self.recent)
            decision = {
                "step": last,
                "first_step": first,
                "rank": d["rank"],
                "reason": d["reason"],
                "excess_ms": round(d["excess"] * 1000, 3),
                "value_ms": round(d["value"] * 1000, 3),
                "others_ms": round(d["others"] * 1000, 3),
                "step_ms": round(d["step"] * 1000, 3),
                "persistent": persistent,
            }
            # The sentence rank 0 logs rides along, so that `triage DIR` reads stragglers.jsonl as a log.
            decisions.append({"schema": SCHEMA, "line": log_line(decision), **decision})
        return decisions


SCHEMA = "torchtriage.straggler/1"

_WHAT = {
    "data": "waits for its batch",
    "compute": "computes",
    "launch": "takes on its CPU to launch the step's work",
}


def log_line(decision: Mapping[str, Any]) -> str:
    """One sentence per decision, in the form the `straggler.monitor` rules read."""
    span = f"steps {decision['first_step']}-{decision['step']}"
    lasting = "persistent" if decision["persistent"] else "transient"
    share = decision["excess_ms"] / decision["step_ms"] * 100 if decision["step_ms"] else 0.0
    excess = f"(+{decision['excess_ms']:.1f} ms, {share:.0f}% of the step); {lasting}"
    if decision["reason"] == "communication":
        return (
            f"torchtriage StepMonitor: {span}: communication is slow on every rank: "
            f"{decision['value_ms']:.1f} ms per step outside the ranks' own work against "
            f"{decision['others_ms']:.1f} ms in earlier windows {excess}"
        )
    return (
        f"torchtriage StepMonitor: {span}: rank {decision['rank']} is the straggler ({decision['reason']}): it "
        f"{_WHAT[decision['reason']]} {decision['value_ms']:.1f} ms per step against a median of "
        f"{decision['others_ms']:.1f} ms on the other ranks {excess}"
    )
