"""For a collective timeout or hang: which rank never joined the collective the others wait in.

Where a rank timed out, three readings of the logs, tried in order; the first that singles someone out
decides (TORCH_DISTRIBUTED_DEBUG=DETAIL's check, whose lines say more, is read first: analysis.rank_comparisons):

1. the same collective (process group, sequence number) reported with a different op or size;
2. the watchdog's progress counters: where three or more ranks report, the minority whose last
   enqueued collective differs from the majority's; with fewer, a rank with nothing in flight while
   its peers wait. Two ranks each waiting in a different collective cannot be told apart from
   counters alone (one skipped a collective, or the other issued an extra one), and the finding
   says so instead of guessing;
3. the Python tracebacks: a rank whose stack is in another collective, or in none, while the ranks
   that timed out wait in one.

Where no rank timed out and every rank that reports lost a peer (a connection closed or reset), where the
survivors were says nothing of who left (`silent_ranks`).
"""

from __future__ import annotations

import signal
from collections import Counter, defaultdict
from dataclasses import dataclass

from torchtriage.analysis.positions import position_of
from torchtriage.analysis.rank_comparisons import DETAIL_KIND, DETAIL_RULE, hang_comparison
from torchtriage.analysis.xid_buses import world_communicator_size
from torchtriage.model import Evidence, Finding, RankPosition, SourceKind
from torchtriage.ranks import format_ranks
from torchtriage.sources.log_records import LogEvent, LogRecords, PyTraceback

_MAX_EVIDENCE = 4
# The fact of a culprit read from the seqs the ranks' watchdogs timed out at, no counters beside them: never above
# medium (lines before torch 2.2 name no group, so two groups' seqs may be compared as one's).
SEQS_ONLY = "timeout_seqs_only"
TIMEOUT_KINDS = (
    "logs.op_mismatch",
    "logs.size_mismatch",
    "logs.lagging_rank",
    "logs.idle_rank",
    "logs.collective_mismatch",
    DETAIL_KIND,
)


_P2P_OP_TYPES = ("SEND", "RECV", "RECVANYSOURCE")
# OpTypes whose NumelIn differs by rank legitimately: an all_to_all's each rank sends its own split, a rooted op's root
# passes a list the others do not, a coalesced op sums whatever each rank batched (its p2p ops included). Their ops
# are compared, their sizes not (as sources/flight_recorder.py compares a dump's).
_ROOTED_OP_TYPES = ("GATHER", "SCATTER")


def _group_named(facts: dict) -> str:
    """The group as people read it: its description and name ("default_pg (pg 0)"), compared as one text."""
    name, desc = facts.get("pg_guid") or facts.get("pg_id") or "", facts.get("pg_name") or ""
    if name and desc and desc != name:
        return f"{desc} (pg {name})"
    return desc or (f"pg {name}" if name else "")


@dataclass
class RankProgress:
    rank: int
    last_enqueued: int
    last_completed: int | None
    timed_out: bool  # the rank's own watchdog reported a timed-out collective
    evidence: LogEvent
    stuck_seq: int | None = None  # the seq its own watchdog timed out at, on this line's group

    @property
    def waiting(self) -> bool:
        """Something is in flight on this rank: it is inside a collective."""
        pending = self.last_completed is not None and self.last_completed < self.last_enqueued
        return self.timed_out or pending


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def progress_by_group(events: list[LogEvent]) -> dict[str, dict[int, RankProgress]]:
    """Each group's ranks' latest watchdog counters, and whether their own watchdog fired. Sequence numbers count
    one process group's collectives: a line's counters are compared with its own group's only (the heartbeat
    monitor's dump line gives the default group's, while the collective that timed out may be a subgroup's). A
    line that names no group is put with the others that name none."""
    timed_out = {e.rank for e in events if e.rank is not None and "timeout_ms" in e.facts and "seq" in e.facts}
    groups: dict[str, dict[int, RankProgress]] = {}
    stuck: dict[tuple[str, int], int] = {}  # (group, rank) -> the seq its watchdog's status line timed out at
    for event in events:
        # the seq its watchdog timed out at, from its timeout line or its status line, with counters or without (a
        # send's or recv's seq counts p2p ops, which the counters do not)
        p2p = event.facts.get("op", "").upper() in _P2P_OP_TYPES
        if event.rank is not None and not p2p and (seq := _int(event.facts.get("seq"))) is not None:
            stuck.setdefault((_group_named(event.facts), event.rank), seq)
    for event in events:
        enqueued = _int(event.facts.get("last_enqueued"))
        if event.rank is None or enqueued is None:
            continue
        group = _group_named(event.facts)
        progress = groups.setdefault(group, {})
        known = progress.get(event.rank)
        if known is None or enqueued >= known.last_enqueued:
            completed = _int(event.facts.get("last_completed"))
            progress[event.rank] = RankProgress(event.rank, enqueued, completed, event.rank in timed_out, event)
    for group, progress in groups.items():
        for rank, found in progress.items():
            found.stuck_seq = stuck.get((group, rank))
    return groups


