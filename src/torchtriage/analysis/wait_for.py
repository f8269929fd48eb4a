"""Who waits for whom: the wait-for graph of a hang that crosses process groups.

Per rank, from its flight-recorder entries: its program (every collective and recorded send or recv it
issued, in record order, across all its groups) and the one it waits in. An edge runs from each waiting
rank to each member of that op's group that is not in it: that has not issued it, or, where the recorder
says which ops completed (NCCL), that issued it but waits in an earlier op of its own (its collectives
return at once and queue on the device behind the one that cannot complete). A rank waiting in a send or
recv waits for its peer, unless the peer waits in the op it pairs with. Then:

- a rank that others wait for and that waits in no collective (a sink) is the culprit; so is one that waits
  in the op but whose device never began it (NCCL with TORCH_NCCL_ENABLE_TIMING=1 records starts): it waits
  for its own device, not for its peers;
- where the chains end in a cycle instead — ranks waiting in one group for peers that wait in another
  group for them — the job deadlocked, and the culprit is the rank whose program departs first: from
  what its peers issued after the last op they all share (a strict majority), or from what it issued
  itself after the same op in earlier steps. Neither deciding, the cycle's ranks are the candidates:
  never the ranks that merely wait on them, whom a majority rule per group would blame.

Pure: takes the loaded dumps and their groups, returns a `WaitFor`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from itertools import compress, count, repeat
from operator import ne
from typing import Any

from torchtriage.analysis.fr_p2p import counterpart
from torchtriage.sources.flight_recorder import LoadResult, P2POp, RankDump

_STATELESS = frozenset(("scheduled", ""))  # gloo records every entry as scheduled: its states say nothing
P2P_UNRECORDED = "a send or recv"  # the op of a rank in a p2p op its recorder does not record (gloo)


@dataclass(frozen=True)
class IssuedOp:
    group: str  # the process group's name
    seq: int  # its collective_seq_id in that group; a send's or recv's p2p_seq_id
    op: str  # "all_reduce", ...; "send" or "recv"
    site: str | None  # the user's call site, "file:line in function"
    index: int  # position in the rank's dump
    frame: Any = field(default=None, compare=False)  # the call site's Frame
    peer: int | None = None  # a send's or recv's peer, a rank of the group (None for a collective)
    record: Any = field(default=None, compare=False)  # a send's or recv's P2POp
    batched: bool = False  # one op of a batch of sends and recvs (batch_isend_irecv)

    @property
    def key(self) -> tuple[str, int, bool]:
        """The op among the group's: its seq, counted apart for collectives and for sends and recvs."""
        return (self.group, self.seq, self.peer is not None)

    @property
    def identity(self) -> tuple[str, str, str | None]:
        """What makes two ops the same step of a program: group, op (a send's or recv's peer too) and call
        site (never the seq)."""
        return (self.group, self.op if self.peer is None else self.towards, self.site)

    @property
    def towards(self) -> str:
        """A send's or recv's op and peer: "send to its rank 1"."""
        return f"{self.op} {'to' if self.op == 'send' else 'from'} its rank {self.peer}"

    def what(self, label: str) -> str:
        if self.peer is None:
            return f"{self.op} seq {self.seq} of {label}"
        batch = ", in a batch of sends and recvs" if self.batched else ""
        return f"{self.towards} of {label} (p2p seq {self.seq}{batch})"

    def describe(self, label: str) -> str:
        return self.what(label) + (f", called at {self.site}" if self.site else "")


class Program:
    """One rank's collectives: the one it waits in and how far it got per group, read at once; its whole
    program (every op in record order, across groups) only when a cycle needs it."""

    def __init__(self, dump: RankDump, frozen: dict[int, tuple[list, tuple]] | None = None) -> None:
        self.rank = dump.rank
        self.dump = dump
        self._frozen = {} if frozen is None else frozen  # id(list) -> (list, its tuple): shared by the ranks
        self.reach: dict[str, int | None] = {name: _reach(dump, name) for name in dump.tracks}
        self.last = last_op(dump)
        # Where the recorder marks ops completed (NCCL), a rank may have issued ops past the one it waits in.
        self.stateful = records_states(dump)
        self.waiting: IssuedOp | None = _waiting(dump, self.last, self.stateful)
        self.maybe_in_p2p = self.waiting is None and _likely_in_p2p(dump, self.last)
        # Its device never began the op it waits in: it waits for its own device, not for its peers.
        self.not_begun = self.waiting is not None and device_never_began(dump, self.waiting)
        self._ops: list[IssuedOp] | None = None
        self._shape: tuple | None = None

    @property
    def shape(self) -> tuple:
        """Equal for ranks whose dumps hold the same ops, in the same order and states: one reading serves
        them all (half of 16k ranks may sit in one cycle, most of them alike). Call sites count by identity
        (the loader makes equal ones one object; hashing each frame would cost more than the reading)."""
        if self._shape is None:
            frozen = self._freeze
            self._shape = (
                tuple(
                    (name, frozen(t.seqs), frozen(t.keys), tuple(map(id, t.sites)), frozen(t.indices), frozen(t.states))
                    for name, t in sorted(self.dump.tracks.items())
                )
                + tuple(
                    (name, tuple((r.index, r.kind, r.src, r.dst, id(r.site), r.state) for r in records))
                    for name, records in sorted(self.dump.p2p.items())
                )
                + ((self.waiting.index if self.waiting else None),)
            )
        return self._shape

    def _freeze(self, column: list) -> tuple:
        """The column as a tuple, made once for the ranks whose dumps share it (those read from one template)."""
        known = self._frozen.get(id(column))
        if known is None or known[0] is not column:
            known = self._frozen[id(column)] = (column, tuple(column))
        return known[1]

    @property
    def ops(self) -> list[IssuedOp]:
        if self._ops is None:
            self._ops = _program_ops(self.dump)
        return self._ops

    def held_before(self, op: IssuedOp) -> bool:
        """Issued `op` (a collective) but waits in an earlier op of its own, the recorder says (NCCL)."""
        if not self.stateful or self.waiting is None or self.waiting.key == op.key:
            return False
        track = self.dump.tracks.get(op.group)
        if track is None:
            return False
        at = bisect_left(track.seqs, op.seq)
        return at < len(track.seqs) and track.seqs[at] == op.seq and track.states[at] != "completed"

    def waits_in(self, record: P2POp) -> bool:
        """Waits in this send or recv, or in the batch it is one op of."""
        mine = self.waiting.record if self.waiting is not None else None
        return mine is not None and (mine is record or (record.batch >= 0 and mine.batch == record.batch))


