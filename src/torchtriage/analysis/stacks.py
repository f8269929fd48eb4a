"""Where each rank of a hung job is, from its py-spy stack, and which rank is not where the others wait.

A hang is almost always a collective mismatch: the healthy ranks wait in one collective, and the
culprit is elsewhere — in no collective at all (sleeping, stuck in a data loader, deadlocked on a
lock), or in a different collective or the same one called from another line (often another process
group). Each rank's main thread gets a state; ranks are grouped by state and call site; the culprit
is the rank, or the minority, outside the waiting majority. With two ranks in two different
collectives nothing says which one departed, and this says so rather than guess; no rank is ever
blamed for being rank 0.

On NCCL a collective is asynchronous: a rank waiting for a peer shows `torch.cuda.synchronize`,
`Event.synchronize` (or, with --native, cudaStreamSynchronize under `.item()` / `.cpu()`) right
after the collective, not the collective itself. That state, `gpu_wait`, counts as waiting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torchtriage.analysis.fusion import verdict_of
from torchtriage.analysis.positions import P2P_OPS, classify_frames, describe, position_of
from torchtriage.model import Assessment, Evidence, Finding, Frame, RankPosition, RankState, SourceKind, Verdict
from torchtriage.ranks import format_ranks
from torchtriage.sources.pyspy import ProcessStack, ThreadStack

# The states, under the names the analysis has always used.
COLLECTIVE, GPU_WAIT, DATALOADER, LOCK = RankState.COLLECTIVE, RankState.GPU_WAIT, RankState.DATALOADER, RankState.LOCK
SLEEPING, BLOCKED, COMPUTING, NO_STACK = RankState.SLEEPING, RankState.BLOCKED, RankState.COMPUTING, RankState.NO_STACK
WAITING_STATES = (COLLECTIVE, GPU_WAIT)


def classify_thread(thread: ThreadStack | None) -> tuple[RankState, str | None, Frame | None]:
    """(state, op, the deciding frame) of one py-spy thread."""
    if thread is None:
        return RankState.NO_STACK, None, None
    return classify_frames(thread.frames, thread.active if thread.state_known else None)


def rank_position(rank: int, process: ProcessStack) -> RankPosition:
    thread = process.main_thread()
    if thread is None:
        return RankPosition(rank, RankState.NO_STACK, None, None, None, SourceKind.PYSPY, process.source)
    active = thread.active if thread.state_known else None
    source = SourceKind.PYSPY if thread.state_known else SourceKind.FAULTHANDLER
    return position_of(rank, thread.frames, active=active, source=source, file=process.source, thread_name=thread.name)


def positions(dumps: Mapping[int, ProcessStack]) -> dict[int, RankPosition]:
    """Each rank's position, from rank -> its py-spy dump."""
    return {rank: rank_position(rank, dumps[rank]) for rank in sorted(dumps)}


# --- across ranks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StackGroup:
    ranks: tuple[int, ...]
    position: RankPosition  # the lowest rank's, standing for all

    def describe(self) -> str:
        return f"{format_ranks(list(self.ranks))} {describe(self.position, plural=len(self.ranks) > 1)}"


@dataclass
class StackAnalysis:
    positions: dict[int, RankPosition]
    groups: list[StackGroup]  # largest first
    findings: list[Finding]
    culprit_ranks: list[int]
    confidence: str  # "high" | "medium" | "low"


def group_positions(found: Mapping[int, RankPosition]) -> list[StackGroup]:
    by_signature: dict[tuple, list[int]] = {}
    for rank in sorted(found):
        by_signature.setdefault(found[rank].signature, []).append(rank)
    groups = [StackGroup(tuple(ranks), found[ranks[0]]) for ranks in by_signature.values()]
    return sorted(groups, key=lambda g: (-len(g.ranks), g.ranks))


_MAX_EVIDENCE = 8


