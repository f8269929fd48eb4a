"""How sure a verdict from the logs is: `high` only when the deciding line is a cause in itself and nothing in
the logs outranks it.

A rule's role gives the ceiling: a cause in itself (`primary`) may be high, a symptom (a timeout, a peer's
error) medium, an aftermath low. A cause in itself is still only medium when
- it is a generic CUDA error (an illegal memory access, a launch failure) and a library reported its own
  failure in the same logs: the generic error names no cause, and which came first decides
  (`analysis.cascades` already hands the error to a library that reported first);
- the logs show a cause of another category that they do not establish came later, or one that came later
  and is more specific (an uncorrectable ECC error after the illegal memory access it caused).
A line that restates a verdict of torchtriage's own (the hang watchdog's, which `torchtriage run` prints on the
job's console) is never surer than that verdict: it adds no evidence to it.
Readings of absence (where a log stops, a rank that printed nothing) are never high: they are made by
`analysis.stall` and `analysis.collective_timeouts` at low or medium. `benchmarks/triage_eval.py` prints how
often each level is right on labelled logs.
"""

from __future__ import annotations

from typing import Protocol

from torchtriage.analysis.cascades import generic_lines, library_lines_before
from torchtriage.knowledge.cascades import cascade_knowledge
from torchtriage.model import Confidence
from torchtriage.sources.log_records import LogEvent, LogRecords

_CEILING = {"primary": Confidence.HIGH, "symptom": Confidence.MEDIUM, "collateral": Confidence.LOW}
# The facts by which a line that restates a verdict of torchtriage's own names that verdict's file and its
# confidence (rule hang.watchdog_verdict captures them from the line `torchtriage run` prints). Fusion never
# counts such a line as a witness beside the stacks and dumps the verdict was made of.
RESTATED_VERDICT = "verdict_file"
RESTATED_CONFIDENCE = "watchdog_confidence"
# The fact by which a finding names the knowledge its culprits rest on beyond its own artifact (a call every
# rank must make): two sources that decided by one premise are one witness, never two that agree.
PREMISE = "premise"
ALL_RANK_CALLS = "calls every rank must make (knowledge/frames.toml [[all_rank_calls]])"
# A rank named for the files it did not leave: no flight-recorder dump, no stack from an armed run's watchdog (which
# writes both). One absence seen twice is one witness; a capture that found no process (/proc) is another.
LEFT_NOTHING = "a rank that left no file of its own"


class Reading(Protocol):
    """What the calibration reads of a failure the verdict may name (triage's candidates)."""

    role: str
    category: str
    priority: int
    title: str
    file: str
    line: int
    time: float | None
    event: LogEvent | None


def calibrated(primary: Reading, candidates: list[Reading], records: LogRecords) -> tuple[Confidence, list[str]]:
    """The confidence the verdict naming `primary` deserves, and what keeps it below its role's ceiling."""
    ceiling = min(_CEILING[primary.role], _restated_confidence(primary), key=list(Confidence).index)
    if ceiling is not Confidence.HIGH:
        return ceiling, []
    doubts = [doubt for doubt in (_library_beside(primary, candidates, records), _rival(primary, candidates)) if doubt]
    return (Confidence.MEDIUM if doubts else Confidence.HIGH), doubts


def _restated_confidence(primary: Reading) -> Confidence:
    """The confidence of the verdict `primary`'s line restates, if it restates one that names it; else high."""
    facts = primary.event.facts if primary.event is not None else {}
    if RESTATED_VERDICT not in facts:
        return Confidence.HIGH
    try:
        return Confidence(facts.get(RESTATED_CONFIDENCE))
    except ValueError:  # the line of an earlier release names no confidence
        return Confidence.HIGH


def _library_beside(primary: Reading, candidates: list[Reading], records: LogRecords) -> str | None:
    """A generic CUDA error with a library's own failure in the same logs (in an order no line settles)."""
    known = cascade_knowledge()
    if primary.event is None or not known.is_generic(primary.event.rule, primary.event.facts):
        return None
    generic = generic_lines(records, known)
    for other in candidates:
        if other.role == "collateral" or other.event is None or (other.file, other.line) in generic:
            continue
        library = known.library_reporting(other.event.rule)
        if library is not None:
            return (
                f"{primary.title} is a generic CUDA error (it says a kernel stopped, not why), and the logs also "
                f"show {library.name}'s own failure ({other.title}, {other.file}:{other.line}) in an order they do "
                "not settle: whichever came first is the cause"
            )
    printed = library_lines_before(records, primary.file, primary.line, generic)
    if printed is not None:
        library, text = printed
        return (
            f"{primary.title} is a generic CUDA error (it says a kernel stopped, not why), and {library} printed a "
            f"failure of its own before it, in a form no rule knows: {text[:160]}"
        )
    return None


def _rival(primary: Reading, candidates: list[Reading]) -> str | None:
    """A cause in itself of another category that the logs do not put after `primary`, or that came later
    and is more specific."""
    for other in candidates:
        if other.role != "primary" or other.category in (primary.category, "unknown"):
            continue
        if not _later(other, primary) or other.priority > primary.priority:
            return (
                f"the logs also show {other.title} ({other.category}, {other.file}:{other.line}), and do not show "
                "it came after as an aftermath"
            )
    return None


def _later(other: Reading, primary: Reading) -> bool:
    """Whether `other` provably came after `primary`: later in the same log, or by comparable time stamps."""
    if other.time is not None and primary.time is not None:
        return other.time > primary.time
    return other.file == primary.file and other.line > primary.line