def _evidence_of(events: list[LogEvent]) -> list[Evidence]:
    return [Evidence("log", e.file, e.line, e.rank, e.text[:500]) for e in events[:_MAX_EVIDENCE]]


def _departed(progress: dict[int, RankProgress], majority: int) -> list[int]:
    """The ranks whose counters leave the majority's: behind it (they never enqueued what most ranks did), or
    ahead of it, unless their own watchdog timed out at a collective the majority enqueued too (enqueued is
    asynchronous: a rank may queue ops behind the one it waits in). A rank behind whose own watchdog timed out in
    the collective most ranks' did, which it enqueued, waits in that collective with them: it only queued less
    behind it."""
    stuck = Counter(p.stuck_seq for p in progress.values() if p.stuck_seq is not None).most_common(1)
    common_stuck = stuck[0][0] if stuck and stuck[0][1] > len(progress) / 2 else None
    found = []
    for rank, p in progress.items():
        in_it = p.stuck_seq is not None and p.stuck_seq == common_stuck and p.last_enqueued >= p.stuck_seq
        if p.last_enqueued < majority and not in_it:
            found.append(rank)
        elif p.last_enqueued > majority and not (p.stuck_seq is not None and p.stuck_seq <= majority):
            found.append(rank)
    return sorted(found)


def sequence_outliers(progress: dict[int, RankProgress]) -> tuple[list[int], Finding | None]:
    """Reading 2: the ranks whose progress departs from their peers'."""
    if len(progress) < 2 or len({p.last_enqueued for p in progress.values()}) < 2:
        return [], None
    counts = Counter(p.last_enqueued for p in progress.values()).most_common()
    described = "; ".join(
        f"{format_ranks(sorted(r for r, p in progress.items() if p.last_enqueued == seq))} at seq {seq}"
        for seq, _ in sorted(counts)
    )
    if len(progress) >= 3 and counts[0][1] > len(progress) / 2 and (culprits := _departed(progress, counts[0][0])):
        majority = counts[0][0]
        message = (
            f"last enqueued collective: {described}: {format_ranks(culprits)} departed from the majority "
            f"(seq {majority})"
        )
        evidence = _evidence_of([progress[r].evidence for r in culprits])
        return culprits, Finding("logs.lagging_rank", culprits, message, "primary", "hang", evidence)
    idle = sorted(r for r, p in progress.items() if not p.waiting)
    busy = sorted(r for r, p in progress.items() if p.waiting)
    if idle and busy:
        message = (
            f"{format_ranks(idle)} had no collective in flight (last enqueued = last completed) while "
            f"{format_ranks(busy)} waited in one ({described}): "
            f"{'it' if len(idle) == 1 else 'they'} never joined the collective the others wait in"
        )
        evidence = _evidence_of([progress[r].evidence for r in idle])
        return idle, Finding("logs.idle_rank", idle, message, "primary", "hang", evidence)
    stuck = {p.stuck_seq for p in progress.values()}
    evidence = _evidence_of([p.evidence for p in progress.values()])
    if None not in stuck and len(stuck) == 1:
        # Every one of these ranks waits in the collective: none of them is a candidate (a rank that printed no
        # counters may be, analysis below).
        message = (
            f"every rank's own watchdog timed out at seq {stuck.pop()} ({described}): each issued it, and the "
            "ranks that enqueued more only queued ops behind it; the counters name no rank (run `torchtriage fr` "
            "on the flight-recorder dumps: the op's state on each rank decides)"
        )
        return [], Finding("logs.lagging_rank", sorted(progress), message, "symptom", "hang", evidence)
    message = (
        f"the ranks wait in different collectives ({described}): one side skipped a collective or the other "
        "issued an extra one, and the logs cannot tell which (run `torchtriage fr` on the flight-recorder "
        "dumps, or `torchtriage diagnose` on the live job: the call sites decide)"
    )
    return [], Finding(
        "logs.lagging_rank", sorted(progress), message, "symptom", "hang", evidence, facts={"undecided": True}
    )


