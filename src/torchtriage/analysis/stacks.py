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

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from torchtriage.analysis.confidence import ALL_RANK_CALLS, LEFT_NOTHING, PREMISE
from torchtriage.analysis.fusion import verdict_of
from torchtriage.analysis.positions import BACKWARD_OP, P2P_OPS, classify_frames, describe, position_of
from torchtriage.model import Assessment, Evidence, Finding, Frame, RankPosition, RankState, SourceKind, Verdict
from torchtriage.ranks import format_ranks
from torchtriage.sources.captures import JobShape, StoppedProcess
from torchtriage.sources.pyspy import ProcessStack, ThreadStack

# The states, under the names the analysis has always used.
COLLECTIVE, GPU_WAIT, DATALOADER, LOCK = RankState.COLLECTIVE, RankState.GPU_WAIT, RankState.DATALOADER, RankState.LOCK
SLEEPING, BLOCKED, COMPUTING, NO_STACK = RankState.SLEEPING, RankState.BLOCKED, RankState.COMPUTING, RankState.NO_STACK
STORE = RankState.STORE
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
    found = {rank: rank_position(rank, dumps[rank]) for rank in sorted(dumps)}
    return _alike_with_native(found, dumps)


def _place(thread: ThreadStack) -> tuple:
    """A main thread's place: its Python frames (native frames aside)."""
    return tuple((f.short_file or f.file, f.line, f.function) for f in thread.python_frames)


def _alike_with_native(found: dict[int, RankPosition], dumps: Mapping[int, ProcessStack]) -> dict[int, RankPosition]:
    """A rank without native frames, at the same place as a rank with them, is in the same call: a thread idle in
    the job's own line is in a C call its Python frames do not show (store.get, a socket's recv, .item() waiting
    for the device, time.sleep), and `py-spy --native` (costly: libtorch's symbols, per process) shows which.
    A capture takes it for one rank of each such place; the others take its reading."""
    with_native: dict[tuple, RankPosition] = {}
    for rank, process in dumps.items():
        thread = process.main_thread()
        if thread is not None and any(f.native for f in thread.frames):
            with_native.setdefault(_place(thread), found[rank])
    if not with_native:
        return found
    for rank, position in found.items():
        thread = dumps[rank].main_thread()
        if thread is None or any(f.native for f in thread.frames):
            continue
        seen = with_native.get(_place(thread))
        if seen is not None and (seen.state, seen.op) != (position.state, position.op):
            found[rank] = replace(position, state=seen.state, op=seen.op, where=seen.where, alike=seen.rank)
    return found


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


def analyze_stacks(
    dumps: Mapping[int, ProcessStack],
    gone: Mapping[int, str] | None = None,
    stopped: Mapping[int, StoppedProcess] | None = None,
    job: JobShape | None = None,
    silent: Mapping[int, str] | None = None,
) -> StackAnalysis:
    """Findings from every rank's stack: `not_in_collective`, `different_collective`, `stack_groups`, `rank_gone`
    for the ranks of the captured nodes that have no process (`gone`: rank -> why) or that an armed run's hang
    watchdog left no stack of (`silent`: rank -> why), and `rank_stopped` for the ranks a capture found stopped and
    could not sample (`stopped`: rank -> its process). `job`: what the captures say of the whole job (its world
    size, whether torchrun restarted its workers)."""
    return analyze_positions(positions(dumps), gone, stopped, job, silent)


