"""A job that finished: a report that every worker it ran exited 0, after every line that looks like a failure.
Those lines did not end the job (an error a rank caught, a warning at error level, an OOM a framework recovered
from, a failure an elastic restart recovered from): the verdict is `ok`, and they are shown as what they are.

The report is the launcher's where it gave one (torchrun's agent: "worker group successfully finished",
knowledge/stall.toml [succeeded]; DeepSpeed's launcher, once every process it spawned "exits successfully",
sources/deepspeed_launch.py; `torchtriage run`'s record of a launcher that exited 0); else the job's own words that
its training ran to the end (HF's, fairseq's, Lightning's, Megatron's: [completed]), weaker, so the verdict says
less. Either covers the lines of its own file only: a launcher's final failure report anywhere (torchrun's
ChildFailedError), a run record of a failure, or a failure line after the report, and the job did not finish.
What torchtriage's own helpers recorded (the non-finite guard's located values, the monitor's stragglers) is a
diagnosis the job ran on through, never a line to survive: it keeps its verdict.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import NamedTuple

from torchtriage.knowledge.stall import stall_knowledge
from torchtriage.sources.log_records import LogRecords, LogTail
from torchtriage.sources.run_exit import run_exits

# A line Python's logging (or a bracketed logger) printed at WARNING level: "WARNING:torch...", "module: [WARNING] ...".
_WARNING = re.compile(r"^(?:\[?WARN(?:ING)?\]?[:\s]|.{0,120}?[\[|] ?WARN(?:ING)? ?[\]|])")


class Failure(NamedTuple):
    """A line that looks like a failure, as far as a finished job is concerned."""

    file: str
    line: int
    node_event: bool = False  # the node's kernel or driver speaking (rule `node_event`)
    lasting: bool = False  # a state of training (a non-finite loss), survived only where a finite loss follows


@dataclass(frozen=True)
class Succeeded:
    """Where a launcher reported that its workers all exited 0, or the job said its training ran to the end."""

    file: str
    line: int  # 0: a run record, which covers its whole run folder
    text: str
    by_launcher: bool = True  # False: the job's own words (knowledge/stall.toml [completed]), which one process said


def _last_report(tail: LogTail, records: LogRecords, by_launcher: bool) -> tuple[Succeeded, frozenset[int]] | None:
    """The last launcher report of success in a log's tail (or, `by_launcher` False, the job's own last words that
    its training ran to the end), and the lines after it that were logged at INFO or WARNING level (teardown
    chatter: a rendezvous that failed to shut down after the job finished)."""
    known = stall_knowledge()
    lines = tail.lines_with_severity()
    if by_launcher:
        counted = records.launches_finished.get(tail.file, (None,))[0]  # DeepSpeed's, every process counted
        found = [i for i, (number, text, _, _) in enumerate(lines) if number == counted or known.succeeded_by(text)]
    else:
        found = [i for i, (_, text, _, _) in enumerate(lines) if known.completed_by(text)]
    if not found:
        return None
    number, text = lines[found[-1]][:2]
    after = lines[found[-1] + 1 :]
    reported = frozenset(n for n, line, _, level in after if level in ("I", "W") or _WARNING.match(line))
    return Succeeded(tail.file, number, text.strip(), by_launcher), reported


def finished_despite(failures: list[Failure], records: LogRecords) -> list[Succeeded] | None:
    """The reports that say a job finished after every failure line (with none, any such report), or None where a
    failure line is not followed, in its own file, by one (or a launcher's final failure report was read). A
    launcher's report is taken where one covers the failures; else the job's own words. The node's kernel and
    driver lines need no launcher's report to follow them: workers that all exited 0 were not ended by them. A
    non-finite loss is survived only where its file states a finite loss after it: a job that trained on NaN to its
    last step and exited 0 did not recover."""
    if records.child_failures:
        return None
    own = {tail.file for tail in records.tails if tail.last_own_record is not None}
    if any(failure.file in own for failure in failures):
        return None  # torchtriage's own helpers' records (the guard's located non-finite values) are diagnoses
    if any(failure.lasting and not _finite_loss_after(failure, records) for failure in failures):
        return None
    ends = run_exits(records.tails)
    if any(not end.finished for end in ends):
        return None
    if ends:
        return [Succeeded(end.file, 0, end.sentence) for end in ends]
    for by_launcher in (True, False):
        reports = _covering(failures, records, by_launcher)
        if reports:
            return reports
    return None


def _finite_loss_after(failure: Failure, records: LogRecords) -> bool:
    """Whether a training step after the failure's line states a finite loss (the run's closing summary, HF's
    {'train_runtime': ..., 'train_loss': ...}, averages every step, the non-finite ones too: it is no step)."""
    known = stall_knowledge()
    for tail in records.tails:
        if tail.file == failure.file:
            for number, text, _, _ in tail.lines_with_severity():
                loss = known.loss_in(text) if number > failure.line and not known.completed_by(text) else None
                if loss is not None and math.isfinite(loss):
                    return True
    return False


def _covering(failures: list[Failure], records: LogRecords, by_launcher: bool) -> list[Succeeded] | None:
    """The reports of one kind that follow every failure line in its own file, or None. Only the failures' files
    are read for them (a folder of 10⁵ logs holds one failure); with no failure to cover, any file's report."""
    failures = [f for f in failures if not (f.node_event and by_launcher)]
    files = {f.file for f in failures}
    tails = [tail for tail in records.tails if tail.file in files] if files else records.tails
    found = {tail.file: report for tail in tails if (report := _last_report(tail, records, by_launcher))}
    reports = []
    for file, line, _, _ in failures:
        if file not in found:
            return None
        success, reported = found[file]
        if success.line <= line and line not in reported:
            return None  # a failure after the report: another node's agent, an exit barrier that timed out
        reports.append(success)
    return list(dict.fromkeys(reports)) or [success for success, _ in found.values()] or None


