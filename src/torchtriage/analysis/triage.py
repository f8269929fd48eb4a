"""From log records to one verdict: the first failure, its rank and line, the rest as collateral.

Pure: takes `LogRecords`, returns a `Verdict`. The order of reasoning:
1. demote lines that a known causal chain explains (a rule's `collateral_of`);
2. pick the primary failure: the most explanatory role, then the earliest time where times are
   comparable, else the more specific rule, else the log order;
3. name the culprit ranks: the ranks showing the primary failure, or, for collective timeouts, the
   ranks that fell behind (their last enqueued collective is older than their peers');
4. locate the culprit's innermost frame in user code from its Python traceback;
5. collect the actions of the rules involved, primary first.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from torchtriage.analysis.collective_timeouts import TIMEOUT_KINDS, collective_culprits
from torchtriage.analysis.log_records import ChildFailure, LogEvent, LogRecords, PyTraceback
from torchtriage.analysis.memory_facts import memory_findings
from torchtriage.analysis.positions import innermost_user_frame
from torchtriage.knowledge.rules import rule_by_id
from torchtriage.model import ROLES, Action, Evidence, Finding, RankState, Verdict
from torchtriage.ranks import format_ranks

_MAX_EVIDENCE = 4
# Exceptions a launcher raises about its children: never the cause, always a report of it.
_LAUNCHER_EXCEPTIONS = ("ChildFailedError", "SignalException")
# Per-line facts that describe the line's rank rather than the failure; ranks are reported apart.
_RANK_FACTS = ("rank", "group_rank", "local_rank")


@dataclass
class _Candidate:
    """A failure the verdict may name: a rule event, or an exception no rule knows."""

    role: str
    priority: int
    category: str
    kind: str
    title: str
    rank: int | None
    time: float | None
    file: str
    line: int
    order: int
    text: str
    event: LogEvent | None = None


def _effective_roles(events: list[LogEvent]) -> list[str]:
    present = {e.rule.category for e in events if e.rule.role != "collateral"}
    roles = []
    for event in events:
        explained = any(cat in present and cat != event.rule.category for cat in event.rule.collateral_of)
        roles.append("collateral" if explained else event.rule.role)
    return roles


def _candidates(records: LogRecords) -> list[_Candidate]:
    candidates = [
        _Candidate(
            role,
            e.rule.priority,
            e.rule.category,
            e.rule.id,
            e.rule.title,
            e.rank,
            e.time,
            e.file,
            e.line,
            e.order,
            e.text,
            e,
        )
        for e, role in zip(records.events, _effective_roles(records.events), strict=True)
    ]
    matched_lines = {(e.file, e.line) for e in records.events}
    for tb in records.tracebacks:
        if tb.exception is None:
            blocked = _blocked_in_collective(tb, len(records.events))
            if blocked is not None:
                candidates.append(blocked)
            continue
        if (tb.file, tb.exception_line) in matched_lines:
            continue
        candidates.append(
            _Candidate(
                role=_exception_role(tb),
                priority=1,
                category="unknown",
                kind="exception",
                title=f"{tb.exception} raised",
                rank=tb.rank,
                time=tb.time,
                file=tb.file,
                line=tb.exception_line or tb.line,
                order=len(records.events) + tb.line,
                text=f"{tb.exception}: {tb.message}".rstrip(": "),
            )
        )
    return candidates


_BLOCKED_RULE = "hang.stack_in_collective"


def collective_of(tb: PyTraceback) -> str | None:
    """The collective a traceback's stack is inside, if any."""
    position = tb.position()
    return position.op if position is not None and position.state is RankState.COLLECTIVE else None


def _blocked_in_collective(tb: PyTraceback, order_base: int) -> _Candidate | None:
    """A stack that ends inside a collective with no exception after it: a capture of a blocked rank."""
    op = collective_of(tb)
    rule = rule_by_id(_BLOCKED_RULE)
    if op is None or rule is None or not tb.frames:
        return None
    last = tb.frames[-1]
    return _Candidate(
        role=rule.role,
        priority=rule.priority,
        category=rule.category,
        kind=rule.id,
        title=rule.title,
        rank=tb.rank,
        time=tb.time,
        file=tb.file,
        line=tb.line,
        order=order_base + tb.line,
        text=f'File "{last.file}", line {last.line}, in {last.function} (stack ends inside {op})',
    )


def _exception_role(tb: PyTraceback) -> str:
    """How much an exception that no rule knows explains.

    A launcher's report of its children explains nothing; an exception raised inside a collective is
    how a rank learns that a peer failed; any other uncaught exception killed its rank, and is a cause.
    """
    if tb.exception and tb.exception.rsplit(".", 1)[-1] in _LAUNCHER_EXCEPTIONS:
        return "collateral"
    if collective_of(tb) is not None:
        return "symptom"
    return "primary"