@dataclass
class WaitFor:
    edges: dict[int, frozenset[int]]  # rank -> the ranks it waits for (one set per op waited in, shared)
    unknown: dict[int, frozenset[int]]  # rank -> members of its group with no dump (they may be the ones)
    place_of: dict[int, tuple] = field(default_factory=dict)  # waiting rank -> the op it waits in
    # "sink" | "cycle" | "p2p" (waited for in an unrecorded p2p op) | "no_dump" (the waits end in ranks that
    # left no dump) | "not_begun" (in ranks whose devices never began the op they wait in) | "lone_waiter" (one
    # rank waits for the idle rest of its group: it made one op more, or they are held unrecorded) | None
    kind: str | None = None
    culprits: list[int] = field(default_factory=list)
    candidates: list[int] = field(default_factory=list)
    cycle: list[int] = field(default_factory=list)
    decided_by: str = ""  # "sink" | "its peers' program order" | "its own program order" | "undecided"
    departure: dict = field(default_factory=dict)  # what the culprit issued, what it was expected to
    # Ranks that wait in an op every member the dumps show has issued (a group whose members are only the ranks
    # that recorded it, gloo's): a member that left no dump, which the dumps cannot name, holds them.
    unaccounted: set[int] = field(default_factory=set)


# ---------------------------------------------------------------------------------------------- programs


_sites: dict[int, tuple[Any, str]] = {}  # id(frame) -> (frame, its text): the loader shares equal call sites


def _site(frame) -> str | None:
    if frame is None:
        return None
    known = _sites.get(id(frame))
    if known is None or known[0] is not frame:
        if len(_sites) > 1 << 16:
            _sites.clear()
        known = _sites[id(frame)] = (frame, f"{frame.site} in {frame.function}")
    return known[1]


def _op(dump: RankDump, name: str, i: int) -> IssuedOp:
    track = dump.tracks[name]
    signature = dump.signatures.get(track.keys[i])
    site = track.sites[i]
    return IssuedOp(name, track.seqs[i], signature.op if signature else "?", _site(site), track.indices[i], site)


def _p2p_op(name: str, record: P2POp) -> IssuedOp:
    peer = record.dst if record.kind == "send" else record.src
    site = _site(record.site)
    return IssuedOp(name, record.seq, record.kind, site, record.index, record.site, peer, record, record.batch >= 0)


def _program_ops(dump: RankDump) -> list[IssuedOp]:
    ops = [_op(dump, name, i) for name, track in dump.tracks.items() for i in range(len(track.seqs))]
    ops += [_p2p_op(name, record) for name, records in dump.p2p.items() for record in records]
    ops.sort(key=lambda op: op.index)
    return ops


def last_op(dump: RankDump) -> IssuedOp | None:
    """The last collective this rank enqueued, in record order."""
    last = max(((t.indices[-1], name) for name, t in dump.tracks.items() if t.indices), default=None)
    return _op(dump, last[1], len(dump.tracks[last[1]].indices) - 1) if last else None


def device_inside_an_op(dump: RankDump) -> bool:
    """The rank's device began an op it has not completed: an entry `started`, or a group whose counters say
    so (`pg_status` keeps counting past the entries a ring buffer dropped)."""
    if any("started" in track.states for track in dump.tracks.values()):
        return True
    if any(op.state == "started" for ops in dump.p2p.values() for op in ops):
        return True
    return any(started > completed for _, started, completed in dump.pg_status.values())


def records_starts(dump: RankDump) -> bool:
    """NCCL recorded when its ops began (TORCH_NCCL_ENABLE_TIMING=1): a group counts an op started. Without
    it no start event exists, every pending op reads `scheduled` and `last_started_collective` stays -1."""
    return dump.backend == "nccl" and any(started >= 0 for _, started, _ in dump.pg_status.values())


def position_in_track(dump: RankDump, group: str, seq: int) -> int | None:
    """Where the collective of this seq stands in the rank's track of the group, or None where it has none."""
    track = dump.tracks.get(group)
    if track is None:
        return None
    at = bisect_left(track.seqs, seq)
    return at if at < len(track.seqs) and track.seqs[at] == seq else None


def device_never_began(dump: RankDump, op: IssuedOp) -> bool:
    """Where NCCL records starts, the rank's device never began `op` and is inside no other op: work queued
    before it on the rank's own stream never ended (a kernel that never returns, a wedged GPU), for the
    communicator's stream runs an op only after the work its rank queued before it."""
    if op.peer is not None:
        state = op.record.state
    else:
        at = position_in_track(dump, op.group, op.seq)
        state = dump.tracks[op.group].states[at] if at is not None else None
    return state == "scheduled" and records_starts(dump) and not device_inside_an_op(dump)


def _reach(dump: RankDump, name: str) -> int | None:
    """The last seq this rank issued in group `name`, or None when its dump cannot say.

    The entries say it. `pg_status.last_enqueued_collective` misleads beside them (gloo counts collectives by
    op id, which sends and recvs take too; NCCL counts a send's or a batch's own p2p sequence number): it is
    read only where no entry of the group is left."""
    track = dump.tracks.get(name)
    if track is not None and track.seqs:
        return track.seqs[-1]
    status = dump.status(name)
    if status is not None and status[0] >= 0:
        return status[0]  # no entry of the group left (an onlyActive dump): the counter is all there is
    if dump.first_record_id:
        return None  # its ring buffer wrapped past every op of the group
    return 0


def records_states(dump: RankDump) -> bool:
    """Whether the recorder marks ops completed (NCCL): a rank may then have issued ops past the one it waits in."""
    if any(not _STATELESS.issuperset(track.states) for track in dump.tracks.values()):
        return True
    return any(record.state not in _STATELESS for records in dump.p2p.values() for record in records)


def first_pending(dump: RankDump) -> IssuedOp | None:
    """Where the recorder marks ops completed (NCCL): the first op that has not completed, collective or send
    or recv, in record order; it holds the rank, and the ops it issued after it wait on the device behind it."""
    first: tuple[int, str, int | P2POp] | None = None  # (entry index, group, track position or the send/recv)
    for name, track in dump.tracks.items():
        i = next(compress(count(), map(ne, track.states, repeat("completed"))), None)  # at C speed
        if i is not None and (first is None or track.indices[i] < first[0]):
            first = (track.indices[i], name, i)
    for name, records in dump.p2p.items():
        record = next((r for r in records if r.state != "completed"), None)
        if record is not None and (first is None or record.index < first[0]):
            first = (record.index, name, record)
    if first is None:
        return None
    _, name, at = first
    return _p2p_op(name, at) if isinstance(at, P2POp) else _op(dump, name, at)


