"""Which rank holds the others back and why, or whether the whole job slowed: the step monitor's decision
(pure: no torch).

Under data parallelism every rank's step takes the same wall time (each waits for the slowest in the
gradient all-reduce), so step times say nothing. What a rank spends *of its own* does, when it is measured
where no wait for another rank or for the device can fall into it (`step_phases`):

- `data`: the wait in the data iterator;
- the forward's compute: on a CPU job the host's forward; on a GPU job the device's forward, from the
  batch's arrival to the backward (never the host's forward: a host that waits for its device, which waits
  for a slower peer, does that waiting wherever it next synchronises, often inside its forward).

Each window, on every rank alike, from every rank's window numbers:

1. **A rank that stands out**: for each own phase, a rank's excess over the median of the other ranks.
   The margin is the job's own noise, never a fixed share: 3 x the largest of how far the two medians move
   by chance within the window (each step's robust spread), how far the other ranks spread (with 3 or
   more), and how far this rank's excess moves from window to window (the robust spread of its successive
   changes, which a step change in a rank leaves alone, one standard error above its estimate); and at
   least 1% of the step, below which naming a rank is not worth a user's time, and one scheduler slice
   (0.75 ms), below which a core shared with other work explains it. Nothing is judged before
   three windows have shown that noise. A GPU rank beyond the margin is `compute` when its host was ahead
   of its device, `launch` when its device waited for its host (most sampled forwards done by the time the
   host had launched the backward) and its host's forward is the longer by half the excess; a device that
   waited for a host no slower than the others' is named neither. A rank that waits for a slower peer has
   no own phase beyond the margin.
2. **The whole job slowed**: no rank stands out, but the median step grew past the same kind of margin over
   the job's earlier calm windows (3 at least; only windows where nothing stood out count). Its reason is
   the own phase that grew past its noise on every rank (the lower median over ranks; the data wait only
   where it accounts for half of the growth; the compute also where the devices that waited for their
   hosts now keep them waiting), the one that accounts for the most; none → `communication` (every rank
   waits longer, none works longer); where one phase may account for half of it without standing out of
   its noise on every rank (a straggler too small to separate, a host slower to launch that its device's
   queue hides) → nothing.
3. **One decision per window**, only when the same rank and phase (or the job) stood out in the window
   before as well: one window can be a blip of the host; two are a slowdown. A decision that also stood
   out in the two windows before is `persistent`.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchtriage.runtime.step_phases import MAD_SCALE, median_error

SCHEMA = "torchtriage.straggler/2"
NOISE_MULTIPLE = 3.0  # one-sided: 0.13% of windows by chance, and a decision needs two in a row
MIN_CHANGES = 2  # window-to-window changes of a rank's excess (or the job's step) before anything is judged
MAD_RELATIVE_ERROR = 1.17
WORTH_NAMING = 0.01  # of the step: a rank or a slowdown costing less is not named
# Linux's shortest scheduler slice (CFS's minimum granularity, EEVDF's base slice: 0.75 ms, more with more
# CPUs). A thread that shares its core with another runnable one for a while waits up to a slice each time it
# wakes: a rank longer by less than that per step may only have had company on its core.
SCHEDULER_SLICE = 0.75e-3
PERSISTENT_WINDOWS = 3
HISTORY_WINDOWS = 16  # recent windows whose changes make a rank's noise, and whose calm make the job's baseline
BASELINE_NEEDED = 3
HOST_PACED = 0.5  # share of sampled steps whose device forward waited for the host, for `launch`

Stats = Mapping[int, Mapping[str, float | None]]

# an own phase: the decision-input key, the record field it is written as, the key of its sample count
_PHASES = {
    "wall": ("step_ms_p50", "steps"),
    "data": ("data_ms", "steps"),
    "forward": ("forward_ms", "steps"),
    "gpu": ("gpu_forward_ms", "gpu_n"),
}


@dataclass
class Candidate:
    """What stood out in one window: a rank's own phase, or the job's step."""

    key: tuple  # (rank, phase) or ("job",): what must stand out in consecutive windows
    rank: int | None
    reason: str
    measured: str  # the record field the value was read from
    value: float
    others: float  # the other ranks' median, or the job's calm baseline
    margin: float

    @property
    def excess(self) -> float:
        return self.value - self.others


def _series_noise(values: Sequence[float]) -> float | None:
    """One value's noise in a series of windows, from its successive changes (a single step change moves one
    of them only, so a rank that became slow keeps the noise it had); None before MIN_CHANGES.

    Read from a few windows, such a spread may be small by chance: this is one standard error above it (a
    median absolute deviation's relative standard error is 1.17 / sqrt(n) for normal noise)."""
    values = list(values)
    changes = [abs(b - a) for a, b in zip(values[:-1], values[1:], strict=True)]
    if len(changes) < MIN_CHANGES:
        return None
    spread = MAD_SCALE * statistics.median(changes) / math.sqrt(2)
    return spread * (1 + MAD_RELATIVE_ERROR / math.sqrt(len(changes)))


def _least_worth_naming(step: float) -> float:
    """The smallest excess per step a decision states, whatever the noise: 1% of the step, and one
    scheduler slice (below it, a core shared with other work for a while explains it)."""
    return max(WORTH_NAMING * step, SCHEDULER_SLICE)


def _lower_median(values: Sequence[float]) -> float:
    """The median that a single rank's rise cannot move (with two ranks, the lower one): a slowdown it
    shows is shared by at least half the ranks, every rank of two."""
    return statistics.median_low(values)


def _error(stats: Mapping[str, float | None], phase: str) -> float:
    count = stats.get(_PHASES[phase][1]) or 0.0
    return median_error(stats.get(f"{phase}_sd") or 0.0, count)


def _device_reason(stats: Stats, rank: int, excess: float) -> str | None:
    """Why a rank's device forward is longer than the others': `compute` when its host was ahead of it;
    `launch` when it waited for its host (most sampled forwards done once the host had launched the
    backward) and that host's forward is longer than the others' by half the excess or more. Waiting for a
    host that is no slower is no rank's fault (equally fast hosts that never wait for their devices drift
    apart, and the one behind keeps its device waiting); nor can it be told from a slow host whose peers
    wait for their devices inside their forward (a copy from pageable memory): then nothing is named."""
    if (stats[rank].get("host_paced") or 0.0) < HOST_PACED:
        return "compute"
    mine = stats[rank].get("forward")
    others = [s["forward"] for r, s in stats.items() if r != rank and s.get("forward") is not None]
    if mine is not None and others and mine - statistics.median(others) >= excess / 2:
        return "launch"
    return None


_REASONS = {"data": "data", "forward": "compute"}


def compute_phase(stats: Stats) -> str:
    """The phase that holds a rank's own compute: the device's forward once any rank measured one."""
    return "gpu" if any(s.get("gpu") is not None for s in stats.values()) else "forward"


def job_step(stats: Stats) -> float:
    return statistics.median(s["wall"] for s in stats.values())


class Decider:
    """Window after window, on every rank alike: at most one decision, its persistence, and the history the
    noise and the job's baseline come from."""

    def __init__(self):
        self.excesses: dict[tuple, deque] = {}  # (rank, phase) -> its recent excesses over the others
        self.calm: dict[Any, deque] = {}  # "wall", "outside", phase, (rank, phase) -> values in calm windows
        self.stood_out: deque = deque(maxlen=PERSISTENT_WINDOWS)  # keys that stood out, per recent window

    def _rank_noise(self, stats: Stats, phase: str, rank: int, values: Mapping[int, float]) -> float | None:
        """How far a rank's excess over the others' median moves by chance: the largest of the two medians'
        errors within the window, the other ranks' spread (3 or more), and the excess's own window-to-window
        changes."""
        others = [v for r, v in values.items() if r != rank]
        within = math.hypot(
            _error(stats[rank], phase), statistics.median(_error(stats[r], phase) for r in values if r != rank)
        )
        centre = statistics.median(others)
        peers = MAD_SCALE * statistics.median(abs(v - centre) for v in others) if len(others) >= 3 else 0.0
        history = _series_noise(self.excesses.get((rank, phase), ()))
        return None if history is None else max(within, peers, history)

    # -- a rank that stands out ----------------------------------------------------------------------------
    def _rank_candidates(self, stats: Stats, step: float) -> list[Candidate]:
        found = []
        for phase in ("data", compute_phase(stats)):
            values = {r: s[phase] for r, s in stats.items() if s.get(phase) is not None}
            if len(values) < 2:
                continue
            for rank, value in values.items():
                others = [v for r, v in values.items() if r != rank]
                centre = statistics.median(others)
                noise = self._rank_noise(stats, phase, rank, values)
                history = self.excesses.setdefault((rank, phase), deque(maxlen=HISTORY_WINDOWS))
                history.append(value - centre)
                if noise is None:
                    continue  # the job's noise is not known yet: nothing is judged before it is
                margin = max(NOISE_MULTIPLE * noise, _least_worth_naming(step))
                if value - centre > margin:
                    reason = _device_reason(stats, rank, value - centre) if phase == "gpu" else _REASONS[phase]
                    if reason is not None:
                        found.append(Candidate((rank, phase), rank, reason, _PHASES[phase][0], value, centre, margin))
        return found

    # -- the whole job ------------------------------------------------------------------------------------
    def _calm_baseline(self, key) -> float | None:
        values = self.calm.get(key)
        return statistics.median(values) if values and len(values) >= BASELINE_NEEDED else None

    def _job_candidate(self, stats: Stats, step: float) -> Candidate | None:
        before = self._calm_baseline("wall")
        if before is None:
            return None
        noise = max(statistics.median(_error(s, "wall") for s in stats.values()), _series_noise(self.calm["wall"]) or 0)
        growth = step - before
        margin = max(NOISE_MULTIPLE * noise, _least_worth_naming(before))
        if growth <= margin:
            return None
        own = ("data", compute_phase(stats))
        grown = {phase: self._growth(stats, phase) for phase in (*own, "forward")}
        if any(grown[phase] is None for phase in own):
            return None  # an own phase that cannot be compared with the past: the slowdown cannot be told
        found, unclear = [], False
        for phase in own:
            # What the phase's growth makes of the step: a data wait adds to it; a slower compute slows the
            # backward and the optimizer as much as the forward, so the forward's share scales to the step
            # (or less: a forward its host paced stretches less than the backward when the device slows).
            job_before = self._calm_baseline(phase)
            scale = 1.0 if phase == "data" else (before - (self._calm_baseline("data") or 0.0)) / job_before
            shared, alone = _lower_median(grown[phase]) * scale, max(grown[phase]) * scale
            beyond_noise = _lower_median(grown[phase]) > self._phase_margin(stats, phase, step)
            if phase == "gpu" and self._devices_fell_behind(stats):
                beyond_noise = True  # the devices' forwards waited for their hosts, and now the hosts wait
            if beyond_noise and (phase != "data" or shared >= growth / 2):
                found.append((shared, self._shared_candidate(stats, phase, job_before, margin)))
            elif max(shared, alone) >= growth / 2:
                unclear = True  # it may explain the slowdown, but not beyond its noise on every rank
        if found:
            return max(found, key=lambda pair: pair[0])[1]
        if unclear or not self._waits_explain(grown.get("forward"), growth, own):
            return None
        outside_before = self._calm_baseline("outside")
        if outside_before is None:
            return None
        return Candidate(("job",), None, "communication", "outside_own_ms", _outside(stats), outside_before, margin)

    def _growth(self, stats: Stats, phase: str) -> list[float] | None:
        """Each rank's phase against its own calm windows; None where a rank cannot be compared."""
        grown = []
        for rank, s in stats.items():
            mine = self._calm_baseline((rank, phase))
            if mine is None or s.get(phase) is None or self._calm_baseline(phase) is None:
                return None
            grown.append(s[phase] - mine)
        return grown

    def _devices_fell_behind(self, stats: Stats) -> bool:
        before = self._calm_baseline("host_paced")
        now = [s.get("host_paced") for s in stats.values()]
        return before is not None and None not in now and before >= HOST_PACED > _lower_median(now)

    def _phase_margin(self, stats: Stats, phase: str, step: float) -> float:
        noise = max(statistics.median(_error(s, phase) for s in stats.values()), _series_noise(self.calm[phase]) or 0.0)
        return max(NOISE_MULTIPLE * noise, _least_worth_naming(step))

    @staticmethod
    def _shared_candidate(stats: Stats, phase: str, before: float, margin: float) -> Candidate:
        reason = "data" if phase == "data" else "compute"
        if phase == "gpu" and _lower_median([s.get("host_paced") or 0.0 for s in stats.values()]) >= HOST_PACED:
            reason = "launch"
        now = _lower_median([s[phase] for s in stats.values()])
        return Candidate(("job",), None, reason, _PHASES[phase][0], now, before, margin)

    @staticmethod
    def _waits_explain(host_forward: list[float] | None, growth: float, own: tuple[str, ...]) -> bool:
        """On a GPU job, whether longer waits can be all the host's forward grew by: a host that waits for
        its device does it where it next synchronises, often in its forward, and by no more than the step
        grew. One rank's host forward grown alone, or every rank's grown past the step's growth, is a host
        that launches slower (its device's work hides it but after a synchronisation): not communication."""
        if "gpu" not in own or host_forward is None:
            return True
        shared = _lower_median(host_forward)
        return not (max(host_forward) >= growth / 2 > shared or shared > 2 * growth)

    def _remember_calm(self, stats: Stats, step: float) -> None:
        def keep(key, value):
            if value is not None:
                self.calm.setdefault(key, deque(maxlen=HISTORY_WINDOWS)).append(value)

        keep("wall", step)
        keep("outside", _outside(stats))
        for phase in ("data", "forward", "gpu", "host_paced"):
            values = [s[phase] for s in stats.values() if s.get(phase) is not None]
            keep(phase, _lower_median(values) if values and len(values) == len(stats) else None)
            for rank, s in stats.items():
                keep((rank, phase), s.get(phase))

    # -- the window ---------------------------------------------------------------------------------------
    def window(self, first: int, last: int, stats: Stats) -> list[dict[str, Any]]:
        """The decisions of one window (none or one), the same on every rank given the same numbers."""
        stats = {r: s for r, s in stats.items() if s.get("wall") is not None}
        if not stats:
            return []
        step = job_step(stats)
        candidates = self._rank_candidates(stats, step)
        if not candidates:
            job = self._job_candidate(stats, step)
            candidates = [job] if job is not None else []
        if not candidates:
            self._remember_calm(stats, step)
        before = list(self.stood_out)
        self.stood_out.append({c.key for c in candidates})
        confirmed = [c for c in candidates if before and c.key in before[-1]]
        if not confirmed:
            return []
        chosen = max(confirmed, key=lambda c: c.excess)
        recent = before[-(PERSISTENT_WINDOWS - 1) :]
        persistent = len(recent) == PERSISTENT_WINDOWS - 1 and all(chosen.key in keys for keys in recent)
        return [_record(chosen, first, last, step, persistent)]


def _outside(stats: Stats) -> float:
    """The median over ranks of the step outside their own data and compute: collectives, backward, optimizer."""
    phase = compute_phase(stats)
    return statistics.median(
        max(0.0, s["wall"] - (s.get("data") or 0.0) - (s.get(phase) or 0.0)) for s in stats.values()
    )


def _record(chosen: Candidate, first: int, last: int, step: float, persistent: bool) -> dict[str, Any]:
    decision = {
        "kind": "straggler" if chosen.rank is not None else "job",
        "step": last,
        "first_step": first,
        "rank": chosen.rank,
        "reason": chosen.reason,
        "measured": chosen.measured,
        "excess_ms": round(chosen.excess * 1000, 3),
        "value_ms": round(chosen.value * 1000, 3),
        "others_ms": round(chosen.others * 1000, 3),
        "margin_ms": round(chosen.margin * 1000, 3),
        "step_ms": round(step * 1000, 3),
        "persistent": persistent,
    }
    # The sentence rank 0 logs rides along, so that `triage DIR` reads stragglers.jsonl as a log.
    return {"schema": SCHEMA, "line": log_line(decision), **decision}


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
    excess = (
        f"(+{decision['excess_ms']:.1f} ms, {share:.0f}% of the step, beyond a noise margin of "
        f"{decision['margin_ms']:.1f} ms); {lasting}"
    )
    if decision["rank"] is None and decision["reason"] == "communication":
        return (
            f"torchtriage StepMonitor: {span}: communication is slow on every rank: "
            f"{decision['value_ms']:.1f} ms per step outside the ranks' own work against "
            f"{decision['others_ms']:.1f} ms in earlier windows {excess}"
        )
    if decision["rank"] is None:
        return (
            f"torchtriage StepMonitor: {span}: the whole job slowed ({decision['reason']}): every rank "
            f"{_WHAT[decision['reason']]} {decision['value_ms']:.1f} ms per step against "
            f"{decision['others_ms']:.1f} ms in earlier windows {excess}"
        )
    return (
        f"torchtriage StepMonitor: {span}: rank {decision['rank']} is the straggler ({decision['reason']}): it "
        f"{_WHAT[decision['reason']]} {decision['value_ms']:.1f} ms per step against a median of "
        f"{decision['others_ms']:.1f} ms on the other ranks {excess}"
    )
