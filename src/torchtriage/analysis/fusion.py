"""One verdict from every source: the one step that turns assessments into a Verdict.

Each analyzer assesses one kind of source (`Assessment`: findings, most explanatory first, and the
culprits it singles out); fusion then
- takes as the headline the most explanatory failure across all sources: a failure that is a cause in
  itself (an OOM, a GPU fault, a killed rank, bad NVLink) outranks the hang it caused, and a hang
  outranks a straggler's skew;
- names the culprit of a hang from the most telling source that names one: the flight recorder (which
  collective each rank reached), then the stacks (where each rank is), then the logs' timeout readings;
- says whether the sources agree, lists both sides when they do not, and names the sources it used and
  those it lacked; a line restating a verdict of torchtriage's own (the hang watchdog's, on `run`'s console)
  agrees with the very stacks and dumps that verdict was made of, so it is shown but never counted as agreeing;
- routes the findings to their actions through the knowledge base: the finding that blames the culprits
  first, then the headline, then the rest.
"""

from __future__ import annotations

from collections.abc import Mapping

from torchtriage.analysis.confidence import PREMISE, RESTATED_VERDICT
from torchtriage.knowledge.actions import route
from torchtriage.knowledge.rules import rule_by_id
from torchtriage.model import Assessment, Category, Confidence, Finding, RankState, Role, Verdict
from torchtriage.ranks import format_ranks

# Every source, in the order their findings are listed.
SOURCES = ("logs", "flight_recorder", "stacks", "memory_snapshot", "profiler_trace", "nvlink", "debug_server")
# The sources a hang verdict is made of (diagnose's three), and the order they are trusted to name its culprit.
HANG_SOURCES = ("logs", "flight_recorder", "stacks")
# The debug server names only the ranks that did not answer: trusted when nothing else names a culprit.
_CULPRIT_TRUST = ("flight_recorder", "stacks", "logs", "debug_server")
# Which source is preferred when several name a failure that is a cause in itself.
_CAUSE_ORDER = ("logs", "memory_snapshot", "nvlink", "flight_recorder", "stacks", "profiler_trace")
_HANG_FAMILY = (Category.HANG, Category.NCCL_TIMEOUT, Category.UNKNOWN)
# The verb that reads each source alone: once a source was read, telling the user to run it adds nothing.
_VERB_OF = {"logs": "triage", "flight_recorder": "fr", "profiler_trace": "trace", "memory_snapshot": "memory"}
_LABEL = {
    "logs": "the logs",
    "flight_recorder": "the flight recorder",
    "stacks": "the stacks",
    "memory_snapshot": "the memory snapshots",
    "profiler_trace": "the profiler traces",
    "nvlink": "the NVLink check",
    "debug_server": "the debug servers",
}


def _is_cause_in_itself(a: Assessment) -> bool:
    """A failure that explains a hang by itself (an OOM, a fault, a killed rank), not a hang or a skew."""
    return a.category not in (*_HANG_FAMILY, Category.STRAGGLER, Category.OK) and any(
        f.role == Role.PRIMARY for f in a.findings
    )


def _headline(present: dict[str, Assessment]) -> Assessment:
    causes = [present[name] for name in _CAUSE_ORDER if name in present and _is_cause_in_itself(present[name])]
    if causes:
        return causes[0]
    trusted = {name: a for name, a in present.items() if not _waits_for_another(a, present)}
    naming = [trusted[name] for name in _CULPRIT_TRUST if name in trusted and trusted[name].culprits]
    if naming:
        return naming[0]
    # No source names a culprit: the one that narrows it to candidates says the most.
    narrowing = [trusted[name] for name in _CULPRIT_TRUST if name in trusted and trusted[name].facts.get("candidates")]
    if narrowing:
        return narrowing[0]
    found = [a for a in trusted.values() if a.findings]
    hangs = [a for a in found if a.category in _HANG_FAMILY]
    return (hangs or found or list(trusted.values()))[0]  # the stacks are trusted whenever they refute


# States in which the stacks show a rank waiting for another rank: in the job's store, or in a collective or
# send/recv the flight recorder did not record (gloo records no p2p; NCCL records an op only once its
# communicator exists). The recorder sees such a rank "in no op" and would blame it.
_WAITING_FOR_A_PEER = (RankState.STORE, RankState.COLLECTIVE)
# A rank that left no dump is blamed as one that died or hangs where its recorder could not dump. A stack that
# shows it waiting as the others do (for the GPU to finish a collective, too) says it is alive and waits: its
# dump was lost on the way, not the rank.
_ALIVE_AND_WAITING = (*_WAITING_FOR_A_PEER, RankState.GPU_WAIT)


