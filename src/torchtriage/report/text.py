"""The verdict for a person at a terminal: what happened, who started it, where, and what to do."""

from __future__ import annotations

import os
import sys

from torchtriage.model import Verdict
from torchtriage.ranks import format_ranks
from torchtriage.report.safe_text import visible_copy

_ROLE_LABEL = {"primary": "cause", "symptom": "symptom", "collateral": "collateral"}
_MAX_FINDINGS = 12
_MAX_ACTIONS = 6


def _use_colour(stream) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ


def _style(text: str, code: str, colour: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if colour else text


def _culprit_line(verdict: Verdict) -> str:
    candidates = verdict.facts.get("candidates")
    if verdict.culprit_ranks:
        named = ", ".join(str(r) for r in verdict.culprit_ranks)
        return f"{named} (the evidence cannot rule out {format_ranks(candidates)})" if candidates else named
    if candidates and len(candidates) == 1:
        return f"not identified; the one candidate is {format_ranks(candidates)}, and the evidence is weak"
    if candidates:
        return f"undecided between {format_ranks(candidates)}: the evidence cannot tell them apart"
    if local := verdict.facts.get("local_ranks"):
        return f"{format_ranks(local, noun='local rank')} of a node the log does not name"
    return "not identified"


_SHOWN_MACHINES = 8
# What puts a rank's host, pid and GPU within a verdict's reach, for when no source read did.
MACHINE_HINT = (
    "a job run under `torchtriage run` records each rank's host, pid and GPU; a live `diagnose` reads host and pid"
)


def machine_lines(verdict: Verdict) -> list[str]:
    """Where each culprit ran (host, pid, GPU), or that nothing read says; without a culprit, the host that printed
    the failure's line where a launcher's prefix names it, else nothing."""
    machines = [verdict.machine_of(rank) for rank in verdict.culprit_ranks]
    failing = verdict.facts.get("failing_host")
    if not machines and isinstance(failing, dict) and failing.get("host"):
        where = f"{failing.get('file')}:{failing.get('line')}"
        return [f"host {failing['host']} printed the failure's line ({where}, its launcher's prefix); no rank is named"]
    if not machines:
        return []
    if not any(m.known for m in machines):
        who = format_ranks(verdict.culprit_ranks)
        return [f"not recorded: nothing read says where {who} ran ({MACHINE_HINT})"]
    lines = [f"rank {m.rank}: {m.text if m.known else 'not recorded'}" for m in machines[:_SHOWN_MACHINES]]
    if len(machines) > _SHOWN_MACHINES:
        lines.append(f"… {len(machines) - _SHOWN_MACHINES} more in --json")
    return lines


def render_text(verdict: Verdict, stream=None) -> str:
    """The verdict for a terminal; every string from the inputs is shown with its control characters escaped."""
    verdict = visible_copy(verdict)
    colour = _use_colour(stream or sys.stdout)
    bold = lambda s: _style(s, "1", colour)  # noqa: E731
    dim = lambda s: _style(s, "2", colour)  # noqa: E731
    lines = [
        f"{bold('verdict')}   {_style(verdict.category, '1;31' if verdict.findings else '1;32', colour)}"
        f"  (confidence: {verdict.confidence})",
        f"{bold('culprit')}   {_culprit_line(verdict)}",
    ]
    for index, line in enumerate(machine_lines(verdict)):
        lines.append(f"{bold('machine') if index == 0 else '       '}   {line}")
    lines.append(f"{bold('summary')}   {verdict.summary}")
    frame = verdict.facts.get("user_frame")
    if frame:
        lines.append(f"{bold('where')}     {frame['file']}:{frame['line']} in {frame['function']}")
    waiting = verdict.facts.get("reporting_rank_frame")
    if waiting:
        # Only a rank outside the named culprits is known not to be one.
        role = "not the culprit" if verdict.culprit_ranks else "which rank started it is not decided"
        rank = f"{'local rank' if waiting.get('rank_is_local') else 'rank'} {waiting['rank']}"
        lines.append(
            f"{bold('waiting')}   {rank} was at {waiting['file']}:{waiting['line']} "
            f"in {waiting['function']} (a rank that reported the failure; {role})"
        )
    if verdict.findings:
        lines += ["", bold("evidence")]
        for finding in verdict.findings[:_MAX_FINDINGS]:
            lines.append(f"  [{_ROLE_LABEL.get(finding.role, finding.role)}] {finding.message}")
            for ev in finding.evidence[:2]:
                where = (f"{ev.file}:{ev.line}" if ev.line is not None else ev.file) if ev.file else ev.source
                lines.append(dim(f"      {where}: {ev.text[:160]}"))
        if len(verdict.findings) > _MAX_FINDINGS:
            lines.append(dim(f"  … {len(verdict.findings) - _MAX_FINDINGS} more in --json"))
    if verdict.actions:
        lines += ["", bold("what to do")]
        for index, action in enumerate(verdict.actions[:_MAX_ACTIONS], 1):
            lines.append(f"  {index}. {action.title}  {dim('[' + action.rule + ']')}")
            if action.detail:
                lines.append(f"     {action.detail}")
            for name, value in action.env.items():
                lines.append(f"     export {name}={value}")
            if action.command:
                lines.append(f"     $ {action.command}")
        if len(verdict.actions) > _MAX_ACTIONS:
            lines.append(dim(f"  … {len(verdict.actions) - _MAX_ACTIONS} more in --json"))
    if verdict.problems:
        lines += ["", bold("could not read everything")]
        lines += [f"  - {problem}" for problem in verdict.problems]
    return "\n".join(lines)