def analyze_positions(
    found: Mapping[int, RankPosition],
    gone: Mapping[int, str] | None = None,
    stopped: Mapping[int, StoppedProcess] | None = None,
    job: JobShape | None = None,
    silent: Mapping[int, str] | None = None,
) -> StackAnalysis:
    found = dict(sorted(found.items()))
    gone = dict(sorted((gone or {}).items()))
    silent = {rank: why for rank, why in sorted((silent or {}).items()) if rank not in found and rank not in gone}
    absent = {**gone, **silent}
    stopped = dict(sorted((stopped or {}).items()))
    groups = group_positions(found)
    waiting = [g for g in groups if g.position.waiting]
    in_store = [g for g in groups if g.position.state == STORE]
    elsewhere = [g for g in groups if not g.position.waiting and g.position.state != STORE]
    waiting_ranks = sorted(r for g in waiting + in_store for r in g.ranks)
    elsewhere_ranks = sorted(r for g in elsewhere for r in g.ranks)
    findings: list[Finding] = []
    culprits: list[int] = []
    confidence = "low"

    active = any(g.position.state == COMPUTING for g in elsewhere)
    if absent and (waiting_ranks or (found and not active)):
        # A rank of the job has no process while its peers wait (or sit idle): it cannot join what they wait in.
        # A missing stack alone is inferred (a watchdog that could not run leaves none either): medium at most.
        culprits = sorted(absent)
        confidence = "high" if waiting_ranks and not elsewhere and not silent else "medium"
        findings.append(_gone_finding(gone, silent, waiting + in_store, elsewhere))
    elif stopped and waiting_ranks:
        # A stopped rank runs nothing: the others' wait cannot end before it is resumed. Its state is a fact read
        # from /proc, but that it is the one they wait for is inferred: medium, unless another source agrees.
        culprits, confidence = sorted(stopped), "medium"
        findings.append(_stopped_finding(stopped, waiting + in_store, elsewhere, blames=True))
    elif waiting_ranks and elsewhere and len(elsewhere_ranks) <= len(waiting_ranks):
        # The ranks the others wait for are not in any collective.
        culprits = elsewhere_ranks
        confidence = "high" if len(waiting_ranks) >= 2 and len(elsewhere_ranks) < len(waiting_ranks) else "medium"
        findings.append(
            Finding(
                "stacks.not_in_collective",
                culprits,
                f"{format_ranks(culprits)} {'is' if len(culprits) == 1 else 'are'} in no collective while the "
                f"others wait: {_groups_text(elsewhere)}; {_groups_text(waiting + in_store)}",
                role="primary",
                category="hang",
                evidence=[e for g in elsewhere for e in _evidence(g.position)][:_MAX_EVIDENCE]
                + _group_evidence(waiting + in_store)[:2],
                blames=True,
            )
        )
        if len(waiting) > 1:
            findings.append(_disagreement(waiting, decided=False))
    elif in_store:
        culprits, confidence, finding = _store_verdict(in_store, waiting)
        findings.append(finding)
    elif len(waiting) == 1 and not elsewhere and waiting[0].position.op == SETUP_OP:
        confidence, finding = _setup_stuck(waiting[0], job or JobShape())
        findings.append(finding)
    elif (created := _group_creation(found)) is not None:
        culprits, confidence, finding = created
        findings.append(finding)
    elif (rooted := _root_mismatch(waiting, found)) is not None:
        culprits, confidence, finding = rooted
        findings.append(finding)
    elif len(waiting) > 1 and not elsewhere and _in_p2p(waiting):
        findings.append(_p2p_wait(waiting, found))
    elif len(waiting) > 1 and not elsewhere and _across_groups(waiting):
        culprits, confidence, finding = _across_groups_verdict(waiting)
        findings.append(finding)
    elif len(waiting) == 2 and not elsewhere and (skipped := _skipped_all_rank_call(waiting)) is not None:
        culprits, confidence = sorted(skipped.ranks), "medium"
        findings.append(_skipped_finding(waiting, skipped))
    elif len(waiting) > 1 and not elsewhere and not _one_group(waiting) and _two_places(waiting, len(found)):
        culprits, confidence = sorted(waiting[1].ranks), "medium"
        findings.append(_majority_apart(waiting))
    elif len(waiting) > 1 and not elsewhere and not _one_group(waiting):
        findings.append(_groups_unseen(waiting))
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
    if stopped and not any(f.kind == _STOPPED for f in findings):
        findings.append(_stopped_finding(stopped, waiting + in_store, elsewhere, blames=False))
    findings.append(_stack_groups(groups, found, waiting_ranks, elsewhere_ranks, unsampled=sorted({*absent, *stopped})))
    return StackAnalysis(found, groups, findings, culprits, confidence)