def _waits_for_another(assessment: Assessment, present: dict[str, Assessment]) -> bool:
    """The flight recorder blames ranks (or names them among candidates) for waiting in no op while their
    stacks show them waiting for another rank (in a recv, a collective it did not record, the job's store):
    they never issued the collective the others wait in because they wait themselves. The recorder's blame is
    then the waits' aftermath, not a departure; the stacks say whom they wait for. So too for the ranks it
    blames for leaving no dump, where their stacks show them alive and waiting."""
    stacks = present.get("stacks")
    idle = assessment.facts.get("in_no_op", ())
    undumped = assessment.facts.get("no_dump_blamed", ())
    if assessment.source != "flight_recorder" or stacks is None or not (idle or undumped):
        return False
    if not set(assessment.culprits) <= {*idle, *undumped}:
        return False  # it blames others too, on evidence of its own
    states = stacks.facts.get("state_by_rank", {})
    return all(states.get(str(r)) in _WAITING_FOR_A_PEER for r in idle) and all(
        states.get(str(r)) in _ALIVE_AND_WAITING for r in undumped
    )


def restates_a_verdict(assessment: Assessment) -> bool:
    """Whether the culprits a source names come from a line restating a verdict of torchtriage's own: the hang
    watchdog's, made of the stacks and flight-recorder buffers of the same stall, which `diagnose` reads beside
    the console that restates it. Agreeing with them, it says nothing they do not; so it never raises the
    confidence. Where it differs, the evidence or its reading changed since: that is said, and lowers it."""
    blaming = assessment.blaming
    return blaming is not None and RESTATED_VERDICT in blaming.facts


def _category(lead: Assessment, present: dict[str, Assessment], diagnosing_a_hang: bool) -> str:
    hang_sources = [a for name, a in present.items() if name in HANG_SOURCES]
    if lead.category in _HANG_FAMILY:
        if any(a.category == Category.NCCL_TIMEOUT for a in hang_sources):
            return Category.NCCL_TIMEOUT  # a watchdog fired: the hang has become a timeout
        if diagnosing_a_hang and lead.category == Category.UNKNOWN and any(a.findings for a in hang_sources):
            return Category.HANG  # the job is stuck, and what the sources found is where
    return lead.category


def _agreement(lead: Assessment, lead_name: str, present: dict[str, Assessment]) -> tuple[list[Finding], bool, bool]:
    """The sources_agree / sources_disagree findings; whether any two agree, whether any disagrees.

    Only sources that name the culprit of the same failure are compared: the lead, and the hang's sources
    (the ranks an OOM started on and the rank a hang waits for are one question; a straggler is another).
    """
    culprits = list(lead.culprits)
    if not culprits:
        return [], False, False
    comparable = {name: a for name, a in present.items() if a is lead or name in HANG_SOURCES}
    named = {name: a.culprits for name, a in comparable.items() if a.culprits}
    # A source that restates a verdict of ours agrees with the evidence that verdict was made of: it is shown,
    # never counted as a witness of its own.
    agree = [name for name, ranks in named.items() if ranks == culprits and not restates_a_verdict(comparable[name])]
    # Sources that decided by one premise (a call every rank must make, read in the recorder's frames and in the
    # stacks alike) are one witness: were the premise wrong, both would be.
    # A guess (low confidence) that agrees is said, but is no witness: two guesses alike are not evidence.
    witnesses = {_premise(comparable[name]) or name for name in agree if comparable[name].confidence != Confidence.LOW}
    # A source that names more ranks, the lead's among them, only says less: the stacks of two ranks in two
    # groups' collectives cannot tell which departed, the flight recorder's order can.
    # A source that only guesses (low confidence) is said to differ, and lowers nothing.
    disagree = {name: ranks for name, ranks in named.items() if not set(culprits) <= set(ranks)}
    guessing = {name for name in disagree if comparable[name].confidence == Confidence.LOW and name != lead_name}
    # A recorder whose culprits the stacks show waiting for another rank differs, explained: it lowers nothing.
    guessing |= {name for name in disagree if _waits_for_another(comparable[name], present)}
    category = lead.category if lead.category not in (Category.UNKNOWN, Category.OK) else Category.HANG
    findings = []
    if culprits and len(witnesses) > 1:
        findings.append(
            Finding(
                "fusion.sources_agree",
                culprits,
                f"{' and '.join(_LABEL[n] for n in agree)} agree: the culprit is {format_ranks(culprits)}",
                Role.PRIMARY,
                category,
                blames=True,
            )
        )
    for name, ranks in disagree.items():
        findings.append(
            Finding(
                "fusion.sources_disagree",
                sorted(set(ranks) | set(culprits)),
                f"{_LABEL[name]} {'point' if _LABEL[name].endswith('s') else 'points'} at {format_ranks(ranks)}, "
                f"{_LABEL[lead_name]} at {format_ranks(culprits)}; "
                f"the verdict follows {_LABEL[lead_name]}",
                Role.SYMPTOM,
                category,
            )
        )
    return findings, bool(culprits) and len(witnesses) > 1, bool(set(disagree) - guessing)