def _waiting(dump: RankDump, last: IssuedOp | None, stateful: bool) -> IssuedOp | None:
    if stateful:
        return first_pending(dump)  # a pipeline's ranks may have issued sends and recvs only
    if last is None:
        return None
    # Gloo: the groups whose pg_status counts more collectives enqueued than completed have one in flight. (It
    # counts collectives only, by op id, and only in groups with a recorded entry: a send or recv in flight
    # shows in no counter.)
    statuses = {name: dump.status(name) for name in dump.tracks}
    if all(status is None for status in statuses.values()):
        return last  # no counters at all: a rank's last op is taken to be where it waits
    in_flight = [
        (dump.tracks[name].indices[-1], name)
        for name, status in statuses.items()
        if status is not None and status[2] < status[0] and dump.tracks[name].indices
    ]
    if not in_flight:
        return None
    _, name = max(in_flight)  # the latest, in record order
    return _op(dump, name, len(dump.tracks[name].indices) - 1)


def unrecorded_between(dump: RankDump, name: str) -> list[int]:
    """How many ops this rank issued in group `name` between each two of its recorded collectives, by their
    op ids: the sends and recvs of a backend that records no p2p (gloo). Empty where the dump records p2p
    ops or has no op ids."""
    track = dump.tracks.get(name)
    if track is None or dump.p2p.get(name) or len(track.op_ids) < 2 or min(track.op_ids) < 0:
        return []
    return [b - a - 1 for a, b in zip(track.op_ids, track.op_ids[1:], strict=False)]


def _likely_in_p2p(dump: RankDump, last: IssuedOp | None) -> bool:
    """Idle by its counters, in a job whose steps put unrecorded ops (sends, recvs) between collectives: it is
    more likely in one of them than in none. (gloo's `last_completed` is the op that completed last, so a batch
    whose send completed before its recv reads as done.)"""
    return last is not None and any(unrecorded_between(dump, last.group))


def programs_of(load: LoadResult) -> dict[int, Program]:
    frozen: dict[int, tuple[list, tuple]] = {}
    return {dump.rank: Program(dump, frozen) for dump in load.dumps}


# ------------------------------------------------------------------------------------------------- graph


def wait_for_graph(programs: dict[int, Program], members_of, unseen_of=None) -> WaitFor:
    """`members_of(rank, group name)`: the global ranks of that rank's group of that name, one tuple per
    group. The ranks that wait in one op share its set of absent members, computed once per op: at 16k
    ranks every rank may wait in the same world collective.

    `unseen_of(rank, group name)`: for a group whose members the dumps may not all show (a gloo group's
    members are only the ranks that recorded it; a member that left no dump, or that never issued an op of
    the group, recorded nothing of it), the ranks that may be its missing members, else None: where every
    member shown issued the op a rank still waits in, one of those is missing from it, or, when there are none,
    a rank no dump names."""
    places: dict[tuple, tuple[frozenset, frozenset]] = {}

    def place(rank: int, op: IssuedOp) -> tuple:
        if op.peer is not None:
            return (op.group, op.seq, 1, rank)  # a send's or recv's place is its rank's own
        return (op.group, op.seq, 0, id(members_of(rank, op.group)))

    def missing(rank: int, op: IssuedOp) -> tuple[frozenset, frozenset]:
        """The members of op's group that are not in it (never issued it, or wait in an op of their own
        before it), and those whose dumps cannot say."""
        key = place(rank, op)
        if key not in places:
            if op.peer is not None:
                absent, unknown = _peer_in(programs, members_of(rank, op.group), rank, op)
            else:
                absent, unknown = [], []
                for member in members_of(rank, op.group):
                    other = programs.get(member)
                    reach = other.reach.get(op.group, 0) if other is not None else None
                    if reach is None:
                        unknown.append(member)
                    elif reach < op.seq or other.held_before(op) or _never_began_it(other, op):
                        absent.append(member)
                unseen = unseen_of(rank, op.group) if unseen_of is not None else None
                if (
                    not absent
                    and not unknown
                    and unseen is not None
                    and _alike_in(programs, members_of(rank, op.group), op)
                ):
                    # Every member the dumps show issued it alike, and it waits: a member they do not show holds
                    # it. One rank alone can be that member: where its dump holds nothing of the group (a member's
                    # recorder records every collective it issues), it never issued the op.
                    only = unseen[0] if len(unseen) == 1 else None
                    if only is not None and only in programs and programs[only].reach.get(op.group, 0) == 0:
                        absent = [only]
                    else:
                        unknown = [r for r in unseen if r not in programs]
                        if not unknown:
                            unaccounted.add(key)
            places[key] = (frozenset(absent), frozenset(unknown))
        return places[key]

    nobody: frozenset = frozenset()
    unaccounted: set[tuple] = set()
    graph = WaitFor({}, {})
    for rank, program in programs.items():
        if program.waiting is None and program.last is not None and missing(rank, program.last)[0]:
            # A collective cannot have completed while a member never issued it: the rank waited in it
            # until it timed out or failed (gloo then counts it completed), and dumped afterwards.
            program.waiting = program.last
        elif program.waiting is None and program.maybe_in_p2p:
            last = program.last
            program.waiting = IssuedOp(last.group, last.seq, P2P_UNRECORDED, None, last.index, None)
        waiting = program.waiting
        if program.not_begun:
            graph.edges[rank], graph.unknown[rank] = nobody, nobody  # it waits for its own device
            graph.place_of[rank] = place(rank, waiting)
            continue
        if waiting is not None and waiting.op == P2P_UNRECORDED:
            graph.edges[rank], graph.unknown[rank] = nobody, frozenset(members_of(rank, waiting.group)) - {rank}
            continue  # it waits for a peer its dump does not name
        absent, unknown = missing(rank, waiting) if waiting is not None else (nobody, nobody)
        graph.edges[rank], graph.unknown[rank] = absent, unknown - {rank}
        if waiting is not None:
            graph.place_of[rank] = place(rank, waiting)
            if graph.place_of[rank] in unaccounted:
                graph.unaccounted.add(rank)
    return graph


def _never_began_it(program: Program, op: IssuedOp) -> bool:
    """This member waits in `op` itself, and its device never began it."""
    return program.not_begun and program.waiting is not None and program.waiting.key == op.key


def _alike_in(programs: dict[int, Program], members: tuple[int, ...], op: IssuedOp) -> bool:
    """Every member with a dump issued the same op (the same comparison key) at op's seq: nothing they recorded
    keeps it from completing (another op at that seq would: a mismatch, which the groups' comparison names)."""
    keys = set()
    for member in members:
        program = programs.get(member)
        track = program.dump.tracks.get(op.group) if program is not None else None
        if track is None:
            return False
        at = bisect_left(track.seqs, op.seq)
        if at >= len(track.seqs) or track.seqs[at] != op.seq:
            return False
        keys.add(track.keys[at])
    return len(keys) == 1


