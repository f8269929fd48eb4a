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

import re
from collections import defaultdict
from dataclasses import dataclass

from torchtriage.analysis.cascades import Cascade, generic_lines, library_cascades
from torchtriage.analysis.collective_timeouts import (
    SEQS_ONLY,
    TIMEOUT_KINDS,
    WORLD_ASSUMED,
    collective_culprits,
    silent_ranks,
)
from torchtriage.analysis.confidence import calibrated
from torchtriage.analysis.consistency import consistent
from torchtriage.analysis.finished_run import Failure, finished_despite, survived_warnings
from torchtriage.analysis.memory_facts import memory_findings
from torchtriage.analysis.oom_victims import victims
from torchtriage.analysis.positions import classify_frames, innermost_user_frame
from torchtriage.analysis.rank_comparisons import COMPARED, IMPLIED, compared_ranks, compares_ranks
from torchtriage.analysis.stall import (
    LOG_STOPS,
    assess_stall,
    every_rank_seen,
    what_was_seen,
)
from torchtriage.analysis.xid_buses import FOREIGN, job_gpus, job_pids, place
from torchtriage.knowledge.frames import stack_knowledge
from torchtriage.knowledge.rules import rule_by_id
from torchtriage.model import ROLES, Assessment, Evidence, Finding, RankState
from torchtriage.ranks import format_ranks
from torchtriage.sources.fields import as_int
from torchtriage.sources.log_records import ChildFailure, LogEvent, LogRecords, PyTraceback
from torchtriage.sources.run_exit import run_exits

_MAX_EVIDENCE = 4
_MESSAGE_LINES = 16  # the lines of one message the scan rejoined (a hard wrap, a tagged block) a stop may end on
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
    cascade: Cascade | None = None  # the library failure whose aftermath this generic CUDA error is
    generic: bool = False  # on a line that holds a generic CUDA error (knowledge/cascades.toml)
    # A line the job went on after, by its own account (finished_run.survived_warnings): no failure to name.
    survived: bool = False
    rank_from: str | None = None  # how `rank` was read, where it is an assumption (LogEvent.rank_from)


# The findings that single out the culprit of a hang from the logs: the timeout readings, and the rank that left
# no line while its peers lost their connections to it.
_BLAMING_KINDS = (*TIMEOUT_KINDS, "logs.silent_rank")
# The categories whose culprit the collective-timeout readings decide (analysis.collective_timeouts).
_HANG_FAMILY = ("nccl_timeout", "hang")


def _own_role(event: LogEvent, survived: bool) -> str:
    """A line's role before any other line explains it."""
    if survived or event.aftermath:
        return "collateral"  # a line the job went on after, or one after what it is the aftermath of
    role = event.rule.role
    if role == "primary" and event.severity == "I":
        return "symptom"  # a line logged at INFO level reports; it is not the failure itself
    if role != "collateral" and event.severity == "W":
        # c10's TORCH_WARN (glog's W): a warning the process carried on after (a connect retry, an IPv6
        # socket it could not open); the failure it may lead to is logged as an error.
        return "collateral"
    return role


def _effective_roles(events: list[LogEvent], survived: set[int]) -> list[str]:
    own = [_own_role(event, index in survived) for index, event in enumerate(events)]
    # Only a line that is not aftermath itself explains others (a rule's `collateral_of`).
    present = {event.rule.category for event, role in zip(events, own, strict=True) if role != "collateral"}
    return [
        "collateral" if any(cat in present and cat != event.rule.category for cat in event.rule.collateral_of) else role
        for event, role in zip(events, own, strict=True)
    ]


def _endings_of_own_failures(records: LogRecords) -> list[int]:
    """The events (by index) that report how a rank's process ended where that rank printed a failure of its own:
    a rank prints nothing once it is gone, so its own failure came first and the ending is its aftermath. A
    line printed after the ending (a later attempt's) explains nothing of it. An ending that names only a
    process id (torchrun's "failed (exitcode: -6) local_rank: 2 (pid: 6549)") is that pid's rank in the report."""
    by_pid = {str(f.pid): f.rank for f in records.child_failures if f.pid is not None and f.rank is not None}
    endings = [
        (i, e, e.rank if e.rank is not None else by_pid.get(e.facts.get("pid", "")))
        for i, e in enumerate(records.events)
        if e.rule.ending
    ]
    if not endings:
        return []
    own: dict[int, list[float | None]] = {}
    for event in records.events:
        if not event.rule.ending and event.rank is not None and event.severity not in ("I", "W"):
            own.setdefault(event.rank, []).append(event.time)
    for tb in records.tracebacks:
        if tb.exception is not None and tb.rank is not None and not tb.ignored:
            own.setdefault(tb.rank, []).append(tb.time)

    def before(time: float | None, ended: float | None) -> bool:
        return time is None or ended is None or time <= ended + 1.0  # the launcher's times have whole seconds

    return [i for i, e, rank in endings if rank is not None and any(before(t, e.time) for t in own.get(rank, []))]