def _evidence(position: RankPosition) -> list[Evidence]:
    frames = [position.user_frame] if position.user_frame else []
    if position.where is not None and position.where is not position.user_frame:
        frames.insert(0, position.where)
    return [Evidence(position.source, position.file, f.printed_at, position.rank, f.text) for f in frames]


def _group_evidence(groups: list[StackGroup]) -> list[Evidence]:
    evidence = []
    for group in groups:
        evidence += _evidence(group.position)
    return evidence[:_MAX_EVIDENCE]


def _groups_text(groups: list[StackGroup]) -> str:
    return "; ".join(g.describe() for g in groups)


def analyze_stacks(dumps: Mapping[int, ProcessStack]) -> StackAnalysis:
    """Findings from every rank's stack: `not_in_collective`, `different_collective`, `stack_groups`."""
    return analyze_positions(positions(dumps))


def analyze_positions(found: Mapping[int, RankPosition]) -> StackAnalysis:
    found = dict(sorted(found.items()))
    groups = group_positions(found)
    waiting = [g for g in groups if g.position.waiting]
    elsewhere = [g for g in groups if not g.position.waiting]
    waiting_ranks = sorted(r for g in waiting for r in g.ranks)
    elsewhere_ranks = sorted(r for g in elsewhere for r in g.ranks)
    findings: list[Finding] = []
    culprits: list[int] = []
    confidence = "low"

    if waiting and elsewhere and len(elsewhere_ranks) <= len(waiting_ranks):
        # The ranks the others wait for are not in any collective.
        culprits = elsewhere_ranks
        confidence = "high" if len(waiting_ranks) >= 2 and len(elsewhere_ranks) < len(waiting_ranks) else "medium"
        findings.append(
            Finding(
                "stacks.not_in_collective",
                culprits,
                f"{format_ranks(culprits)} {'is' if len(culprits) == 1 else 'are'} in no collective while the "
                f"others wait: {_groups_text(elsewhere)}; {_groups_text(waiting)}",
                role="primary",
                category="hang",
                evidence=[e for g in elsewhere for e in _evidence(g.position)][:_MAX_EVIDENCE]
                + _group_evidence(waiting)[:2],
                blames=True,
            )
        )
        if len(waiting) > 1:
            findings.append(_disagreement(waiting, decided=False))
    elif len(waiting) > 1 and not elsewhere and _in_p2p(waiting):
        findings.append(_p2p_wait(waiting, found))
    elif len(waiting) > 1 and not elsewhere and _across_groups(waiting):
        culprits, confidence, finding = _across_groups_verdict(waiting)
        findings.append(finding)
    elif len(waiting) > 1 and not elsewhere:
        largest, runner_up = len(waiting[0].ranks), len(waiting[1].ranks)
        if largest > runner_up and largest >= 2:
            culprits = sorted(r for g in waiting[1:] for r in g.ranks)
            confidence = "high" if largest > len(found) / 2 else "medium"
            if len({g.position.op for g in waiting}) == 1:
                # One collective from two lines is often two process groups: the majority may be the ranks
                # that wait in the world group for the minority, which waits in its subgroup for a rank
                # that never came. Without the groups, the stacks can only guess.
                confidence = "low"
            findings.append(_disagreement(waiting, decided=True, culprits=culprits))
        else:
            findings.append(_disagreement(waiting, decided=False))
    findings.append(_stack_groups(groups, found, waiting_ranks, elsewhere_ranks))
    return StackAnalysis(found, groups, findings, culprits, confidence)


# A wait on a Work whose op the stack does not show (an async collective's, a batch_isend_irecv's): like a
# send or recv, it may wait for one peer, and numbers decide nothing.
_UNSEEN_OP = "Work.wait"


def _waits_for_one_peer(position: RankPosition) -> bool:
    return position.op in P2P_OPS or position.op == _UNSEEN_OP


def _in_p2p(waiting: list[StackGroup]) -> bool:
    return any(_waits_for_one_peer(g.position) for g in waiting)