def behind_in_timeouts(events: list[LogEvent]) -> tuple[list[int], Finding | None]:
    """Reading 2 from the timeout lines alone: each rank's watchdog reports the oldest collective of its group that
    it enqueued and that never completed. Where most ranks of a group wait in seq M and the others time out at an
    earlier one, those are behind: the majority completed what they still wait in, and wait in M for them. Ranks
    ahead of the majority name nobody (they queued more behind the one they wait in). A send's or recv's seq counts
    its rank's own p2p ops, which differ by rank (a pipeline's first and last stages have one neighbour): no p2p
    op is compared."""
    waits: dict[str, dict[int, LogEvent]] = defaultdict(dict)
    for event in events:
        if event.rank is None or "timeout_ms" not in event.facts or _int(event.facts.get("seq")) is None:
            continue
        if str(event.facts.get("op", "")).upper() not in _P2P_OP_TYPES:
            waits[_group_named(event.facts)].setdefault(event.rank, event)
    for group, per_rank in sorted(waits.items()):
        seqs = {rank: int(event.facts["seq"]) for rank, event in per_rank.items()}
        (majority, count), *_ = Counter(seqs.values()).most_common()
        behind = sorted(rank for rank, seq in seqs.items() if seq < majority)
        if len(seqs) < 3 or count <= len(seqs) / 2 or not behind:
            continue
        where = f" of {group}" if group else ""
        earlier = ", ".join(sorted({str(seqs[r]) for r in behind}))
        one = len(behind) == 1
        message = (
            f"{format_ranks(behind)} timed out in an earlier collective{where} (seq {earlier}) than the majority, "
            f"which waits in seq {majority}: {'it is' if one else 'they are'} behind, and the others wait for "
            f"{'it' if one else 'them'}"
        )
        evidence = _evidence_of([per_rank[r] for r in behind])
        return behind, Finding("logs.lagging_rank", behind, message, "primary", "hang", evidence, {SEQS_ONLY: True})
    return [], None


