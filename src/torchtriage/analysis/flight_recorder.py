"""Flight-recorder records -> the first point where ranks disagree, the culprit, one Verdict.

Pure: takes the loaded dumps, returns a `Verdict`. The reasoning, per process group:
1. members from `pg_config` (gloo records none: the default group is then every rank up to the highest seen,
   a subgroup the ranks that recorded it); members without a dump are named and treated as unknown;
2. align the ranks by `collective_seq_id` from the latest buffer start of any rank (ring buffers start at
   different records); a rank's `pg_status` counter says how far it got only where its entries are gone;
3. ranks with identical op sequences form one class (a few classes even at thousands of ranks), and the
   classes are walked seq by seq to the first disagreement: ranks that never enqueued the op (`not_joined`),
   another op (`op_mismatch`), other sizes (`size_mismatch`), other dtypes (`dtype_mismatch`); failing
   that, all_to_all totals, then ops completed on some ranks but not others (`state_mismatch`), or pending on
   every rank but begun by some ranks' devices only (`not_started`, with TORCH_NCCL_ENABLE_TIMING=1);
4. the culprit is the minority; an even split (two ranks) is decided by the call-site history: the side
   whose user call site departs from the ones it used for earlier seqs of the group; a side that stopped
   issuing ops loses against one waiting at its usual call site. Rank numbers never decide;
5. p2p (`analysis.fr_p2p`): the k-th send from a to b must meet the k-th recv at b from a, with the same sizes;
6. a group's culprits that are blocked in another group's disagreement (their last op is there, where they
   are on the joined side) are collateral: the cause is the other group's;
7. across groups, the wait-for graph (`analysis.wait_for`) leads wherever it decides otherwise than a group's
   majority: a rank others wait for that waits in no collective, or the rank of a cycle that departed first.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass

from torchtriage.analysis import fr_unrecorded, wait_for, wait_for_findings
from torchtriage.analysis.confidence import ALL_RANK_CALLS, PREMISE
from torchtriage.analysis.fr_model import ABSENT, Disagreement, Group, group_key
from torchtriage.analysis.fr_p2p import p2p_disagreement
from torchtriage.analysis.fusion import verdict_of
from torchtriage.analysis.positions import describe
from torchtriage.model import Assessment, Evidence, Finding, Frame, RankPosition, RankState, SourceKind, Verdict
from torchtriage.ranks import format_ranks
from torchtriage.sources.flight_recorder import LoadResult, RankDump, Signature, Track

_UNKNOWN = None  # before the rank's buffer start, or enqueued (pg_status) but not in the buffer
_DEFAULT_PG_DESCS = ("default_pg",)
_MAX_EVIDENCE = 4
# A disagreement's kind is its finding's kind under this prefix: the rules in knowledge/rules/fr.toml.
_KIND_PREFIX = "fr."


# ------------------------------------------------------------------------------------------------------ groups


def build_groups(load: LoadResult) -> dict[tuple[str, str | None], Group]:
    """Process groups by (name, membership digest): split groups may share a name with other members."""
    dumps = load.dumps
    world_top = max((d.rank for d in dumps), default=-1)
    known = set(load.known_ranks)
    groups: dict[tuple[str, str | None], Group] = {}
    recorded_by: dict[str, set[int]] = defaultdict(set)
    descs: dict[str, str] = {}
    for dump in dumps:
        for name in (*dump.tracks, *dump.p2p):
            recorded_by[name].add(dump.rank)
        for name, desc in dump.pg_desc.items():
            descs.setdefault(name, desc)
        for name, info in dump.pg_config.items():
            key = (name, info.ranks_digest)
            if key not in groups:
                members = load.ranks_of(info.ranks_digest)
                if members is not None:
                    groups[key] = Group(name, info.desc or descs.get(name, ""), members, False, info.ranks_digest)
    for dump in dumps:
        for name in (*dump.tracks, *dump.p2p):
            if group_key(dump, name) in groups:
                continue
            desc = descs.get(name, "")
            if desc in _DEFAULT_PG_DESCS or (name == "0" and desc in ("", "undefined")):
                world = load.ranks_of(dump.nameless_ranks) or range(world_top + 1)
                members = tuple(sorted(set(world) | known | {d.rank for d in dumps}))
            else:
                members = tuple(sorted(recorded_by[name]))
            groups[(name, None)] = Group(name, desc, members, True, None)
    return groups


def _status_enqueued(dump: RankDump, name: str) -> int:
    """How far a rank got in a group by its `pg_status` counter: only where its entries of the group are
    gone (an onlyActive dump). Beside entries it misleads: gloo counts its collectives by op id (sends and recvs
    take ids too), and NCCL counts its works by their own sequence numbers (a send's, a batch_isend_irecv's)."""
    track = dump.tracks.get(name)
    if track is not None and track.seqs:
        return -1
    status = dump.status(name)
    return status[0] if status else -1


# -------------------------------------------------------------------------------------------------- collectives


@dataclass
class _RankView:
    rank: int
    track: Track | None
    start: int  # index into track of the first seq >= the common start
    hi: int  # the last seq this rank enqueued (buffer or pg_status)


def _value_at(view: _RankView, seq: int, lookup: dict[int, str] | None) -> str | None:
    if lookup is not None and seq in lookup:
        return lookup[seq]
    if seq > view.hi:
        return ABSENT
    return _UNKNOWN


def _seq_lookup(view: _RankView) -> dict[int, str]:
    if view.track is None:
        return {}
    track = view.track
    return dict(zip(track.seqs[view.start :], track.keys[view.start :], strict=True))


def collective_disagreement(
    group: Group, dumps: dict[int, RankDump], signatures: dict[str, Signature]
) -> Disagreement | None:
    views: list[_RankView] = []
    starts: list[int] = []
    for rank in group.members:
        dump = dumps.get(rank)
        if dump is None:
            continue
        track = dump.tracks.get(group.name) if group_key(dump, group.name) == _key(group) else None
        hi = max(track.seqs[-1] if track and track.seqs else 0, _status_enqueued(dump, group.name))
        if track and track.seqs:
            starts.append(track.seqs[0])
        elif dump.first_record_id:
            starts.append(hi + 1)  # its buffer wrapped past every op of this group: nothing before is known
        views.append(_RankView(rank, track, 0, hi))
    if len(views) < 2 and not (views and len(group.members) > 1):
        return None
    common = max(starts, default=1)
    classes: dict[tuple, list[_RankView]] = defaultdict(list)
    for view in views:
        if view.track is not None:
            view.start = bisect.bisect_left(view.track.seqs, common)
            seqs = view.track.seqs[view.start :]
            keys = tuple(view.track.keys[view.start :])
            contiguous = not seqs or seqs[-1] - seqs[0] == len(seqs) - 1
            shape = (seqs[0] if seqs else None, len(seqs)) if contiguous else tuple(seqs)
            classes[(shape, keys, view.hi)].append(view)
        else:
            classes[((None, 0), (), view.hi)].append(view)
    reps = [(members[0], _seq_lookup(members[0]), [v.rank for v in members]) for members in classes.values()]
    last = max((v.hi for v in views), default=0)
    if len(reps) > 1:
        # Only a seq some rank recorded can have two sides (elsewhere every rank is absent or unknown), so
        # the walk covers those: never the span up to a counter, which a dump may set to anything.
        recorded = sorted({seq for _, lookup, _ in reps for seq in lookup if common <= seq <= last})
        for seq in recorded:
            sides: dict[str, list[int]] = defaultdict(list)
            for view, lookup, ranks in reps:
                value = _value_at(view, seq, lookup)
                if value is not _UNKNOWN:
                    sides[value].extend(ranks)
            if len(sides) > 1:
                return _decide(group, seq, dict(sides), dumps, signatures)
    impossible = _impossible_everywhere(group, reps, signatures)
    if impossible is not None:
        return impossible
    a2a = _all_to_all_totals(group, views, common, signatures)
    if a2a is not None:
        return a2a
    return _state_disagreement(group, views, common, dumps)


def _impossible_everywhere(group: Group, reps: list, signatures: dict[str, Signature]) -> Disagreement | None:
    """An op every rank called alike, with sizes no group of this size can run (an all_reduce whose output
    is not its input, an all_gather whose output is not input x group size): the call itself is wrong.
    Only where the group's size is known: members inferred from the ranks that recorded the group (gloo) miss
    those that left no dump."""
    if group.inferred:
        return None
    size = len(group.members)
    for _, lookup, _ranks in reps:
        for seq, key in sorted(lookup.items()):
            sig = signatures.get(key)
            if sig is not None and not _sizes_consistent(sig, size):
                everyone = sorted(r for _, _, members in reps for r in members)
                return Disagreement(
                    group,
                    seq,
                    False,
                    {key: everyone},
                    key,
                    [],
                    "sizes",
                    "size_mismatch",
                    f"every rank called {sig.op} with sizes no group of {size} can run (in "
                    f"{[list(s) for s in sig.input_sizes]}, out {[list(s) for s in sig.output_sizes]}): the call "
                    "itself is wrong on every rank alike",
                )
    return None


def _key(group: Group) -> tuple[str, str | None]:
    return (group.name, group.digest)


def _all_to_all_totals(
    group: Group, views: list[_RankView], common: int, signatures: dict[str, Signature]
) -> Disagreement | None:
    totals: dict[int, list[int]] = {}
    for view in views:
        if view.track is None or not view.track.a2a_numel:
            continue
        for seq, (numel_in, numel_out) in view.track.a2a_numel.items():
            if seq >= common:
                entry = totals.setdefault(seq, [0, 0, 0])
                entry[0] += numel_in
                entry[1] += numel_out
                entry[2] += 1
    for seq in sorted(totals):
        numel_in, numel_out, count = totals[seq]
        if count == len(views) and numel_in != numel_out:
            ranks = [v.rank for v in views]
            facts = {"total_input_numel": numel_in, "total_output_numel": numel_out}
            sent = f"all_to_all totals disagree: the ranks send {numel_in} elements in all and receive {numel_out}"
            odd = _odd_one_out({v.rank: v.track.a2a_numel[seq] for v in views}, numel_in - numel_out)  # type: ignore[union-attr]
            if odd is not None:
                rank, own, usual = odd
                note = (
                    f"{sent}; rank {rank} sends {own[0]} and receives {own[1]} where every other rank sends "
                    f"{usual[0]} and receives {usual[1]}: with its peers' splits the totals would agree"
                )
                return Disagreement(
                    group, seq, False, {"all_to_all": ranks}, None, [rank], "its totals alone off its peers'",
                    "size_mismatch", note, facts | {"sent": own[0], "received": own[1], "peers_send": usual[0]},
                )  # fmt: skip
            return Disagreement(
                group,
                seq,
                False,
                {"all_to_all": ranks},
                None,
                [],
                "undecided",
                "size_mismatch",
                f"{sent}; some rank's split sizes are wrong, and the totals cannot say which",
                facts,
            )
    return None


def _odd_one_out(numels: dict[int, tuple[int, int]], excess: int) -> tuple[int, tuple, tuple] | None:
    """The one rank whose (sent, received) elements differ from every other rank's, which all agree, and
    whose taking its peers' would balance the totals (`excess`: sent less received, over the group); None
    where uneven splits are the job's own (experts' loads) or more than one rank would have to change."""
    pairs = Counter(numels.values())
    if len(numels) < 3 or len(pairs) != 2:
        return None
    (usual, peers), (own, alone) = pairs.most_common()
    if alone != 1 or peers != len(numels) - 1 or (own[0] - usual[0]) - (own[1] - usual[1]) != excess:
        return None
    rank = next(r for r, pair in numels.items() if pair == own)
    return rank, own, usual


def _state_disagreement(
    group: Group, views: list[_RankView], common: int, dumps: dict[int, RankDump]
) -> Disagreement | None:
    """Ops completed on some ranks and still pending on others (only where the backend records states); where
    none completed it, ops begun on some ranks' devices and not on others' (`_not_started`)."""
    first_pending: dict[int, int] = {}
    has_states = False
    for view in views:
        track = view.track
        if track is None:
            continue
        pending = None
        for i in range(view.start, len(track.states)):
            state = track.states[i]
            if state != "scheduled":
                has_states = True
            if state != "completed":
                pending = track.seqs[i]
                break
        if pending is not None:
            first_pending[view.rank] = pending
    if not has_states or not first_pending:
        return None
    seq = min(first_pending.values())
    waiting = sorted(r for r, s in first_pending.items() if s == seq)
    done = sorted(
        v.rank
        for v in views
        if v.track is not None and first_pending.get(v.rank, seq + 1) > seq and seq in v.track.seqs[v.start :]
    )
    if not done:
        # Every member with a dump waits in it (those without one are unknown).
        return _not_started(group, views, seq, dumps) if len(waiting) == len(views) else None
    if len(done) == len(waiting):
        culprits: list[int] = []
        decided = "undecided"
    else:
        culprits = waiting if len(waiting) < len(done) else done
        decided = "majority"
    return Disagreement(
        group,
        seq,
        False,
        {"completed": done, "not completed": waiting},
        None,
        culprits,
        decided,
        "state_mismatch",
    )


def _not_started(group: Group, views: list[_RankView], seq: int, dumps: dict[int, RankDump]) -> Disagreement | None:
    """Every member with a dump waits in the op at `seq`; on some the device began it (`started`), on others not
    (`scheduled`). NCCL records `started` only with TORCH_NCCL_ENABLE_TIMING=1: a start event recorded on the
    communicator's stream, which runs the op only after the work queued before it on the rank's own stream.
    Peers that began it wait inside it for the ranks whose device never reached it: work before it never ended
    there (a kernel that never returns, a wedged GPU). Said only of a rank whose device began no op it has not
    completed, in any group: a device inside another collective waits for that one's peers instead.

    Where no rank with a dump began it, only members that left no dump could say whether theirs did: the ranks
    whose own record shows timing on are candidates with those members (a kernel held before the op may itself
    wait for a peer)."""
    started, behind, op = [], [], "collective"
    for view in views:
        track = view.track
        at = bisect.bisect_left(track.seqs, seq) if track is not None else 0
        if track is None or at >= len(track.seqs) or track.seqs[at] != seq:
            return None
        state = track.states[at]
        signature = dumps[view.rank].signatures.get(track.keys[at])
        op = signature.op if signature is not None else op
        if state == "started":
            started.append(view.rank)
        elif state == "scheduled" and not wait_for.device_inside_an_op(dumps[view.rank]):
            behind.append(view.rank)
        else:
            return None
    if not behind:
        return None
    if not started:
        return _not_started_alone(group, seq, behind, op, dumps)
    note = (
        f"the GPU of {format_ranks(behind)} never began the {op} that {format_ranks(started)} began and "
        f"{'waits' if len(started) == 1 else 'wait'} in"
    )
    sides = {"started": started, "not started": behind}
    return Disagreement(group, seq, False, sides, "started", behind, "its device", "not_started", note)


def _not_started_alone(group: Group, seq: int, behind: list[int], op: str, dumps: dict) -> Disagreement | None:
    """No rank with a dump began the op; the members without one are unknown."""
    unknown = [r for r in group.members if r not in dumps]
    if not unknown or not all(wait_for.records_starts(dumps[r]) for r in behind):
        return None  # without timing no op reads `started`: `scheduled` says nothing
    one = len(unknown) == 1
    note = (
        f"the GPU of {format_ranks(behind)} never began the {op} {'it waits' if len(behind) == 1 else 'they wait'} "
        f"in, inside no other op; {format_ranks(unknown)} left no dump: whether {'its' if one else 'their'} GPU "
        f"began it, or whether the work held on {format_ranks(behind)}'s GPU waits for {'it' if one else 'them'} "
        "(a kernel that waits on a peer), no dump read can tell"
    )
    sides = {"not started": behind, "no dump": unknown}
    detail = {"not_begun": format_ranks(behind), "no_dump": format_ranks(unknown)}
    return Disagreement(group, seq, False, sides, None, [], "undecided", "not_started", note, detail)


def _departure(dump: RankDump, group: Group, seq: int, signatures: dict[str, Signature]) -> int | None:
    """How far this rank's op at `seq` departs from its own history in the group.

    2: an op it never issued before; 1: a known op from a call site it never used for that op; 0: an op and call
    site it used at earlier seqs. None when it cannot be told: no frames, no op at `seq`, no earlier op.
    """
    track = dump.tracks.get(group.name)
    if track is None:
        return None
    i = bisect.bisect_left(track.seqs, seq)
    if i >= len(track.seqs) or track.seqs[i] != seq or i == 0:
        return None
    site = track.sites[i]
    if site is None:
        return None
    op = signatures[track.keys[i]].op
    earlier = {(signatures[k].op, s) for k, s in zip(track.keys[:i], track.sites[:i], strict=True) if s is not None}
    if not earlier:
        return None
    if (op, site) in earlier:
        return 0
    return 1 if any(known_op == op for known_op, _ in earlier) else 2


def _decide(
    group: Group, seq: int, sides: dict[str, list[int]], dumps: dict[int, RankDump], signatures: dict[str, Signature]
) -> Disagreement:
    counts = Counter({value: len(ranks) for value, ranks in sides.items()})
    ranked = counts.most_common()
    top = ranked[0][1]
    # A majority holds only if the members without a dump, all on the runner-up's side, could not tie it.
    unseen = len(_without_a_dump(group, dumps))
    tied = [value for value, n in ranked if n + unseen >= top]
    expected: str | None
    inside = _side_inside_all_rank_call(group, seq, sides, dumps)
    if inside is not None and (len(tied) > 1 or tied[0] != inside):
        # The side inside a call every rank must make is the program, whatever the count: the others skipped it
        # (`if rank == 0:` around a state-dict consolidation leaves the many outside it).
        expected, decided = inside, wait_for.ALL_RANK_CALL
    elif len(tied) == 1:
        expected, decided = tied[0], "majority"
    else:
        expected, decided = _break_tie(group, seq, tied, sides, dumps, signatures)
    if expected is None:
        culprits: list[int] = []
    else:
        culprits = sorted(r for value, ranks in sides.items() if value != expected for r in ranks)
    for ranks in sides.values():
        ranks.sort()
    disagreement = Disagreement(group, seq, False, sides, expected, culprits, decided)
    disagreement.kind = _kind(sides, expected, signatures)
    if decided == wait_for.ALL_RANK_CALL and expected is not None:
        call = _all_rank_call_at(dumps.get(sides[expected][0]), group, seq)
        disagreement.detail = {"all_rank_call": call}
    return disagreement


def _without_a_dump(group: Group, dumps: dict[int, RankDump]) -> set[int]:
    """The group's members that left no dump; for a group whose members were inferred from the ranks that recorded
    it (gloo), also every rank below the highest that dumped and left none (it may be a member)."""
    missing = {r for r in group.members if r not in dumps}
    if group.inferred:
        missing |= set(range(max(dumps, default=-1) + 1)) - dumps.keys()
    return missing


def _break_tie(
    group: Group,
    seq: int,
    tied: list[str],
    sides: dict[str, list[int]],
    dumps: dict[int, RankDump],
    signatures: dict[str, Signature],
) -> tuple[str | None, str]:
    # An op whose own sizes are impossible for the group (all_gather output != input x size) is wrong, unless it
    # ran at an earlier seq (a recorder's shapes are not always the call's: funcol's all_gather on gloo).
    consistent = [
        v
        for v in tied
        if v == ABSENT
        or _sizes_consistent(signatures[v], len(group.members))
        or _ran_before(group, v, seq, sides, dumps)
    ]
    if len(consistent) == 1 and len(tied) == 2:
        return consistent[0], "sizes"
    # A known call at the wrong point of the step decides (`_against_the_step`). Failing that, a call the side
    # never made before (an op, or an op from a new line) against one it always made: most often the new call is
    # the departure (an extra collective, one rank's branch), though the other side may have skipped a new phase
    # every rank was to enter (a checkpoint's first collective): medium confidence at most.
    by_step = _against_the_step(group, seq, tied, sides, dumps)
    if by_step is not None:
        return by_step, "the group's step order"
    if ABSENT not in tied:
        scores: dict[str, int | None] = {}
        for value in tied:
            seen = [_departure(dumps[r], group, seq, signatures) for r in sides[value] if r in dumps]
            scores[value] = None if not seen or None in seen else max(seen)  # type: ignore[type-var]
        known = [v for v in tied if scores[v] is not None]
        if len(known) == len(tied):
            top = max(scores[v] for v in known)  # type: ignore[type-var]
            leaders = [v for v in known if scores[v] == top]
            if top and len(leaders) == 1 and len(tied) == 2:
                return next(v for v in tied if v != leaders[0]), "call-site history"
    if ABSENT in tied and len(tied) == 2:
        # One side waits in the op, the other stopped issuing collectives: the stop is the departure. A new call
        # site on the waiting side proves nothing (the first step after a warm-up is called from a new line).
        return next(v for v in tied if v != ABSENT), "stopped issuing"
    return None, "undecided"


def _side_inside_all_rank_call(
    group: Group, seq: int, sides: dict[str, list[int]], dumps: dict[int, RankDump]
) -> str | None:
    """Of two sides, the one whose op at `seq` was issued inside a call every rank must make (a checkpoint's save,
    a state-dict consolidation), where the other side's was not: the other side skipped that call. Its first
    collective is a call the side never made before, which alone would read as an extra call, and its side may
    be the fewer."""
    if len(sides) != 2 or ABSENT in sides:
        return None
    calls = {v: [_all_rank_call_at(dumps.get(r), group, seq) for r in ranks] for v, ranks in sides.items()}
    inside = [v for v in sides if calls[v] and all(calls[v])]
    if len(inside) != 1 or any(any(calls[v]) for v in sides if v != inside[0]):
        return None
    return inside[0]


def _all_rank_call_at(dump: RankDump | None, group: Group, seq: int) -> str | None:
    i = _entry_at(dump, group, seq) if dump is not None else None
    return dump.tracks[group.name].all_rank_calls.get(i) if i is not None else None


def _ran_before(group: Group, value: str, seq: int, sides: dict[str, list[int]], dumps: dict[int, RankDump]) -> bool:
    """The same op (comparison key) at an earlier seq of the group: it ran then, so its sizes are possible."""
    for rank in sides.get(value, [])[:1]:
        track = dumps[rank].tracks.get(group.name) if rank in dumps else None
        if track is not None:
            return any(k == value for k, s in zip(track.keys, track.seqs, strict=True) if s < seq)
    return False


_LONGEST_STEP = 64  # ops of one group in one training step, at most, when looking for the step's period


def _group_steps(dump: RankDump, group: Group) -> dict[int, tuple]:
    """seq -> (comparison key, call site) of this rank's ops in the group."""
    track = dump.tracks.get(group.name)
    if track is None:
        return {}
    return {s: (k, site) for s, k, site in zip(track.seqs, track.keys, track.sites, strict=True)}


