"""The lowest layer of triage: a log that shows no error, only where the job stopped.

Most reports of a stalled job carry no error at all. The user pressed Ctrl-C (Python printed the stack
it interrupted; torchrun said it received the signal), or pasted a stack dump of the stuck processes
(faulthandler, py-spy, gdb, a traceback without its exception), or the log simply stops: after NCCL's
set-up, a progress bar, a checkpoint save. This layer reads the end of each log for those signs; it
speaks only when no error family did, so a log with a real error keeps its category.

Stacks go through the one stack classifier live `diagnose` uses (`analysis.positions`, with the tables
of `knowledge/frames.toml`); with the stacks of several ranks, the same cross-rank analysis names the
rank that is not where the others wait. The rest is said with the confidence it deserves: low.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from torchtriage.analysis.positions import describe, position_of
from torchtriage.analysis.stacks import analyze_positions, assess_stacks
from torchtriage.knowledge.stall import StallKnowledge, stall_knowledge
from torchtriage.model import Assessment, Evidence, Finding, RankPosition, RankState, SourceKind
from torchtriage.ranks import format_ranks
from torchtriage.sources.log_records import LogRecords, LogTail
from torchtriage.sources.log_stacks import LogStack, stacks_in

UNRECOGNISED = "logs.unrecognised_failure"
LOSS_DIVERGED = "nan_inf.loss_diverged"
INTERRUPTED = "hang.interrupted"
INTERRUPTED_OUTSIDE = "hang.interrupted_outside_collective"
STACK_DUMP = "hang.stack_dump"
LOG_STOPS = "hang.log_stops"
# The exceptions a stalled job is stopped with from outside: their traceback is where it was stuck.
_INTERRUPT_EXCEPTIONS = frozenset({"KeyboardInterrupt"})
# How many of a log's last lines are searched for a sign of interruption.
_INTERRUPT_WINDOW = 400
# How many of a log's last lines are searched for a sign that the job finished.
_FINISH_WINDOW = 20


@dataclass
class TailReading:
    """What the end of one log says."""

    file: str
    stacks: list[LogStack]
    interrupt: tuple[int, str, int | None] | None  # (line, text, rank) of the last sign of Ctrl-C
    last: tuple[int, str, int | None] | None  # the last line that carries something
    finished: bool  # the log ends saying the job finished
    failed: bool  # its last lines show a failure no rule knows (an error line, an exit code, a C++ backtrace)
    last_failure: tuple[int, str, int | None] | None = None  # the last of those lines
    cut_at_start: bool = False  # the tail begins inside a message (the log or the paste starts mid-way)
    world_size: int | None = None  # the largest world size a line states
    diverged: tuple[tuple[int, str, int | None], float, float] | None = None  # (line, loss, its earlier median)


def stops_with_interrupt(stack: LogStack) -> bool:
    return stack.exception is not None and stack.exception.rsplit(".", 1)[-1] in _INTERRUPT_EXCEPTIONS


def _shows_a_stall(stack: LogStack, interrupted: bool) -> bool:
    """Whether a stack is where a stuck process was, rather than a failure's traceback cut short.

    A dump (faulthandler, py-spy, gdb) and a traceback ending in KeyboardInterrupt are; so is a stack
    printed without the traceback header (`traceback.print_stack`, a paste of frames). A traceback under
    its header whose exception line is missing was cut off: an error, unless the job was interrupted."""
    if stack.form != "traceback" or stops_with_interrupt(stack):
        return True
    return stack.exception is None and (not stack.headed or interrupted)


def read_tail(tail: LogTail, known: StallKnowledge) -> TailReading:
    rich = tail.lines_with_severity()
    lines = [(number, text, rank) for number, text, rank, _ in rich]
    reports = {number for number, _, _, severity in rich if severity in ("I", "W")}  # logged, carried on
    window = lines[-_INTERRUPT_WINDOW:]
    interrupt = next((item for item in reversed(window) if known.interrupted(item[1])), None)
    stacks = [s for s in stacks_in(lines) if _shows_a_stall(s, interrupt is not None)]
    meaningful = _meaningful(window, known)
    last = meaningful[-1] if meaningful else None
    if tail.last_own_record is not None:
        last = None  # torchtriage's own records (the guard's, the monitor's): where they end says nothing of a stall
    # Teardown chatter may follow the sign of a finished job ("Destroy COMPLETE", then plugins closing).
    finished = any(known.finished_by(text) for _, text, _ in meaningful[-_FINISH_WINDOW:])
    framed = {f.printed_at for stack in stacks for f in stack.frames}  # a frame's name is not an error line
    failures = [
        item for item in window if item[0] not in framed and item[0] not in reports and known.shows_failure(item[1])
    ]
    cut_at_start = tail.cut_at_start
    worlds = [w for w in map(known.world_size_in, (text for _, text, _ in lines)) if w]
    diverged = _loss_diverged(lines, known)
    return TailReading(
        tail.file,
        stacks,
        interrupt,
        last,
        finished,
        bool(failures),
        failures[-1] if failures else None,
        cut_at_start,
        max(worlds) if worlds else None,
        diverged,
    )


def _meaningful(lines: list[tuple[int, str, int | None]], known: StallKnowledge) -> list[tuple[int, str, int | None]]:
    """The lines that say something about where a log stopped: no noise, and no source line that Python's
    warnings module echoed, indented, under the warning it printed."""
    kept = []
    previous = None
    for item in lines:
        echo = (
            previous is not None and previous[0] == item[0] - 1 and item[1][:1].isspace() and known.warns(previous[1])
        )
        if not echo and not known.is_noise(item[1]):
            kept.append(item)
        previous = item
    return kept


_LOSS_BASELINE = 3  # the first losses of a log whose median is the scale the others are measured against


def _loss_diverged(lines: list[tuple[int, str, int | None]], known: StallKnowledge):
    """The first step line whose loss grew `factor`-fold over the median of the log's first losses."""
    losses = [(item, value) for item in lines if (value := known.loss_in(item[1])) is not None and math.isfinite(value)]
    if len(losses) <= _LOSS_BASELINE:
        return None
    baseline = statistics.median(abs(v) for _, v in losses[:_LOSS_BASELINE])
    for item, value in losses[_LOSS_BASELINE:]:
        if baseline > 0 and value >= known.loss_at_least and value >= known.loss_factor * baseline:
            return item, value, baseline
    return None