def _pick_primary(candidates: list[_Candidate]) -> tuple[_Candidate, str]:
    """The candidate that most likely started it, and how the order was established."""
    best_role = min(ROLES.index(c.role) for c in candidates)
    pool = [c for c in candidates if ROLES.index(c.role) == best_role]
    if len(pool) > 1 and all(c.time is not None for c in pool):
        first = min(c.time for c in pool)  # type: ignore[type-var]
        earliest = [c for c in pool if c.time is not None and c.time - first < 1.0]
        return max(earliest, key=lambda c: (c.priority, -c.order)), "timestamps"
    top = max(c.priority for c in pool)
    pool = [c for c in pool if c.priority == top]
    basis = "log order" if len({c.file for c in pool}) == 1 else "rule specificity"
    return min(pool, key=lambda c: c.order), basis


def _evidence(items: list[_Candidate]) -> list[Evidence]:
    return [Evidence("log", c.file, c.line, c.rank, c.text[:500]) for c in items[:_MAX_EVIDENCE]]


def _rank_list(ranks: set[int | None]) -> list[int]:
    return sorted(r for r in ranks if r is not None)


def _findings(candidates: list[_Candidate]) -> list[Finding]:
    groups: dict[tuple[str, str], list[_Candidate]] = defaultdict(list)
    for c in candidates:
        groups[(c.kind, c.role)].append(c)
    findings = []
    for (kind, role), items in groups.items():
        items.sort(key=lambda c: c.order)
        ranks = _rank_list({c.rank for c in items})
        message = items[0].title if items[0].kind != "exception" else items[0].text
        findings.append(
            Finding(kind, ranks, f"{message} ({format_ranks(ranks)})", role, items[0].category, _evidence(items))
        )
    findings.sort(key=lambda f: (ROLES.index(f.role), min((c.order for c in groups[(f.kind, f.role)]), default=0)))
    return findings


def _merge_facts(primary: _Candidate, related: list[LogEvent]) -> dict:
    """The primary line's facts, completed by those of the lines of the same category."""
    facts: dict = {}
    for event in ([primary.event] if primary.event else []) + related:
        for key, value in event.facts.items():
            if key not in _RANK_FACTS:
                facts.setdefault(key, value)
    return facts


def _child_failure_facts(failures: list[ChildFailure]) -> dict:
    exits = {}
    for failure in failures:
        if failure.rank is not None and failure.exit_code is not None:
            exits[str(failure.rank)] = failure.exit_code
    facts: dict = {"exit_codes": exits} if exits else {}
    root = next((f for f in failures if f.root_cause and f.rank is not None), None)
    if root is not None:
        facts["launcher_root_cause_rank"] = root.rank
    return facts


def _user_frame(records: LogRecords, ranks: list[int], near: _Candidate):
    """The innermost user frame of a traceback of one of `ranks`, the one nearest `near` first."""
    ordered = sorted(records.tracebacks, key=lambda tb: (tb.file != near.file, abs(tb.line - near.line)))
    for tb in ordered:
        if tb.rank in ranks:
            frame = innermost_user_frame(tb.frames[::-1])
            if frame:
                return tb, frame
    return None, None


def _frame_fact(tb: PyTraceback, frame) -> dict:
    return frame.to_fact(tb.rank)


def _actions(primary: _Candidate, findings: list[Finding], extra: list[Action]) -> list[Action]:
    """The actions of the rules involved, the primary failure's first, each fix once.

    Rules of one family repeat a fix under their own titles (arming the flight recorder, say); an
    action whose command and environment were already given adds nothing.
    """
    # What the analysis found about this job comes first; the rules' general advice follows.
    ordered: list[Action] = [a for a in extra if a.rule == "culprit"]
    rule_ids = [primary.kind] + [f.kind for f in findings if f.role != "collateral"]
    for rule_id in dict.fromkeys(rule_ids):
        rule = rule_by_id(rule_id)
        ordered.extend(rule.actions if rule else ())
        if rule_id == primary.kind:
            ordered.extend(a for a in extra if a.rule != "culprit")
    seen: set = set()
    actions = []
    for action in ordered:
        if (action.command or "").startswith("torchtriage triage"):
            continue  # the user just ran it: this verdict is that comparison

        keys = {("title", action.title)}
        if action.command or action.env:
            keys.add(("fix", action.command, tuple(sorted(action.env.items()))))
        if keys & seen:
            continue
        seen |= keys
        actions.append(action)
    return actions