def _peer_in(
    programs: dict[int, Program], members: tuple[int, ...], rank: int, op: IssuedOp
) -> tuple[list[int], list[int]]:
    """The peers of the send or recv `rank` waits in (of every op of its batch, where it is one), as (absent,
    unknown): absent when a peer never posted the op this one pairs with, or waits in an op of its own before
    it; unknown when its dump cannot say; neither when it waits in that op too (or completed it)."""
    dump = programs[rank].dump
    batch = op.record.batch
    records = [r for r in dump.p2p.get(op.group, ()) if r.batch == batch] if batch >= 0 else [op.record]
    absent, unknown = [], []
    for record in records:
        local = record.dst if record.kind == "send" else record.src
        if not 0 <= local < len(members) or members[local] == rank:
            continue
        peer = members[local]
        other = programs.get(peer)
        if other is None:
            unknown.append(peer)
            continue
        try:
            paired = counterpart(op.group, dump, other.dump, record)
        except LookupError:  # the two buffers cannot be aligned there
            unknown.append(peer)
            continue
        if paired is None or not (paired.state == "completed" or other.waits_in(paired)):
            absent.append(peer)
    return absent, unknown


def _strongly_connected(edges: dict) -> list[list]:
    """Tarjan's strongly connected components, iteratively (a long chain must not exhaust the stack)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    components: list[list[int]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in edges:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


PROGRESS_STOPPED = "its peers completed the op its dump still lists as pending"
NOT_BEGUN = "its device never began the op its peers wait in"
NO_DUMP = "the ranks others wait for wait for it, and it left no dump"


def decide(graph: WaitFor, programs: dict[int, Program], members_of=None) -> WaitFor:
    """The sink the waits end in, a rank whose progress stopped, or the cycle the waits end in and the rank that
    departed first."""
    distinct = {id(targets): targets for targets in graph.edges.values() if targets}
    waited = frozenset().union(*distinct.values())
    sinks = sorted(m for m in waited if programs[m].waiting is None)
    stopped = _progress_stopped(programs, members_of, frozenset(graph.edges)) if members_of is not None else []
    if stopped and not sinks:
        graph.kind, graph.culprits, graph.decided_by = "stopped", stopped, PROGRESS_STOPPED
        return graph
    if not waited:  # nobody waits for a rank with a dump: the waits may end in ranks without one
        return _ends_without_dump(graph, frozenset(graph.edges), programs)
    if sinks:
        ahead = _one_op_ahead(graph, programs, sinks, members_of) if members_of is not None else None
        if ahead is not None:
            rank, extra, instead = ahead
            graph.kind, graph.culprits, graph.decided_by = "shifted", [rank], ONE_OP_AHEAD
            graph.departure = {"issued": extra, "peers_issued": instead, "idle": sinks}
            return graph
        odd = _odd_waiters(graph, programs, sinks)
        if odd is not None:
            graph.kind, graph.culprits, graph.decided_by = "odd_waiter", odd.pop("culprits"), ODD_WAITER
            graph.departure = odd | {"idle": sinks}
            return graph
        lone = _lone_waiter(graph, programs, sinks, members_of) if members_of is not None else None
        if lone is not None:
            graph.kind, graph.candidates, graph.decided_by = "lone_waiter", sorted([lone, *sinks]), "undecided"
            graph.departure = {"waiter": lone, "idle": sinks}
            return graph
        graph.kind, graph.culprits, graph.decided_by = "sink", sinks, "sink"
        return graph
    not_begun = sorted(m for m in waited if programs[m].not_begun)
    if not_begun:  # they issued the op, but wait for their own devices, which never began it
        graph.kind, graph.culprits, graph.decided_by = "not_begun", not_begun, NOT_BEGUN
        return graph

    in_p2p = sorted(m for m in waited if programs[m].waiting.op == P2P_UNRECORDED)
    if in_p2p:
        # The others wait for ranks that wait in a send or recv no dump records: its peer may be the rank
        # that departed (a stage that skipped its send) or one of them may (a recv posted before its send).
        graph.kind, graph.candidates, graph.decided_by = "p2p", in_p2p, "undecided"
        departed, decided, detail = _p2p_departure(programs, programs[in_p2p[0]].waiting.group)
        if departed:
            graph.culprits, graph.decided_by, graph.departure = departed, decided, detail
            graph.candidates = []
        return graph
    cycle = _deadlocked(graph)
    if not cycle:
        return _ends_without_dump(graph, waited, programs)

    graph.kind, graph.cycle = "cycle", cycle
    culprits, decided_by, departure = _first_departure(cycle, programs, members_of)
    graph.culprits, graph.decided_by, graph.departure = culprits, decided_by, departure
    if not culprits:
        graph.candidates = cycle
    return graph


ONE_OP_AHEAD = "one op more, from a call site it never used before, where every other member called another"
ODD_WAITER = "another collective than the other ranks that wait at its seq, beside ranks in no collective"


def _odd_waiters(graph: WaitFor, programs: dict[int, Program], sinks: list[int]) -> dict | None:
    """The ranks that wait for the idle ones disagree: at one seq of one group, a minority issued another
    collective than the rest (two at least, in agreement). The idle ranks alone cannot explain that: had they
    departed, the others would still have issued the same op there. One departure explains both: the minority
    issued another op (one more, or another instead), and the idle ranks wait for it where no dump records (a
    pipeline's send or recv, which gloo does not record; a communicator's creation; a store wait). Returns the
    minority and its op, the rest and theirs."""
    by_seq: dict[tuple, dict[str, list[int]]] = {}
    for rank, targets in graph.edges.items():
        op = programs[rank].waiting
        if targets & set(sinks) and op is not None and op.peer is None:
            by_seq.setdefault(op.key, {}).setdefault(op.op, []).append(rank)
    for ops in by_seq.values():
        if len(ops) != 2:
            continue
        fewer, more = sorted(ops.values(), key=len)
        if len(more) >= 2 and len(more) > len(fewer):
            issued, instead = programs[fewer[0]].waiting, programs[more[0]].waiting
            return {"issued": issued, "peers_issued": instead, "culprits": sorted(fewer), "peers": sorted(more)}
    return None


def _lone_waiter(graph: WaitFor, programs: dict[int, Program], sinks: list[int], members_of) -> int | None:
    """The one rank that waits for idle ranks, where they are two or more and every other member of the group it
    waits in. One rank's departure leaves that only two ways: the lone rank made one op more (from a line it used
    before, so its call sites cannot show it), or the idle ranks are held where no dump records (creating a group's
    communicator, a store wait) by one of them. Were they the culprits, the healthy ones would have issued the op
    and waited in it beside it."""
    waiting = [r for r, targets in graph.edges.items() if targets & set(sinks)]
    if len(waiting) != 1 or len(sinks) < 2:
        return None
    rank = waiting[0]
    op = programs[rank].waiting
    if op is None or op.peer is not None:
        return None
    others = {m for m in members_of(rank, op.group) if m != rank}
    return rank if others == set(sinks) else None


def _one_op_ahead(
    graph: WaitFor, programs: dict[int, Program], sinks: list[int], members_of
) -> tuple[int, IssuedOp, IssuedOp] | None:
    """One rank waits, one op past the others of its group, which are idle: either they all stopped issuing, or it
    made one op more. Alike collectives from different lines complete together (no backend knows a call site),
    so an extra op pairs with its peers' next one, and each later op with their one after: they run out of ops
    first and go idle. Its own record tells: at one seq it called from a line it never used before where every
    other member (two at least, in agreement) called from another, and from then on each of its ops came from
    the line its peers used one seq earlier. Returns (the rank, its extra op, the op its peers issued there)."""
    waiting = [r for r, targets in graph.edges.items() if targets]
    if len(waiting) != 1:
        return None
    rank = waiting[0]
    op = programs[rank].waiting
    others = [m for m in members_of(rank, op.group) if m != rank]
    if op.peer is not None or len(others) < 2 or not set(others) <= set(sinks):
        return None
    mine = _sites_by_seq(programs[rank], op.group, op.seq)
    theirs = {_sites_by_seq(programs[m], op.group, op.seq) for m in others}
    if mine is None or len(theirs) != 1 or None in theirs:
        return None
    peers = dict(next(iter(theirs)))
    split = next((seq for seq, site in mine if seq in peers and site != peers[seq]), None)
    if split is None or dict(mine)[split] in {site for seq, site in mine if seq < split}:
        return None  # they never differ, or it had used that line before
    later = [(seq, site) for seq, site in mine if seq > split and seq - 1 in peers]
    if not later or any(site != peers[seq - 1] for seq, site in later):
        return None  # its later ops are not its peers' shifted by one
    extra, instead = (_op_at(programs[r].dump, op.group, split) for r in (rank, others[0]))
    return rank, extra, instead


def _op_at(dump: RankDump, group: str, seq: int) -> IssuedOp:
    """The collective of this seq in the rank's track of the group (which holds it)."""
    return _op(dump, group, bisect_left(dump.tracks[group].seqs, seq))


