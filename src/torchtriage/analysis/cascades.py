"""A library's cascade: its own failure first, then the generic CUDA error its broken context raises.

DeepEP's kernels print their timeout and trap; NVSHMEM's transport reports its error; NCCL aborts a
communicator under a running kernel; cuBLAS fails to allocate its workspace. The next CUDA call on that
context returns "unspecified launch failure" or "an illegal memory access was encountered", which says a
kernel stopped, not why. Read alone, that generic error is a GPU fault and a cause in itself; after the
library's own report (or raised inside the library's frames, where the same rank reported it) it is the
report's aftermath. `knowledge/cascades.toml` says which errors are generic and which lines are a library's
own failure.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchtriage.knowledge.cascades import CascadeKnowledge, Library, cascade_knowledge
from torchtriage.knowledge.frames import stack_knowledge
from torchtriage.sources.log_records import LogEvent, LogRecords

AFTER = "after"  # printed after the library's own failure
INSIDE = "inside"  # raised in the library's frames, or by its own wrapper of the CUDA call
TRAP = "trap"  # what the library's own kernel leaves when it stops itself, on the rank that reported it


@dataclass(frozen=True)
class Cascade:
    """Why a generic error's line is a library failure's aftermath."""

    owner: LogEvent  # the library's report of its own failure
    library: str
    how: str  # AFTER, INSIDE or TRAP


def generic_lines(records: LogRecords, known: CascadeKnowledge | None = None) -> set[tuple[str, int]]:
    """The (file, line) of every line that holds a generic CUDA error."""
    known = known or cascade_knowledge()
    return {(e.file, e.line) for e in records.events if known.is_generic(e.rule, e.facts)}


def library_cascades(
    records: LogRecords, roles: list[str], generic: set[tuple[str, int]] | None = None
) -> dict[int, Cascade]:
    """For each event (by index) on a generic error's line that a library's own failure explains: that
    failure, and how it explains it. `roles` are the events' roles so far: collateral lines explain nothing
    and need no explaining. `generic`: the generic errors' lines, where the caller has them."""
    known = cascade_knowledge()
    generic = generic_lines(records, known) if generic is None else generic
    if not generic:
        return {}
    owners = _own_failures(records, roles, generic, known)
    if not owners:
        return {}
    first_in_file: dict[str, LogEvent] = {}
    for event, _ in owners:
        if event.file not in first_in_file or event.line < first_in_file[event.file].line:
            first_in_file[event.file] = event
    timed = [event for event, _ in owners if event.time is not None]
    earliest = min(timed, key=lambda e: e.time) if timed else None  # type: ignore[arg-type,return-value]
    library_of = {id(event): library for event, library in owners}
    places, by_rank = _Places(records, known), _Owners(owners)
    explained: dict[tuple[str, int], Cascade] = {}
    for index, event in enumerate(records.events):
        place = (event.file, event.line)
        if place not in generic or place in explained or roles[index] == "collateral":
            continue
        # The kernel's and driver's lines (an Xid) keep their own clock: appended to a job's log (dmesg after the
        # job), their place in the file says nothing of which came first.
        before = None if event.rule.node_event else first_in_file.get(event.file)
        if before is not None and before.line < event.line:
            explained[place] = Cascade(before, library_of[id(before)].name, AFTER)
        elif earliest is not None and event.time is not None and earliest.time < event.time:  # type: ignore[operator]
            explained[place] = Cascade(earliest, library_of[id(earliest)].name, AFTER)
        else:
            inside = _inside(places, event, by_rank) or _trapped(known, event, by_rank)
            if inside is not None:
                explained[place] = inside
    return {
        index: explained[(e.file, e.line)]
        for index, e in enumerate(records.events)
        if (e.file, e.line) in explained and roles[index] != "collateral"
    }


def _own_failures(
    records: LogRecords, roles: list[str], generic: set[tuple[str, int]], known: CascadeKnowledge
) -> list[tuple[LogEvent, Library]]:
    """The lines where a library reports its own failure: not a generic error's line (NCCL's "Cuda failure
    'an illegal memory access …'" and DeepEP's wrapper of a CUDA call report the generic error), and not a
    line that something else already explains."""
    owners = []
    for event, role in zip(records.events, roles, strict=True):
        if role == "collateral" or (event.file, event.line) in generic:
            continue
        library = known.library_reporting(event.rule)
        if library is not None:
            owners.append((event, library))
    return owners