def _endings_after_the_job_was_ended(records: LogRecords) -> list[int]:
    """The events (by index) that report a rank's end after a line of the same file said the job was ended from
    outside (a scheduler's time limit or preemption, the launcher's own death signal): the kill that follows is
    that end's, not a failure of the rank's (no out-of-memory killer sent it)."""
    ended_at: dict[str, int] = {}
    for event in records.events:
        if event.rule.ends_the_job:
            ended_at.setdefault(event.file, event.order)
    return [
        i for i, e in enumerate(records.events) if e.rule.ending and e.file in ended_at and e.order > ended_at[e.file]
    ]


def _xid_places(records: LogRecords, roles: list[str], pids: dict[tuple[str, int], int]) -> dict[int, int]:
    """The rank each GPU-fault line's PCI address (or, failing it, its pid) places it on (event index -> rank), by
    the job's NCCL set-up lines; a line about a GPU none of the job's ranks used is made collateral in `roles`
    (analysis/xid_buses.py)."""
    gpus = job_gpus(records.events)
    placed: dict[int, int] = {}
    if gpus is None and not pids:
        return placed
    faults = [(i, e) for i, e in enumerate(records.events) if e.rule.category == "gpu_fault"]
    erring = frozenset(e.rank for _, e in faults if e.rank is not None)  # ranks whose own lines report a GPU error
    # One line can reach several rules; the address one of them read places the line.
    by_line = {(e.file, e.line): where for _, e in faults if (where := place(e, gpus, pids, erring)) is not None}
    for index, event in faults:
        where = by_line.get((event.file, event.line))
        if where == FOREIGN:
            roles[index] = "collateral"
        elif where is not None:
            placed[index] = where
    return placed


def _oom_victim_places(records: LogRecords, roles: list[str], pids: dict[tuple[str, int], int]) -> dict[int, int]:
    """The rank whose process each OOM killer's line killed (event index -> rank), by the pids of the job's NCCL
    set-up lines; a kill of another program's process is made collateral in `roles` (analysis/oom_victims.py)."""
    placed = {}
    for index, where in victims(records.events, pids).items():
        if where == FOREIGN:
            roles[index] = "collateral"
        else:
            placed[index] = int(where)
    return placed


def _of_an_earlier_boot(records: LogRecords) -> list[int]:
    """The node's kernel and driver lines (rule `node_event`) above journalctl's last boot separator in their file:
    an earlier boot's, of a GPU the driver has since reloaded; history, not the cause of a job that ran after it."""
    return [
        index
        for index, event in enumerate(records.events)
        if event.rule.node_event and event.line < records.boots.get(event.file, 0)
    ]


def _candidates(records: LogRecords) -> list[_Candidate]:
    survived = survived_warnings(records)
    roles = _effective_roles(records.events, survived)
    generic = generic_lines(records)
    cascades = library_cascades(records, roles, generic)
    for index in cascades:
        roles[index] = "collateral"  # a generic CUDA error after (or inside) a library's own failure
    for index in _endings_of_own_failures(records):
        roles[index] = "collateral"
    for index in _endings_after_the_job_was_ended(records):
        roles[index] = "collateral"
    for index in _of_an_earlier_boot(records):
        roles[index] = "collateral"
    pids = job_pids(records.events, records.child_failures)  # each rank's (host, pid): whose process an Xid names
    placed = _xid_places(records, roles, pids) | _oom_victim_places(records, roles, pids)
    candidates = [
        _Candidate(
            role,
            e.rule.priority,
            e.rule.category,
            e.rule.id,
            e.rule.title,
            placed.get(index, e.rank),
            e.time,
            e.file,
            e.line,
            e.order,
            e.text,
            e,
            cascades.get(index),
            (e.file, e.line) in generic,
            index in survived,
            e.rank_from,
        )
        for index, (e, role) in enumerate(zip(records.events, roles, strict=True))
    ]
    matched_lines = {(e.file, e.line) for e in records.events}
    wrapped = _wrapped_by_a_known_failure(
        records.tracebacks, {(e.file, e.line): e.rule.category for e in records.events}
    )
    for tb in records.tracebacks:
        if tb.exception is None:
            blocked = _blocked_in_collective(tb, len(records.events))
            if blocked is not None:
                candidates.append(blocked)
            continue
        if (tb.file, tb.exception_line) in matched_lines:
            continue
        if tb.exception.rsplit(".", 1)[-1] in _INTERRUPTS:
            continue  # stopped from outside: the stall layer reads where it was
        candidates.append(
            _Candidate(
                role="symptom" if id(tb) in wrapped else _exception_role(tb),
                priority=1,
                category=_category_of_exception(tb),
                kind=UNCAUGHT_EXCEPTION,
                title=f"{tb.exception} raised",
                rank=tb.rank,
                time=tb.time,
                file=tb.file,
                line=tb.exception_line or tb.line,
                order=len(records.events) + tb.line,
                text=f"{tb.exception}: {tb.message}".rstrip(": "),
                rank_from=tb.rank_from,
            )
        )
    return candidates


# Python prints a chained exception's traceback after its cause's exception line, one blank line, the chain's
# sentence ("During handling of the above exception, another exception occurred:", "The above exception was the
# direct cause of the following exception:") and another (Lib/traceback.py, TracebackException.format).
_CHAIN_GAP = 4


