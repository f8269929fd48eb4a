"""Everything a job left behind, read by kind and fused into one verdict (`diagnose`, `report`, the watchdog).

The source registry sorts the paths by content: logs, py-spy and faulthandler stacks, flight-recorder
dumps, profiler traces and CUDA memory snapshots. Each kind is assessed by its own analyzer, and fusion
makes one verdict of them all: a failure that is a cause in itself (an OOM in a log or a snapshot)
outranks the hang it caused, and the hang outranks a straggler's skew.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchtriage.analysis.fusion import HANG_SOURCES, fuse
from torchtriage.analysis.machines import attach_machines
from torchtriage.errors import InputError, TriageError
from torchtriage.model import Assessment, Category, SourceKind, Verdict
from torchtriage.sources.registry import Input, discover, not_read_here
from torchtriage.sources.stacks import STACK_KINDS

# What a post-mortem reads: a hang's three sources, and what slow or out-of-memory jobs leave.
RUN_KINDS = (
    SourceKind.LOG,
    *STACK_KINDS,
    SourceKind.FLIGHT_RECORDER,
    SourceKind.PROFILER_TRACE,
    SourceKind.MEMORY_SNAPSHOT,
)
_MISSING = {
    "stacks": "no py-spy dumps found (nor faulthandler dumps)",
    "flight_recorder": "no flight-recorder dumps found",
    "logs": "no logs found",
}


@dataclass
class RunInputs:
    """The artifacts under some paths, by kind, and what could not be read."""

    inputs: list[Input] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # What the live captures' summaries say (_not_sampled), read once: the stack and dump readings both ask.
    captured: tuple | None = field(default=None, repr=False)

    def of(self, *kinds: SourceKind) -> list[Input]:
        return [i for i in self.inputs if i.kind in kinds]

    def files(self, *kinds: SourceKind) -> list[str]:
        return [i.path for i in self.of(*kinds)]


@dataclass
class RunAnalysis:
    """The fused verdict, and what it was made of (the report draws from these)."""

    verdict: Verdict
    assessments: list[Assessment]
    stacks: dict[int, Any] | None = None  # rank -> ProcessStack
    flight_recorder: Any = None  # LoadResult
    traces: Any = None  # TraceAnalysis
    snapshots: list[Assessment] = field(default_factory=list)


def gather(paths: Iterable[str], skip: Iterable[str] = ()) -> RunInputs:
    """Discover every artifact under `paths` (leaving out `skip`, say the page being written)."""
    found = RunInputs()
    skipped = {str(Path(p).resolve()) for p in skip}
    found.inputs = discover(list(paths), found.problems)
    if skipped:  # resolving every path costs a second at 16,384 ranks: only when there is something to skip
        found.inputs = [i for i in found.inputs if str(Path(i.path).resolve()) not in skipped]
    return found


def _stacks(found: RunInputs, run: RunAnalysis) -> Assessment:
    from torchtriage.analysis.stacks import analyze_stacks, assess_stacks
    from torchtriage.sources.stacks import load_stack_inputs

    problems: list[str] = []
    run.stacks = load_stack_inputs(found.of(*STACK_KINDS), problems)
    gone, stopped, job = _not_sampled(found)
    gone = {rank: why for rank, why in gone.items() if rank not in run.stacks}
    stopped = {rank: why for rank, why in stopped.items() if rank not in run.stacks}
    silent = _left_no_stack(found, run.stacks)
    analysis = analyze_stacks(run.stacks, gone, stopped, job, silent)
    assessment = assess_stacks(analysis, files=found.files(*STACK_KINDS))
    assessment.problems += problems
    return assessment


def _not_sampled(found: RunInputs):
    """From a live capture's `summary.json`: the ranks its node should run that it found no process of, the ranks
    it found stopped (rank -> why, each), and the job's shape (its world size, whether its workers restarted)."""
    from torchtriage.sources.captures import CAPTURE_SUMMARY, gone_ranks, job_shape, read_capture, stopped_ranks

    if found.captured is None:
        summaries = [i.path for i in found.of(SourceKind.TORCHTRIAGE_OUTPUT) if Path(i.path).name == CAPTURE_SUMMARY]
        captures = [c for c in map(read_capture, summaries) if c is not None]
        found.captured = gone_ranks(captures), stopped_ranks(captures), job_shape(captures)
    return found.captured