# A census is taken of worlds up to this size: beyond it a log names too few ranks to say who is missing.
_CENSUS_MAX = 4096


def census(records: LogRecords, readings: list[TailReading]) -> tuple[int | None, list[int]]:
    """The world size the logs state and the ranks of it that printed nothing, where both are known."""
    worlds = [r.world_size for r in readings if r.world_size]
    world = max(worlds) if worlds else None
    seen = records.ranks_seen
    if world is None or not seen or world > _CENSUS_MAX or max(seen) >= world:
        return world, []
    return world, sorted(set(range(world)) - seen)


def what_was_seen(records: LogRecords, known: StallKnowledge | None = None) -> tuple[dict, list[Finding]]:
    """When no family explains a log: what it shows (ranks, its last line, whether it looks cut), and a
    finding when its last lines hold a failure no rule knows."""
    known = known or stall_knowledge()
    readings = [read_tail(tail, known) for tail in records.tails]
    facts: dict = {"ranks_seen": sorted(records.ranks_seen)}
    last = next((r.last for r in reversed(readings) if r.last is not None), None)
    if last is not None:
        facts["last_line"] = last[1].strip()[:500]
    if any(r.cut_at_start for r in readings):
        facts["cut_at_start"] = True
    failing = [r for r in readings if r.last_failure is not None and not r.finished]
    if not failing:
        return facts, []
    reading = failing[-1]
    line, text, rank = reading.last_failure  # type: ignore[misc]
    ranks = sorted(records.ranks_seen)
    seen = (f"ranks seen: {format_ranks(ranks)}" if ranks else "no rank named") + (
        "; the log starts mid-message" if facts.get("cut_at_start") else ""
    )
    finding = _line_finding(
        UNRECOGNISED,
        "unknown",
        reading.file,
        (line, text, rank),
        f"The log shows a failure that no rule knows: {text.strip()[:200]}",
        {"last_failure": text.strip()[:300], "seen": seen},
    )
    return facts, [finding]


def _position(stack: LogStack, file: str) -> RankPosition:
    return position_of(
        stack.rank if stack.rank is not None else -1,
        stack.frames,
        active=stack.active,
        source=SourceKind.LOG,
        file=file,
        thread_name=stack.thread,
    )


_PREFERENCE = {RankState.COLLECTIVE: 0, RankState.GPU_WAIT: 1, RankState.DATALOADER: 2, RankState.LOCK: 3}


def _telling(positions: list[RankPosition]) -> RankPosition:
    """Of one process's threads, the one that says most: waiting in a collective or for the GPU, in the
    data loader, on a lock; else the main thread; else the last stack printed."""
    return min(
        reversed(positions),
        key=lambda p: (
            _PREFERENCE.get(p.state, 9),
            p.thread_name not in (None, "MainThread"),
            p.state is RankState.NO_STACK,
        ),
    )


