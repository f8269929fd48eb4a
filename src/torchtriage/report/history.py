"""`torchtriage history`, rendered: each attempt's verdict and culprit's machine, then what they say together.

The JSON form (`torchtriage.history/1`) is public, like the verdict's: keys may be added, never renamed or removed
without a new version.
"""

from __future__ import annotations

from torchtriage.analysis.history import AttemptResult, Judgement
from torchtriage.model import Action

SCHEMA = "torchtriage.history/1"
_SUMMARY_CHARS = 160


def _culprits(attempt: AttemptResult) -> str:
    if attempt.verdict is None:
        return attempt.note or "no verdict"
    if not attempt.failed:
        return f"{attempt.verdict.category}: nothing wrong found"
    if not attempt.verdict.culprit_ranks:
        return f"{attempt.verdict.category}, culprit not identified"
    where = "; ".join(f"rank {m.rank} on {m.text if m.known else 'a machine not recorded'}" for m in attempt.blamed)
    return f"{attempt.verdict.category}, {where}"


def _action_lines(actions: list[Action]) -> list[str]:
    lines = []
    for index, action in enumerate(actions, 1):
        lines.append(f"  {index}. {action.title}  [{action.rule}]")
        if action.detail:
            lines.append(f"     {action.detail}")
        if action.command:
            lines.append(f"     $ {action.command}")
    return lines


def render_history_text(judgement: Judgement) -> str:
    lines = ["attempts"]
    for attempt in judgement.attempts:
        lines.append(f"  {attempt.name}: {_culprits(attempt)}")
        if attempt.site:
            lines.append(f"      at {attempt.site}")
        if attempt.verdict is not None and attempt.failed:
            lines.append(f"      {' '.join(attempt.verdict.summary.split())[:_SUMMARY_CHARS]}")
        lines.append(f"      {attempt.folder}")
    lines += ["", f"pattern   {judgement.pattern}", f"summary   {judgement.summary}"]
    if len(judgement.findings) > 1:
        lines += ["", "evidence"] + [f"  {finding.message}" for finding in judgement.findings]
    if judgement.actions:
        lines += ["", "what to do", *_action_lines(judgement.actions)]
    return "\n".join(lines)


def history_json(judgement: Judgement) -> dict:
    return {
        "schema": SCHEMA,
        "pattern": judgement.pattern,
        "summary": judgement.summary,
        "attempts": [_attempt_json(a) for a in judgement.attempts],
        "findings": [
            {"kind": f.kind, "ranks": f.ranks, "message": f.message, "role": str(f.role), "category": str(f.category)}
            for f in judgement.findings
        ],
        "actions": [
            {"rule": a.rule, "title": a.title, "detail": a.detail, "command": a.command, "env": a.env}
            for a in judgement.actions
        ],
    }


def _attempt_json(attempt: AttemptResult) -> dict:
    verdict = attempt.verdict
    return {
        "attempt": attempt.number,
        "name": attempt.name,
        "folder": attempt.folder,
        "category": str(verdict.category) if verdict is not None else None,
        "culprit_ranks": list(verdict.culprit_ranks) if verdict is not None else [],
        "culprit_machines": [{**m.__dict__, "sources": list(m.sources)} for m in attempt.blamed],
        "site": attempt.site,
        "summary": verdict.summary if verdict is not None else None,
        "confidence": str(verdict.confidence) if verdict is not None else None,
        "note": attempt.note or None,
    }
