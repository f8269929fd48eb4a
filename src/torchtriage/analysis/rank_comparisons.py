"""Checks that compare every rank's value with the printing rank's own, in rank order: who departed.

PyTorch's checks all-gather a value from every rank and compare them in rank order, raising at the first that
differs:
- TORCH_DISTRIBUTED_DEBUG=DETAIL's collective check ("Rank <self> is running collective: <own fingerprint>, but
  Rank <peer> is running collective: <its fingerprint>", c10d ProcessGroupWrapper.cpp, `verify_tensors`);
- DDP's model check at construction ("DDP expects same model across all ranks, but Rank <self> has <n> params,
  while rank <peer> has inconsistent <m> params", c10d comm.cpp, `verify_params_across_processes`);
- FSDP's forward-order check on the first iteration ("Forward order differs across ranks: rank <r1> is
  all-gathering ... while rank <r2> ...", fsdp/_exec_order_utils.py): every rank prints the same line, for the
  first pair in rank order that differs, so r1 is rank 0 and every rank below r2 has its value.
A rule reads such a line's `value` and `peer_rank`/`peer_value`. One line says that two ranks differ, not which
of them departed: the rank that prints it may be the odd one or any of the others. It also says that every rank
numbered below the peer has the printing rank's value (the comparison stopped at the peer).

Every rank whose value differs from another's prints such a line, so with the lines of several ranks the ranks
outside the value that more than half of the group's ranks have departed (the group has at least as many ranks as
its lines show; where no value has that many, no side is named). Ranks are those of the group the check compared
(the check's own "Rank N", not a launcher's prefix). Decided from the ranks' own values (three ranks
or more printing theirs), the finding blames; decided only with what the comparison order implies, its fact
`implied` says so and the verdict is medium at most; an even split names both sides as candidates. Where the
logs hold only some ranks' lines and the departed are most of those, a majority of the ranks shown is not one of
the job's (tests/test_rank_comparisons.py measures how often).
"""

from __future__ import annotations

import re
from collections import defaultdict

from torchtriage.model import Evidence, Finding
from torchtriage.ranks import format_ranks
from torchtriage.sources.fields import as_int
from torchtriage.sources.log_records import LogEvent

# The DETAIL check's rule, read by the collective-timeout readings, and the kind of what they find from it.
DETAIL_RULE = "c10d.collective_mismatch"
DETAIL_KIND = "logs.fingerprint_mismatch"
# The fact of a culprit read with what the check's rank order implies, not from each rank's own line.
IMPLIED = "implied"
# The fact that marks what this reading found (the verdict's summary states it).
COMPARED = "rank_order_check"
# The ranks below a peer, implied by the comparison's order: far enough for any job's ranks, bounded for a line
# that claims a peer of rank 10**12.
_IMPLIED_MAX = 1 << 17
_MAX_EVIDENCE = 4
_FINGERPRINT = (("", re.compile(r"OpType=(\w+)")), ("seq ", re.compile(r"SequenceNumber=(\d+)")),
                ("shape ", re.compile(r"TensorShape=(\[[^\]]*\])")))  # fmt: skip


def compares_ranks(event: LogEvent | None) -> bool:
    """Whether a line names a peer whose value differs from its printer's (a rule capturing `peer_rank`)."""
    return event is not None and _printer(event) is not None and "peer_rank" in event.facts and "value" in event.facts


def _printer(event: LogEvent) -> int | None:
    """The rank whose value a check's line gives first, numbered as its peer is: the rank the line says holds it
    (`value_rank`: FSDP's pair, printed alike by every rank), else the printer in the compared group (`group_rank`,
    the check's own "Rank N"), else the line's rank (a launcher's prefix numbers ranks in the world)."""
    for key in ("value_rank", "group_rank"):
        if event.facts.get(key):
            rank = as_int(event.facts[key], None)
            if rank is not None:
                return rank
    return event.rank


def _shown(value: str) -> str:
    """A value as people compare them: a collective's fingerprint by its op, sequence number and shape."""
    found = [(label, pattern.search(value)) for label, pattern in _FINGERPRINT]
    parts = " ".join(label + match.group(1) for label, match in found if match)
    return parts or value[:120]


def _normal(value: str) -> str:
    return " ".join(value.split())