def _sites_by_seq(program: Program, group: str, below: int) -> tuple | None:
    """The rank's (seq, call site) of the group's collectives before seq `below`, when each names its site."""
    track = program.dump.tracks.get(group)
    if track is None:
        return None
    pairs = tuple((seq, site) for seq, site in zip(track.seqs, track.sites, strict=False) if seq < below)
    return pairs if pairs and all(site is not None for _, site in pairs) else None


def _progress_stopped(programs: dict[int, Program], members_of, waited: frozenset) -> list[int]:
    """Ranks others wait for whose own op waited in a peer completed (NCCL records states): a collective cannot
    complete on one member while another's kernel never ran, nor a send without its recv. The rank's dump lists
    as pending what its peers saw complete: its device stopped (a kernel that never returns, a fault) or its
    progress thread stopped updating its recorder (a wedged process)."""
    found = []
    for rank in sorted(waited):
        program = programs[rank]
        op = program.waiting
        if op is None or not program.stateful or op.op == P2P_UNRECORDED:
            continue
        members = members_of(rank, op.group)
        if op.peer is None:
            # Only the same op: a collective whose sizes differ completes on the ranks with the smaller count.
            key = _key_at(program, op)
            done = any(_completed_at(programs.get(m), op, key) for m in members if m != rank)
        else:
            done = _peer_completed(programs, members, rank, op)
        if done:
            found.append(rank)
    return found


def _key_at(program: Program, op: IssuedOp) -> str | None:
    at = position_in_track(program.dump, op.group, op.seq)
    return program.dump.tracks[op.group].keys[at] if at is not None else None


def _completed_at(program: Program | None, op: IssuedOp, key: str | None) -> bool:
    """This rank completed the same op (comparison key) at op's seq of its group."""
    at = position_in_track(program.dump, op.group, op.seq) if program is not None and key is not None else None
    if at is None:
        return False
    track = program.dump.tracks[op.group]
    done = track.states[at] == "completed" and track.keys[at] == key
    return done and _seen_complete(program.dump, op.group, op.seq)


def _seen_complete(dump: RankDump, group: str, seq: int) -> bool:
    """Whether the rank's watchdog saw the op of this seq complete (`pg_status.last_completed_collective`;
    NCCL counts a send's or recv's own p2p seq there). An entry's `completed` alone is not enough: an op
    still connecting its channels (NCCL's runtime connect, at the first op of an algorithm) is recorded with
    no end event, and an end event never recorded reads as completed. Dumps without counters: the state."""
    status = dump.status(group)
    return status is None or status[2] >= seq


def _peer_completed(programs: dict[int, Program], members: tuple[int, ...], rank: int, op: IssuedOp) -> bool:
    """The peer completed the send or recv this one pairs with. Not for an op of a batch: a batch's ops take its
    marker's state, and the batch waits for all of them while its peer's op may have completed."""
    record = op.record
    if record.batch >= 0:
        return False
    local = record.dst if record.kind == "send" else record.src
    if not 0 <= local < len(members) or members[local] == rank or members[local] not in programs:
        return False
    try:
        paired = counterpart(op.group, programs[rank].dump, programs[members[local]].dump, record)
    except LookupError:
        return False
    same = paired is not None and (paired.sizes, paired.dtypes) == (record.sizes, record.dtypes)
    done = same and paired.state == "completed"
    return done and _seen_complete(programs[members[local]].dump, op.group, paired.seq)


def _ends_without_dump(graph: WaitFor, waited: frozenset, programs: dict[int, Program]) -> WaitFor:
    """The ranks others wait for wait only for members that left no dump: the waits end there. One such rank
    is the culprit (it died, or hangs where nothing recorded it); several are candidates. (A peer whose dump
    cannot be aligned with this rank's is unknown too, but it left a dump: the waits do not end there.)"""
    ends = [r for r in waited if not graph.edges.get(r) and graph.unknown.get(r, frozenset()) - programs.keys()]
    if not ends and waited & graph.unaccounted:
        held = sorted(waited & graph.unaccounted)
        graph.kind, graph.decided_by = "no_dump", "undecided"
        graph.departure = {"waiting_for_it": held}
        if all(_rootless(programs[rank].waiting.op) for rank in held):
            # Every member that dumped joined alike, and nothing unrecorded (a root) can differ: a member that
            # left no dump holds them. Every rank up to the highest that dumped did: it is a rank above that one,
            # or a living rank whose dump was lost, held in an op of its own by these ranks' departure.
            graph.departure["above"] = max(programs)
            graph.candidates = held
            return graph
        # Held by a member no dump names, or by members that disagree in what the dumps do not record (a
        # broadcast's root, gloo's sends and recvs): the dumps cannot say who; the ranks in those ops are the
        # candidates, unless a member is missing.
        graph.candidates = held
        return graph
    if not ends:
        return graph  # the waits end in ranks that are in a collective every member joined: a mismatch
    missing = sorted(frozenset().union(*(graph.unknown[r] for r in ends)) - programs.keys())
    graph.kind = "no_dump"
    graph.departure = {"waiting_for_it": sorted(ends), "no_dump": missing}
    if len(missing) == 1:
        # It died, exited or hangs where nothing recorded it. (A rank whose dump was lost while it waits in turn
        # for a rank that waits for it reads the same: its stack, where there is one, tells them apart.)
        graph.culprits, graph.decided_by = missing, NO_DUMP
        return graph
    graph.candidates, graph.decided_by = missing, "undecided"
    return graph