def build_verdict(records: LogRecords) -> Verdict:
    candidates = _candidates(records)
    if not candidates:
        summary = "No known failure signature found"
        if not records.files_read:
            summary = "Nothing could be read"
        return Verdict(
            "unknown",
            [],
            summary,
            "low",
            facts={"ranks_seen": sorted(records.ranks_seen)},
            sources=records.files_read,
            problems=records.problems,
        )

    primary, order_basis = _pick_primary(candidates)
    same_failure = [c for c in candidates if c.kind == primary.kind and c.role == primary.role]
    culprits = _rank_list({c.rank for c in same_failure})
    findings = _findings(candidates)
    related = [c.event for c in candidates if c.event and c.category == primary.category]
    facts = _merge_facts(primary, related)
    facts.update(_child_failure_facts(records.child_failures))

    extra_actions: list[Action] = []
    if primary.category in ("nccl_timeout", "hang"):
        waiting = {c.rank for c in same_failure if c.rank is not None}
        hang_culprits, hang_findings, hang_facts = collective_culprits(records, waiting)
        facts.update(hang_facts)
        findings[0:0] = hang_findings
        if hang_culprits:
            culprits = hang_culprits
        elif primary.role != "primary":
            culprits = []  # the ranks that timed out are the victims; the culprit is not in the logs
    if primary.category == "oom":
        mem_findings, mem_facts, mem_actions = memory_findings([c.event for c in same_failure if c.event])
        findings[1:1] = mem_findings
        facts.update(mem_facts)
        extra_actions.extend(mem_actions)

    tb, frame = _user_frame(records, culprits, primary)
    if frame is not None:
        facts["user_frame"] = _frame_fact(tb, frame)
    else:
        # No culprit traceback: where the ranks that reported the failure were is still worth showing.
        reporters = _rank_list({c.rank for c in same_failure})
        waiting_tb, waiting = _user_frame(records, reporters, primary)
        if waiting is not None:
            facts["reporting_rank_frame"] = _frame_fact(waiting_tb, waiting)

    facts["ranks_seen"] = sorted(records.ranks_seen)
    facts["order_basis"] = order_basis
    if order_basis == "rule specificity" and len(_rank_list({c.rank for c in candidates})) > 1:
        records.problems.append(
            "The order of failures across files could not be established (no comparable timestamps); "
            "the verdict names the most specific failure, not necessarily the first."
        )

    summary = _summary(primary, culprits, frame, facts, findings)
    culprit_action = _culprit_action(findings, culprits, frame)
    if culprit_action is not None:
        extra_actions.insert(0, culprit_action)
    confidence = {"primary": "high", "symptom": "medium", "collateral": "low"}[primary.role]
    if any(f.kind in _CULPRIT_FINDINGS and f.ranks == culprits for f in findings) and culprits:
        confidence = "high"  # the ranks' own records single the culprit out
    elif primary.category == "unknown":
        confidence = "medium" if primary.role == "primary" and culprits else "low"
    return Verdict(
        category=primary.category,
        culprit_ranks=culprits,
        summary=summary,
        confidence=confidence,
        findings=findings,
        actions=_actions(primary, findings, extra_actions),
        facts=facts,
        sources=records.files_read,
        problems=records.problems,
    )


def _culprit_action(findings: list[Finding], culprits: list[int], frame) -> Action | None:
    """When the ranks' records single out the culprit, the first thing to do is look at its code."""
    lead = next((f for f in findings if f.kind in _CULPRIT_FINDINGS and f.ranks == culprits), None)
    if lead is None or not culprits:
        return None
    who = format_ranks(culprits)
    where = f" at {frame.file}:{frame.line} (in {frame.function})" if frame else ""
    if lead.kind == "collective_mismatch":
        detail = (
            f"{who} reached a different collective{where} than the one its peers wait in. Every rank must issue "
            "the same collectives in the same order: look for a data-dependent branch, an early exit or an "
            "uneven number of batches on that rank, and make the decision agree across ranks."
        )
    elif lead.kind == "lagging_rank":
        detail = (
            f"{who} never issued the collective its peers wait in. Read that rank's log just before the timeout for "
            "an earlier error, and if it is still alive, capture its stack to see the line it is stuck in."
        )
    else:
        detail = (
            f"{who} called the collective with a different {lead.kind.split('_')[0]}: compare the arguments it "
            "passes with its peers' (assert_rank_uniform on the shapes pins the diverging rank)."
        )
    return Action("culprit", f"Look at what {who} does instead{where}", detail)


_CULPRIT_FINDINGS = TIMEOUT_KINDS


def _summary(primary: _Candidate, culprits: list[int], frame, facts: dict, findings: list[Finding]) -> str:
    """One line: what failed, with its key facts, then who started it and where."""
    detail = _summary_detail(facts)
    head = f"{primary.title} ({detail})" if detail else primary.title
    lead = next((f for f in findings if f.kind in _CULPRIT_FINDINGS), None)
    if lead is not None:
        return f"{head}; {lead.message}"
    if not culprits and primary.role == "primary":
        return f"{head}; the log does not say which rank"
    if not culprits:
        return f"{head}; the culprit rank is not in the logs"
    where = f" at {frame}" if frame else ""
    return f"{head} on {format_ranks(culprits)}{where}"


def _summary_detail(facts: dict) -> str:
    parts = []
    if "op" in facts:
        parts.append(facts["op"].lower() if facts["op"].isupper() else facts["op"])
    if "seq" in facts:
        parts.append(f"seq {facts['seq']}")
    if "pg_name" in facts:
        parts.append(f"of {facts['pg_name']}")
    if "timeout_ms" in facts:
        parts.append(f"timeout {facts['timeout_ms']} ms")
    if "alloc" in facts:
        parts.append(f"tried to allocate {facts['alloc']}")
    if "xid" in facts:
        parts.append(f"Xid {facts['xid']}")
    if "cuda_error" in facts and "alloc" not in facts:
        parts.append(facts["cuda_error"])
    return ", ".join(parts)
