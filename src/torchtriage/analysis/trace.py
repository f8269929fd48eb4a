"""Where each rank's step time goes, which collective waits for whom, and who the straggler is: pure functions.

Per rank and per `ProfilerStep#N`, the GPU timeline is split, overlap-aware, into parts that sum to the
step's GPU time:

    step = compute + communication (exposed) + memory copies (exposed) + idle

`compute` is the union of compute kernels on every stream; `communication` is the time when collectives
run and no compute does; `memory` the time when only copies/memsets run; `idle` when nothing runs.
`overlapped communication` (collectives hidden under compute) is reported beside, as a part of compute.
A kernel belongs to the step whose CPU range launched it (the GPU may run far behind the CPU).

Collectives are matched across ranks by process group and sequence (the record's own sequence number
when it has one, else the step and the order within the step). For each: latency is the minimum duration
across ranks (the rank that arrived last waits for nobody), every other rank's excess is time spent
waiting, and the rank with the least wait arrived last. This needs no clock alignment between hosts.
"""

from __future__ import annotations

import bisect
import statistics
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from torchtriage.analysis.fusion import verdict_of
from torchtriage.errors import InputError
from torchtriage.knowledge.kernels import COMMUNICATION, COMPUTE, KIND_NAMES, MEMORY, KernelTable, kernel_table
from torchtriage.model import Assessment, Category, Confidence, Evidence, Finding, Verdict
from torchtriage.ranks import format_ranks
from torchtriage.sources import limits
from torchtriage.sources.profiler_trace import RankTrace, TraceReadError, read_trace

# A collective whose ranks' durations differ by less than this has no meaningful "last arrival".
MIN_SKEW_US = 20.0
# One rank is the straggler when it causes at least this share of all the waiting in collectives ...
STRAGGLER_SHARE = 0.6
# ... and the others' waiting for it costs at least this share of a step.
STRAGGLER_COST = 0.05
DATA_PHASE_WORDS = ("data", "load", "batch", "input", "dataloader", "prefetch", "fetch")

Interval = tuple[float, float]


# ----------------------------------------------------------------------------- interval arithmetic