class _Places:
    """The libraries a line is inside: those whose rules matched it (DeepEP's wrapper of a CUDA call), and
    the one whose Python frames the traceback it ends was raised in. Read once, when first asked."""

    def __init__(self, records: LogRecords, known: CascadeKnowledge) -> None:
        self.records, self.known = records, known
        self.reporting: dict[tuple[str, int], list[Library]] | None = None
        self.framed: dict[tuple[str, int], Library] = {}

    def _read(self) -> dict[tuple[str, int], list[Library]]:
        reporting: dict[tuple[str, int], list[Library]] = {}
        for event in self.records.events:
            library = self.known.library_reporting(event.rule)
            if library is not None:
                reporting.setdefault((event.file, event.line), []).append(library)
        frames = stack_knowledge()
        for tb in self.records.tracebacks:
            if tb.exception_line is not None and tb.frames:
                library = self.known.library_of_frames(frames.category_raised_in(tb.frames[::-1]))
                if library is not None:
                    self.framed[(tb.file, tb.exception_line)] = library
        return reporting

    def libraries_of(self, event: LogEvent) -> list[Library]:
        if self.reporting is None:
            self.reporting = self._read()
        place = (event.file, event.line)
        return self.reporting.get(place, []) + ([self.framed[place]] if place in self.framed else [])


class _Owners:
    """Each library's own failures, found by the rank and the file of a line."""

    def __init__(self, owners: list[tuple[LogEvent, Library]]) -> None:
        self.by_rank: dict[tuple[str, int], LogEvent] = {}
        self.by_file: dict[tuple[str, str], LogEvent] = {}
        self.rankless_by_file: dict[tuple[str, str], LogEvent] = {}
        for event, library in owners:
            if event.rank is not None:
                self.by_rank.setdefault((library.name, event.rank), event)
            else:
                self.rankless_by_file.setdefault((library.name, event.file), event)
            self.by_file.setdefault((library.name, event.file), event)

    def of_same_rank(self, library: Library, event: LogEvent) -> LogEvent | None:
        """An own failure of `library` by the rank of `event`: the same rank, or the same file where either
        line names none."""
        if event.rank is None:
            return self.by_file.get((library.name, event.file))
        return self.by_rank.get((library.name, event.rank)) or self.rankless_by_file.get((library.name, event.file))


def _inside(places: _Places, event: LogEvent, owners: _Owners) -> Cascade | None:
    """A generic error raised inside a library (its wrapper of the CUDA call on the same line, or its Python
    frames) whose own failure the same rank reported, in any order: a kernel's printf reaches stdout when
    the host synchronises, and stdout and stderr interleave as they flush."""
    for library in places.libraries_of(event):
        owner = owners.of_same_rank(library, event)
        if owner is not None:
            return Cascade(owner, library.name, INSIDE)
    return None


def _trapped(known: CascadeKnowledge, event: LogEvent, owners: _Owners) -> Cascade | None:
    """The error a library's own kernel leaves when it traps, on a rank that reported the library's failure."""
    for library in known.libraries:
        if event.rule.id in library.traps:
            owner = owners.of_same_rank(library, event)
            if owner is not None:
                return Cascade(owner, library.name, TRAP)
    return None


def library_lines_before(
    records: LogRecords, file: str, line: int, generic: set[tuple[str, int]]
) -> tuple[str, str] | None:
    """A line some library printed when it failed, in a format no rule may know: before `line` of `file`,
    or anywhere in another log (whose order against it is unknown). Returns (library, the line)."""
    known = cascade_knowledge()
    for tail in records.tails:
        for number, text, _ in tail.lines():
            if tail.file == file and number >= line:
                break
            if (tail.file, number) in generic:
                continue
            library = next((lib for lib in known.libraries if lib.printed_failure(text)), None)
            if library is not None:
                return library.name, text.strip()
    return None