def mismatch_at_same_seq(events: list[LogEvent]) -> tuple[list[int], Finding] | None:
    """Reading 1: ranks that timed out in the same collective but report a different op or size.

    The culprit is the strict minority of two sides; with an even split (two ranks), or three values or more,
    the logs cannot tell who departed, and the finding says so — the flight recorder's call-site history can.
    Sizes are compared only for ops whose size every rank shares (not an all_to_all's, a rooted or a coalesced op's).
    """
    # A timeout line names its process group in its prefix (torch 2.2+), else the same rank's status line for that
    # seq may. The group's name (GUID) is the same on every rank; its id (uid) is each process's own count.
    group_of = {
        (e.rank, e.facts["seq"]): _group_named(e.facts)
        for e in events
        if e.rank is not None and "seq" in e.facts and _group_named(e.facts)
    }
    by_collective: dict[tuple[str, str, str], dict[int, LogEvent]] = defaultdict(dict)
    for event in events:
        if event.rule.id == DETAIL_RULE:
            continue  # the DETAIL check's line names its printer's collective and a peer's: read by rank_comparisons
        if event.rank is not None and "seq" in event.facts and "op" in event.facts:
            group = _group_named(event.facts) or group_of.get((event.rank, event.facts["seq"]), "")
            # A send's or recv's SeqNum counts the group's p2p ops, a collective's its collectives.
            counter = "p2p" if event.facts["op"].upper() in _P2P_OP_TYPES else "collective"
            by_collective[(group, counter, event.facts["seq"])].setdefault(event.rank, event)
    for (group, _, seq), per_rank in sorted(by_collective.items(), key=lambda item: item[0][2]):
        for what, key in (("op", lambda e: e.facts["op"]), ("size", lambda e: e.facts.get("numel_in"))):
            values: dict[str, list[int]] = defaultdict(list)
            for rank, event in sorted(per_rank.items()):
                values[str(key(event))].append(rank)
            if len(values) < 2 or "None" in values or (what == "size" and not _sizes_agree(per_rank.values())):
                continue
            ranked = sorted(values.items(), key=lambda item: len(item[1]))
            described = "; ".join(f"{format_ranks(r)}: {value}" for value, r in ranked)
            # One side departed only where every other rank agrees: with three values or more, the "others"
            # disagree among themselves, and the smallest side is no more the one that departed than any other.
            culprits = ranked[0][1] if len(values) == 2 and len(ranked[0][1]) < len(ranked[-1][1]) else []
            split = "an even split" if len(values) == 2 else f"{len(values)} {what}s, no two sides agreeing"
            verdict = (
                f"{format_ranks(culprits)} departed from the others"
                if culprits
                else f"{split}: the logs cannot tell which side departed (run `torchtriage fr` on the "
                "flight-recorder dumps: the call-site history decides)"
            )
            where = f"collective seq {seq} of {group}" if group else f"collective seq {seq}"
            message = f"{what} mismatch in {where}: {described} — {verdict}"
            role = "primary" if culprits else "symptom"
            evidence = _evidence_of(list(per_rank.values()))
            facts = {} if culprits else {"undecided": True}
            ranks = culprits or sorted(per_rank)
            return culprits, Finding(f"logs.{what}_mismatch", ranks, message, role, "hang", evidence, facts)
    return None


def _sizes_agree(events) -> bool:
    """Whether these ranks' collective must have the same size on every rank (not an all_to_all, a rooted or a
    coalesced op, whose sizes differ by rank legitimately)."""
    ops = {e.facts["op"].upper().lstrip("_") for e in events}
    return not any(
        op.startswith("ALLTOALL") or op in _ROOTED_OP_TYPES or op.endswith("COALESCED") or op in _P2P_OP_TYPES
        for op in ops
    )


def latest_positions(tracebacks: list[PyTraceback]) -> dict[int, RankPosition]:
    """Each rank's position from its last traceback."""
    found: dict[int, RankPosition] = {}
    for tb in tracebacks:
        if tb.rank is not None and tb.frames:  # a traceback lists its frames outermost first
            found[tb.rank] = position_of(tb.rank, tb.frames[::-1], active=None, source=SourceKind.LOG, file=tb.file)
    return found


def _place(position: RankPosition) -> str | None:
    """The collective (or GPU wait) a rank waits in; None when it waits in none."""
    return position.op if position.waiting else None


def odd_ones_out(found: dict[int, RankPosition], waiting_ranks: set[int]) -> tuple[list[int], str | None]:
    """Ranks not in the collective the others wait in, and that collective.

    The ranks that timed out define where the job waits; without them, the strict majority does.
    Returns ([], None) when the stacks do not single anyone out.
    """
    if len(found) < 2:
        return [], None
    waiting = [_place(found[r]) for r in waiting_ranks if r in found and _place(found[r])]
    if waiting:
        expected = Counter(waiting).most_common(1)[0][0]
    else:
        counts = Counter(_place(p) for p in found.values()).most_common()
        if counts[0][0] is None or (len(counts) > 1 and counts[0][1] == counts[1][1]):
            return [], None
        expected = counts[0][0]
    culprits = sorted(rank for rank, p in found.items() if _place(p) != expected)
    if not culprits or len(culprits) == len(found):
        return [], None
    return culprits, expected