_STOPPED = "stacks.rank_stopped"
# Every rank enters init_process_group, which returns once the store gave each rank the others' addresses and the
# backend connected to them: a rank that never arrives keeps the others there (a departure, read as any collective's),
# but all ranks there together arrived and still cannot connect.
SETUP_OP = "init_process_group"


def _setup_stuck(group: StackGroup, job: JobShape) -> tuple[str, Finding]:
    """Every rank sampled is in init_process_group: when they are the whole job, none is missing; they cannot
    connect. Whether torchrun restarted the workers decides the likeliest cause (the `restarted` fact)."""
    whole = job.world_size is not None and len(group.ranks) == job.world_size
    message = f"{group.describe()}: " + (
        f"every rank of the job ({job.world_size}) arrived, and they cannot connect to one another"
        if whole
        else "the ranks sampled arrived; the job's other ranks were not sampled (another node, perhaps), and one "
        "that never arrived would keep them there"
    )
    facts: dict = {"restarted": True} if job.restarted else {}
    if not whole:
        facts |= {"undecided": True}
    finding = Finding("stacks.setup_stuck", [], message, "primary", "rendezvous", _group_evidence([group]), facts)
    return ("medium" if whole else "low"), finding


def _stopped_finding(
    stopped: Mapping[int, StoppedProcess], waiting: list[StackGroup], elsewhere: list[StackGroup], blames: bool
) -> Finding:
    """The ranks a capture found stopped: the culprits when the others wait for a peer, else a fact to know."""
    ranks = sorted(stopped)
    pids = ", ".join(f"pid {stopped[rank].pid} on {stopped[rank].host}" for rank in ranks[:8])
    states = "/".join(sorted({process.state for process in stopped.values()}))
    verb = "is" if len(ranks) == 1 else "are"
    message = (
        f"{format_ranks(ranks)} ({pids}) {verb} stopped (SIGSTOP/SIGTSTP or a debugger: state {states} in /proc); "
        "a stopped rank stops every rank that waits for it"
    )
    if waiting:
        message += f": {_groups_text(waiting)}"
    if elsewhere:
        message += f"; in no collective: {_groups_text(elsewhere)}"
    return Finding(
        _STOPPED,
        ranks,
        message,
        role="primary" if blames else "symptom",
        category="hang",
        evidence=_group_evidence(waiting)[:2],
        facts={"stopped": {str(rank): str(what) for rank, what in stopped.items()}, "pid": stopped[ranks[0]].pid},
        blames=blames,
    )


def _gone_finding(
    gone: Mapping[int, str], silent: Mapping[int, str], waiting: list[StackGroup], elsewhere: list[StackGroup]
) -> Finding:
    ranks = sorted({*gone, *silent})
    said = []
    for these, verbs in ((gone, ("has no process", "have no process")), (silent, ("left no stack",) * 2)):
        if these:
            why = "; ".join(f"rank {rank}: {reason}" for rank, reason in list(these.items())[:8])
            said.append(f"{format_ranks(sorted(these))} {verbs[len(these) > 1]} ({why})")
    also = f"; also in no collective: {_groups_text(elsewhere)}" if elsewhere else ""
    return Finding(
        "stacks.rank_gone",
        ranks,
        f"{'; '.join(said)} while the others wait: {_groups_text(waiting)}{also}",
        role="primary",
        category="hang",
        evidence=_group_evidence(waiting)[:2],
        facts={"gone": {str(rank): reason for rank, reason in {**silent, **gone}.items()}}
        | ({} if gone else {PREMISE: LEFT_NOTHING}),
        blames=True,
    )