# Collectives whose members all pass alike what the recorder records, with no root or peer it leaves out: once every
# member has issued one alike, only a member that never did keeps it from completing. (A broadcast's, reduce's,
# gather's or scatter's root is not recorded: its members may disagree on it.)
_ROOTLESS = ("all_reduce", "allreduce", "all_gather", "allgather", "_all_gather", "reduce_scatter",
             "_reduce_scatter", "all_to_all", "alltoall", "barrier")  # fmt: skip


def _rootless(op: str) -> bool:
    inner = op[len("coalesced[") : -1].split(", ") if op.startswith("coalesced[") and op.endswith("]") else [op]
    return all(name.startswith(_ROOTLESS) for name in inner)


def _deadlocked(graph: WaitFor) -> list[int]:
    """The ranks of the largest cycle the waits end in. Solved on the ops waited in (a few), not the ranks
    (thousands): an op waits for the ops its absent members wait in; a terminal cycle of ops holds the
    ranks that wait in it for each other, and the ranks it waits for are the deadlocked ones."""
    targets: dict[tuple, frozenset[int]] = {}
    for rank, place in graph.place_of.items():
        targets[place] = graph.edges[rank]
    op_edges = {place: {graph.place_of[r] for r in absent if r in graph.place_of} for place, absent in targets.items()}
    best: list[int] = []
    for component in _strongly_connected(op_edges):
        inside = set(component)
        if len(component) > 1 and all(op_edges[place] <= inside for place in component):
            ranks = sorted(frozenset().union(*(targets[place] for place in component)))
            best = max(best, ranks, key=len)
    return best


# -------------------------------------------------------------------------------------------- departure


def _upto_waiting(program: Program) -> list[IssuedOp]:
    ops = program.ops
    if program.waiting is None:
        return ops
    return ops[: ops.index(program.waiting) + 1]


def _after_last_shared(
    cycle: list[int], programs: dict[int, Program]
) -> tuple[tuple[str, int, bool] | None, dict[int, IssuedOp | None]]:
    """The last op every rank of the cycle issued (group and seq), and each rank's op after it."""
    issued = {rank: _upto_waiting(programs[rank]) for rank in cycle}
    # Collectives only: a send's or recv's seq counts the rank's own, no op its peers share.
    shared = set.intersection(*({op.key for op in ops if op.peer is None} for ops in issued.values()))
    if not shared:
        return None, {}
    first = issued[cycle[0]]
    anchor = max(shared, key=lambda key: next(i for i, op in enumerate(first) if op.key == key))
    following = {}
    for rank, ops in issued.items():
        at = next(i for i, op in enumerate(ops) if op.key == anchor)
        following[rank] = ops[at + 1] if at + 1 < len(ops) else None
    return anchor, following


def _against_its_history(program: Program, since: int) -> tuple[tuple[IssuedOp, set, int] | None, bool]:
    """How the ops after position `since` follow their predecessors, against this rank's earlier steps:
    the first that no earlier step had after the same op (with what had followed it, and how many times the
    predecessor was seen), and whether every one of them had (the rank keeps its order). One pass: a cycle
    may hold thousands of ranks."""
    ops = _upto_waiting(program)
    seen: dict[tuple, set] = {}
    times: Counter = Counter()
    keeps = len(ops) > max(1, since + 1)
    for at in range(1, len(ops)):
        before, this = ops[at - 1].identity, ops[at].identity
        followers = seen.get(before)
        if at > since:
            if followers and this not in followers:
                return (ops[at], set(followers), times[before]), False
            keeps = keeps and bool(followers)
        seen.setdefault(before, set()).add(this)
        times[before] += 1
    return None, keeps


def _steps_alike(following: dict[int, IssuedOp | None], members_of) -> dict[int, tuple | None]:
    """rank -> a key equal for ranks whose op is the same step of one SPMD program: the op and call site, on the
    same group or a sibling of it. One line of code issues its collective on each rank's own group of a mesh
    dimension (the ep groups (0, 1) and (2, 3)): siblings have the same members relative to their first and
    share no member. The world in place of a subgroup, a group of another dimension, or another group of the
    same members (a subgroup as large as the world) is not a sibling. Sends and recvs keep their group: which
    one a rank issues depends on its pipeline stage, so ranks of different stages are not peers in order."""
    classes: dict[tuple, list[tuple[set, set, tuple]]] = {}  # shape -> [(members so far, group names, key)]
    relative: dict[int, tuple] = {}  # id(members) -> (members, relative to the first): once per group, not per rank
    keys: dict[int, tuple | None] = {}
    for rank, op in following.items():
        members = members_of(rank, op.group) if members_of is not None and op is not None and op.peer is None else ()
        if not members:
            keys[rank] = op.identity if op is not None else None
            continue
        known = relative.get(id(members))
        if known is None or known[0] is not members:  # held with its tuple, so an id is never a freed tuple's
            known = relative[id(members)] = (members, tuple(m - members[0] for m in members))
        shape = (known[1], *op.identity[1:])
        siblings = classes.setdefault(shape, [])
        found = next((c for c in siblings if op.group in c[1] or c[0].isdisjoint(members)), None)
        if found is None:
            found = (set(), set(), (*shape, len(siblings)))
            siblings.append(found)
        if op.group not in found[1]:  # thousands of ranks of one group: its members are taken in once
            found[0].update(members)
            found[1].add(op.group)
        keys[rank] = found[2]
    return keys