def _p2p_wait(waiting: list[StackGroup], found: Mapping[int, RankPosition]) -> Finding:
    """A send or recv waits for one peer, not for a majority: no rank is blamed by number. The ranks in p2p
    ops and the peers they name (py-spy's locals) are the candidates."""
    in_p2p = sorted(r for g in waiting if _waits_for_one_peer(g.position) for r in g.ranks)
    peers = sorted({p.peer for r in in_p2p if (p := found[r]).peer is not None} - set(in_p2p))
    candidates = sorted(set(in_p2p) | set(peers))
    named = f"; they wait for {format_ranks(peers)}" if peers else " (py-spy's --locals would name the peers)"
    return Finding(
        "stacks.different_collective",
        candidates,
        f"{format_ranks(in_p2p)} {'waits' if len(in_p2p) == 1 else 'wait'} in a send, a recv or a Work's wait{named}: "
        f"{_groups_text(waiting)}. A p2p op waits for one peer, so numbers decide nothing here: the candidates "
        "are the ranks in p2p ops and their peers (the flight recorder's op counts can decide)",
        role="symptom",
        category="hang",
        evidence=_group_evidence(waiting),
        facts={"undecided": True, "candidates": candidates},
    )


def _across_groups(waiting: list[StackGroup]) -> bool:
    """Some ranks wait in a collective on a group their caller passed, others on the default group (py-spy's
    locals say which): the wait crosses groups."""
    given = {g.position.group_given for g in waiting}
    return given == {True, False}


def _across_groups_verdict(waiting: list[StackGroup]) -> tuple[list[int], str, Finding]:
    """The ranks on a passed group (a subgroup) wait there for a member that is not in it: blocked, never the
    culprit by number. Among the ranks on the default group, one place apart from a clear majority is the
    rank the subgroup waits for; with none, the stacks cannot tell which rank it is."""
    on_default = [g for g in waiting if g.position.group_given is False]  # largest first, as `waiting`
    on_given = [g for g in waiting if g.position.group_given]
    blocked = sorted(r for g in on_given for r in g.ranks)
    where = (
        f"{_groups_text(on_given)}: blocked in a group their caller passed, waiting for a member that is not "
        f"in it; {_groups_text(on_default)}"
    )
    if len(on_default) > 1 and len(on_default[0].ranks) > len(on_default[1].ranks):
        majority = on_default[0]
        culprits = sorted(r for g in on_default if g is not majority for r in g.ranks)
        finding = Finding(
            "stacks.different_collective",
            culprits,
            f"{format_ranks(culprits)} {'waits' if len(culprits) == 1 else 'wait'} on the default group from "
            f"another place than the others there: the member the blocked ranks wait for. {where}",
            role="primary",
            category="hang",
            evidence=[e for g in on_default if g is not majority for e in _evidence(g.position)][:_MAX_EVIDENCE]
            + _group_evidence(on_given)[:2],
            blames=True,
        )
        return culprits, "medium", finding
    # Without a place apart, the rank the subgroup waits for may wait on the default group like the rest, or
    # be the one on a passed group (a barrier on its subgroup where its peers went on): every rank is a candidate.
    candidates = sorted(r for g in waiting for r in g.ranks)
    finding = Finding(
        "stacks.different_collective",
        candidates,
        f"The wait crosses process groups: {where}. The stacks cannot tell which rank departed (the flight "
        "recorder's order can): candidates, not culprits",
        role="symptom",
        category="hang",
        evidence=_group_evidence(waiting),
        facts={"undecided": True, "candidates": candidates, "blocked": blocked},
    )
    return [], "low", finding