def _stack_evidence(position: RankPosition, stack_line: int) -> list[Evidence]:
    frames = [f for f in (position.where, position.user_frame) if f is not None]
    unique = list(dict.fromkeys(id(f) for f in frames))
    shown = [next(f for f in frames if id(f) == i) for i in unique]
    rank = position.rank if position.rank >= 0 else None
    return [Evidence("log", position.file, f.printed_at or stack_line, rank, f.text) for f in shown] or [
        Evidence("log", position.file, stack_line, rank, "a stack with no frame the classifier could read")
    ]


def _line_finding(
    kind: str, category: str, file: str, item: tuple[int, str, int | None], message: str, facts: dict
) -> Finding:
    """A symptom whose evidence is one line of the log: `item` is (line number, text, rank)."""
    line, text, rank = item
    ranks = [rank] if rank is not None else []
    return Finding(
        kind, ranks, message, "symptom", category, [Evidence("log", file, line, rank, text.strip()[:500])], facts
    )


def _it_was(ranks: list[int]) -> str:
    return "it was" if len(ranks) == 1 else "they were"


def every_rank_seen(records: LogRecords) -> set[int]:
    """The ranks of the lines that matched, and of every line at the ends of the logs."""
    return set(records.ranks_seen) | {r for tail in records.tails for _, _, r in tail.lines() if r is not None}


def _interrupted_in_python_only(
    ranked: dict[int, tuple[RankPosition, LogStack]], seen: set[int]
) -> tuple[list[int], list[int]] | None:
    """After Ctrl-C: the ranks that printed a stack in no collective, and the ranks the log shows that
    printed none (blocked in native code, where a collective waits), when there are both."""
    stacked = sorted(r for r, (position, _) in ranked.items() if not position.waiting)
    if not stacked or len(stacked) < len(ranked):
        return None  # some rank was interrupted inside a collective: the cross-rank analysis decides
    silent = sorted(seen - set(ranked))
    return (stacked, silent) if silent else None


def _who(position: RankPosition) -> str:
    return f"rank {position.rank}" if position.rank >= 0 else "the process"


_CUT_AT_START = "the log starts mid-message: what came before, the first failure perhaps, is not in it"


def assess_stall(records: LogRecords, known: StallKnowledge | None = None) -> Assessment | None:
    """A `hang` assessment from the ends of the logs, or None when they carry no sign of a stall. A log
    that starts mid-message says so: its beginning, where a failure may be, is missing."""
    known = known or stall_knowledge()
    readings = [read_tail(tail, known) for tail in records.tails]
    assessment = _assess_stall(records, readings, known)
    if assessment is not None and any(r.cut_at_start for r in readings):
        assessment.facts["cut_at_start"] = True
        assessment.summary = f"{assessment.summary}; {_CUT_AT_START}"
    return assessment