def traceback_outliers(records: LogRecords, waiting_ranks: set[int]) -> tuple[list[int], Finding | None, dict]:
    """Reading 3: a rank whose Python stack is in another collective, or none."""
    found = latest_positions(records.tracebacks)
    facts = {"collective_by_rank": {str(r): _place(p) for r, p in sorted(found.items())}} if found else {}
    culprits, expected = odd_ones_out(found, waiting_ranks)
    if not culprits:
        return [], None, facts
    others = sorted(set(found) - set(culprits))
    parts = []
    for rank in culprits:
        where = found[rank]
        site = f" at {where.user_frame.file}:{where.user_frame.line}" if where.user_frame else ""
        parts.append(f"rank {rank} was in {_place(where) or 'no collective'}{site}")
    message = f"{'; '.join(parts)}, while {format_ranks(others)} waited in {expected}"
    evidence = [
        Evidence("log", tb.file, tb.exception_line or tb.line, tb.rank, f"{tb.exception}: {tb.message}"[:500])
        for tb in records.tracebacks
        if tb.rank in culprits
    ][-_MAX_EVIDENCE:]
    return culprits, Finding("logs.collective_mismatch", culprits, message, "primary", "hang", evidence), facts


def collective_culprits(records: LogRecords, waiting_ranks: set[int]) -> tuple[list[int], list[Finding], dict]:
    """The culprit ranks of a collective timeout, the findings that show it, and the facts read."""
    findings: list[Finding] = []
    mismatch = hang_comparison(records.events) or mismatch_at_same_seq(records.events)
    if mismatch is not None:
        culprits, finding = mismatch
        findings.append(finding)
        if culprits:
            return culprits, findings, {}
    facts: dict = {}
    for group, progress in sorted(progress_by_group(records.events).items(), key=lambda item: -len(item[1])):
        if "last_enqueued_by_rank" not in facts:  # the group most ranks report on
            facts["last_enqueued_by_rank"] = {str(r): p.last_enqueued for r, p in sorted(progress.items())}
        culprits, finding = sequence_outliers(progress)
        if finding is not None:
            findings.append(finding)
        if culprits:
            if group:
                facts["counters_group"] = group
            return culprits, findings, facts
    if not facts:  # no rank printed its counters (torch < 2.2): the seqs its watchdog timed out at still compare
        culprits, finding = behind_in_timeouts(records.events)
        if finding is not None:
            findings.append(finding)
        if culprits:
            return culprits, findings, facts
    culprits, finding, traceback_facts = traceback_outliers(records, waiting_ranks)
    facts.update(traceback_facts)
    if finding is not None:
        findings.append(finding)
    if not culprits and finding is None:
        culprits, absent_findings, absent_facts = absent_from_timeout(records, waiting_ranks)
        findings += absent_findings
        facts.update(absent_facts)
    if not culprits and not any(f.kind == "logs.silent_rank" for f in findings):
        culprits, absent_findings, absent_facts = absent_from_a_subgroup(records.events)
        findings += absent_findings
        facts.update(absent_facts)
    return culprits, findings, facts


def failing_ranks(records: LogRecords) -> set[int]:
    """The ranks the logs show, less those whose every line that counted them was logged at INFO level (NCCL's
    set-up, DeepSpeed's [INFO]), read by a rule or not, with no traceback and no launcher's report of their own:
    such a rank printed nothing of the failure, and is as silent as one that printed nothing at all."""
    informing = {e.rank for e in records.events if e.severity == "I"} | records.ranks_informing
    failing = {e.rank for e in records.events if e.severity != "I"} | records.ranks_reporting
    failing |= {tb.rank for tb in records.tracebacks} | {f.rank for f in records.child_failures}
    return records.ranks_seen - (informing - failing)