def _store_verdict(in_store: list[StackGroup], waiting: list[StackGroup]) -> tuple[list[int], str, Finding]:
    """Ranks blocked in the job's store wait for a key that another rank sets: one that is not itself in a
    store wait. One rank outside it is the one they wait for (where two or more wait for it: they did not all
    skip the collective it waits in); several are candidates (any may be the setter), and so are the two of one
    rank in the store against one outside."""
    stored = sorted(r for g in in_store for r in g.ranks)
    outside = sorted(r for g in waiting for r in g.ranks)
    where = _groups_text(in_store + waiting)
    verb = "waits" if len(stored) == 1 else "wait"
    head = f"{format_ranks(stored)} {verb} in the job's store for a key another rank sets: {where}"
    if len(outside) == 1 and len(stored) == 1:
        return _store_pair(in_store[0], waiting[0], head)
    if len(outside) == 1:
        message = (
            f"{head}. {format_ranks(outside)}, the only rank outside the store, went on without setting the key "
            "(or set another one) and waits for the ranks that wait for it"
        )
        evidence = [e for g in waiting for e in _evidence(g.position)][:_MAX_EVIDENCE] + _group_evidence(in_store)[:2]
        finding = Finding("stacks.store_wait", outside, message, "primary", "hang", evidence, blames=True)
        return outside, "medium", finding
    candidates = outside or stored
    who = "is among the others" if outside else "waits there too, or left"
    message = f"{head}. The rank that should set the key {who}: candidates, not culprits"
    facts = {"undecided": True, "candidates": candidates}
    evidence = _group_evidence(in_store + waiting)
    finding = Finding("stacks.store_wait", candidates, message, "symptom", "hang", evidence, facts)
    return [], "low", finding


def _store_pair(stored: StackGroup, outside: StackGroup, head: str) -> tuple[list[int], str, Finding]:
    """One rank in the store against one in a collective: each waits for the other. The one outside went on
    without setting the key, or the one in the store skipped the collective and went on to the store; where
    each stands in its loop, the stacks cannot say (the later line may be a pass behind): both are candidates."""
    candidates = sorted(stored.ranks + outside.ranks)
    message = (
        f"{head}. Either {format_ranks(list(outside.ranks))}, the only rank outside the store, went on without "
        f"setting the key (or set another one), or {format_ranks(list(stored.ranks))} skipped the collective the "
        "other waits in and went on to the store: one rank against one, the stacks cannot tell which; both are "
        "the candidates"
    )
    facts = {"undecided": True, "candidates": candidates}
    evidence = _group_evidence([stored, outside])
    return [], "low", Finding("stacks.store_wait", candidates, message, "symptom", "hang", evidence, facts)


def _group_creation(found: Mapping[int, RankPosition]) -> tuple[list[int], str, Finding] | None:
    """Ranks creating process groups of different names: every rank must call `new_group` for every group, in
    one order (the names come from one counter), so the ranks creating another group than a clear majority
    skipped or added a call. None when no two ranks in new_group differ."""
    names = {r: p.process_group for r, p in found.items() if p.op == "new_group" and p.process_group is not None}
    by_name: dict[str, list[int]] = {}
    for rank, name in names.items():
        by_name.setdefault(name, []).append(rank)
    if len(by_name) < 2:
        return None
    ordered = sorted(by_name.items(), key=lambda item: (-len(item[1]), item[0]))
    (_, majority), (_, runner_up) = ordered[0], ordered[1]
    described = "; ".join(f"{format_ranks(ranks)} create group {name!r}" for name, ranks in ordered)
    evidence = [e for rank in sorted(names) for e in _evidence(found[rank])][:_MAX_EVIDENCE]
    if len(majority) > len(runner_up):
        culprits = sorted(r for name, ranks in ordered[1:] for r in ranks)
        message = (
            f"The ranks create different process groups: {described}. Every rank calls new_group for every group "
            f"in one order (its name counts the calls): {format_ranks(culprits)} skipped or added a new_group call"
        )
        confidence = "high" if len(majority) > len(names) / 2 and len(culprits) == 1 else "medium"
        return culprits, confidence, Finding("stacks.group_creation", culprits, message, "primary", "hang", evidence,
                                             blames=True)  # fmt: skip
    candidates = sorted(names)
    message = f"The ranks create different process groups: {described}; an even split: candidates, not culprits"
    facts = {"undecided": True, "candidates": candidates}
    return [], "low", Finding("stacks.group_creation", candidates, message, "symptom", "hang", evidence, facts)