def survived_warnings(records: LogRecords) -> set[int]:
    """The events (by index) a program logged at Python's WARNING level (a failure it caught and reports: fairseq's
    "OOM: Ran out of memory with exception: ..." before it recovers) after which the same rank's training went on (a
    later line of its file, of that rank, states a finite loss): the program's own judgement, borne out; and the
    calibration of a loss scaler (rule `calibration`) after whose last line its training went on. Such a line is no
    cause of a failure that came after it."""
    warned = [(i, e) for i, e in enumerate(records.events) if e.severity is None and _WARNING.match(e.text)]
    calibrating = [(i, e) for i, e in enumerate(records.events) if e.rule.calibration]
    if not warned and not calibrating:
        return set()
    progress = _finite_loss_lines(records, {e.file for _, e in warned + calibrating})

    def losses_after(file: str, rank: int | None, line: int) -> int:
        return sum(1 for at, of in progress.get(file, ()) if at > line and of in (rank, None))

    survived = {index for index, event in warned if losses_after(event.file, event.rank, event.line)}
    last: dict[tuple[str, int | None], int] = {}  # each file and rank's last calibration line: the scale settled
    for _, event in calibrating:  # only if training went on after it, counted once per file and rank
        last[event.file, event.rank] = max(last.get((event.file, event.rank), -1), event.line)
    settled = {key for key, line in last.items() if losses_after(*key, line) > 1}
    return survived | {index for index, event in calibrating if (event.file, event.rank) in settled}


def _finite_loss_lines(records: LogRecords, files: set[str]) -> dict[str, list[tuple[int, int | None]]]:
    """(line, rank) of each line of `files`' tails that states a finite loss."""
    known = stall_knowledge()
    found: dict[str, list[tuple[int, int | None]]] = {}
    for tail in records.tails:
        if tail.file in files:
            for number, text, rank, _ in tail.lines_with_severity():
                loss = known.loss_in(text)
                if loss is not None and math.isfinite(loss):
                    found.setdefault(tail.file, []).append((number, rank))
    return found