def _assess_stall(records: LogRecords, readings: list[TailReading], known: StallKnowledge) -> Assessment | None:
    stacks = [(r, s) for r in readings for s in r.stacks]
    interrupts = [(r, r.interrupt) for r in readings if r.interrupt is not None]
    if any(r.failed for r in readings) and not interrupts:
        return None  # a failure no rule knows is not a stall: it stays unknown
    if not stacks and not interrupts:
        diverging = next((r for r in readings if r.diverged is not None), None)
        if diverging is not None:
            return _loss_diverges(records, diverging)
        ends = [(r, r.last) for r in readings if r.last is not None]
        if not ends or all(r.finished for r, _ in ends):
            return None
        return _log_stops(records, ends, readings)

    by_rank: dict[int, list[tuple[RankPosition, LogStack]]] = {}
    for reading, stack in stacks:
        position = _position(stack, reading.file)
        by_rank.setdefault(position.rank, []).append((position, stack))
    chosen: dict[int, tuple[RankPosition, LogStack]] = {}
    for rank, items in by_rank.items():
        best = _telling([p for p, _ in items])
        chosen[rank] = next(item for item in items if item[0] is best)

    findings: list[Finding] = []
    culprits: list[int] = []
    confidence = "low"
    facts: dict = {"ranks_seen": sorted(records.ranks_seen)}
    ranked = {rank: item for rank, item in chosen.items() if rank >= 0}
    if len(ranked) >= 2:
        analysis = analyze_positions({rank: position for rank, (position, _) in ranked.items()})
        stacks_said = assess_stacks(analysis, records.files_read)
        findings += stacks_said.findings
        culprits = list(stacks_said.culprits)
        confidence = "medium" if culprits else "low"
        facts |= stacks_said.facts
    elif chosen:
        best = _telling([position for position, _ in chosen.values()])
        position, stack = next(item for item in chosen.values() if item[0] is best)
        said = describe(position)
        findings.append(
            Finding(
                STACK_DUMP,
                [position.rank] if position.rank >= 0 else [],
                f"The {stack.form} stack of {_who(position)} shows it {said}",
                "symptom",
                "hang",
                _stack_evidence(position, stack.line),
                {"position": said, "state": str(position.state), "form": stack.form},
            )
        )
        if position.user_frame is not None:
            facts["user_frame"] = position.user_frame.to_fact(position.rank if position.rank >= 0 else None)
        confidence = "medium" if position.waiting else "low"
    if interrupts and not culprits:
        quiet = _interrupted_in_python_only(ranked, every_rank_seen(records))
        if quiet:
            stacked, silent = quiet
            facts["candidates"] = stacked
            findings.append(
                Finding(
                    INTERRUPTED_OUTSIDE,
                    stacked,
                    f"Interrupted, {format_ranks(stacked)} printed where {_it_was(stacked)}"
                    f" (in no collective) and {format_ranks(silent)} printed nothing: Python raises KeyboardInterrupt"
                    " only between bytecodes, so a rank blocked inside a collective's native wait prints no stack",
                    "symptom",
                    "hang",
                    [
                        e
                        for position, stack in (ranked[r] for r in stacked)
                        for e in _stack_evidence(position, stack.line)
                    ][:4],
                    {"candidates": stacked, "silent": silent},
                )
            )
    if interrupts:
        reading, (line, text, rank) = interrupts[0]
        where = findings[0].message if findings else "no stack of where it was"
        findings.insert(
            0,
            Finding(
                INTERRUPTED,
                [rank] if rank is not None else [],
                "The job was interrupted (Ctrl-C) with no error before it: it had stopped making progress",
                "symptom",
                "hang",
                [Evidence("log", reading.file, line, rank, text[:500])],
                {"where": where},
            ),
        )
    lead = next((f for f in findings if f.role == "primary"), findings[0])
    summary = lead.message
    if interrupts and lead.kind == INTERRUPTED and len(findings) > 1:
        summary = f"{lead.message}; {findings[1].message}"
    return Assessment(
        source="logs",
        findings=findings,
        summary=summary,
        category="hang",
        culprits=culprits,
        confidence=confidence,
        facts=facts,
        files=records.files_read,
        problems=records.problems,
        lead=lead,
        blaming=next((f for f in findings if f.blames), None),
    )


def _loss_diverges(records: LogRecords, reading: TailReading) -> Assessment:
    """No error, but the loss grew by orders of magnitude: the run diverged (a NaN or a crash usually follows)."""
    item, value, baseline = reading.diverged  # type: ignore[misc]
    finding = _line_finding(
        LOSS_DIVERGED,
        "nan_inf",
        reading.file,
        item,
        f"The loss diverged: {value:.4g}, from about {baseline:.4g} at the start of the log, with no error reported",
        {"loss": f"{value:.6g}", "baseline_loss": f"{baseline:.6g}"},
    )
    return Assessment(
        source="logs",
        findings=[finding],
        summary=finding.message,
        category="nan_inf",
        culprits=list(finding.ranks),
        confidence="low",
        facts={"ranks_seen": sorted(records.ranks_seen), "loss": finding.facts["loss"]},
        files=records.files_read,
        problems=records.problems,
        lead=finding,
    )


def _log_stops(
    records: LogRecords, ends: list[tuple[TailReading, tuple[int, str, int | None]]], readings: list[TailReading]
) -> Assessment:
    """Only where the logs stop: said with low confidence, with what to capture next, and the ranks of a
    stated world that printed nothing as candidates (never as culprits: a rank may log nothing and be fine)."""
    known = stall_knowledge()
    reading, (line, text, rank) = ends[-1]
    doing = known.doing(text)
    what = f"{doing}" if doing else "its last line"
    ranks = sorted(records.ranks_seen)
    world, silent = census(records, readings)
    seen = f"; ranks seen: {format_ranks(ranks)}" if ranks else ""
    if silent:
        seen += f"; of a world of {world}, {format_ranks(silent)} printed nothing"
    finding = _line_finding(
        LOG_STOPS,
        "hang",
        reading.file,
        (line, text, rank),
        f"The log shows no error and stops after {what}: {text.strip()[:200]}{seen}",
        {"last_line": text.strip()[:500], "doing": doing or "", "stopped_after": what},
    )
    return Assessment(
        source="logs",
        findings=[finding],
        summary=finding.message,
        category="hang",
        culprits=[],
        confidence="low",
        facts={"ranks_seen": ranks, "last_line": finding.facts["last_line"]}
        | ({"world_size": world, "candidates": silent} if silent else {}),
        files=records.files_read,
        problems=records.problems,
        lead=finding,
    )
