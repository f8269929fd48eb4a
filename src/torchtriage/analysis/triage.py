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

from torchtriage.analysis.log_records import ChildFailure, LogEvent, LogRecords, PyTraceback
from torchtriage.analysis.memory_facts import memory_findings
from torchtriage.knowledge.rules import rule_by_id
from torchtriage.model import ROLES, Action, Evidence, Finding, Verdict

_MAX_EVIDENCE = 4
# Exceptions a launcher raises about its children: never the cause, always a report of it.
_LAUNCHER_EXCEPTIONS = ("ChildFailedError", "SignalException")
_LIBRARY_PATH_MARKERS = ("site-packages", "dist-packages", "/lib/python", "<frozen", "/torch/", "<string>")
# Facts that identify the failing operation; copied from the primary event into `facts`.
_KEY_FACTS = (
    "pg_name",
    "pg_id",
    "seq",
    "op",
    "numel_in",
    "numel_out",
    "timeout_ms",
    "ran_for_ms",
    "last_enqueued",
    "last_completed",
    "alloc",
    "gpu_total",
    "gpu_free",
    "gpu_in_use",
    "allocated",
    "reserved_unallocated",
    "device",
    "exit_code",
    "signal",
    "xid",
    "nccl_error",
    "nccl_version",
    "cuda_error",
    "error_type",
    "port",
    "address",
    "step",
    "world_size",
    "ep_size",
    "host",
    "path",
)


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


def is_user_frame(path: str) -> bool:
    return not any(marker in path for marker in _LIBRARY_PATH_MARKERS)


def innermost_user_frame(traceback: PyTraceback):
    return next((frame for frame in reversed(traceback.frames) if is_user_frame(frame.path)), None)


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
        if tb.exception is None or (tb.file, tb.exception_line) in matched_lines:
            continue
        launcher = tb.exception.rsplit(".", 1)[-1] in _LAUNCHER_EXCEPTIONS
        candidates.append(
            _Candidate(
                role="collateral" if launcher else "symptom",
                priority=5,
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


def lagging_ranks(events: list[LogEvent]) -> tuple[list[int], dict[int, int]]:
    """Ranks whose last enqueued collective is older than their peers' (from watchdog reports)."""
    last_enqueued: dict[int, int] = {}
    for event in events:
        value = event.facts.get("last_enqueued")
        if event.rank is not None and value and value.isdigit():
            last_enqueued[event.rank] = max(last_enqueued.get(event.rank, 0), int(value))
    if len(last_enqueued) < 2 or len(set(last_enqueued.values())) < 2:
        return [], last_enqueued
    lowest = min(last_enqueued.values())
    return sorted(r for r, seq in last_enqueued.items() if seq == lowest), last_enqueued


def _evidence(items: list[_Candidate]) -> list[Evidence]:
    return [Evidence("log", c.file, c.line, c.rank, c.text[:500]) for c in items[:_MAX_EVIDENCE]]


def _rank_list(ranks: set[int | None]) -> list[int]:
    return sorted(r for r in ranks if r is not None)


def format_ranks(ranks: list[int]) -> str:
    """'rank 3', 'ranks 0-3, 7'."""
    if not ranks:
        return "no rank identified"
    spans, start = [], ranks[0]
    for prev, cur in zip(ranks, ranks[1:] + [None], strict=True):
        if cur is None or cur != prev + 1:
            spans.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(spans)


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
    facts: dict = {}
    for event in ([primary.event] if primary.event else []) + related:
        for key in _KEY_FACTS:
            if key in event.facts and key not in facts:
                facts[key] = event.facts[key]
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
            frame = innermost_user_frame(tb)
            if frame:
                return tb, frame
    return None, None


def _frame_fact(tb: PyTraceback, frame) -> dict:
    return {"file": frame.path, "line": frame.line, "function": frame.function, "rank": tb.rank}


def _actions(primary: _Candidate, findings: list[Finding], extra: list[Action]) -> list[Action]:
    seen, actions = set(), []
    rule_ids = [primary.kind] + [f.kind for f in findings if f.role != "collateral"]
    for rule_id in rule_ids:
        rule = rule_by_id(rule_id)
        for action in rule.actions if rule else ():
            if action.title not in seen:
                seen.add(action.title)
                actions.append(action)
        if rule_id == primary.kind:
            for action in extra:  # analyzer-derived actions follow the primary rule's own
                if action.title not in seen:
                    seen.add(action.title)
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
        laggers, last_enqueued = lagging_ranks(records.events)
        if last_enqueued:
            facts["last_enqueued_by_rank"] = {str(r): s for r, s in sorted(last_enqueued.items())}
        if laggers:
            culprits = laggers
            ahead = sorted(set(last_enqueued) - set(laggers))
            findings.insert(
                0,
                Finding(
                    "lagging_rank",
                    laggers,
                    f"{format_ranks(laggers)} enqueued collectives only up to seq {last_enqueued[laggers[0]]}, "
                    f"while {format_ranks(ahead)} reached seq {max(last_enqueued.values())}: "
                    f"{'it' if len(laggers) == 1 else 'they'} never joined the collective the others wait in",
                    "primary",
                    primary.category,
                    _evidence(
                        [c for c in candidates if c.event and c.rank in laggers and "last_enqueued" in c.event.facts]
                    ),
                ),
            )
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

    where = f" at {frame.path}:{frame.line} in {frame.function}" if frame else ""
    culprit_text = format_ranks(culprits) if culprits else "culprit rank not in the logs"
    summary = f"{primary.title}: {culprit_text}{where}"
    detail = _summary_detail(facts)
    if detail:
        summary += f" ({detail})"
    confidence = {"primary": "high", "symptom": "medium", "collateral": "low"}[primary.role]
    if primary.category == "unknown":
        confidence = "low"
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