def _left_no_stack(found: RunInputs, stacks: dict) -> dict[int, str]:
    """Rank -> why, for the ranks of an armed run that wrote their identity record as they started but of which the
    run's hang watchdog wrote no stack, where it wrote the other ranks'. The watchdog runs in every rank and asks
    every living one for its stack, stalled or not: a rank with none died or exited, or hangs where its watchdog
    cannot run. Only ranks whose record lies beside the stacks' folder count (a record of another node's run
    folder, whose stacks are not here, says nothing)."""
    from torchtriage.protocol import HANG_SUBDIR
    from torchtriage.sources.identity import read_identity_once

    watched = {os.path.dirname(path) for path in found.files(*STACK_KINDS)}
    silent: dict[int, str] = {}
    for path in found.files(SourceKind.IDENTITY):
        record = read_identity_once(path)
        if isinstance(record, str) or record.machine.rank in stacks:
            continue
        # `run`'s watchdog writes into the run folder's hang/; one the program started writes its own folder.
        folder = _folder_recorded(path)
        own = folder != os.path.dirname(os.path.dirname(path))
        beside = {os.path.join(folder, HANG_SUBDIR), folder if own else ""}
        if watched.isdisjoint(beside):
            continue
        machine = record.machine
        where = f"pid {machine.pid}" + (f" on {machine.host}" if machine.host else "")
        silent[machine.rank] = (
            f"it started as {where} by its identity record, and the run's hang watchdog, which asks every living rank "
            "for its stack, wrote none of it: it died or exited, or hangs where its watchdog cannot run"
        )
    return silent


def _folder_recorded(record: str) -> str:
    """The folder an identity record (`FOLDER/identity/rank<N>.json`) belongs to: `run`'s run folder, or the
    folder of a watchdog the program started itself, which keeps the records in a dot folder of it (`.run/`)."""
    from torchtriage.protocol import OWN_RUN_SUBDIR

    run_dir = os.path.dirname(os.path.dirname(record))
    return os.path.dirname(run_dir) if os.path.basename(run_dir) == OWN_RUN_SUBDIR else run_dir


_POOL_FROM = 256  # dumps


def _flight_recorder(found: RunInputs, run: RunAnalysis, meanwhile: Callable[[], object] | None = None) -> Assessment:
    """`meanwhile` runs in this process while forked children start loading the dumps."""
    from torchtriage.analysis.flight_recorder import assess_dumps
    from torchtriage.sources.flight_recorder import load_dump_files

    files = found.files(SourceKind.FLIGHT_RECORDER)
    # A few dumps load faster here than a pool starts; thousands are read on every core.
    loaded = load_dump_files(files, jobs=1 if len(files) < _POOL_FROM else None, meanwhile=meanwhile)
    run.flight_recorder = loaded.require_dumps()
    run.flight_recorder.known_ranks = _known_ranks(found, files)
    return assess_dumps(run.flight_recorder)


def _known_ranks(found: RunInputs, dumps: list[str]) -> frozenset[int]:
    """The ranks the job had by what its ranks and captures say besides the dumps: the identity records of the
    folder the dumps lie in (the world size they agree on; another run folder's say nothing of these dumps), a live
    capture's world size."""
    from torchtriage.sources.identity import ranks_of_the_job

    dump_folders = {os.path.dirname(path) for path in dumps}
    records = [p for p in found.files(SourceKind.IDENTITY) if _dumps_of(_folder_recorded(p)) & dump_folders]
    world = _not_sampled(found)[2].world_size
    return frozenset(ranks_of_the_job(records) | set(range(world or 0)))


def _dumps_of(folder: str) -> set[str]:
    """Where the recorder's dumps of a run folder go: the hang watchdog's (`hang/fr`), the ranks' own at exit or
    timeout (`fr`)."""
    from torchtriage.protocol import FR_SUBDIR, HANG_SUBDIR

    return {os.path.join(folder, HANG_SUBDIR, FR_SUBDIR), os.path.join(folder, FR_SUBDIR)}


def _logs(found: RunInputs, run: RunAnalysis) -> Assessment:
    from torchtriage.analysis.pipeline import assess_inputs

    return assess_inputs(found.of(SourceKind.LOG, SourceKind.IDENTITY))  # the ranks' records: the job's ranks


def _traces(found: RunInputs, run: RunAnalysis) -> Assessment:
    from torchtriage.analysis.trace import assess_traces, read_traces

    run.traces = read_traces(found.files(SourceKind.PROFILER_TRACE))
    return assess_traces(run.traces)