def _one_group(waiting: list[StackGroup]) -> bool:
    """Whether the ranks' collectives are known to be on one group: every rank's on the default group (py-spy's
    locals say so), or a single place. A collective the stack shows no group of (no locals, backward's
    gradient collectives) may be on any group: comparing by majority would blame the ranks of another group."""
    return len(waiting) < 2 or all(g.position.group_given is False and g.position.op != BACKWARD_OP for g in waiting)


def _two_places(waiting: list[StackGroup], ranks: int) -> bool:
    """Every rank waits at one of two places in two different collectives: a strict majority (two ranks or
    more) at one, on a group the stack does not show (backward's gradient collectives, arguments py-spy cut
    short), the others on the default group (py-spy's locals say so). Those wait for every rank of the
    majority; the majority, stuck at one place with every other rank elsewhere, waits for ranks apart (a
    collective whose members all reached it completes). The two places wait for each other, and the ranks
    apart left the program the majority keeps (or the whole majority skipped one call alike): medium. Where
    the ranks apart are on a group the stack does not show, they may be blocked in a group of their own whose
    other member went on with the majority, and nothing decides."""
    if len(waiting) != 2:
        return False
    majority, apart = waiting
    on_default = apart.position.group_given is False and apart.position.op != BACKWARD_OP
    # In a collective (a rank waiting for its device may only be computing: a slow job, not a hang).
    unseen = majority.position.state == COLLECTIVE and (
        majority.position.group_given is None or majority.position.op == BACKWARD_OP
    )
    distinct_ops = majority.position.op != apart.position.op
    return on_default and unseen and distinct_ops and len(majority.ranks) >= 2 and len(majority.ranks) * 2 > ranks


def _majority_apart(waiting: list[StackGroup]) -> Finding:
    majority, apart = waiting
    culprits = sorted(apart.ranks)
    verb = "waits" if len(culprits) == 1 else "wait"
    return Finding(
        "stacks.different_collective",
        culprits,
        f"{apart.describe()}: apart from the others; {majority.describe()}. Every rank is at one of these two "
        f"places: the majority waits for {format_ranks(culprits)}, which {verb} on the default group for every "
        f"rank of the majority; {format_ranks(culprits)} left the program the majority keeps (unless the whole "
        "majority skipped one call alike)",
        role="primary",
        category="hang",
        evidence=_evidence(apart.position)[:_MAX_EVIDENCE] + _evidence(majority.position),
        blames=True,
    )


def _skipped_all_rank_call(waiting: list[StackGroup]) -> StackGroup | None:
    """Of two places, one waits inside a call every rank must make (a checkpoint's save) and the other in none:
    the ranks inside it wait for a member that never entered it, and every other rank is at the other place.
    Those skipped it (a rank-local decision to save, say); by call order alone the call would read as an extra
    one its ranks made."""
    inside = [g for g in waiting if g.position.all_rank_call]
    if len(inside) != 1:
        return None
    return next(g for g in waiting if g is not inside[0])


def _skipped_finding(waiting: list[StackGroup], skipped: StackGroup) -> Finding:
    inside = next(g for g in waiting if g is not skipped)
    call = inside.position.all_rank_call
    culprits = sorted(skipped.ranks)
    return Finding(
        "stacks.skipped_all_rank_call",
        culprits,
        f"{inside.describe()}, inside {call}, which every rank must call; {format_ranks(culprits)} never entered "
        f"it: {skipped.describe()}",
        role="primary",
        category="hang",
        evidence=_evidence(skipped.position)[:_MAX_EVIDENCE] + _evidence(inside.position),
        facts={"all_rank_call": call, PREMISE: ALL_RANK_CALLS},
        blames=True,
    )