def _wrapped_by_a_known_failure(tracebacks: list[PyTraceback], matched: dict[tuple[str, int], str]) -> set[int]:
    """The tracebacks (by id) whose exception a library caught and raised again as one whose failure is known (the
    next traceback of the same file and rank, chained to it; a rule reads its exception line, of category
    `matched[(file, line)]`, or the place it was raised gives its category): where the inner exception's category is
    unknown or the same, it is that failure's detail (ConnectionRefusedError inside torchrun's
    RendezvousConnectionError), not a failure of its own."""
    by_place: dict[tuple[str, int | None], list[PyTraceback]] = defaultdict(list)
    for tb in tracebacks:
        by_place[(tb.file, tb.rank)].append(tb)
    wrapped: dict[int, str] = {}  # id -> the category of the known failure that wraps it
    for chain in by_place.values():
        chain.sort(key=lambda tb: tb.line)
        pairs = list(zip(chain, chain[1:], strict=False))
        for inner, outer in reversed(pairs):  # a chain of several: each link wrapped by the next, up to the known
            if not (inner.exception_line and 0 < outer.line - inner.exception_line <= _CHAIN_GAP):
                continue
            known = matched.get((outer.file, outer.exception_line or 0)) or wrapped.get(id(outer))
            known = known or _category_of_exception(outer)
            if known != "unknown" and _category_of_exception(inner) in ("unknown", known):
                wrapped[id(inner)] = known
    return set(wrapped)


def _stops_because_it_finished(stall: Assessment, records: LogRecords) -> bool:
    """Whether logs that only 'stop' belong to a job whose launcher exited 0 (`torchtriage run`'s record of its
    end): they stop where the job ended, not where it stuck."""
    if stall.lead is None or stall.lead.kind != LOG_STOPS:
        return False
    ends = run_exits(records.tails)
    return bool(ends) and all(end.finished for end in ends)


def _stops_at_a_known_line(stall: Assessment, candidates: list[_Candidate]) -> bool:
    """Whether a log that only 'stops' stops at a line a rule knows (a warning, say): then that line,
    not the stop, is the evidence. The scan reads a message printed over several lines (hard-wrapped, or under
    one tag) as one, numbered by its first line, where the tail sees each line: a last line that ends a message
    a rule matched a few lines before is that message."""
    if stall.lead is None or stall.lead.kind != LOG_STOPS or not stall.lead.evidence:
        return False
    last = stall.lead.evidence[0]
    ending = last.text.strip()
    return any(
        c.file == last.file
        and (
            c.line == last.line
            or (c.line < last.line <= c.line + _MESSAGE_LINES and bool(ending) and c.text.rstrip().endswith(ending))
        )
        for c in candidates
    )


_BLOCKED_RULE = "hang.stack_in_collective"
# Exceptions raised into a rank from outside (Ctrl-C): evidence of where it was, never a cause.
_INTERRUPTS = ("KeyboardInterrupt",)
UNCAUGHT_EXCEPTION = "logs.uncaught_exception"


def collective_of(tb: PyTraceback) -> str | None:
    """The collective a traceback's stack is inside, if any (whether or not the log says whose it is)."""
    state, op, _ = classify_frames(tb.frames[::-1], None)
    return op if state is RankState.COLLECTIVE else None


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
        rank_from=tb.rank_from,
    )


def _category_of_exception(tb: PyTraceback) -> str:
    """An exception no rule knows: the category of where it was raised, else of its type, else unknown."""
    known = stack_knowledge()
    return known.category_raised_in(tb.frames[::-1]) or known.category_raised_as(tb.exception) or "unknown"


def _exception_role(tb: PyTraceback) -> str:
    """How much an exception that no rule knows explains.

    A launcher's report of its children explains nothing; an exception raised inside a collective is
    how a rank learns that a peer failed; any other uncaught exception killed its rank, and is a cause.
    """
    if tb.ignored or (tb.exception and tb.exception.rsplit(".", 1)[-1] in _LAUNCHER_EXCEPTIONS):
        return "collateral"
    if collective_of(tb) is not None:
        return "symptom"
    return "primary"


def _pick_primary(candidates: list[_Candidate]) -> tuple[_Candidate, str]:
    """The candidate that most likely started it, and how the order was established."""
    best_role = min(ROLES.index(c.role) for c in candidates)
    pool = [c for c in candidates if ROLES.index(c.role) == best_role]
    # A generic CUDA error says a kernel stopped, not why: a cause of the same standing that says why leads.
    pool = [c for c in pool if not c.generic] or pool
    # Among aftermaths alone, one its own file says is the answer to another line (a step's cancel after srun's
    # "Terminating", which follows a task's failure) says less of the failure than one that does not.
    pool = [c for c in pool if not (c.event and c.event.aftermath)] or pool
    if len({c.kind for c in pool}) == 1 and len({c.rank for c in pool}) == 1:
        return min(pool, key=lambda c: c.order), "the only cause"  # one failure of one rank: nothing to order
    if len(pool) > 1 and all(c.time is not None for c in pool):
        first = min(c.time for c in pool)  # type: ignore[type-var]
        earliest = [c for c in pool if c.time is not None and c.time - first < 1.0]
        return max(earliest, key=lambda c: (c.priority, -c.order)), "timestamps"
    top = max(c.priority for c in pool)
    pool = [c for c in pool if c.priority == top]
    basis = "log order" if len({c.file for c in pool}) == 1 else "rule specificity"
    return min(pool, key=lambda c: c.order), basis


