"""A job that finished: its launcher's own report that every worker it ran exited 0, after every line that looks
like a failure. Those lines did not end the job (an error a rank caught, a warning at error level, a failure an
elastic restart recovered from): the verdict is `ok`, and they are shown as what they are.

The report is the launcher's (torchrun's agent: "worker group successfully finished", knowledge/stall.toml
[succeeded]; `torchtriage run`'s record of a launcher that exited 0), never the job's own words, and it covers the
lines of its own file only: a launcher's final failure report anywhere (torchrun's ChildFailedError), a run record
of a failure, or a failure line after the report, and the job did not finish. What torchtriage's own helpers
recorded (the non-finite guard's located values, the monitor's stragglers) is a diagnosis the job ran on through,
never a line to survive: it keeps its verdict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torchtriage.knowledge.stall import stall_knowledge
from torchtriage.sources.log_records import LogRecords, LogTail
from torchtriage.sources.run_exit import run_exits

# A line Python's logging (or a bracketed logger) printed at WARNING level: "WARNING:torch...", "module: [WARNING] ...".
_WARNING = re.compile(r"^(?:\[?WARN(?:ING)?\]?[:\s]|.{0,120}?[\[|] ?WARN(?:ING)? ?[\]|])")


@dataclass(frozen=True)
class Succeeded:
    """Where a launcher reported that its workers all exited 0."""

    file: str
    line: int  # 0: a run record, which covers its whole run folder
    text: str


def _last_success(tail: LogTail) -> tuple[Succeeded, frozenset[int]] | None:
    """The last launcher report of success in a log's tail, and the lines after it that were logged at INFO or
    WARNING level (teardown chatter: a rendezvous that failed to shut down after the job finished)."""
    known = stall_knowledge()
    lines = tail.lines_with_severity()
    found = [(i, number, text) for i, (number, text, _, _) in enumerate(lines) if known.succeeded_by(text)]
    if not found:
        return None
    index, number, text = found[-1]
    reported = frozenset(n for n, line, _, level in lines[index + 1 :] if level in ("I", "W") or _WARNING.match(line))
    return Succeeded(tail.file, number, text.strip()), reported


def finished_despite(failures: list[tuple[str, int]], records: LogRecords) -> list[Succeeded] | None:
    """The launcher reports that say a job finished after every failure line (`(file, line)`; with none, any such
    report), or None where a failure line is not followed, in its own file, by one (or a launcher's final failure
    report was read)."""
    if records.child_failures:
        return None
    own = {tail.file for tail in records.tails if tail.last_own_record is not None}
    if any(file in own for file, _ in failures):
        return None  # torchtriage's own helpers' records (the guard's located non-finite values) are diagnoses
    ends = run_exits(records.tails)
    if any(not end.finished for end in ends):
        return None
    if ends:
        return [Succeeded(end.file, 0, end.sentence) for end in ends]
    found = {tail.file: success for tail in records.tails if (success := _last_success(tail)) is not None}
    if not failures:
        return [success for success, _ in found.values()] or None
    reports = []
    for file, line in failures:
        if file not in found:
            return None
        success, reported = found[file]
        if success.line <= line and line not in reported:
            return None  # a failure after the report: another node's agent, an exit barrier that timed out
        reports.append(success)
    return list(dict.fromkeys(reports))