def _premise(assessment: Assessment) -> str | None:
    """The premise the source's culprits rest on, where it is knowledge another source may share."""
    blaming = assessment.blaming
    return blaming.facts.get(PREMISE) if blaming is not None else None


def _action_order(lead: Assessment, others: list[Assessment]) -> list[Finding]:
    """The findings whose actions a verdict gives, the most telling first; collateral adds none."""
    trust = {name: index for index, name in enumerate(_CULPRIT_TRUST)}
    others = sorted(others, key=lambda a: trust.get(a.source, len(trust)))
    ordered = [a.blaming for a in [lead, *others] if a.blaming is not None]
    ordered += [lead.lead] if lead.lead is not None else []
    ordered += [f for a in [lead, *others] for f in a.findings if f.role != Role.COLLATERAL]
    return ordered


class _Rules(Mapping):
    """Finding kind -> rule: the built-in knowledge base, plus the rules a run added (--rules-dir)."""

    def __init__(self, extra: Mapping | None) -> None:
        self.extra = extra or {}

    def __getitem__(self, kind):
        rule = self.extra.get(kind) or rule_by_id(kind)
        if rule is None:
            raise KeyError(kind)
        return rule

    def __iter__(self):
        return iter(self.extra)

    def __len__(self) -> int:
        return len(self.extra)


def fuse(
    assessments: list[Assessment],
    missing_reasons: Mapping[str, str] | None = None,
    *,
    rules: Mapping | None = None,
    expected: tuple[str, ...] = HANG_SOURCES,
) -> Verdict:
    """The verdict of `assessments` (one per source read). `expected` names sources whose absence is
    worth saying (with `missing_reasons`); `rules` adds rules by id to the built-in knowledge base."""
    present = {a.source: a for a in sorted(assessments, key=lambda a: SOURCES.index(a.source))}
    missing = {name: (missing_reasons or {}).get(name, "not given") for name in expected if name not in present}
    if not present:
        return Verdict(
            Category.UNKNOWN,
            [],
            "No source could be read",
            Confidence.LOW,
            facts={"sources_used": [], "sources_missing": missing},
        )
    lead = _headline(present)
    lead_name = lead.source
    others = [a for a in present.values() if a is not lead]
    culprits = list(lead.culprits)
    agreement, agreed, disputed = _agreement(lead, lead_name, present) if len(present) > 1 else ([], False, False)

    confidence = Confidence(lead.confidence)
    if agreed and not disputed:
        confidence = Confidence.HIGH
    elif disputed:
        confidence = confidence.lowered()

    facts: dict = dict(lead.facts) if len(present) == 1 else {}
    if len(present) > 1 or expected:
        facts |= {"sources_used": list(present), "sources_missing": missing}
        for name, assessment in present.items():
            facts[name] = assessment.facts
        frame = next((a.facts["user_frame"] for a in [lead, *others] if "user_frame" in a.facts), None)
        if frame is not None and culprits and frame.get("rank") in culprits:
            facts["user_frame"] = frame
        elif len(culprits) == 1:  # the culprit's own line, from a source that saw it
            own = next((a.user_frames[culprits[0]] for a in [lead, *others] if culprits[0] in a.user_frames), None)
            if own is not None:
                facts["user_frame"] = own.to_fact(culprits[0])
        candidates = lead.facts.get("candidates")
        if candidates and (not culprits or set(culprits) < set(candidates)):
            # No culprit, or one the evidence cannot tell from the other candidates (it leads at low confidence).
            facts["candidates"] = candidates
        if not culprits and lead.facts.get("candidates_above") is not None:
            facts["candidates_above"] = lead.facts["candidates_above"]  # a rank above this one, unnamed

    summary = lead.summary
    stacks = present.get("stacks")
    if stacks is not None and lead is not stacks and stacks.culprits == culprits and culprits and stacks.summary:
        summary = f"{summary}; stacks: {stacks.summary}"
    read = [verb for name, verb in _VERB_OF.items() if name in present]
    return Verdict(
        category=_category(lead, present, diagnosing_a_hang=bool(expected)),
        culprit_ranks=culprits,
        summary=summary,
        confidence=confidence,
        findings=agreement + [f for a in present.values() for f in a.findings],
        actions=route(
            _action_order(lead, others),
            _Rules(rules),
            skip_commands=tuple(f"torchtriage {v} " for v in read),
            env_in_effect={k: v for a in present.values() for k, v in a.facts.get("env_in_effect", {}).items()},
        ),
        facts=facts,
        sources=[s for a in present.values() for s in a.files],
        problems=[p for a in present.values() for p in a.problems],
    )


def verdict_of(assessment: Assessment, rules: Mapping | None = None) -> Verdict:
    """The verdict of a single source (what `triage`, `fr`, `trace`, `memory` and `nvlink` print)."""
    return fuse([assessment], rules=rules, expected=())