def absent_from_timeout(records: LogRecords, waiting_ranks: set[int]) -> tuple[list[int], list[Finding], dict]:
    """Reading 4: the ranks that printed no failure line while the others timed out in a collective. A rank that
    never reached the collective has nothing to time out on (its watchdog times only what it enqueued), so it is
    silent where its peers report: one such rank below the highest reporting one is the culprit, several are the
    candidates. Read from an absence (a rank whose output is missing from the logs looks the same), so never more
    than medium (analysis/triage.py)."""
    seen = failing_ranks(records)
    timed_out = {e.rank for e in records.events if e.rule.category == "nccl_timeout"}
    if len(waiting_ranks) < 2 or not waiting_ranks <= seen & timed_out:
        return [], [], {}  # only ranks that said they timed out (a report of a mismatch, or an excerpt, says less)
    closed = _closed_while_running(records)
    world = known_world(records)
    # The tasks a launcher listed as it ended them were as many processes, each a rank or a node of ranks: the job
    # had at least that many ranks, though none of them printed a line.
    size = max(max(seen) + 1, world or 0, max(records.ended_by_launcher, default=-1) + 1)
    silent = sorted(set(range(size)) - (seen - closed))
    if not silent or len(silent) > SILENT_LISTED_MAX:
        return [], [], {}
    one = len(silent) == 1
    message = (
        f"{format_ranks(silent)} printed no failure line while {format_ranks(sorted(waiting_ranks))} timed out "
        f"waiting in the collective: {'it' if one else 'one of them'} never reached it (a rank that never enqueues a "
        "collective has nothing to time out on), or its output is not in these logs"
    )
    if set(silent) <= closed:
        message += f"; torchrun's report shows {'it' if one else 'them'} running when the agent closed the workers"
    unsure = world is None and not set(silent) <= closed and not _a_jobs_size(size)
    return _silent_verdict(silent, message, size if unsure else None)


def _closed_while_running(records: LogRecords) -> set[int]:
    """The ranks torchrun's report shows only as ended by SIGTERM, with no line of their own that a rule reads:
    the agent sends it to the workers still running once one has failed (`Sending process P closing signal
    SIGTERM`), so such a rank was alive, and printed no timeout, when its peers had timed out."""
    terminated = {f.rank for f in records.child_failures if f.exit_code == -signal.SIGTERM and f.rank is not None}
    return terminated - {e.rank for e in records.events}


def absent_from_a_subgroup(events: list[LogEvent]) -> tuple[list[int], list[Finding], dict]:
    """Reading 4 within one process group: its watchdog's status lines number the printer in the group ("[PG ID 2
    ... Rank 1]") while its prefix gives the job's rank. Where three or more members timed out at one seq and their
    two numberings agree on one stride (global = first + stride x group rank: Megatron's and DeviceMesh's groups
    are evenly spaced), the group ranks below the highest that printed nothing never reached the collective, and
    the stride places them in the job (a TP group's rank 2 of job ranks 4-7 is rank 6, though it printed the
    default group's lines)."""
    members: dict[str, dict[int, int]] = defaultdict(dict)  # group -> group rank -> job rank
    for event in events:
        group_rank, seq = _int(event.facts.get("group_rank")), _int(event.facts.get("seq"))
        if event.rank is not None and group_rank is not None and seq is not None and "last_enqueued" in event.facts:
            members[f"{_group_named(event.facts)} seq {seq}"].setdefault(group_rank, event.rank)
    for group, ranks in sorted(members.items(), key=lambda item: -len(item[1])):
        spacing = _even_spacing(ranks)
        silent_in_group = sorted(set(range(max(ranks) + 1)) - set(ranks))
        if spacing is None or not silent_in_group or len(silent_in_group) > SILENT_LISTED_MAX:
            continue
        first, stride = spacing
        silent = [first + stride * g for g in silent_in_group]
        message = (
            f"{format_ranks(silent)} ({format_ranks(silent_in_group)} of {group.rsplit(' seq ', 1)[0]}) printed no "
            f"timeout while {format_ranks(sorted(ranks.values()))} of that group timed out at the same collective: "
            "never reached it, or its output is not in these logs"
        )
        return _silent_verdict(silent, message)
    return [], [], {}


def _even_spacing(ranks: dict[int, int]) -> tuple[int, int] | None:
    """(first, stride) where every (group rank, job rank) pair of three or more lies on job = first + stride x
    group rank with a whole stride of 1 or more; two points fit any line, so they prove nothing."""
    if len(ranks) < 3:
        return None
    (g0, r0), (g1, r1) = sorted(ranks.items())[:2]
    stride, rest = divmod(r1 - r0, g1 - g0)
    first = r0 - stride * g0
    if rest or stride < 1 or first < 0 or any(first + stride * g != r for g, r in ranks.items()):
        return None
    return first, stride