def _against_the_step(
    group: Group, seq: int, tied: list[str], sides: dict[str, list[int]], dumps: dict[int, RankDump]
) -> str | None:
    """An even split decided by the group's own step: where every side issued the same ops (and call sites) up to
    some seq, those ops repeat with a period P (the group's ops in one training step); at the first seq where the
    sides' calls differ, the side that issued what the step issued P ops earlier kept the program, and the other
    departed, provided what it issued instead is an op of the repeating step (a skipped or reordered call). An op
    the step does not hold may belong to a phase every rank was to enter: never seen before (a checkpoint's first
    collective), or seen only before the repeating part began (a barrier every fifth step, which the last steps
    do not show): a second rank cannot tell that from an extra call. None when the history shows no period or
    does not decide."""
    reps = {v: sides[v][0] for v in tied if v != ABSENT and sides[v] and sides[v][0] in dumps}
    if len(reps) != len(tied) or len(reps) != 2:
        return None
    ops = {v: _group_steps(dumps[r], group) for v, r in reps.items()}
    first, second = (ops[v] for v in reps)
    shared = sorted(s for s in first if s < seq and first[s] == second.get(s))
    split = min((s for s in first if s in second and s <= seq and first[s] != second[s]), default=seq)
    history = [first[s] for s in shared if s < split]
    found = _period(history)
    if found is None:
        return None
    period, repeating = found
    if split - period not in first or first.get(split - period) != second.get(split - period):
        return None
    expected = first[split - period]
    keeping = [v for v in reps if ops[v].get(split) == expected]
    if len(keeping) != 1:
        return None
    departed = next(v for v in reps if v not in keeping)
    instead = ops[departed].get(split)
    return keeping[0] if instead is not None and instead in history[-repeating:] else None