def values_by_rank(lines: list[LogEvent]) -> tuple[dict[int, str], dict[int, str]]:
    """(each rank's value as it printed it, each rank's value as another rank's line shows or implies)."""
    own: dict[int, str] = {}
    told: dict[int, str] = {}
    implied = 0  # the ranks below this one are told already (or print their own): the first line to imply one wins
    for event in lines:
        peer, printer = as_int(event.facts["peer_rank"], None), _printer(event)
        if peer is None or printer is None:
            continue
        mine, theirs = _normal(event.facts["value"]), _normal(event.facts.get("peer_value", ""))
        own.setdefault(printer, mine)
        told.setdefault(peer, theirs)
        below = min(peer, _IMPLIED_MAX)
        told.update((rank, mine) for rank in range(implied, below) if rank != printer and rank not in told)
        implied = max(implied, below)
    return own, told


def _minority(values: dict[int, str], ranks: int) -> list[int]:
    """The ranks outside the value that more than half of the job's `ranks` have; [] when none does (the ranks
    whose value no line shows might have any)."""
    by_value: dict[str, list[int]] = defaultdict(list)
    for rank, value in values.items():
        by_value[value].append(rank)
    leading = max(by_value.values(), key=len)
    if len(by_value) < 2 or 2 * len(leading) <= ranks:
        return []
    return sorted(set(values) - set(leading))


def _in_world(lines: list[LogEvent]) -> dict[int, int] | None:
    """Each printing rank's rank in the job, by its group rank; None where the lines say nothing of a subgroup
    (no line's prefix rank differs from the check's own)."""
    world = {_printer(e): e.rank for e in lines if e.rank is not None and not e.facts.get("value_rank")}
    return world if any(group != rank for group, rank in world.items()) else None


def compared_ranks(events: list[LogEvent], rule_id: str, kind: str, category: str) -> tuple[list[int], Finding] | None:
    """Who departed, from the lines of rule `rule_id` that name a peer; None where none does. On a subgroup, ranks
    are named in the job where the lines' prefixes give them, and a rank no prefix places is not named."""
    lines = [e for e in events if e.rule.id == rule_id and compares_ranks(e)]
    own, told = values_by_rank(lines)
    if not own:
        return None
    values = told | own
    # The group has at least as many ranks as its lines show: a majority is of those, not of the lines read.
    ranks = max(values) + 1
    culprits = _minority(values, ranks)
    by_own = len(own) >= 3 and _minority(own, ranks) == culprits
    groups: dict[str, list[int]] = defaultdict(list)
    for rank, value in sorted(values.items()):
        groups[value].append(rank)
    world = _in_world(lines)
    where = " (ranks of the group the check compared)" if world else ""
    described = "; ".join(f"{format_ranks(members)}: {_shown(value)}" for value, members in groups.items()) + where
    shown = sorted(lines, key=lambda e: _printer(e) not in culprits)[:_MAX_EVIDENCE]  # the departed ranks' own first
    evidence = [Evidence("log", e.file, e.line, e.rank, e.text[:500]) for e in shown]
    named = culprits if world is None else [world[r] for r in culprits if r in world]
    if not culprits or len(named) < len(culprits):
        message = (
            f"the check found ranks that differ ({described}): a line names two ranks whose values differ, not "
            "which one departed, and no side is the larger"
            if not culprits
            else f"by rank: {described} — {format_ranks(culprits)} of the group departed, and the lines do not say "
            "which ranks of the job that is"
        )
        suspects = culprits or sorted(values)
        if world is None:
            candidates = suspects
        else:  # in the job's numbering, or none where a suspect's is unknown
            candidates = sorted(world[r] for r in suspects) if all(r in world for r in suspects) else []
        facts = {COMPARED: True, "undecided": True}
        return [], Finding(kind, candidates, message, "symptom", category, evidence, facts)
    basis = "as each rank printed its own" if by_own else "as the lines show them and the check's rank order implies"
    message = f"by rank, {basis}: {described} — {format_ranks(sorted(named))} departed from the others"
    facts = {COMPARED: True} if by_own else {COMPARED: True, IMPLIED: True}
    return sorted(named), Finding(kind, sorted(named), message, "primary", category, evidence, facts)


def hang_comparison(events: list[LogEvent]) -> tuple[list[int], Finding] | None:
    """Who departed, from the first hang-family check among the lines that compares ranks (the DETAIL check's
    fingerprints, FSDP's forward order); None where no line does."""
    rule_ids = dict.fromkeys(e.rule.id for e in events if e.rule.category == "hang" and compares_ranks(e))
    for rule_id in rule_ids:
        found = compared_ranks(events, rule_id, DETAIL_KIND if rule_id == DETAIL_RULE else rule_id, "hang")
        if found is not None:
            return found
    return None
