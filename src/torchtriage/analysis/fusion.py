"""One verdict from several sources: logs say what failed first, the flight recorder which collective
each rank reached, the stacks where each rank is.

Each source is analysed on its own into a Verdict (`triage`, `fr`, the stack analysis); fusion then:
- keeps a failure the logs name as a cause in itself (an OOM, a GPU fault, a killed rank): a hang that
  follows it is its aftermath, so the category and culprit are the logs';
- otherwise takes the culprit from the most telling source that names one: the flight recorder
  (which collective), then the stacks (where), then the logs' timeout readings;
- says whether the sources agree, lists both sides when they do not, and names the sources it used
  and those it lacked.
"""

from __future__ import annotations

from torchtriage.model import Action, Finding, Verdict
from torchtriage.ranks import format_ranks

# The order in which sources are trusted to name the culprit of a hang.
SOURCES = ("logs", "flight_recorder", "stacks")
_HANG_CATEGORIES = ("hang", "nccl_timeout", "unknown")
_CONFIDENCE = ("low", "medium", "high")


def _logs_name_a_cause(verdict: Verdict | None) -> bool:
    """The logs show a failure that explains a hang by itself (an OOM, a fault, a killed rank)."""
    return (
        verdict is not None
        and verdict.category not in _HANG_CATEGORIES
        and any(f.role == "primary" for f in verdict.findings)
    )


def _merge_actions(verdicts: list[Verdict]) -> list[Action]:
    culprit_first = [a for v in verdicts for a in v.actions if a.rule in ("culprit", "stacks", "flight_recorder")]
    seen, actions = set(), []
    for action in culprit_first + [a for v in verdicts for a in v.actions]:
        key = (action.title, action.command, tuple(sorted(action.env.items())))
        if key not in seen:
            seen.add(key)
            actions.append(action)
    return actions


def fuse(by_source: dict[str, Verdict | None], missing_reasons: dict[str, str] | None = None) -> Verdict:
    """The fused verdict of `by_source` (keys from SOURCES; a None or absent value means not available)."""
    present = {name: v for name, v in by_source.items() if v is not None}
    missing = {name: (missing_reasons or {}).get(name, "not given") for name in SOURCES if name not in present}
    logs, fr, stacks = (present.get(name) for name in SOURCES)

    if _logs_name_a_cause(logs):
        lead_name, lead = "logs", logs
    else:
        naming = [
            (name, present[name])
            for name in ("flight_recorder", "stacks", "logs")
            if name in present and present[name].culprit_ranks
        ]
        lead_name, lead = naming[0] if naming else (next(iter(present.items())) if present else ("", None))
    if lead is None:
        return Verdict(
            "unknown", [], "No source could be read", "low", facts={"sources_used": [], "sources_missing": missing}
        )

    category = lead.category
    if category in _HANG_CATEGORIES and any(v.category == "nccl_timeout" for v in present.values()):
        category = "nccl_timeout"  # a watchdog fired: the hang has become a timeout
    elif category == "unknown" and any(v.findings for v in present.values()):
        category = "hang"

    culprits = list(lead.culprit_ranks)
    named = {name: v.culprit_ranks for name, v in present.items() if v.culprit_ranks}
    agree = [name for name, ranks in named.items() if ranks == culprits]
    disagree = {name: ranks for name, ranks in named.items() if ranks != culprits}

    findings: list[Finding] = []
    if culprits and len(agree) > 1:
        findings.append(
            Finding(
                "sources_agree",
                culprits,
                f"{' and '.join(_label(n) for n in agree)} agree: the culprit is {format_ranks(culprits)}",
                "primary",
                category,
            )
        )
    for name, ranks in disagree.items():
        findings.append(
            Finding(
                "sources_disagree",
                sorted(set(ranks) | set(culprits)),
                f"{_label(name)} point at {format_ranks(ranks)}, {_label(lead_name)} at {format_ranks(culprits)}; "
                f"the verdict follows {_label(lead_name)}",
                "symptom",
                category,
            )
        )
    for name in SOURCES:
        if name in present:
            findings.extend(present[name].findings)

    confidence = lead.confidence
    if culprits and len(agree) > 1 and not disagree:
        confidence = "high"
    elif disagree:
        confidence = _CONFIDENCE[max(0, _CONFIDENCE.index(confidence) - 1)]

    facts: dict = {"sources_used": [n for n in SOURCES if n in present], "sources_missing": missing}
    for name, verdict in present.items():
        facts[name] = verdict.facts
    frame = next((v.facts["user_frame"] for v in (lead, stacks, fr, logs) if v and "user_frame" in v.facts), None)
    if frame is not None and culprits and frame.get("rank") in culprits:
        facts["user_frame"] = frame

    summary = lead.summary
    if stacks is not None and lead is not stacks and stacks.culprit_ranks == culprits and stacks.summary:
        summary = f"{summary}; stacks: {stacks.summary}"
    return Verdict(
        category=category,
        culprit_ranks=culprits,
        summary=summary,
        confidence=confidence,
        findings=findings,
        actions=_merge_actions([lead] + [v for v in present.values() if v is not lead]),
        facts=facts,
        sources=[s for v in present.values() for s in v.sources],
        problems=[p for v in present.values() for p in v.problems],
    )


def _label(source: str) -> str:
    return {"logs": "the logs", "flight_recorder": "the flight recorder", "stacks": "the stacks"}[source]