# Each source: the kinds it reads, and its analyzer.
_ANALYZERS: tuple[tuple[str, tuple[SourceKind, ...], Callable[[RunInputs, RunAnalysis], Assessment]], ...] = (
    ("stacks", STACK_KINDS, _stacks),
    ("flight_recorder", (SourceKind.FLIGHT_RECORDER,), _flight_recorder),
    ("logs", (SourceKind.LOG,), _logs),
    ("profiler_trace", (SourceKind.PROFILER_TRACE,), _traces),
)


def analyse_run(
    found: RunInputs,
    on_snapshot: Callable[[Any, Any], None] | None = None,
    collected: Iterable[Assessment] = (),
) -> RunAnalysis:
    """Assess every kind of artifact found and fuse them, with what a live collector `collected` said by
    itself. `on_snapshot(snapshot, report)` sees each memory snapshot while it is in memory (the report draws
    it; it is not kept)."""
    run = RunAnalysis(Verdict(Category.UNKNOWN, [], ""), list(collected))
    reasons = dict(_MISSING)
    problems = list(found.problems)
    made: dict[str, Assessment] = {}

    def assess(name: str, analyzer: Callable[..., Assessment], *args: object) -> None:
        try:
            made[name] = analyzer(found, run, *args)
        except TriageError as err:
            reasons[name] = str(err)
            problems.append(f"{name}: {err}")

    present = [(name, analyzer) for name, kinds, analyzer in _ANALYZERS if found.of(*kinds)]
    pending = [(name, analyzer) for name, analyzer in present if analyzer is not _flight_recorder]

    def assess_others() -> None:
        while pending:
            assess(*pending.pop(0))

    if len(pending) < len(present):  # the other sources are read here while the dumps load on the other cores
        assess("flight_recorder", _flight_recorder, assess_others)
    assess_others()  # without dumps, or when their loading failed before it got to them
    run.assessments += [made[name] for name, _ in present if name in made]
    snapshots = _snapshots(found.files(SourceKind.MEMORY_SNAPSHOT), problems, on_snapshot)
    run.snapshots = snapshots
    if snapshots:
        run.assessments.append(_headline_snapshot(snapshots))
    if not run.assessments:
        reasons_text = "\n  ".join(problems + not_read_here(found.inputs, RUN_KINDS)) or "the paths hold no file"
        raise InputError(
            "nothing readable: no log, py-spy or faulthandler dump, flight-recorder dump, profiler trace or "
            f"memory snapshot could be read:\n  {reasons_text}"
        )
    verdict = fuse(run.assessments, reasons, expected=HANG_SOURCES)
    run.verdict = attach_machines(verdict, found.inputs, run.stacks, [a.facts for a in run.assessments])
    run.verdict.problems[:0] = problems + not_read_here(found.inputs, RUN_KINDS)
    return run


def _snapshots(paths: list[str], problems: list[str], on_snapshot) -> list[Assessment]:
    from torchtriage.analysis.memory import analyse_snapshot, assess_memory, read_snapshot

    assessments = []
    for path in paths:
        try:
            snapshot = read_snapshot(path)
        except TriageError as err:
            problems.append(str(err))
            continue
        report = analyse_snapshot(snapshot)
        if on_snapshot is not None:
            on_snapshot(snapshot, report)
        assessments.append(assess_memory(report))
        del snapshot, report
    return assessments


def _headline_snapshot(assessments: list[Assessment]) -> Assessment:
    """Several snapshots are one source: the one that found the most, with the others' findings after it."""
    lead = max(assessments, key=lambda a: (any(f.role == "primary" for f in a.findings), len(a.findings)))
    merged = Assessment(**{**lead.__dict__})
    merged.findings = list(lead.findings) + [f for a in assessments if a is not lead for f in a.findings]
    merged.files = [f for a in assessments for f in a.files]
    merged.problems = [p for a in assessments for p in a.problems]
    return merged


def diagnose_paths(
    paths: list[str],
    extra_logs: list[str] | None = None,
    skip: Iterable[str] = (),
    collected: Iterable[Assessment] = (),
) -> Verdict:
    """The fused verdict of every artifact under `paths` and `extra_logs` (and of what a live collector
    said by itself). Raises InputError when none is readable."""
    found = gather(list(paths) + list(extra_logs or []), skip)
    return analyse_run(found, collected=collected).verdict