def _own_error_outside_the_reporters(primary: _Candidate, candidates: list[_Candidate]) -> _Candidate | None:
    """Where ranks report a collective that timed out, or a peer that went away, and one rank that is not among
    them failed with an error of its own (a cuBLAS failure, a crash), that rank never reached the collective, or
    is the peer that went, because of it: the reports are its peers', and its error leads. Another rank's report
    of waiting or of a lost peer is no error of its own. Only one such rank: two are two stories the order must
    tell."""
    lost_peer = primary.event is not None and primary.event.rule.printer_lost_peer
    if primary.category not in _HANG_FAMILY and not lost_peer:
        return None
    reporters = {c.rank for c in candidates if c.kind == primary.kind and c.rank is not None}
    own = [
        c
        for c in candidates
        if c.role in ("primary", "symptom")
        and c.category not in _HANG_FAMILY
        and not _printer_waits(c)
        and c.rank is not None
        and c.rank not in reporters
    ]
    if len(reporters) < 2 or len({c.rank for c in own}) != 1:
        return None
    return max(own, key=lambda c: (-ROLES.index(c.role), c.priority, -c.order))


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
        message = items[0].title if items[0].kind != UNCAUGHT_EXCEPTION else items[0].text
        facts = dict(items[0].event.facts) if items[0].event else {"exception": items[0].title.removesuffix(" raised")}
        findings.append(
            Finding(kind, ranks, f"{message} ({format_ranks(ranks)})", role, items[0].category, _evidence(items), facts)
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


# One rank of a list a report prints: "5", or torch elastic's "rank 5 (node-2)" (its rank decoder's form).
_LISTED_RANK = re.compile(r"(?:rank\s*)?(\d{1,7})(?:\s*\(.*\))?")


def _rank_numbers(text: str) -> list[int]:
    parts = [p.strip() for p in text.replace(";", ",").split(",")]
    listed = (_LISTED_RANK.fullmatch(p) for p in parts if p.isascii())
    return sorted({int(m.group(1)) for m in listed if m})


def _ranks_the_lines_name(
    candidates: list[_Candidate], category: str, records: LogRecords, facts: dict
) -> tuple[list[int], str | None]:
    """The ranks a report of the failure names as the ones behind it: `lagging_ranks` (monitored_barrier's
    "Ranks 2, 5 failed to pass", the desync report, Horovod's "missing ranks"), or the ranks seen that
    are not among its `ready_ranks`. Returns them and the kind of the line that named them."""
    for c in candidates:
        if c.event is None or c.category != category:
            continue
        lagging = _rank_numbers(c.event.facts.get("lagging_ranks", ""))
        if lagging:
            # Every line of that kind (monitored_barrier with wait_all_ranks prints one line per rank it missed).
            same = (o for o in candidates if o.event is not None and o.kind == c.kind and o.category == category)
            return sorted({r for o in same for r in _rank_numbers(o.event.facts.get("lagging_ranks", ""))}), c.kind
        ready = _rank_numbers(c.event.facts.get("ready_ranks", ""))
        if ready:
            world = as_int(str(facts.get("world_size", "")), None) if "world_size" in facts else None
            everyone = set(range(world)) if world and world <= 1 << 20 else every_rank_seen(records)
            missing = sorted(everyone - set(ready))
            if missing:
                return missing, c.kind
    return [], None


def _compared_ranks(
    primary: _Candidate, lead: Finding, findings: list[Finding], records: LogRecords
) -> list[int] | None:
    """The culprits of a check that compared every rank's value with its printer's (DDP's model check), its reading
    added after `lead`; None where the primary line is no such check's (the hang readings read the DETAIL check's)."""
    if not compares_ranks(primary.event) or primary.category in _HANG_FAMILY:
        return None
    culprits, comparison = compared_ranks(records.events, primary.kind, primary.kind, primary.category)
    findings.insert(findings.index(lead) + 1, comparison)
    lead.message = f"{primary.title} (printed by {format_ranks(lead.ranks)})"
    lead.ranks = comparison.ranks  # the lines' printers are witnesses, not culprits
    return culprits


def _spread_to_every_rank(primary: _Candidate, culprits: list[int], records: LogRecords) -> Finding | None:
    """A failure every rank the logs show reports (two or more) where that says it is no rank's own: a non-finite
    symptom the gradient all-reduce spread (knowledge: nan_inf.every_rank), or a set-up failure every rank of a
    host or link meets alike (rule field `shared_cause`; knowledge: logs.every_rank_alike)."""
    shared = primary.event is not None and primary.event.rule.shared_cause
    spread = primary.category == "nan_inf" and primary.role != "primary"
    if not (shared or spread) or len(culprits) < 2 or set(culprits) < records.ranks_seen:
        return None
    if shared:
        message = (
            f"every rank the logs show ({format_ranks(culprits)}) met it alike: it is the set-up their host shares, "
            "or the link to a peer whose side the logs may not show, not one rank's"
        )
        return Finding("logs.every_rank_alike", culprits, message, "symptom", primary.category, [], {"alike": True})
    message = (
        f"every rank the logs show ({format_ranks(culprits)}) went non-finite: the gradient all-reduce spreads one "
        "rank's NaN or Inf to every replica, so where it began is not in the logs"
    )
    return Finding("nan_inf.every_rank", culprits, message, "symptom", "nan_inf", [], {"undecided": True})


def _causing(primary: _Candidate, candidates: list[_Candidate]) -> list[_Candidate]:
    """The lines whose printers say they cause the verdict's failure in their peers (knowledge: `culprit_of`): a
    rank that warned it advertises its loopback address, where its peers could not connect."""
    if primary.event is None:
        return []
    return [c for c in candidates if c.event is not None and primary.event.rule.id in c.event.rule.culprit_of]


def _printer_waits(candidate: _Candidate) -> bool:
    """Whether a line's rank is the rank that printed it while it waited for another or lost a peer, or that
    logged a state every rank shares (knowledge: `printer_waits`, `printer_lost_peer`, `shared_state`), not one
    the line names (`rank_fact`)."""
    rule = candidate.event.rule if candidate.event is not None else None
    if rule is None or not (rule.printer_waits or rule.printer_lost_peer or rule.shared_state):
        return False
    return not (rule.rank_fact and rule.rank_fact in candidate.event.facts)


def _the_reports_one_exception(primary: _Candidate, candidates: list[_Candidate], records: LogRecords) -> list[int]:
    """The rank of a failure whose lines carry none, where torchrun's report below them in their file names one
    failed rank, and that rank ended of an exception (exitcode 1: Python's, which printed a traceback): the
    failure's lines are that exception's. With several failed ranks, or lines of the failure after the report, it
    cannot say whose they are."""
    if primary.rank is not None or (primary.event is not None and primary.event.rule.shared_state):
        return []  # a state every rank shares: the rank that exited first of it is no culprit
    entries = [f for f in records.child_failures if f.file == primary.file]
    if len(entries) != 1 or entries[0].rank is None or entries[0].exit_code != 1:
        return []
    same = [c for c in candidates if c.category == primary.category and c.role != "collateral"]
    if any(c.rank is not None or c.file != primary.file or c.line > entries[0].line for c in same):
        return []
    if _uncaught_without_rank(records.tracebacks, primary.file, entries[0].line) > 1:
        return []  # a process ends of one uncaught exception: of two in the file, the report says whose neither is
    return [entries[0].rank]


def _uncaught_without_rank(tracebacks: list[PyTraceback], file: str, before: int) -> int:
    """The uncaught exceptions no rank prefix names in `file` before line `before`, each chain counted once (an
    exception raised while handling another: one process's end, Python's chain sentence between them), the
    launcher's own report of its children left out."""
    return sum(
        1
        for tb in tracebacks
        if tb.file == file
        and tb.rank is None
        and tb.exception
        and not tb.ignored
        and not tb.chained
        and tb.line < before
        and tb.exception.rsplit(".", 1)[-1] not in _LAUNCHER_EXCEPTIONS
    )


def _nccl_processes(records: LogRecords, culprits: list[int]) -> dict[str, dict]:
    """Where NCCL's set-up lines say each culprit rank ran (its `host:pid:tid` prefix): the culprit's machine."""
    wanted = set(culprits)
    if not wanted:
        return {}
    return {
        str(rank): {"host": host, "pid": pid}
        for (host, pid), rank in job_pids(records.events).items()
        if rank in wanted
    }


def _prefix_hosts(records: LogRecords, culprits: list[int]) -> dict[str, dict]:
    """Where the host prefixes of a culprit's own lines (pdsh's "node-07: [rank3]: ...") say it ran: only lines it
    printed (not lines naming it), and only where they name one host."""
    hosts: dict[int, set[str]] = defaultdict(set)
    for event in records.events:
        names_another = bool(event.rule.rank_fact) and event.rule.rank_fact in event.facts
        if event.host and event.rank in culprits and not names_another:
            hosts[event.rank].add(event.host)
    return {str(rank): {"host": next(iter(seen))} for rank, seen in hosts.items() if len(seen) == 1}


def _failing_host(primary: _Candidate) -> dict | None:
    """The host a launcher put before the failure's line: where it was printed, rank or no rank."""
    host = primary.event.host if primary.event is not None else None
    return {"host": host, "file": primary.file, "line": primary.line} if host else None


def _child_failure_facts(failures: list[ChildFailure]) -> dict:
    exits = {}
    for failure in failures:
        if failure.rank is not None and failure.exit_code is not None:
            exits[str(failure.rank)] = failure.exit_code
    facts: dict = {"exit_codes": exits} if exits else {}
    # Where torchrun's report says each failed child ran: the host and pid of its entry.
    processes = {
        str(f.rank): {"host": f.host, "pid": f.pid} for f in failures if f.rank is not None and (f.host or f.pid)
    }
    if processes:
        facts["launcher_processes"] = processes
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
    fact = frame.to_fact(tb.rank)
    return fact | {"rank_is_local": True} if tb.rank_from == "local" else fact


def _nothing_found(records: LogRecords) -> Assessment:
    """No family, no stall: what the logs show, and a finding when they end in a failure no rule knows."""
    facts, findings = what_was_seen(records)
    summary = "No known failure signature found" if records.files_read else "Nothing could be read"
    finished = [end for end in run_exits(records.tails) if end.finished]
    if finished:
        facts["job_finished"] = finished[0].sentence
    if findings:
        summary = findings[0].message
    elif finished and facts.get("last_line") != finished[0].sentence:
        summary = f"{summary}; {finished[0].sentence.removeprefix('torchtriage run: ')}"
    if not findings and "last_line" in facts:
        summary = f"{summary}; the log ends: {facts['last_line'][:160]}"
    return Assessment(
        "logs",
        findings,
        summary,
        facts=facts,
        files=records.files_read,
        problems=records.problems,
        lead=findings[0] if findings else None,
    )


def assess_logs(records: LogRecords) -> Assessment:
    """What the logs say: the first failure, the ranks that started it, their line, the rest as collateral;
    a verdict whose quoted line shows another failure says so (`analysis.consistency`)."""
    return consistent(_assess_logs(records))


def _finished_run(candidates: list[_Candidate], records: LogRecords) -> Assessment | None:
    """A job whose launcher reports every worker exited 0 after every line that looks like a failure (or, weaker,
    which says itself that its training ran to the end): `ok`, those lines shown as symptoms it survived
    (analysis/finished_run.py)."""
    failing = [c for c in candidates if c.role != "collateral"]
    reports = finished_despite(
        [
            Failure(c.file, c.line, c.event is not None and c.event.rule.node_event, c.category == "nan_inf")
            for c in failing
        ],
        records,
    )
    if reports is None:
        return None
    survived = _findings(candidates)
    for finding in survived:
        if finding.role == "primary":
            finding.role = "symptom"
    first = reports[0]
    by_launcher = all(r.by_launcher for r in reports)
    said = "the launcher reports that every worker exited 0" if by_launcher else "the job says its training ended"
    lead = Finding(
        "logs.job_finished" if by_launcher else "logs.training_completed",
        [],
        f"{said}: {first.text[:200]}",
        "primary",
        "ok",
        [Evidence("log", r.file, r.line, None, r.text[:500]) for r in reports[:_MAX_EVIDENCE] if r.line],
        {"finished_by": first.text[:200]},
    )
    summary = (
        "The job finished: its launcher reports that every worker exited 0"
        if by_launcher
        else "Training ran to its end, the job says"
    )
    if failing:
        primary, _ = _pick_primary(failing)
        lines = f"{len(failing)} line{'s' if len(failing) != 1 else ''}"
        summary += f", after the lines that look like a failure; they did not end it ({primary.title}, {lines})"
    return Assessment(
        source="logs",
        findings=[lead, *survived],
        summary=summary,
        category="ok",
        confidence="medium" if by_launcher else "low",
        facts={"job_finished": first.text[:200], "ranks_seen": sorted(records.ranks_seen)},
        files=records.files_read,
        problems=records.problems,
        lead=lead,
    )


def _assess_logs(records: LogRecords) -> Assessment:
    candidates = _candidates(records)
    finished = _finished_run(candidates, records)
    if finished is not None:
        return finished
    if all(c.role == "collateral" for c in candidates):
        # No error of its own: where the logs stop, the lowest layer, speaks before any aftermath does.
        stall = assess_stall(records)
        if (
            stall is not None
            and not _stops_at_a_known_line(stall, candidates)
            and not _stops_because_it_finished(stall, records)
        ):
            stall.findings += _findings(candidates)
            return stall
    failures = [c for c in candidates if not c.survived]  # a line the job went on after names no failure
    if not failures:
        nothing = _nothing_found(records)
        nothing.findings += _findings(candidates)
        return nothing

    primary, order_basis = _pick_primary(failures)
    outside = _own_error_outside_the_reporters(primary, candidates)
    if outside is not None:
        primary, order_basis = outside, "the one rank that failed on its own while the others waited for it or lost it"
    same_failure = [c for c in candidates if c.kind == primary.kind and c.role == primary.role]
    culprits = _rank_list({c.rank for c in same_failure if not _printer_waits(c)})
    if not culprits and primary.role == "primary":
        # One event, two lines: a kernel's assertion prints no rank, the `[rank1]: ... device-side assert
        # triggered` after it does.
        # A printer that is not where the failure is stays unnamed here too.
        culprits = _rank_list(
            {
                c.rank
                for c in candidates
                if c.category == primary.category and c.role != "collateral" and not _printer_waits(c)
            }
        )
    if not culprits and primary.role == "primary":
        culprits = _the_reports_one_exception(primary, candidates, records)
    findings = _findings(candidates)
    lead = next(f for f in findings if f.kind == primary.kind and f.role == primary.role)
    # The same failure's other lines complete its facts; a generic CUDA error it caused says nothing of it.
    related = [c.event for c in candidates if c.event and c.category == primary.category and c.cascade is None]
    facts = _merge_facts(primary, related)
    facts.update(_child_failure_facts(records.child_failures))
    lead.facts.update(facts)
    compared = _compared_ranks(primary, lead, findings, records)
    if compared is not None:
        culprits = compared

    causing = _causing(primary, candidates)
    spread = None if causing else _spread_to_every_rank(primary, culprits, records)
    if causing:
        culprits = _rank_list({c.rank for c in causing})
    elif spread is not None:
        culprits = []
        findings.insert(findings.index(lead) + 1, spread)

    lost_peer = primary.event is not None and primary.event.rule.printer_lost_peer
    reporters = {c.rank for c in same_failure if c.rank is not None}
    if lost_peer and not culprits and len(reporters) > 1 and primary.category not in _HANG_FAMILY:
        # Every rank that reports lost a peer: the one that left first appears in no failure line (one rank's
        # lines alone are as likely an excerpt, or a link of its own).
        culprits, lost_findings, lost_facts = silent_ranks(records)
        facts.update(lost_facts)
        findings[0:0] = lost_findings

    named, named_by = _ranks_the_lines_name(candidates, primary.category, records, facts)
    if primary.category in _HANG_FAMILY and named:
        # A line that says which ranks never arrived (monitored_barrier, the desync report) is read before where
        # the others' counters or stacks were: those readings only infer it.
        culprits = named
    elif primary.category in _HANG_FAMILY:
        waiting = {c.rank for c in same_failure if c.rank is not None}
        if primary.role == "collateral":  # no rank timed out: each lost a peer, wherever it was
            hang_culprits, hang_findings, hang_facts = silent_ranks(records)
        else:
            hang_culprits, hang_findings, hang_facts = collective_culprits(records, waiting)
        facts.update(hang_facts)
        findings[0:0] = hang_findings
        if hang_culprits:
            culprits = hang_culprits
        elif primary.role != "primary":
            culprits = []  # the ranks that timed out are the victims; the culprit is not in the logs
    if primary.category == "oom":
        mem_findings, mem_facts = memory_findings([c.event for c in same_failure if c.event])
        findings[findings.index(lead) + 1 : findings.index(lead) + 1] = mem_findings
        facts.update(mem_facts)

    if not culprits and named:
        culprits = named
    elif culprits != named:
        named_by = None
    if _named_only_as("local", candidates, culprits):
        # torchrun --tee's "[default3]:", DeepEP's NVLink rank: a rank within its node; nothing read says which node,
        # nor that there was one: the job's rank is not named, the local one is said.
        facts["local_ranks"], culprits = culprits, []
    blaming = next((f for f in findings if f.kind in _BLAMING_KINDS and f.ranks == culprits and culprits), None)
    if causing:
        blaming = next((f for f in findings if f.kind in {c.kind for c in causing}), None)
    if blaming is None and culprits and lead.role == "primary" and lead.ranks == culprits:
        blaming = lead
    if blaming is None and named_by is not None:
        blaming = next((f for f in findings if f.kind == named_by), None)
        if blaming is not None:
            blaming.ranks = culprits
    if blaming is not None:
        blaming.blames = True
    if processes := _nccl_processes(records, culprits):
        facts["nccl_processes"] = processes
    if hosts := _prefix_hosts(records, culprits):
        facts["prefix_hosts"] = hosts
    if failing_host := _failing_host(primary):
        facts["failing_host"] = failing_host
    tb, frame = _user_frame(records, culprits or facts.get("local_ranks", []), primary)  # a local rank's line too
    if frame is not None:
        facts["user_frame"] = _frame_fact(tb, frame)
        for finding in (blaming, lead):
            if finding is not None:
                finding.facts["site"] = f"{frame.file}:{frame.line} (in {frame.function})"
    else:
        # No culprit traceback: where the ranks that reported the failure were is still worth showing.
        reporters = _rank_list({c.rank for c in same_failure})
        waiting_tb, waiting = _user_frame(records, reporters, primary)
        if waiting is not None:
            facts["reporting_rank_frame"] = _frame_fact(waiting_tb, waiting)
    undecided = next((f for f in findings if f.facts.get("undecided")), None)
    if not culprits and undecided is not None:
        facts["candidates"] = undecided.ranks

    facts["ranks_seen"] = sorted(records.ranks_seen)
    facts["order_basis"] = order_basis
    cut = [t.file for t in records.tails if t.cut_at_start]
    if cut:
        facts["cut_at_start"] = True
        records.problems.append(
            f"{', '.join(cut[:3])}: starts mid-message; what came before it (the first failure, perhaps) is not "
            "in the log, so the verdict is about what follows"
        )
    if order_basis == "rule specificity" and len(_rank_list({c.rank for c in candidates})) > 1:
        records.problems.append(
            "The order of failures across files could not be established (no comparable timestamps); "
            "the verdict names the most specific failure, not necessarily the first."
        )

    confidence, doubts = calibrated(primary, candidates, records)
    if confidence == "high" and (doubt := _task_number_doubt(same_failure, culprits)):
        confidence = "medium"
        doubts.append(doubt)
    if doubts:
        facts["doubts"] = doubts
        records.problems += [f"Confidence {confidence}, not high: {doubt}" for doubt in doubts]
    aftermath = _aftermath(primary, candidates)
    if aftermath:
        facts["aftermath"] = aftermath
    if blaming is not None and blaming.kind in TIMEOUT_KINDS:
        confidence = "high"  # the ranks' own records single the culprit out
    elif blaming is not None and blaming.kind == "logs.silent_rank" and blaming.facts.get(WORLD_ASSUMED):
        # Read from an absence, in a job whose size nothing said: a rank above the highest seen would be silent too.
        confidence = "low"
        doubt = (
            f"the job's size is taken to be {blaming.facts[WORLD_ASSUMED]} (the highest rank seen, plus one): "
            "nothing read says it, no job on whole nodes has it, and a rank above would be silent too"
        )
        facts.setdefault("doubts", []).append(doubt)
        records.problems.append(f"Confidence low, not medium: {doubt}")
    elif blaming is not None and blaming.kind == "logs.silent_rank":
        confidence = "medium"  # read from an absence: a rank whose lines carry no rank prefix looks silent too
    elif primary.kind == UNCAUGHT_EXCEPTION:
        # An exception no rule knows: its category is read from where it was raised or from its type.
        placed = culprits or primary.category != "unknown"
        confidence = "medium" if primary.role == "primary" and placed else "low"
    if confidence == "high" and any(f.facts.get(IMPLIED) and f.ranks == culprits for f in findings):
        confidence = "medium"  # the culprit rests on what a check's rank order implies of ranks that printed nothing
    if confidence == "high" and blaming is not None and blaming.facts.get(SEQS_ONLY):
        confidence = "medium"  # seqs alone, without counters: collectives of groups the lines do not name may mix
    return Assessment(
        source="logs",
        findings=findings,
        summary=_summary(primary, culprits, frame, facts, findings) + _aftermath_note(aftermath),
        category=primary.category,
        culprits=culprits,
        confidence=confidence,
        facts=facts,
        files=records.files_read,
        problems=records.problems,
        lead=lead,
        blaming=blaming,
    )


def _named_only_as(origin: str, candidates: list[_Candidate], culprits: list[int]) -> bool:
    """Whether every line that names the culprits names a number taken for a job's rank on the assumption `origin`
    (`LogEvent.rank_from`: "task", "local")."""
    naming = [c for c in candidates if c.rank in culprits]
    return bool(naming) and all(c.rank_from == origin for c in naming)


def _task_number_doubt(same_failure: list[_Candidate], culprits: list[int]) -> str | None:
    """Why the culprits are in doubt where every line that names them names srun's task: a rank where srun started
    the ranks themselves, a node where it started torchrun's agent on each (whose lines a log need not show)."""
    if not _named_only_as("task", same_failure, culprits):
        return None
    tasks = format_ranks(culprits, noun="task")
    return (
        f"{format_ranks(culprits)} is read from the launcher's {tasks}: a rank where the launcher started the "
        "ranks themselves, a node where it started torchrun on each"
    )


def _aftermath(primary: _Candidate, candidates: list[_Candidate]) -> list[dict]:
    """The generic CUDA errors that the primary failure's library explains, when it is a library's."""
    after = [c for c in candidates if c.cascade is not None and c.cascade.owner.rule.category == primary.category]
    seen: dict[tuple[str, int], dict] = {}
    for c in sorted(after, key=lambda c: c.order):
        seen.setdefault(
            (c.file, c.line),
            {
                "rank": c.rank,
                **({"rank_is_local": True} if c.rank_from == "local" else {}),
                "file": c.file,
                "line": c.line,
                "text": c.text[:300],
                "library": c.cascade.library,
                "how": c.cascade.how,
            },
        )
    return list(seen.values())[:_MAX_EVIDENCE]


def _aftermath_note(aftermath: list[dict]) -> str:
    if not aftermath:
        return ""
    first = aftermath[0]
    where = {"inside": "raised inside it", "trap": "its kernel's trap left"}.get(first["how"], "after it")
    noun = "local rank" if first.get("rank_is_local") else "rank"
    rank = f" on {noun} {first['rank']}" if first["rank"] is not None else ""
    return f"; the CUDA error {where}{rank} is its aftermath ({first['text'][:120]})"


def _summary(primary: _Candidate, culprits: list[int], frame, facts: dict, findings: list[Finding]) -> str:
    """One line: what failed, with its key facts, then who started it and where."""
    detail = _summary_detail(facts)
    head = f"{primary.title} ({detail})" if detail else primary.title
    lead = next(
        (
            f
            for f in findings
            if f.kind in _BLAMING_KINDS or f.facts.get(COMPARED) or f.facts.get("undecided") or f.facts.get("alike")
        ),
        None,
    )
    if lead is not None:
        return f"{head}; {lead.message}"
    if not culprits and primary.role == "primary" and facts.get("host") and facts.get("task"):
        # A launcher's task that ran torchrun's agent: a node, not a rank (sources/log_records.py)
        agent = f"the launcher's task {facts['task']}: a node's torchrun agent, whose ranks the log does not say"
        return f"{head} on {facts['host']} ({agent})"
    if not culprits and facts.get("local_ranks"):
        local = format_ranks(facts["local_ranks"], noun="local rank")
        return f"{head} on {local} of a node the log does not name (its ranks are numbered within their node)"
    if not culprits and primary.event is not None and primary.event.rule.shared_state:
        return f"{head}; a state every rank shares, so no rank is its culprit"
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