def _disagreement(waiting: list[StackGroup], decided: bool, culprits: list[int] | None = None) -> Finding:
    ops = {g.position.op for g in waiting}
    how = "different collectives" if len(ops) > 1 else f"{next(iter(ops))} called from different lines"
    if not decided:
        why = "the stacks alone cannot say which side departed; the flight recorder's sequence numbers or the logs can"
        ranks = sorted(r for g in waiting for r in g.ranks)
        return Finding(
            "stacks.different_collective",
            ranks,
            f"The ranks wait in {how}: {_groups_text(waiting)}; {why}",
            role="symptom",
            category="hang",
            evidence=_group_evidence(waiting),
            facts={"undecided": True},
        )
    majority, minority = waiting[0], waiting[1:]
    if len(ops) == 1:
        how = "the same collective called from another line (often another process group)"
    else:
        how = "a different collective, or one called from another line,"
    return Finding(
        "stacks.different_collective",
        culprits or [],
        f"{_groups_text(minority)}: {how} than the others; {majority.describe()}",
        role="primary",
        category="hang",
        evidence=[e for g in minority for e in _evidence(g.position)][:_MAX_EVIDENCE] + _evidence(majority.position),
        blames=True,
    )


def _stack_groups(
    groups: list[StackGroup], found: Mapping[int, RankPosition], waiting: list[int], elsewhere: list[int]
) -> Finding:
    facts: dict = {}
    if not found:
        message = "No rank's stack was read"
    elif not waiting:
        message = f"No rank waits in a collective: {_groups_text(groups)}; this does not look like a collective hang"
    elif waiting and elsewhere and len(elsewhere) > len(waiting):
        message = (
            f"Most ranks are not in a collective ({_groups_text(groups)}): the job may still be running; "
            "dump again in a few seconds to see who stays put"
        )
        facts["moving"] = True
    elif len(groups) == 1:
        message = (
            f"All ranks are at the same place: {_groups_text(groups)}; the stacks cannot tell which rank is "
            "behind (the flight recorder's sequence numbers can)"
        )
    else:
        message = f"{len(groups)} stack groups: {_groups_text(groups)}"
    return Finding("stacks.stack_groups", sorted(found), message, "symptom", "hang", _group_evidence(groups), facts)


def stacks_verdict(analysis: StackAnalysis) -> Verdict:
    """The verdict of the stacks alone."""
    return verdict_of(assess_stacks(analysis))


def assess_stacks(analysis: StackAnalysis, files: list[str] | None = None) -> Assessment:
    """What the stacks say: a `hang` assessment, for `diagnose` to fuse with logs and the flight recorder."""
    primary = [f for f in analysis.findings if f.role == "primary"]
    summary = primary[0].message if primary else analysis.findings[0].message if analysis.findings else ""
    facts: dict = {
        "state_by_rank": {str(r): p.state for r, p in analysis.positions.items()},
        "collective_by_rank": {str(r): p.op for r, p in analysis.positions.items() if p.state == COLLECTIVE},
        "stack_groups": [
            {
                "ranks": list(g.ranks),
                "state": g.position.state,
                "op": g.position.op,
                "frame": g.position.user_frame.text if g.position.user_frame else None,
            }
            for g in analysis.groups
        ],
    }
    blaming = next((f for f in analysis.findings if f.blames), None)
    undecided = next((f for f in analysis.findings if f.facts.get("undecided")), None)
    if not analysis.culprit_ranks and undecided is not None:
        facts["candidates"] = undecided.ranks
    culprit = next((analysis.positions[r] for r in analysis.culprit_ranks if analysis.positions[r].user_frame), None)
    if culprit:
        frame = culprit.user_frame
        facts["user_frame"] = frame.to_fact(culprit.rank)
        if blaming is not None:
            blaming.facts |= {
                "culprit_rank": culprit.rank,
                "function": frame.function,
                "site": frame.site,
                "position": describe(culprit),
            }
    return Assessment(
        source="stacks",
        findings=list(analysis.findings),
        summary=summary,
        category="hang",
        culprits=list(analysis.culprit_ranks),
        confidence=analysis.confidence,
        facts=facts,
        files=files or sorted({p.file for p in analysis.positions.values()}),
        lead=primary[0] if primary else (analysis.findings[0] if analysis.findings else None),
        blaming=blaming,
        user_frames={r: p.user_frame for r, p in analysis.positions.items() if p.user_frame is not None},
    )