def _period(history: list[tuple]) -> tuple[int, int] | None:
    """The group's step: the period P that the history's longest repeating end follows, and that end's length
    (at least two steps). The longest, not the smallest: a step's run of alike ops (one all_gather per block)
    repeats with period 1 over a few entries, while the step itself repeats over the whole history."""
    best: tuple[int, int] | None = None
    for period in range(1, min(_LONGEST_STEP, len(history) // 2) + 1):
        start = len(history) - period
        while start > 0 and history[start - 1] == history[start - 1 + period]:
            start -= 1
        repeating = len(history) - start
        if repeating >= 2 * period and (best is None or repeating > best[1]):
            best = (period, repeating)
    return best


def _sizes_consistent(sig: Signature, group_size: int) -> bool:
    op = sig.op
    if not sig.input_sizes or not sig.output_sizes:
        return True
    if op in ("all_reduce", "allreduce"):
        return sig.input_sizes == sig.output_sizes
    if op in ("all_gather", "_all_gather_base", "all_gather_into_tensor", "all_gather_into_tensor_coalesced"):
        return sig.output_numel == sig.input_numel * group_size
    if op in ("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"):
        return sig.input_numel == sig.output_numel * group_size
    return True


def _kind(sides: dict[str, list[int]], expected: str | None, signatures: dict[str, Signature]) -> str:
    values = list(sides)
    if ABSENT in values:
        return "not_joined"
    reference = signatures[expected] if expected else signatures[values[0]]
    others = [signatures[v] for v in values if v != expected]
    if expected is None:
        others = [signatures[v] for v in values[1:]]
    if any(o.op != reference.op for o in others):
        return "op_mismatch"
    if any((o.input_sizes, o.output_sizes) != (reference.input_sizes, reference.output_sizes) for o in others):
        return "size_mismatch"
    if any((o.input_dtypes, o.output_dtypes) != (reference.input_dtypes, reference.output_dtypes) for o in others):
        return "dtype_mismatch"
    return "op_mismatch"


# ------------------------------------------------------------------------------------------------------ verdict


def _entry_at(dump: RankDump, group: Group, seq: int) -> int | None:
    return wait_for.position_in_track(dump, group.name, seq)


def _last_op(dump: RankDump) -> tuple[str, int] | None:
    """The group and seq of the last collective this rank enqueued (in record order)."""
    last = wait_for.last_op(dump)
    return (last.group, last.seq) if last else None


def rank_positions(load: LoadResult, programs: dict[int, wait_for.Program] | None = None) -> dict[int, RankPosition]:
    """Where each rank is by its flight recorder: where the recorder marks ops completed (NCCL), in the first op
    that has not (its ops return at once and those it issued after wait behind it); else in its last
    collective, or past it if that completed. `programs`, when the wait-for graph has read them, say it."""
    found = {}
    for dump in load.dumps:
        program = programs.get(dump.rank) if programs is not None else None
        if program is not None and program.dump is dump:
            last = (program.last.group, program.last.seq) if program.last is not None else None
            pending = program.waiting if program.stateful else None
        else:
            last = _last_op(dump)
            pending = wait_for.first_pending(dump) if last is not None and wait_for.records_states(dump) else None
        if last is None:
            continue
        if pending is not None:
            members = (
                load.ranks_of(dump.pg_config[pending.group].ranks_digest) if pending.group in dump.pg_config else None
            )
            peer = None
            if pending.peer is not None and members and 0 <= pending.peer < len(members):
                peer = members[pending.peer]
            found[dump.rank] = RankPosition(
                dump.rank, RankState.COLLECTIVE, pending.op, pending.frame, pending.frame, SourceKind.FLIGHT_RECORDER,
                dump.path, process_group=pending.group, seq=pending.seq, peer=peer,
            )  # fmt: skip
            continue
        pg, seq = last
        track = dump.tracks[pg]
        sig = dump.signatures.get(track.keys[-1])
        op = sig.op if sig is not None else "?"
        state = RankState.BETWEEN if track.states[-1] == "completed" else RankState.COLLECTIVE
        site = track.sites[-1]
        found[dump.rank] = RankPosition(
            dump.rank, state, op, site, site, SourceKind.FLIGHT_RECORDER, dump.path, process_group=pg, seq=seq
        )
    return dict(sorted(found.items()))


def _describe(sig: Signature | None) -> str:
    if sig is None:
        return "?"
    dtypes = sorted(set(sig.input_dtypes) | set(sig.output_dtypes))
    return (
        f"{sig.op} (in {list(map(list, sig.input_sizes))}, out {list(map(list, sig.output_sizes))}, {'/'.join(dtypes)})"
    )


def _side_text(value: str, signatures: dict[str, Signature]) -> str:
    if value == ABSENT:
        return "never enqueued it"
    return _describe(signatures.get(value)) if value in signatures else value


def _evidence_for(d: Disagreement, dumps: dict[int, RankDump], signatures: dict[str, Signature]) -> list[Evidence]:
    evidence = []
    order = d.culprits + [r for ranks in d.sides.values() for r in ranks if r not in d.culprits]
    for rank in order[: _MAX_EVIDENCE * 2]:
        dump = dumps.get(rank)
        if dump is None:
            continue
        i = _entry_at(dump, d.group, d.seq) if not d.p2p else None
        line = None
        if i is not None:
            track = dump.tracks[d.group.name]
            site = track.sites[i]
            line = track.indices[i]
            what = _describe(signatures.get(track.keys[i]))
            if d.seq in track.a2a_numel:  # all_to_all: the key leaves sizes out, each rank has its own
                sent, received = track.a2a_numel[d.seq]
                what = f"{what.split(' ', 1)[0]} (its own: {sent} elements sent, {received} received)"
            text = f"entries[{track.indices[i]}]: {what}, seq {d.seq}, state {track.states[i]}" + (
                f", called at {site}" if site else ""
            )
        else:
            last = _last_op(dump)
            if last:
                line = dump.tracks[last[0]].indices[-1]
            text = f"no entry for seq {d.seq} of {d.group.label}" + (
                f"; its last op is entries[{line}], seq {last[1]} of pg {last[0]}" if last else ""
            )
        # `line` is the index of the entry in the dump's `entries` list.
        evidence.append(Evidence("flight_recorder", dump.path, line, rank, text))
        if len(evidence) >= _MAX_EVIDENCE:
            break
    return evidence


def _message(d: Disagreement, signatures: dict[str, Signature]) -> str:
    where = f"{'p2p op' if d.p2p else 'collective'} seq {d.seq} of {d.group.label}"
    if d.note:
        head = f"{d.note} ({where})"
    else:
        parts = [f"{format_ranks(r)}: {_side_text(v, signatures)}" for v, r in d.sides.items()]
        head = f"{d.kind.replace('_', ' ')} at {where}: " + "; ".join(parts)
    if d.culprits:
        how = {
            "majority": "the minority",
            "call-site history": "its call site departs from the one it used for earlier seqs; unless every rank was "
            "to make that new call and the others skipped it",
            "stopped issuing": "its peers wait in the op while it stopped issuing collectives, or never issued one",
            "sizes": "its sizes are impossible for the group size",
            "the group's step order": "the group's ops repeat every step, and at this point of the step it issued "
            "an op its step issues elsewhere",
            "its device": "it enqueued the op like its peers, but work queued before it on its GPU never ended: a "
            "kernel that does not return, or a GPU that stopped",
            wait_for.ALL_RANK_CALL: f"its peers wait inside {d.detail.get('all_rank_call')}, which every rank must "
            "call; it never entered it",
        }.get(d.decided_by, d.decided_by)
        return f"{head} — {format_ranks(d.culprits)} departed ({how})"
    if d.decided_by == "undecided" and len(d.sides) > 1 and not d.note:
        return f"{head} — an even split that the call-site history cannot decide"
    return head


def _call_sites(d: Disagreement, dumps: dict[int, RankDump]) -> dict[str, str]:
    sites = {}
    for ranks in d.sides.values():
        for rank in ranks[:8]:
            dump = dumps.get(rank)
            i = _entry_at(dump, d.group, d.seq) if dump and not d.p2p else None
            if i is not None and dump.tracks[d.group.name].sites[i]:
                sites[str(rank)] = str(dump.tracks[d.group.name].sites[i])
    return sites


def _divergence(d: Disagreement, dumps: dict[int, RankDump]) -> tuple[int, Frame | None, Frame | None] | None:
    """Where the culprit's program first left its peers' in the group: the first seq at or before the
    disagreement where its op or call site differs from a peer's on the side it departed from (ops of one kind
    and size from another line, or from a thread with no Python frames, complete on NCCL and shift every later
    op). (seq, the culprit's call site there, the peer's), or None when they first differ at the disagreement."""
    peers = d.sides.get(d.expected or "", []) if d.expected else []
    culprit = next((r for r in d.culprits if r in dumps), None)
    peer = next((r for r in peers if r in dumps), None)
    if culprit is None or peer is None:
        return None
    mine, theirs = _group_steps(dumps[culprit], d.group), _group_steps(dumps[peer], d.group)
    first = min((s for s in mine if s in theirs and s < d.seq and mine[s] != theirs[s]), default=None)
    if first is None:
        return None
    return first, mine[first][1], theirs[first][1]


def _culprit_site(d: Disagreement, dumps: dict[int, RankDump]) -> tuple[int, Frame] | None:
    """Where the culprit is: its op at the seq, or (if it never enqueued it) its last op."""
    for rank in d.culprits:
        dump = dumps.get(rank)
        if dump is None:
            continue
        i = _entry_at(dump, d.group, d.seq)
        if i is not None and dump.tracks[d.group.name].sites[i]:
            return rank, dump.tracks[d.group.name].sites[i]  # type: ignore[return-value]
        if d.kind == "not_started":
            continue  # its host went on to this op: an earlier call is not where it is
        last = _last_op(dump)
        if last:
            track = dump.tracks[last[0]]
            if track.sites[-1]:
                return rank, track.sites[-1]  # type: ignore[return-value]
    return None


def _last_seq_facts(group: Group, dumps: dict[int, RankDump]) -> dict[str, str]:
    by_seq: dict[int, list[int]] = defaultdict(list)
    for rank in group.members:
        dump = dumps.get(rank)
        if dump is None:
            continue
        track = dump.tracks.get(group.name)
        by_seq[max(track.seqs[-1] if track and track.seqs else 0, _status_enqueued(dump, group.name))].append(rank)
    return {str(seq): format_ranks(ranks) for seq, ranks in sorted(by_seq.items())}


def build_verdict(load: LoadResult) -> Verdict:
    """The verdict of the dumps alone (`torchtriage fr`)."""
    return verdict_of(assess_dumps(load))


def _disagreements(
    groups: dict, dumps: dict[int, RankDump], signatures: dict[str, Signature]
) -> tuple[list[Disagreement], dict[str, list[int]]]:
    """Every group's first disagreement (collective and p2p), and the members each group has no dump of."""
    missing_by_group: dict[str, list[int]] = {}
    disagreements: list[Disagreement] = []
    for group in sorted(groups.values(), key=lambda g: (len(g.members) == 0, g.name)):
        missing = [r for r in group.members if r not in dumps]
        if missing:
            missing_by_group[group.label] = missing
        for found in (collective_disagreement(group, dumps, signatures), p2p_disagreement(group, dumps)):
            if found is not None:
                disagreements.append(found)
    return disagreements, missing_by_group


def _causes_and_collateral(
    disagreements: list[Disagreement], programs: dict[int, wait_for.Program]
) -> tuple[list[Disagreement], list[Disagreement]]:
    """A rank blamed in one group's disagreement (it never issued the op there, or issued another) while it waits
    in an op of another group is held there: its side of this group says nothing of who departed, and the
    disagreement is collateral. The question moves to the group it waits in (and, across groups, to the wait-for
    graph)."""
    waits_in = {rank: p.waiting.group for rank, p in programs.items() if p.waiting is not None}
    primary: list[Disagreement] = []
    collateral: list[Disagreement] = []
    for d in disagreements:
        # A device that never began an op and is inside none (not_started) is held by no other group's op.
        held = [r for r in d.culprits if waits_in.get(r, d.group.name) != d.group.name and d.kind != "not_started"]
        (collateral if d.culprits and len(held) == len(d.culprits) else primary).append(d)
    primary.sort(key=lambda d: (not d.culprits, d.kind == "state_mismatch", d.group.name != "0", d.seq))
    return primary, collateral


def _finding(d: Disagreement, role: str, dumps: dict[int, RankDump], signatures: dict[str, Signature]) -> Finding:
    ranks = d.culprits or sorted(r for ranks in d.sides.values() for r in ranks)
    facts = {"seq": d.seq, "group": d.group.label}
    if not d.culprits and d.decided_by == "undecided":
        facts["undecided"] = True
    if d.decided_by == wait_for.ALL_RANK_CALL:
        facts[PREMISE] = ALL_RANK_CALLS
    facts |= d.detail
    evidence = _evidence_for(d, dumps, signatures)
    return Finding(_KIND_PREFIX + d.kind, ranks, _message(d, signatures), role, "hang", evidence, facts)


def _problems(load: LoadResult, missing_by_group: dict[str, list[int]]) -> list[str]:
    problems = [f"{p.path}: {p.message}" for p in load.problems]
    versions = Counter(d.version for d in load.dumps)
    if len(versions) > 1:
        problems.append(
            "the dumps come in several format versions ("
            + ", ".join(f"{v}: {n} ranks" for v, n in versions.most_common())
            + "); were they written by one job?"
        )
    all_missing = sorted({r for ranks in missing_by_group.values() for r in ranks})
    if all_missing:
        problems.append(
            f"no dump for {format_ranks(all_missing)} (members of "
            + ", ".join(missing_by_group)
            + "): their side of each collective is unknown; look for their dumps (a rank that hung in teardown "
            "or was killed often writes none)"
        )
    return problems


def _missing_dump(missing: list[int], waiting: list[int]) -> Finding:
    """Every dump agrees and its rank waits: a missing rank may have hung or died (a hung rank often never
    dumps), or its dump was lost and any rank may be behind. Candidates, the missing ranks first to look at."""
    candidates = sorted({*missing, *waiting})
    message = (
        f"{format_ranks(missing)} wrote no dump while every rank that did agrees and waits in its last collective: "
        f"a rank that hung or died often never dumps, but a dump may also be lost; {format_ranks(candidates)} are "
        f"the candidates, {format_ranks(missing)} first"
    )
    facts = {"undecided": True, "candidates": candidates}
    return Finding("fr.missing_dump", missing, message, "symptom", "hang", facts=facts)


def _waiting_alike(waiting: list[int], dumps: dict[int, RankDump]) -> Finding:
    """Every dump agrees, and `waiting` still wait in their last op: the op order cannot tell who is behind. What
    can: each device's progress (`started`, NCCL with TORCH_NCCL_ENABLE_TIMING=1, where it said nothing here),
    or the stacks."""
    timed = any(wait_for.records_starts(d) or wait_for.device_inside_an_op(d) for d in dumps.values())
    nccl = any(d.backend == "nccl" for d in dumps.values())
    message = (
        f"Every dump agrees and {format_ranks(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in the last op "
        "they issued: the op order cannot tell which rank is behind; every rank is a candidate"
    )
    facts = {"undecided": True, "candidates": waiting, "untimed": nccl and not timed}
    return Finding("fr.waiting_alike", waiting, message, "symptom", "hang", facts=facts)


def _load_facts(load: LoadResult, groups: dict, missing: list[int], timed_out: list) -> dict:
    versions = Counter(d.version for d in load.dumps)
    facts: dict = {
        "ranks_loaded": len(load.dumps),
        "backend": Counter(d.backend for d in load.dumps).most_common(1)[0][0] if load.dumps else "",
        "format_version": versions.most_common(1)[0][0] if versions else "",
        "process_groups": {
            g.label: {"size": len(g.members), "members_inferred": g.inferred} for g in list(groups.values())[:32]
        },
    }
    if missing:
        facts["missing_ranks"] = format_ranks(missing)
    if any(wait_for.records_starts(d) for d in load.dumps):
        # What the job already had set: an action asking for it again would send the user in a circle.
        facts["env_in_effect"] = {"TORCH_NCCL_ENABLE_TIMING": "1"}
    if timed_out:
        facts["timed_out"] = [{"rank": r, "pg": pg, "seq": seq} for r, pg, seq in timed_out[:16]]
    return facts


def assess_dumps(load: LoadResult) -> Assessment:
    """What the flight recorder says: the first collective where the ranks disagree, and who departed."""
    dumps = {d.rank: d for d in load.dumps}
    signatures: dict[str, Signature] = {}
    for dump in load.dumps:
        signatures.update(dump.signatures)
    groups = build_groups(load)
    disagreements, missing_by_group = _disagreements(groups, dumps, signatures)
    all_missing = sorted({r for ranks in missing_by_group.values() for r in ranks})
    graph, programs = _wait_for(load, groups, dumps)
    primary, collateral = _causes_and_collateral(disagreements, programs)
    per_group = sorted({r for d in primary if d.culprits and d.kind != "state_mismatch" for r in d.culprits})
    # Per group, the majority can be the victims of a rank that waits in another group: where the graph
    # of who waits for whom decides otherwise, it leads and the groups' disagreements are its aftermath.
    # A cycle is told only by the graph; a sink the groups' own disagreement says as well, when it agrees.
    graph_leads = graph.kind in ("cycle", "p2p", "no_dump", "stopped", "lone_waiter") or (
        graph.kind in ("sink", "not_begun", "shifted", "odd_waiter") and sorted(graph.culprits) != per_group
    )
    if graph_leads:
        primary, collateral = [], primary + collateral
        for d in collateral:  # what a group's majority said is superseded: no side of it departed
            d.culprits, d.decided_by = [], "the wait-for graph"
    findings = [
        _finding(d, "primary" if d.culprits and d.kind != "state_mismatch" else "symptom", dumps, signatures)
        for d in primary
    ] + [_finding(d, "collateral", dumps, signatures) for d in collateral]

    lead = primary[0] if primary else None
    culprits = per_group
    confidence = "low"
    if lead is not None and culprits:
        confidence = {"majority": "high", "sizes": "high"}.get(lead.decided_by, "medium")
    if lead is not None and lead.kind == "state_mismatch" and not culprits:
        culprits = list(lead.culprits)
    if graph_leads:
        findings.insert(0, _graph_finding(graph, programs, groups, dumps))
        culprits = list(graph.culprits)
        confidence = _GRAPH_CONFIDENCE.get(graph.decided_by, "medium") if culprits else "low"
        if graph.decided_by == wait_for.NO_DUMP and not set(culprits) <= load.known_ranks:
            # Dumps gathered without the run's identity records beside them: a living rank's dump lost on the way
            # reads the same as a rank that died (the simulator, one dump lost: 48 of 360 named at medium wrong).
            confidence = "low"
    # Blamed for waiting in no recorded op: a claim that another source (the stacks) can contradict.
    in_no_op = [r for r in culprits if r in programs and programs[r].waiting is None]
    unrecorded, shown = fr_unrecorded.may_wait_unrecorded(culprits, programs, groups, dumps)
    unrecorded_candidates: list[int] = []
    if unrecorded:
        unrecorded_note = fr_unrecorded.unrecorded_finding(unrecorded, dumps)
        findings.append(unrecorded_note)
        confidence = "medium" if confidence == "high" else confidence
        waiting_for_them = {r for r, t in graph.edges.items() if t & set(culprits)}
        # only gloo's own recorder leaves unrecorded p2p; a dump with no entry names no backend: the job's
        gloo = (dumps[culprits[0]].backend or fr_unrecorded.job_backend(dumps)) == "gloo"
        if (
            set(unrecorded) >= set(culprits)
            and graph.kind == "sink"
            and fr_unrecorded.cannot_tell(culprits, waiting_for_them, shown, gloo)
        ):
            unrecorded_candidates = sorted(set(culprits) | waiting_for_them)
            culprits, confidence = [], "low"
    compared = any(len([r for r in g.members if r in dumps]) > 1 for g in groups.values())
    waiting = _waiting_ranks(dumps)
    missing_note = None
    if not culprits and not graph_leads and all_missing and compared and waiting:
        missing_note = _missing_dump(all_missing, waiting)
        findings.append(missing_note)
    alike = _waiting_alike(waiting, dumps) if not findings and compared and waiting else None
    if alike is not None:
        findings.append(alike)

    timed_out = sorted({(d.rank, pg, seq) for d in load.dumps for pg, seq in d.timed_out})
    category = "nccl_timeout" if timed_out else "hang"
    for finding in findings:
        finding.category = category
    facts = _load_facts(load, groups, all_missing, timed_out) | wait_for_findings.facts(graph)
    if in_no_op:
        facts["in_no_op"] = in_no_op
    if graph_leads and graph.decided_by == wait_for.NO_DUMP:
        # Blamed for leaving no dump: a claim the stacks contradict where they show the rank alive and waiting.
        facts["no_dump_blamed"] = list(graph.culprits)
    if unrecorded:
        facts["may_wait_unrecorded"] = {str(rank): sorted(where) for rank, where in unrecorded.items()}
    where = rank_positions(load, programs)
    facts["position_by_rank"] = {str(rank): describe(p) for rank, p in list(where.items())[:64]}
    blaming = next((f for f in findings if f.blames), None)  # the missing ranks, when nothing else decides
    if graph_leads:
        facts |= _graph_facts(graph, programs, groups, dumps, findings[0])
    elif lead is not None:
        facts.update(_lead_facts(lead, dumps, signatures))
        where = _culprit_site(lead, dumps) if culprits else None
        departed = _divergence(lead, dumps) if culprits else None
        if departed is not None:
            facts |= _departure_facts(lead, departed)
            site = departed[1] or departed[2]
            where = (lead.culprits[0], site) if site is not None else where
            findings[0].message += facts["departure"]
        if where is not None:
            # A rank that never enqueued the op is somewhere after its last recorded call, not at it.
            # (Unless its record shows where it left its peers' program: that is its line.)
            last_call = lead.kind == "not_joined" and departed is None
            facts["last_call_site" if last_call else "user_frame"] = where[1].to_fact(where[0])
        if not culprits and lead.decided_by == "undecided":
            facts["candidates"] = sorted(r for ranks in lead.sides.values() for r in ranks)
        if culprits and findings[0].role == "primary":
            blaming = findings[0]
            blaming.blames = True
            if where is not None:
                blaming.facts["site"] = str(where[1])
    if unrecorded_candidates:
        facts["candidates"] = unrecorded_candidates
        findings[0].blames, findings[0].role = False, "symptom"
        findings[0].facts |= {"undecided": True, "candidates": unrecorded_candidates}
        blaming = None
    if alike is not None:
        facts["candidates"] = alike.ranks
        summary = alike.message
    elif missing_note is not None:
        facts["candidates"] = missing_note.facts["candidates"]
        summary = missing_note.message
    elif graph_leads:
        summary = findings[0].message
    elif unrecorded_candidates:
        summary = (
            f"{unrecorded_note.message}: {format_ranks(unrecorded_candidates)} are the candidates, the ranks in no "
            "recorded op and those waiting for them"
        )
    else:
        summary = (
            _summary(lead, culprits, findings, load) if findings or compared else _cannot_compare(load, groups, dumps)
        )
    sources = [d.path for d in load.dumps]
    return Assessment(
        source="flight_recorder",
        findings=findings,
        summary=summary,
        category=category if findings else "unknown",
        culprits=culprits,
        confidence=confidence if findings else ("medium" if compared else "low"),
        facts=facts | {"compared": compared},
        files=sources if len(sources) <= 64 else sources[:64] + [f"… and {len(sources) - 64} more"],
        problems=_problems(load, missing_by_group),
        lead=findings[0] if findings else None,
        blaming=blaming,
    )


def _departure_facts(lead: Disagreement, departed: tuple[int, Frame | None, Frame | None]) -> dict:
    seq, mine, theirs = departed
    culprit = format_ranks(lead.culprits)
    where_mine = f"at {mine.site} in {mine.function}" if mine else "from a thread with no Python frames (autograd's)"
    where_theirs = f"at {theirs.site} in {theirs.function}" if theirs else "from a thread with no Python frames"
    said = (
        f"; {culprit}'s program left its peers' earlier, at seq {seq} of {lead.group.label}: it called {where_mine} "
        f"where its peers called {where_theirs}"
    )
    return {"departure": said, "departed_at_seq": seq}


def _lead_facts(lead: Disagreement, dumps: dict[int, RankDump], signatures: dict[str, Signature]) -> dict:
    facts = {
        "pg": lead.group.name,
        "pg_desc": lead.group.desc,
        "pg_size": len(lead.group.members),
        "seq": lead.seq,
        "seq_kind": "p2p_seq_id" if lead.p2p else "collective_seq_id",
        "decided_by": lead.decided_by,
        "sides": {format_ranks(ranks): _side_text(value, signatures) for value, ranks in list(lead.sides.items())[:8]},
        "last_enqueued_seq": _last_seq_facts(lead.group, dumps),
        "call_sites": _call_sites(lead, dumps),
    } | lead.detail
    if lead.expected and lead.expected != ABSENT and lead.expected in signatures:
        sig = signatures[lead.expected]
        facts["op"] = sig.op
        facts["sizes"] = {"input": [list(s) for s in sig.input_sizes], "output": [list(s) for s in sig.output_sizes]}
    return facts


def _cannot_compare(load: LoadResult, groups: dict, dumps: dict[int, RankDump]) -> str:
    """What a single dump (or dumps of disjoint groups) lets us say: nothing across ranks, and where it is."""
    ranks = sorted(d.rank for d in load.dumps)
    if not ranks:
        return "No flight-recorder dump could be read"
    members = sorted({r for g in groups.values() for r in g.members} - set(ranks))
    if not members:
        return f"{format_ranks(ranks)} alone in its groups: nothing to compare across ranks"
    where = []
    for rank in ranks[:4]:
        last = _last_op(dumps[rank])
        if last is not None:
            state = dumps[rank].tracks[last[0]].states[-1]
            where.append(f"rank {rank}'s last collective is seq {last[1]} of pg {last[0]} ({state})")
    shown = f" ({'; '.join(where)})" if where else ""
    return (
        f"cannot compare: only {format_ranks(ranks)}'s dump was read{shown}; the dumps of {format_ranks(members)}, "
        "members of its groups, are missing. A collective is judged across the ranks of its group: give every "
        "rank's dump"
    )


_GRAPH_CONFIDENCE = {
    "sink": "high",
    "its peers' program order and its own": "high",
    "its peers' program order": "medium",
    # Two stories: the rest skipped a phase every rank enters, or the majority added a call together.
    wait_for.NEW_PHASE: "medium",
    "its own program order, its peers keeping theirs": "high",
    "its own program order": "medium",
    "its own program order, with a call it never made before": "medium",
    "one op more than every rank that entered the new phase": "medium",
    wait_for.LEFT_EARLY: "medium",
    wait_for.LEFT_MID_STEP: "medium",
    # Every other member agrees against it, but one story of one rank's extra op against all others' early stop.
    wait_for.ONE_OP_AHEAD: "medium",
    # The rest agree against it, and the idle ranks may wait for it unrecorded: one departure explains all.
    wait_for.ODD_WAITER: "medium",
    # Two stories leave the same records (its loop ended sooner, or its peer's ran longer): no third rank counts.
    wait_for.LOOP_LENGTH: "low",
    "its own program order, seen once before": "medium",
    "the ops between its collectives, its peers keeping theirs": "high",
    wait_for.PROGRESS_STOPPED: "medium",
    # Its own record says its device never began the op: what held the device before it (a kernel that never
    # returns, a kernel that waits on a peer) the dumps cannot say.
    wait_for.NOT_BEGUN: "medium",
    # The waits end in a rank with no dump: it died, or hangs where nothing recorded it. Its stack (or the
    # capture's note that it has no process) confirms it.
    wait_for.NO_DUMP: "medium",
    wait_for.ALL_RANK_CALL: "medium",
}


def _wait_for(load: LoadResult, groups: dict, dumps: dict[int, RankDump]):
    programs = wait_for.programs_of(load)
    # The world: every member of a group, every rank up to the highest that dumped (ranks are numbered from 0; a
    # rank below it with no dump existed), and the ranks other sources know.
    world = {r for g in groups.values() for r in g.members} | set(range(max(dumps, default=-1) + 1))
    world |= load.known_ranks

    def members_of(rank: int, name: str) -> tuple[int, ...]:
        group = groups.get(group_key(dumps[rank], name))
        return group.members if group is not None else ()

    def unseen_of(rank: int, name: str) -> tuple[int, ...] | None:
        """A group whose members were inferred from the ranks that recorded it (gloo) may have members that
        recorded nothing of it: ranks of the world that left no dump, and ranks whose dump holds no op of the
        group (c10d makes every rank create every group, member or not; a member records only what it issued)."""
        group = groups.get(group_key(dumps[rank], name))
        if group is None or not group.inferred:
            return None
        return tuple(sorted(world - set(group.members)))

    graph = wait_for.wait_for_graph(programs, members_of, unseen_of)
    return wait_for.decide(graph, programs, members_of), programs


def _graph_finding(graph, programs, groups: dict, dumps: dict[int, RankDump]) -> Finding:
    def label_of(rank: int, name: str) -> str:
        group = groups.get(group_key(dumps[rank], name))
        return group.label if group is not None else f"pg {name}"

    return wait_for_findings.finding(graph, programs, label_of, lambda rank: dumps[rank].path)


def _graph_facts(graph, programs, groups: dict, dumps: dict[int, RankDump], lead: Finding) -> dict:
    """The graph's verdict for JSON readers: the op the culprit issued (`pg`, `seq`, its frame), and the op
    its peers wait in for it (`peers_wait_in`)."""
    facts: dict = {"decided_by": graph.decided_by}
    for key in ("seq", "group", "candidates", "candidates_above"):
        if key in lead.facts:
            facts[key] = lead.facts[key]
    if not graph.culprits:
        return facts
    culprit = graph.culprits[0]
    issued = graph.departure.get("issued")
    if issued is None and graph.kind == "sink":
        issued = programs[culprit].last
    if issued is not None:
        group = groups.get(group_key(dumps[culprit], issued.group))
        seq_kind = "collective_seq_id" if issued.peer is None else "p2p_seq_id"
        facts |= {"pg": issued.group, "pg_size": len(group.members) if group else None, "seq_kind": seq_kind}
        if issued.frame is not None:
            facts["user_frame" if graph.kind == "cycle" else "last_call_site"] = issued.frame.to_fact(culprit)
    for rank, targets in sorted(graph.edges.items()):
        waiting = programs[rank].waiting
        if culprit in targets and waiting is not None:
            group = groups.get(group_key(dumps[rank], waiting.group))
            facts["peers_wait_in"] = {
                "pg": waiting.group,
                "group": group.label if group else waiting.group,
                "seq": waiting.seq,
                "op": waiting.op,
            }
            break
    return facts


def _waiting_ranks(dumps: dict[int, RankDump]) -> list[int]:
    """The ranks whose last op is still pending (for backends that record states), or whose states are unknown
    (gloo records every entry `scheduled`)."""
    return sorted(r for r, d in dumps.items() if (last := _last_op(d)) and d.tracks[last[0]].states[-1] != "completed")


def _summary(lead: Disagreement | None, culprits: list[int], findings, load: LoadResult) -> str:
    if lead is None:
        if culprits:
            return findings[-1].message
        return (
            f"The {len(load.dumps)} dumps agree: every rank issued the same collectives in the same order "
            "and no p2p op lacks its peer"
        )
    op = f"seq {lead.seq} of {lead.group.label}"
    if lead.kind == "not_joined" and culprits and lead.expected != ABSENT:
        waiting = lead.sides.get(lead.expected or "", [])
        return (
            f"{format_ranks(culprits)} never enqueued {'p2p op' if lead.p2p else 'collective'} {op} "
            f"that {format_ranks(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in"
        )
    return findings[0].message if findings else f"disagreement at {op}"