def _root_mismatch(
    waiting: list[StackGroup], found: Mapping[int, RankPosition]
) -> tuple[list[int], str, Finding] | None:
    """Ranks waiting in one rooted collective's call (same op and line) that gave it different roots: candidates,
    never culprits. A rank may have chosen its root wrongly, or the ranks are at different calls of a loop over
    sources (one broadcast per rank, as a state-dict consolidation or ZeRO's parameter sync issues them): gloo's
    tree broadcast lets a member that got its data go on to the next call while others still wait in this one,
    so which ranks share a call, and so which root is the odd one, the stacks cannot say. None where every rank
    of every such place gave the same root, or the stacks do not show it."""
    for group in waiting:
        roots = {r: found[r].root for r in group.ranks if found[r].root is not None}
        if len(set(roots.values())) < 2:
            continue
        counts = sorted(((n, v) for v, n in Counter(roots.values()).items()), reverse=True)
        given = "; ".join(f"{format_ranks(sorted(r for r in roots if roots[r] == v))}: root {v}" for _, v in counts)
        op = group.position.op
        message = (
            f"{format_ranks(sorted(roots))} wait in {op} from one line with different roots ({given}): a rank chose "
            "another root than its peers, or the ranks are at different calls of a loop over roots (a tree "
            "broadcast lets a member that got its data go on to the next call); the stacks cannot say which"
        )
        finding = Finding(
            "stacks.root_mismatch",
            sorted(roots),
            message,
            role="symptom",
            category="hang",
            evidence=_evidence(group.position)[:_MAX_EVIDENCE],
            facts={"undecided": True, "candidates": sorted(roots)},
        )
        return [], "low", finding
    return None


def _groups_unseen(waiting: list[StackGroup]) -> Finding:
    candidates = sorted(r for g in waiting for r in g.ranks)
    return Finding(
        "stacks.different_collective",
        candidates,
        f"The ranks wait in different collectives or lines: {_groups_text(waiting)}. The stacks do not show on "
        "which group each waits (py-spy's --locals show the group a collective was given; backward's gradient "
        "collectives none): if they share one group the minority departed, else a member of the minority's "
        "group that went on did. The flight recorder's groups decide: candidates, not culprits",
        role="symptom",
        category="hang",
        evidence=_group_evidence(waiting),
        facts={"undecided": True, "candidates": candidates},
    )


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
    if any(found[r].peer is None for r in in_p2p):
        candidates = sorted(found)  # a peer the stack does not name may be any rank
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
    groups: list[StackGroup],
    found: Mapping[int, RankPosition],
    waiting: list[int],
    elsewhere: list[int],
    unsampled: Sequence[int] = (),
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
    elif len(groups) == 1 and waiting and unsampled:
        # The ranks that could not be sampled (gone, stopped) are where the others' wait is explained.
        message = (
            f"Every rank sampled is at the same place: {_groups_text(groups)}; not sampled: {format_ranks(unsampled)}"
        )
    elif len(groups) == 1 and groups[0].position.op == SETUP_OP:
        message = f"All ranks are at the same place: {_groups_text(groups)}"  # stacks.setup_stuck reads it
    elif len(groups) == 1:
        message = (
            f"All ranks are at the same place: {_groups_text(groups)}; the stacks cannot tell which rank is "
            "behind (the flight recorder's sequence numbers can): every rank is a candidate"
        )
        facts |= {"undecided": True, "all_alike": True}
        if groups[0].position.state == GPU_WAIT:
            facts["gpu_wait"] = True  # only the devices' progress can tell: the flight recorder's op states
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
    candidates = undecided.facts.get("candidates", undecided.ranks) if undecided is not None else []
    if candidates and (not analysis.culprit_ranks or set(analysis.culprit_ranks) < set(candidates)):
        facts["candidates"] = candidates  # none named, or a lead the evidence cannot tell from them
    culprit = next(
        (p for r in analysis.culprit_ranks if (p := analysis.positions.get(r)) is not None and p.user_frame), None
    )
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
        category=primary[0].category if primary else "hang",  # a hang, or a rendezvous that never completed
        culprits=list(analysis.culprit_ranks),
        confidence=analysis.confidence,
        facts=facts,
        files=files or sorted({p.file for p in analysis.positions.values()}),
        lead=primary[0] if primary else (analysis.findings[0] if analysis.findings else None),
        blaming=blaming,
        user_frames={r: p.user_frame for r, p in analysis.positions.items() if p.user_frame is not None},
    )