def union(intervals: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def total(intervals: list[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Intersection of two unions (each sorted and disjoint)."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(intervals: list[Interval], start: float, end: float) -> list[Interval]:
    return [(max(s, start), min(e, end)) for s, e in intervals if e > start and s < end]


# ----------------------------------------------------------------------------- temporal breakdown


@dataclass
class StepBreakdown:
    step: int
    start: float  # GPU time (µs) of the window, on this rank's clock
    end: float
    compute: float
    communication: float  # exposed: collectives with no compute running
    memory: float  # exposed: copies/memsets with neither compute nor collectives
    idle: float
    overlapped_communication: float  # collectives hidden under compute (part of `compute`)
    cpu_duration: float = 0.0
    collective_cpu: float = 0.0  # CPU time inside collective calls (CPU-only traces)

    @property
    def duration(self) -> float:
        return self.end - self.start


def breakdown(kinds: list[tuple[float, float, int]], start: float, end: float) -> dict[str, float]:
    """Split [start, end) by what the GPU ran: the parts sum to end - start."""
    compute = union([(s, e) for s, e, k in kinds if k == COMPUTE])
    comm = union([(s, e) for s, e, k in kinds if k == COMMUNICATION])
    memory = union([(s, e) for s, e, k in kinds if k == MEMORY])
    compute, comm, memory = clip(compute, start, end), clip(comm, start, end), clip(memory, start, end)
    busy = union(compute + comm + memory)
    compute_time = total(compute)
    overlapped = total(intersect(comm, compute))
    comm_or_compute = total(union(compute + comm))
    window = end - start
    return {
        "compute": compute_time,
        "communication": comm_or_compute - compute_time,
        "memory": total(busy) - comm_or_compute,
        "idle": window - total(busy),
        "overlapped_communication": overlapped,
    }


def _step_of(steps: list, starts: list[float], ts: float) -> int | None:
    index = bisect.bisect_right(starts, ts) - 1
    if index >= 0 and ts <= steps[index][2]:
        return steps[index][0]
    return None


def _first_step_by_number(steps: list) -> dict[int, tuple]:
    """Each step number's first (number, start, end) in time order: looked up per step or per collective, a
    search of the list each time would cost the number of steps squared (a trace of 100,000 steps)."""
    first: dict[int, tuple] = {}
    for step in steps:
        first.setdefault(step[0], step)
    return first


TIMELINE_EVENTS = 4000


def rank_breakdown(trace: RankTrace, timeline: list | None = None) -> tuple[list[StepBreakdown], dict[str, float]]:
    """Per-step breakdown, and the whole-trace one (over the span of all GPU activity).

    `timeline`, when given, receives the middle step's activity as (start, end, kind) from its start."""
    steps = trace.steps
    starts = [s[1] for s in steps]
    whole: dict[str, float] = {}
    per_step: list[StepBreakdown] = []
    if trace.has_gpu:
        events = list(zip(trace.gpu_ts, trace.gpu_end, trace.gpu_kind, strict=True))
        span_start, span_end = min(trace.gpu_ts), max(trace.gpu_end)
        whole = breakdown(events, span_start, span_end) | {"span": span_end - span_start}
        if steps:
            order = sorted(range(len(trace.launch_corr)), key=trace.launch_corr.__getitem__)
            corrs = [trace.launch_corr[i] for i in order]
            launch_ts = [trace.launch_ts[i] for i in order]
            by_step: dict[int, list] = defaultdict(list)
            for ts, end, kind, corr in zip(trace.gpu_ts, trace.gpu_end, trace.gpu_kind, trace.gpu_corr, strict=True):
                at = bisect.bisect_left(corrs, corr)
                if at < len(corrs) and corrs[at] == corr:
                    step = _step_of(steps, starts, launch_ts[at])
                    if step is not None:
                        by_step[step].append((ts, end, kind))
            numbers = [n for n, _, _ in steps if by_step.get(n)]
            first_step = _first_step_by_number(steps)
            for index, number in enumerate(numbers):
                group = by_step[number]
                start = min(s for s, _, _ in group)
                if index + 1 < len(numbers):
                    end = min(s for s, _, _ in by_step[numbers[index + 1]])
                else:
                    end = max(e for _, e, _ in group)
                end = max(end, start)
                parts = breakdown(group, start, end)
                cpu = first_step[number]
                per_step.append(StepBreakdown(number, start, end, cpu_duration=cpu[2] - cpu[1], **parts))
                if timeline is not None and index == len(numbers) // 2:
                    timeline += [(s - start, e - start, KIND_NAMES[k]) for s, e, k in group[:TIMELINE_EVENTS]]
    else:
        # Each step's collectives found by bisection, not by a pass over all of them per step.
        collectives = sorted(trace.collectives, key=lambda c: c.ts)
        collective_starts = [c.ts for c in collectives]
        for number, start, end in steps:
            first, stop = bisect.bisect_left(collective_starts, start), bisect.bisect_left(collective_starts, end)
            inside = union([(c.ts, c.ts + c.dur) for c in collectives[first:stop]])
            coll = total(clip(inside, start, end))
            per_step.append(
                StepBreakdown(
                    number, start, end, 0.0, 0.0, 0.0, 0.0, 0.0, cpu_duration=end - start, collective_cpu=coll
                )
            )
            if timeline is not None and len(per_step) == len(steps) // 2 + 1:
                timeline += [(s - start, e - start, "communication") for s, e in clip(inside, start, end)]
    return per_step, whole


# ----------------------------------------------------------------------------- collectives across ranks


@dataclass
class CollectiveMatch:
    key: str  # "pg/step/index" or "pg/seq"
    pg: str
    step: int | None
    name: str
    kind: str
    bytes: int
    group_size: int
    ranks: list[int]
    durations: dict[int, float]  # µs, GPU kernel when present, else CPU call
    latency: float
    skew: float  # largest wait of a rank = max duration - min duration
    last_rank: int | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    waits: dict[int, float] = field(default_factory=dict)


def _collective_keys(trace: RankTrace) -> list[tuple[str, Any]]:
    steps = trace.steps
    starts = [s[1] for s in steps]
    counters: Counter = Counter()
    keyed = []
    for record in trace.collectives:
        pg = record.pg_name or record.pg_desc or "?"
        if record.seq is not None and record.seq >= 0:
            key = f"{pg}/seq{record.seq}"
            step = _step_of(steps, starts, record.ts) if steps else None
        else:
            step = _step_of(steps, starts, record.ts) if steps else None
            if steps and step is None:
                continue  # outside the profiled steps: its order there is unknown on other ranks
            slot = (pg, step)
            key = f"{pg}/step{step}/{counters[slot]}" if step is not None else f"{pg}/{counters[slot]}"
            counters[slot] += 1
        keyed.append((key, step, record))
    return keyed


def match_collectives(traces: list[RankTrace], table: KernelTable) -> list[CollectiveMatch]:
    by_key: dict[str, dict[int, Any]] = defaultdict(dict)
    order: dict[str, tuple] = {}
    for trace in traces:
        for key, step, record in _collective_keys(trace):
            # On a GPU the collective's time is its kernel's: the CPU call only enqueues it. A record whose
            # kernel was not found says nothing of the wait; on a CPU-only trace the call is the collective.
            duration = record.gpu_dur if trace.has_gpu else record.dur
            if duration is not None:
                by_key[key][trace.rank] = (step, record, duration)
                order.setdefault(key, (step if step is not None else -1, record.ts))
    matches = []
    for key in sorted(by_key, key=lambda k: order[k]):
        per_rank = by_key[key]
        step, first, _ = next(iter(per_rank.values()))
        durations = {rank: duration for rank, (_, _, duration) in sorted(per_rank.items())}
        latency = min(durations.values())
        skew = max(durations.values()) - latency
        waits = {rank: d - latency for rank, d in durations.items()}
        last = min(durations, key=durations.get) if len(durations) > 1 and skew >= MIN_SKEW_US else None
        nbytes = max(first.in_nelems, first.out_nelems) * int(table.dtype_bytes.get(first.dtype, 0))
        group = first.group_size or len(per_rank)
        algbw = busbw = None
        if nbytes and latency > 0:
            algbw = nbytes / (latency * 1e-6) / 1e9
            busbw = algbw * table.busbw_factor(first.kind, group)
        matches.append(
            CollectiveMatch(
                key, first.pg_name, step, first.name, first.kind, nbytes, group, sorted(per_rank),
                durations, latency, skew, last, algbw, busbw, waits,
            )
        )  # fmt: skip
    return matches


# ----------------------------------------------------------------------------- stragglers


@dataclass
class RankSummary:
    rank: int
    path: str
    steps: list[StepBreakdown]
    whole: dict[str, float]
    phases: dict[str, float]  # annotation name -> median duration per step (µs)
    gpu_compute_per_step: float | None
    first_collective_offset: float | None  # median µs from the CPU step start to its first collective call
    last_arrivals: int = 0
    wait_caused: float = 0.0  # µs other ranks waited on collectives where this rank arrived last
    has_gpu: bool = False
    collectives: int = 0
    timeline: list = field(default_factory=list)  # the middle step: (start, end, kind), µs from its start


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarise_rank(trace: RankTrace) -> RankSummary:
    timeline: list = []
    steps, whole = rank_breakdown(trace, timeline)
    per_name: dict[str, list[float]] = defaultdict(list)
    offsets: list[float] = []
    if trace.steps:
        starts = [s[1] for s in trace.steps]
        sums: dict[tuple[str, int], float] = defaultdict(float)
        for name, start, end in trace.annotations:
            step = _step_of(trace.steps, starts, start)
            if step is not None:
                sums[(name, step)] += end - start
        for (name, _), value in sums.items():
            per_name[name].append(value)
        firsts: dict[int, float] = {}
        first_step = _first_step_by_number(trace.steps)
        for record in trace.collectives:
            step = _step_of(trace.steps, starts, record.ts)
            if step is not None and step not in firsts:
                firsts[step] = record.ts - first_step[step][1]
        offsets = list(firsts.values())
    phases = {name: statistics.median(v) for name, v in per_name.items()}
    gpu_compute = _median([s.compute for s in steps]) if trace.has_gpu else None
    return RankSummary(
        trace.rank if trace.rank is not None else -1,
        trace.path,
        steps,
        whole,
        phases,
        gpu_compute,
        _median(offsets),
        has_gpu=trace.has_gpu,
        collectives=len(trace.collectives),
        timeline=timeline,
    )


def _fmt_ms(us: float) -> str:
    return f"{us / 1000:.1f} ms" if abs(us) >= 1000 else f"{us:.0f} µs"


def _excess_reason(kind: str, phase: str, mine: float | None, others: list[float | None], describe) -> dict | None:
    """A reason when this rank's value exceeds the others' median by more than the skew floor (or 10%)."""
    theirs = [value for value in others if value is not None]
    if mine is None or not theirs:
        return None
    typical = statistics.median(theirs)
    excess = mine - typical
    if excess <= max(MIN_SKEW_US, 0.1 * typical):
        return None
    text = describe(mine, typical, excess)
    return {"kind": kind, "phase": phase, "excess_us": excess, "rank_us": mine, "others_us": typical, "text": text}


def straggler_reasons(rank: RankSummary, others: list[RankSummary]) -> list[dict[str, Any]]:
    """Why `rank` is late: the phases in which it spends longer than the others, largest excess first."""
    reasons = []
    for name, value in rank.phases.items():
        theirs = [o.phases[name] for o in others if name in o.phases]
        if not theirs:
            continue
        typical = statistics.median(theirs)
        excess = value - typical
        if excess > max(MIN_SKEW_US, 0.1 * typical):
            is_data = any(word in name.lower() for word in DATA_PHASE_WORDS)
            reasons.append(
                {
                    "kind": "data" if is_data else "phase",
                    "phase": name,
                    "excess_us": excess,
                    "rank_us": value,
                    "others_us": typical,
                    "text": f"its `{name}` phase is longer"
                    + (" (data loading)" if is_data else "")
                    + f": {_fmt_ms(value)} vs {_fmt_ms(typical)} per step (+{_fmt_ms(excess)})",
                }
            )
    compute = _excess_reason(
        "compute", "GPU compute", rank.gpu_compute_per_step, [o.gpu_compute_per_step for o in others],
        lambda mine, typical, excess: f"its GPU compute is longer: {_fmt_ms(mine)} vs {_fmt_ms(typical)} per step "
        f"(+{_fmt_ms(excess)})",
    )  # fmt: skip
    launch = _excess_reason(
        "launch", "first collective launch", rank.first_collective_offset,
        [o.first_collective_offset for o in others],
        lambda mine, typical, excess: f"it launches its first collective late: {_fmt_ms(mine)} into the step vs "
        f"{_fmt_ms(typical)} (+{_fmt_ms(excess)})",
    )  # fmt: skip
    reasons += [r for r in (compute, launch) if r is not None]
    # The launch delay is the consequence of the longer phases: list causes first.
    reasons.sort(key=lambda r: (r["kind"] == "launch", -r["excess_us"]))
    return reasons


@dataclass
class TraceAnalysis:
    ranks: list[RankSummary]
    collectives: list[CollectiveMatch]
    problems: list[str]
    straggler: int | None = None
    straggler_reasons: list[dict[str, Any]] = field(default_factory=list)
    ranking: list[dict[str, Any]] = field(default_factory=list)
    mean_step_us: float | None = None
    missing_ranks: list[int] = field(default_factory=list)
    incomplete: bool = False  # a trace could not be read, or only in part


def read_traces(paths: list[str], progress=None) -> TraceAnalysis:
    """Read and analyse every rank's trace; a trace that cannot be read is a problem, the others go on.

    `progress(path)`, when given, is a context manager whose value is read_trace's progress callback.
    Raises InputError when no trace could be read.
    """
    traces, problems = [], []
    for path in paths:
        try:
            if progress is None:
                traces.append(read_trace(path))
            else:
                with progress(path) as tick:
                    traces.append(read_trace(path, progress=tick))
        except TraceReadError as err:
            problems.append(f"{path}: {err}")
    if not traces:
        raise InputError("no profiler trace could be read:\n  " + ("\n  ".join(problems) or "none given"))
    analysis = analyse_traces(traces)
    analysis.problems[:0] = problems
    analysis.incomplete = bool(problems) or any(t.partial for t in traces)
    return analysis


def _ranked(traces: list[RankTrace], problems: list[str]) -> list[RankTrace]:
    """The traces whose rank is known, one per rank. A lone trace without one is taken as rank 0; among
    several, a trace without a rank cannot be matched to its peers and is left out, with the reason."""
    if len(traces) == 1 and traces[0].rank is None:
        traces[0].rank = 0
        problems.append(f"{traces[0].path}: no rank in the trace (no distributedInfo) nor in its name: taken as rank 0")
    seen: dict[int, str] = {}
    usable = []
    for trace in traces:
        if trace.rank is None:
            problems.append(
                f"{trace.path}: no rank in the trace (no distributedInfo) nor in its name (rank<N>): left out; "
                "record with the process group initialised, or name the file after its rank"
            )
            continue
        if trace.rank in seen:
            problems.append(f"{trace.path}: rank {trace.rank} again (also {seen[trace.rank]}): ignored")
            continue
        seen[trace.rank] = trace.path
        usable.append(trace)
    return usable


def _missing_ranks(traces: list[RankTrace]) -> list[int]:
    """The ranks of the job (its world size, from distributedInfo) that no trace was read for."""
    world = max((t.world_size or 0 for t in traces), default=0)
    if not 0 < world <= limits.active().rank + 1:  # a larger world size in a trace is garbage, not a job
        return []
    read = {t.rank for t in traces}
    return [rank for rank in range(world) if rank not in read]


def analyse_traces(traces: list[RankTrace], table: KernelTable | None = None) -> TraceAnalysis:
    table = table or kernel_table()
    problems = [p for t in traces for p in t.problems]
    usable = _ranked(traces, problems)
    missing = _missing_ranks(usable)
    if missing:
        problems.append(
            f"traces of {len(usable)} of the job's {len(usable) + len(missing)} ranks: {format_ranks(missing)} "
            "missing; a straggler is named among the ranks read only"
        )
    summaries = [summarise_rank(t) for t in sorted(usable, key=lambda t: t.rank)]
    for summary in summaries:
        if not summary.has_gpu:
            problems.append(
                f"{summary.path}: no GPU events (a CPU-only trace, or CUDA activity was not profiled): "
                "the breakdown uses the CPU side, collectives are timed by their CPU calls"
            )
        if not summary.collectives:
            problems.append(
                f"{summary.path}: no collective records (record_param_comms): no per-collective latency, "
                "bandwidth or skew for this rank"
            )
        if not summary.steps:
            problems.append(f"{summary.path}: no ProfilerStep#N ranges: no per-step breakdown (call prof.step())")
    matches = match_collectives(usable, table) if len(usable) else []
    analysis = TraceAnalysis(summaries, matches, problems, missing_ranks=missing)
    step_times = [s.duration if s.duration else s.cpu_duration for r in summaries for s in r.steps]
    analysis.mean_step_us = statistics.mean(step_times) if step_times else None
    by_rank = {r.rank: r for r in summaries}
    skewed = [m for m in matches if m.last_rank is not None]
    for match in skewed:
        holder = by_rank.get(match.last_rank)
        if holder:
            holder.last_arrivals += 1
            holder.wait_caused += sum(w for r, w in match.waits.items() if r != match.last_rank) / max(
                len(match.waits) - 1, 1
            )
    steps_seen = max((len(r.steps) for r in summaries), default=0) or 1
    for summary in sorted(summaries, key=lambda r: (-r.wait_caused, r.rank)):
        analysis.ranking.append(
            {
                "rank": summary.rank,
                "last_arrivals": summary.last_arrivals,
                "of_collectives": len(skewed),
                "wait_caused_per_step_us": summary.wait_caused / steps_seen,
            }
        )
    if skewed and len(summaries) > 1:
        top = analysis.ranking[0]
        # Weighted by the wait caused: with few ranks, tiny collectives make "who was last" a coin toss.
        share = top["wait_caused_per_step_us"] / (sum(r["wait_caused_per_step_us"] for r in analysis.ranking) or 1)
        cost = top["wait_caused_per_step_us"] / analysis.mean_step_us if analysis.mean_step_us else 0.0
        if share >= STRAGGLER_SHARE and cost >= STRAGGLER_COST:
            analysis.straggler = top["rank"]
            others = [r for r in summaries if r.rank != top["rank"]]
            analysis.straggler_reasons = straggler_reasons(by_rank[top["rank"]], others)
    return analysis


# ----------------------------------------------------------------------------- verdict


def _step_table(summary: RankSummary) -> dict[str, Any]:
    steps = [asdict(s) | {"duration": s.duration} for s in summary.steps]
    keys = (
        "duration",
        "compute",
        "communication",
        "memory",
        "idle",
        "overlapped_communication",
        "cpu_duration",
        "collective_cpu",
    )
    mean = {k: statistics.mean(s[k] for s in steps) for k in keys} if steps else {}
    return {
        "rank": summary.rank,
        "path": summary.path,
        "has_gpu": summary.has_gpu,
        "steps": steps,
        "mean_step": mean,
        "whole_trace": summary.whole,
        "phases_us": summary.phases,
        "gpu_compute_per_step_us": summary.gpu_compute_per_step,
        "first_collective_offset_us": summary.first_collective_offset,
        "last_arrivals": summary.last_arrivals,
    }


def build_trace_verdict(analysis: TraceAnalysis) -> Verdict:
    """The verdict of the traces alone (`torchtriage trace`)."""
    return verdict_of(assess_traces(analysis))


def assess_traces(analysis: TraceAnalysis) -> Assessment:
    """What the traces say: the straggler and why, or where every rank's step goes."""
    facts: dict[str, Any] = {
        "ranks": [_step_table(r) for r in analysis.ranks],
        "collectives": [asdict(m) for m in analysis.collectives],
        "straggler_ranking": analysis.ranking,
        "mean_step_us": analysis.mean_step_us,
        "units": "microseconds; bandwidths in GB/s",
    }
    if analysis.missing_ranks:
        facts["missing_ranks"] = format_ranks(analysis.missing_ranks)
    files = [r.path for r in analysis.ranks]
    if analysis.straggler is not None:
        rank = analysis.straggler
        top = next(r for r in analysis.ranking if r["rank"] == rank)
        reasons = analysis.straggler_reasons
        why = "; ".join(r["text"] for r in reasons[:3]) or "no phase of its own explains it (look at its host)"
        summary = (
            f"rank {rank} is the straggler: it arrives last at {top['last_arrivals']} of {top['of_collectives']} "
            f"skewed collectives and the others wait {_fmt_ms(top['wait_caused_per_step_us'])} per step for it "
            f"(a step is {_fmt_ms(analysis.mean_step_us or 0)}). Why: {why}."
        )
        path = next((r.path for r in analysis.ranks if r.rank == rank), None)
        kinds = {r["kind"] for r in reasons}
        reason_facts = {
            "slow_data": "data" in kinds,
            "slow_compute": "compute" in kinds or "phase" in kinds,
        }
        reason_facts["unexplained"] = not any(reason_facts.values())
        finding = Finding(
            "trace.straggler",
            [rank],
            f"rank {rank} arrives last at {top['last_arrivals']}/{top['of_collectives']} collectives",
            role="primary",
            category="straggler",
            evidence=[Evidence("profiler_trace", path, rank=rank, text=r["text"]) for r in reasons[:3]],
            facts=reason_facts,
            blames=True,
        )
        # Among a few of the job's ranks, "the last to arrive" may only be the last of those read.
        confidence = Confidence.HIGH if reasons and not analysis.missing_ranks else Confidence.MEDIUM
        return Assessment(
            "profiler_trace", [finding], summary, Category.STRAGGLER, [rank], confidence, facts, files,
            analysis.problems, finding, finding,
        )  # fmt: skip
    parts = []
    for r in analysis.ranks:
        table = _step_table(r)["mean_step"]
        if r.has_gpu and table:
            d = table["duration"] or 1
            parts.append(
                f"rank {r.rank}: step {_fmt_ms(d)}, compute {table['compute'] / d:.0%}, "
                f"communication {table['communication'] / d:.0%}, idle {table['idle'] / d:.0%}"
            )
    summary = "no straggler: no rank holds the others back. " + ("; ".join(parts) if parts else "")
    return Assessment(
        "profiler_trace", [], summary.strip(), Category.UNKNOWN, confidence=Confidence.MEDIUM, facts=facts,
        files=files, problems=analysis.problems,
    )  # fmt: skip