# A silent-rank finding's fact: the job's size was taken to be the highest rank seen plus one, which nothing read said
# and no job on whole nodes has (5 ranks): a rank above it would be silent too (analysis/triage.py says it at low).
WORLD_ASSUMED = "world_assumed"


def known_world(records: LogRecords) -> int | None:
    """The job's number of ranks where a source read says it: the identity records `torchtriage run` leaves, or the
    size of the largest communicator NCCL set up (the world's: "comm 0x... rank 3 nranks 16 ... Init COMPLETE"); a
    launcher's list of the tasks it ended (`ended_by_launcher`) says at least that many."""
    sizes = [max(records.ranks_known) + 1] if records.ranks_known else []
    if (nccl := world_communicator_size(records.events)) is not None:
        sizes.append(nccl)
    if not sizes:
        return None
    return max(max(sizes), max(records.ended_by_launcher, default=-1) + 1)


def _a_jobs_size(ranks: int) -> bool:
    """Whether a job can have this many ranks on whole nodes: a GPU node holds 1, 2, 4 or 8 (a world of 5 is a
    job's first ranks, the rest unseen)."""
    return ranks in (1, 2, 4) or ranks % 8 == 0


def _silent_verdict(
    silent: list[int], message: str, assumed_world: int | None = None
) -> tuple[list[int], list[Finding], dict]:
    """What silent ranks decide: one is the culprit; several are candidates, undecided. `assumed_world`: the size
    the reading took the job to have, where nothing read said it."""
    one = len(silent) == 1
    facts: dict = {} if one else {"undecided": True}
    if assumed_world is not None:
        facts[WORLD_ASSUMED] = assumed_world
    finding = Finding("logs.silent_rank", silent, message, "primary" if one else "symptom", "hang", [], facts)
    return (silent if one else []), [finding], {"silent_ranks": silent}


# Past this many silent ranks the logs are a sample of a large job, not its census: they are counted, not listed.
SILENT_LISTED_MAX = 4096


def silent_ranks(records: LogRecords) -> tuple[list[int], list[Finding], dict]:
    """Every rank that reports lost its connection to a peer and none timed out: the peer went away first.
    Ranks are numbered from 0, so a rank below the highest seen that appears in no line of the logs that could
    report a failure (`records.ranks_seen`: a rule's message, a traceback, torchrun's report; its step lines and
    chatter do not count) existed and left no trace: it exited or was killed without an error of its own. One
    such rank is the culprit; several are candidates; none (the highest ranks leave no trace) leaves the culprit
    unknown, unless the job's identity records (`records.ranks_known`) say how many ranks it had. A rank srun
    ended itself once a task had failed (`records.ended_by_launcher`) was running then: it did not leave first."""
    seen = failing_ranks(records)
    if not seen:
        return [], [], {}
    running = records.ended_by_launcher - seen
    world = known_world(records)
    # The job's identity records, NCCL's world communicator and srun's list of the tasks it ended know its world.
    highest = max(max(seen), (world or 0) - 1, max(running, default=0))
    missing = highest + 1 - len(seen) - len(running)
    if not missing:
        return [], [], {}
    if missing > SILENT_LISTED_MAX:
        message = (
            f"{missing} ranks below the highest seen ({highest}) appear in no line of the logs: the logs hold only "
            "some ranks of a large job, so they cannot say which rank left first; give every rank's log"
        )
        finding = Finding("logs.silent_rank", [], message, "symptom", "hang", [], {"undecided": True})
        return [], [finding], {"silent_ranks_count": missing}
    silent = sorted(set(range(highest + 1)) - seen - running)
    reporting = format_ranks(sorted(seen))
    message = (
        f"{format_ranks(silent)} appear{'s' if len(silent) == 1 else ''} in no failure line of the logs "
        f"while {reporting} lost {'its' if len(seen) == 1 else 'their'} connection to a peer: "
        f"{'it' if len(silent) == 1 else 'one of them'} exited or was killed without an error of its own"
    )
    unsure = world is None and not _a_jobs_size(highest + 1)
    return _silent_verdict(silent, message, highest + 1 if unsure else None)