def _first_departure(cycle: list[int], programs: dict[int, Program], members_of) -> tuple[list[int], str, dict]:
    alike: dict[tuple, list[int]] = {}
    for rank in cycle:
        alike.setdefault(programs[rank].shape, []).append(rank)
    ranks_like = {ranks[0]: ranks for ranks in alike.values()}  # one reading per kind of program
    readers = sorted(ranks_like)
    anchor, following = _after_last_shared(readers, programs)
    by_peers: list[int] = []
    detail: dict = {}
    if anchor is not None:
        step = _steps_alike(following, members_of)
        tally: Counter = Counter()
        for reader, key in step.items():
            tally[key] += len(ranks_like[reader])
        (usual, count), *rest = tally.most_common()
        if rest and count * 2 > len(cycle):
            departing = [r for r, key in step.items() if key != usual]
            by_peers = sorted(rank for reader in departing for rank in ranks_like[reader])
            expected = next((following[r] for r, key in step.items() if key == usual), None)
            detail = {"after": {"group": anchor[0], "seq": anchor[1]}, "peers_issued": expected}
    own: dict[int, tuple[IssuedOp, set, int]] = {}  # rank -> (the op, what usually followed, times seen)
    kept: set[int] = set()  # ranks whose program shows the order of earlier steps and keeps it
    for reader in readers:
        program = programs[reader]
        since = -1
        if anchor is not None:
            since = next(i for i, op in enumerate(program.ops) if op.key == anchor)
        found, keeps = _against_its_history(program, since)
        for rank in ranks_like[reader]:
            if found is not None:
                own[rank] = found
            elif keeps:
                kept.add(rank)
    following = {rank: following.get(reader) for reader in readers for rank in ranks_like[reader]}
    by_history = sorted(own) if len(own) < len(cycle) else []
    if by_peers and (not by_history or by_history == by_peers):
        decided = "its peers' program order" + (" and its own" if by_history else "")
        return by_peers, decided, detail | _issued(by_peers, following, own)
    if by_peers and _entered_together(by_history, by_peers, cycle, own, programs, detail.get("peers_issued")):
        # The ranks that break their own order are the majority, all with the one call none made before (a first
        # evaluation, a first checkpoint): a phase the program enters on every rank, which the rest went past.
        decided = NEW_PHASE
        return by_peers, decided, detail | _issued(by_peers, following, own)
    entered = _entered_all_rank_call(cycle, by_history, own, programs)
    if entered:
        # The break is a call every rank must make (a checkpoint's save): the ranks that never entered it skipped it.
        return entered, ALL_RANK_CALL, _issued(entered, following, {})
    if by_history and not by_peers and _one_break(by_history, own, members_of):
        # Every other rank of the cycle kept the order of its earlier steps: the break is this rank's alone.
        decided = "its own program order" + (", its peers keeping theirs" if kept | set(own) == set(cycle) else "")
        if any(own[r][2] < 2 for r in by_history):
            # What followed that op was seen once: a step that runs an op every few steps (a periodic log, a
            # checkpoint) follows it otherwise in its turn, and one observation does not make an order.
            decided = "its own program order, seen once before"
        new_calls = [own[r][0] for r in by_history if _never_issued(programs[r], own[r][0])]
        if new_calls and _made_elsewhere(new_calls, programs, set(cycle)):
            # A call the rank never made before (the end of training's barrier, a checkpoint's first
            # collective) that ranks outside the cycle made too is a phase every rank enters: the rank may
            # have entered it in time while its peer issued one op too many or too few before it.
            decided = "its own program order, with a call it never made before"
            counted, ranks = _counted_against_the_phase(cycle, by_history, own, programs)
            if counted == ONE_OP_MORE:
                return ranks, ONE_OP_MORE, _issued(ranks, {r: programs[r].waiting for r in ranks}, {})
            broke = [r for r in readers if r in own]  # one rank per kind of program: thousands may break alike
            if counted == LEFT_EARLY:
                decided = LEFT_EARLY
            elif _left_mid_step(broke, own, programs):
                decided = LEFT_MID_STEP
            elif all(_from_a_new_place(programs[r], own[r][0]) for r in broke):
                # The rank went from the end of its step to a place it never called from (the end of training, an
                # evaluation): its loop ended sooner, or its peer's ran longer or made one op more. Each story
                # leaves these records; the first (uneven batches) is the common one, and leads at low confidence.
                stories = {"two_stories": _two_stories(cycle, by_history)}
                return by_history, LOOP_LENGTH, _issued(by_history, following, own) | stories
        return by_history, decided, _issued(by_history, following, own)
    return [], "undecided", {}


def _one_break(ranks: list[int], own: dict[int, tuple[IssuedOp, set, int]], members_of) -> bool:
    """The ranks that break their own order all break it with the same step (one departure, seen on the ranks of
    one kind of program). One rank's departure does not change another's program: ranks that each break their
    order with a step of their own show that their history is too short to hold the order (a step that runs an
    op every few steps), not that several departed."""
    return len(set(_steps_alike({r: own[r][0] for r in ranks}, members_of).values())) == 1


NEW_PHASE = "its peers' program order, its peers entering a new phase together"
ALL_RANK_CALL = "a call every rank must make"


def _entered_all_rank_call(
    cycle: list[int], by_history: list[int], own: dict[int, tuple[IssuedOp, set, int]], programs: dict[int, Program]
) -> list[int]:
    """The ranks of the cycle that skipped a call every rank must make: the ranks whose program breaks its order
    all broke it with an op issued inside such a call (knowledge/frames.toml [[all_rank_calls]]), and these are
    the rest, none of them inside one."""
    if not by_history or not all(_inside_all_rank_call(programs[r], own[r][0]) for r in by_history):
        return []
    rest = [r for r in cycle if r not in by_history]
    if any(programs[r].waiting is None or _inside_all_rank_call(programs[r], programs[r].waiting) for r in rest):
        return []
    return sorted(rest)


def _inside_all_rank_call(program: Program, op: IssuedOp) -> str | None:
    """The call every rank must make that issued this collective, if any."""
    at = position_in_track(program.dump, op.group, op.seq) if op.peer is None else None
    return program.dump.tracks[op.group].all_rank_calls.get(at) if at is not None else None


ONE_OP_MORE = "one op more than every rank that entered the new phase"
LEFT_EARLY = "its own program order, with fewer ops than the ranks that entered the new phase"
LEFT_MID_STEP = "its own program order, leaving its step midway for a call it never made before"
LOOP_LENGTH = "its own program order, its loop ending a step sooner than its peers' (or theirs running longer)"


def _counted_against_the_phase(
    cycle: list[int], by_history: list[int], own: dict[int, tuple[IssuedOp, set, int]], programs: dict[int, Program]
) -> tuple[str | None, list[int]]:
    """The ranks of the cycle that entered the new phase against the ranks outside the cycle that entered it too,
    counted at the call each staying rank waits in (its op and call site; its ops there on one group). In an SPMD
    program every rank that reached the phase issued that call as often: staying ranks each one seq past that
    count made one op more (ONE_OP_MORE); ranks that entered the phase with fewer left early (LEFT_EARLY). Needs a
    rank outside the cycle in the phase: with the cycle alone, one op too many on one side and a phase entered
    early on the other are one story each (None)."""
    phase_call = {(own[r][0].op, own[r][0].site) for r in by_history}
    if len(phase_call) != 1:
        return None, []
    (want,) = phase_call
    outside = _entered_outside(want, programs, set(cycle))
    staying = [r for r in cycle if r not in by_history]
    if not outside or not staying:
        return None, []
    one_more = left_early = True
    for rank in staying:
        waiting = programs[rank].waiting
        if waiting is None or waiting.peer is not None:
            return None, []
        call = (waiting.op, waiting.site)
        counts = {_last_seq_at(programs[r], call, want) for r in outside}
        if len(counts) != 1 or None in counts:
            return None, []
        (count,) = counts
        entered = [_last_seq_at(programs[r], call, want) for r in by_history]
        one_more = one_more and waiting.seq == count + 1 and all(seq == count for seq in entered)
        left_early = left_early and all(seq is not None and seq < count for seq in entered)
    if one_more:
        return ONE_OP_MORE, sorted(staying)
    return (LEFT_EARLY, sorted(by_history)) if left_early else (None, [])


