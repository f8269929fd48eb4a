"""TORCH_DISTRIBUTED_DEBUG=DETAIL's collective check: which rank issued another collective than its peers.

Before each collective, c10d's ProcessGroupWrapper all-gathers every rank's fingerprint of it (sequence number,
op, tensor shapes, dtypes, devices) and each rank compares them, in rank order, with its own; at the first that
differs it raises "Rank <self> is running collective: <own>, but Rank <peer> is running collective: <peer's>"
(ProcessGroupWrapper.cpp, `verify_tensors`). So one such line says that two ranks differ, not which of them
departed: the rank that prints it may be the odd one or any of the others. What a line does say:
- the printing rank's fingerprint and the peer's;
- every rank numbered below the peer runs the printing rank's collective (the comparison stopped at the peer).

Every rank whose fingerprint differs from another's prints such a line, so with the lines of several ranks the
ranks outside the fingerprint that more than half of the job's ranks run departed (the job has at least as many
ranks as its lines show; where no fingerprint has that many, no side is named). Decided from the ranks' own
fingerprints (three ranks or more reporting their own), the finding blames as the watchdog's readings do;
decided only with what the comparison order implies, its fact `implied` says so and the verdict stays medium;
an even split names both sides as candidates. Where the logs hold only some ranks' lines and the departed are
most of those, a majority of the ranks shown is not one of the job's (tests/test_detail_fingerprints.py
measures how often).
"""

from __future__ import annotations

import re
from collections import defaultdict

from torchtriage.model import Evidence, Finding
from torchtriage.ranks import format_ranks
from torchtriage.sources.fields import as_int
from torchtriage.sources.log_records import LogEvent

RULE = "c10d.collective_mismatch"
KIND = "logs.fingerprint_mismatch"
# The fact of a culprit read with what the check's rank order implies, not from each rank's own line.
IMPLIED = "implied"
# The ranks below a peer, implied by the comparison's order: far enough for any job's ranks, bounded for a line
# that claims a peer of rank 10**12.
_IMPLIED_MAX = 1 << 17
_MAX_EVIDENCE = 4
_SHOWN = (("", re.compile(r"OpType=(\w+)")), ("seq ", re.compile(r"SequenceNumber=(\d+)")),
          ("shape ", re.compile(r"TensorShape=(\[[^\]]*\])")))  # fmt: skip


def _short(fingerprint: str) -> str:
    """A fingerprint as people compare them: its op, sequence number and shape."""
    found = [(label, pattern.search(fingerprint)) for label, pattern in _SHOWN]
    shown = " ".join(label + match.group(1) for label, match in found if match)
    return shown or fingerprint[:120]


def _normal(fingerprint: str) -> str:
    return "".join(fingerprint.split())


def fingerprints_by_rank(lines: list[LogEvent]) -> tuple[dict[int, str], dict[int, str]]:
    """(each rank's fingerprint as it printed it, each rank's fingerprint as another rank's line shows or implies)."""
    own: dict[int, str] = {}
    told: dict[int, str] = {}
    implied = 0  # the ranks below this one are told already (or print their own): the first line to imply one wins
    for event in lines:
        peer = as_int(event.facts["peer_rank"], None)
        if peer is None or event.rank is None:
            continue
        mine, theirs = _normal(event.facts["fingerprint"]), _normal(event.facts["peer_fingerprint"])
        own.setdefault(event.rank, mine)
        told.setdefault(peer, theirs)
        below = min(peer, _IMPLIED_MAX)
        told.update((rank, mine) for rank in range(implied, below) if rank != event.rank and rank not in told)
        implied = max(implied, below)
    return own, told


def _minority(values: dict[int, str], ranks: int) -> list[int]:
    """The ranks outside the fingerprint that more than half of the job's `ranks` run; [] when none does (the
    ranks whose fingerprint no line shows might run any)."""
    by_value: dict[str, list[int]] = defaultdict(list)
    for rank, value in values.items():
        by_value[value].append(rank)
    leading = max(by_value.values(), key=len)
    if len(by_value) < 2 or 2 * len(leading) <= ranks:
        return []
    return sorted(set(values) - set(leading))


def fingerprint_mismatch(events: list[LogEvent]) -> tuple[list[int], Finding] | None:
    """Who departed, from the DETAIL check's lines; None where no line names a peer."""
    lines = [e for e in events if e.rule.id == RULE and "peer_rank" in e.facts and e.rank is not None]
    own, told = fingerprints_by_rank(lines)
    if not own:
        return None
    values = told | own
    # The job has at least as many ranks as any line shows: a majority is of those, not of the lines read.
    ranks = max(max(values), max((e.rank for e in events if e.rank is not None), default=0)) + 1
    culprits = _minority(values, ranks)
    by_own = len(own) >= 3 and _minority(own, ranks) == culprits
    groups: dict[str, list[int]] = defaultdict(list)
    for rank, value in sorted(values.items()):
        groups[value].append(rank)
    described = "; ".join(f"{format_ranks(ranks)}: {_short(value)}" for value, ranks in groups.items())
    shown = sorted(lines, key=lambda e: e.rank not in culprits)[:_MAX_EVIDENCE]  # the departed ranks' own first
    evidence = [Evidence("log", e.file, e.line, e.rank, e.text[:500]) for e in shown]
    if not culprits:
        message = (
            f"the DETAIL check found ranks running different collectives ({described}): each line names the rank "
            "that printed it and the first peer that differs, not which one departed, and no side is the smaller"
        )
        return [], Finding(KIND, sorted(values), message, "symptom", "hang", evidence, {"undecided": True})
    basis = "as each rank printed its own" if by_own else "as the lines show them and the check's rank order implies"
    message = f"collectives by rank, {basis}: {described} — {format_ranks(culprits)} departed from the others"
    return culprits, Finding(KIND, culprits, message, "primary", "hang", evidence, {} if by_own else {IMPLIED: True})