def _left_mid_step(
    by_history: list[int], own: dict[int, tuple[IssuedOp, set, int]], programs: dict[int, Program]
) -> bool:
    """Every rank that went to the new call went from inside a step: the op it made last is none of the ops its
    steps end with. Its peer then cannot have made one op more, nor its loop have ended sooner (a loop ends
    between two steps): it left its step."""
    for rank in by_history:
        before = _before(programs[rank], own[rank][0])
        ends = _ends_of_steps(programs[rank], before)
        if not ends or before[-1].identity in ends:
            return False
    return True


def _before(program: Program, op: IssuedOp) -> list[IssuedOp]:
    return program.ops[: program.ops.index(op)] if op in program.ops else []


def _ends_of_steps(program: Program, before: list[IssuedOp]) -> set:
    """The identities of the ops the rank's steps ended with, read from its ops `before` the new call: a step
    begins with the first op that recurs (what came before it, once, is the setup) and ends with the op made just
    before it recurred. Empty where the record does not reach the first step (the recorder's ring dropped it)
    or no op recurs."""
    if not all(track.seqs and track.seqs[0] <= 1 for track in program.dump.tracks.values()):
        return set()
    seen = Counter(op.identity for op in before)
    start = next((i for i, op in enumerate(before) if seen[op.identity] > 1), None)
    if start is None:
        return set()
    first = before[start].identity
    return {before[i - 1].identity for i in range(start + 1, len(before)) if before[i].identity == first}


def _from_a_new_place(program: Program, op: IssuedOp) -> bool:
    """The rank never called anything from `op`'s call site before it: a new place in its program (the end of
    training's barrier, a first evaluation), not an old call site issuing on another group or out of turn."""
    return op.site is not None and all(other.site != op.site for other in _before(program, op))


def _two_stories(cycle: list[int], by_history: list[int]) -> dict:
    """Who the records' two stories are about: the ranks whose loop seems to have ended, the ranks that went on."""
    return {"entered": sorted(by_history), "staying": [r for r in cycle if r not in by_history]}


def _entered_outside(phase: tuple[str, str | None], programs: dict[int, Program], cycle: set[int]) -> list[int]:
    """One rank per kind of program outside the cycle that made the phase's call (ranks of one shape issued the
    same ops: one reading serves them, as in `_made_elsewhere`); none past 64 kinds, where the doubt stands."""
    found, seen = [], set()
    for rank, program in programs.items():
        if rank in cycle or program.shape in seen:
            continue
        if len(seen) >= 64:
            return []
        seen.add(program.shape)
        if any((op.op, op.site) == phase for op in program.ops):
            found.append(rank)
    return found


def _last_seq_at(program: Program, call: tuple[str, str | None], phase: tuple[str, str | None]) -> int | None:
    """The seq of the rank's last op at `call` (op, call site) before it entered the phase, where all its ops at
    that call are of one group; None otherwise."""
    found: dict[str, int] = {}
    for op in program.ops:
        if (op.op, op.site) == phase:
            break
        if (op.op, op.site) == call and op.peer is None:
            found[op.group] = op.seq
    return next(iter(found.values())) if len(found) == 1 else None


def _entered_together(
    by_history: list[int],
    by_peers: list[int],
    cycle: list[int],
    own: dict[int, tuple[IssuedOp, set, int]],
    programs: dict[int, Program],
    usual: IssuedOp | None,
) -> bool:
    """The ranks that break their own order are exactly the cycle's majority, each with the op its peers all
    issued next (group, op, call site), a call it never made before."""
    if usual is None or not by_history or set(by_history) | set(by_peers) != set(cycle):
        return False
    return all(own[r][0].identity == usual.identity and _never_issued(programs[r], own[r][0]) for r in by_history)


def _made_elsewhere(calls: list[IssuedOp], programs: dict[int, Program], cycle: set[int]) -> bool:
    """Any rank outside the cycle issued one of these calls (op and call site, on any group), or no rank
    outside the cycle is there to show it did not: at most a few programs are read, those of distinct shapes."""
    if not set(programs) - cycle:
        return True
    wanted = {(op.op, op.site) for op in calls}
    seen: set[tuple] = set()
    for rank, program in programs.items():
        if rank in cycle or program.shape in seen:
            continue
        seen.add(program.shape)
        if any((op.op, op.site) in wanted for op in program.ops):
            return True
        if len(seen) >= 64:
            return True  # too many kinds of programs to read: the doubt stands
    return False


def _never_issued(program: Program, op: IssuedOp) -> bool:
    """`op` (its group, op and call site) appears nowhere before it in the rank's program."""
    earlier = program.ops[: program.ops.index(op)] if op in program.ops else program.ops
    return all(other.identity != op.identity for other in earlier)


def _p2p_departure(programs: dict[int, Program], name: str) -> tuple[list[int], str, dict]:
    """The rank that issued, between its last two collectives of group `name`, another number of unrecorded
    ops (sends, recvs) than in each of its earlier steps, while every other rank kept its own number: it
    skipped a send or recv (or added one)."""
    departed: dict[int, tuple[int, int]] = {}
    kept, unknown = set(), set()
    for rank, program in programs.items():
        gaps = unrecorded_between(program.dump, name)
        earlier = set(gaps[:-1])
        if len(gaps) >= 2 and len(earlier) == 1 and gaps[-1] not in earlier:
            departed[rank] = (gaps[-1], next(iter(earlier)))
        elif gaps and len(set(gaps)) == 1:
            kept.add(rank)
        else:
            unknown.add(rank)
    if not departed or unknown or len(departed) > 1:
        return [], "undecided", {}
    ((rank, (issued, usual)),) = departed.items()
    return (
        [rank],
        "the ops between its collectives, its peers keeping theirs",
        {"rank": rank, "unrecorded_ops": issued, "usually": usual},
    )


def _issued(
    culprits: list[int], following: dict[int, IssuedOp | None], own: dict[int, tuple[IssuedOp, set, int]]
) -> dict:
    rank = culprits[0]
    facts: dict = {"rank": rank}
    if rank in own:
        op, usual, _ = own[rank]
        facts["issued"] = op
        facts["usually_next"] = sorted(usual, key=str)
    elif following.get(rank) is not None:
        facts["issued"] = following[rank]
    return facts
