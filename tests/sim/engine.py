"""Play every rank's actions under a backend's semantics until the job finishes or deadlocks.

What each backend does, as far as a hang shows it:

- **gloo** blocks the calling thread in every collective until each member has issued the same op of the
  group (matched by the group's sequence number); a send completes once its bytes are handed to the
  transport, a recv when the matching send (the k-th from that peer) was issued. The flight recorder
  records collectives only (sends and recvs take op ids), every entry `scheduled`. DDP's reducer issues its
  gradient all_reduces asynchronously during backward and waits for them all at its end.
- **NCCL** returns from every op at once: the op is queued on the rank's device, in order, and runs when it
  reaches the head; a collective completes when every member's device reached it, a send or recv when its
  peer's did (a batch, when all its ops did). The CPU waits only where the job reads a result back (the
  step's end), in a barrier, an object collective, a store wait, or, without eager initialisation, in the
  first op of a group while its communicator is created. Ops of the same group whose sizes differ still
  complete (NCCL runs each rank's own count); ops of another kind never do.
  NCCL (2.22 on, by default) also connects a communicator for an algorithm only at the first op that uses it:
  that op is recorded, then its launch blocks the CPU until every member connects too (`nccl_algorithm`).
- **gloo's broadcast** is a binomial tree from the root each member was given (gloo/broadcast.cc): a member
  completes once it received from its parent and its children received from it, whoever else has arrived; so
  members given different roots deadlock some of them while others go on (measured: a rank that received from
  the source it expected went on to its next op, the two ranks that each took itself for the source waited).
  NCCL's ring broadcast with different roots completes with garbage or hangs, by size, as sizes that differ.
- **p2p sequence numbers**: NCCL counts a group's sends, recvs and batches; gloo keeps no such count (its
  entries say 0).

The result is each rank's records (what its flight recorder holds) and where each rank's main thread
waits (`Wait`), from which `artifacts` writes the files a real job leaves.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .mesh import Group
from .program import BACKWARD, COLLECTIVES, P2P, STORE, SYNC, Action

MAX_EVENTS = 200_000  # a runaway simulation is a bug of the simulator, not a case


@dataclass
class Record:
    """One flight-recorder entry of one rank."""

    action: Action
    name: str  # the op as the profiling name says it: "all_reduce", "_all_gather_base", "send", "coalesced"
    group: Group
    seq: int  # collective_seq_id
    p2p_seq: int
    op_id: int
    input_sizes: list
    output_sizes: list
    dtypes: list
    is_p2p: bool
    src: int = -1  # p2p: group-local ranks, as the profiling name gives them
    dst: int = -1
    done: bool = False  # completed, as the simulation knows it (what the recorder says is `artifacts`' business)
    python: bool = True  # recorded with the Python frames of its call (False: an autograd thread's)
    record_id: int = 0
    part: int = 0  # which op of a composite call (all_gather_object's second all_gather)
    batched: bool = False  # one op of a batch_isend_irecv (its `coalesced` marker says when the batch completed)
    launched: bool = True  # NCCL: False while its launch waits for the communicator's connections


@dataclass
class Unit:
    """What completes at once: one collective instance, one send or recv, or one batch of them."""

    rank: int
    kind: str  # "collective" | "p2p" | "batch"
    records: list[Record]
    key: tuple = ()  # collective: (group name, ranks, seq); p2p: (group name, src, dst, k) of each op
    keys: tuple = ()  # batch: one p2p key per op
    signature: tuple = ()
    done: bool = False
    sends: frozenset = frozenset()  # the p2p keys of its sends (the rest are recvs)
    blockers: frozenset = frozenset()  # gloo's broadcast: the members this one waits for (global ranks)


@dataclass
class Wait:
    """Where a rank's main thread is, once nothing moves."""

    # "op" (in a collective/p2p call), "backward", "sync", "store", "init", "connect" (NCCL: launching an op of
    # an algorithm its communicator has not connected yet), "stuck", "exited", "dead"
    kind: str
    action: Action | None = None
    units: tuple = ()
    detail: str = ""  # stuck: "sleep", "compute", "lock", ...; store: the key


@dataclass
class RankRun:
    rank: int
    actions: list[Action]
    pc: int = 0
    records: list[Record] = field(default_factory=list)
    hidden: list[Record] = field(default_factory=list)  # gloo's sends and recvs: op ids, no entries
    queue: deque = field(default_factory=deque)  # NCCL: units in device order
    pending: list[Unit] = field(default_factory=list)  # gloo: async units issued and not yet waited for
    wait: Wait | None = None
    seq: dict = field(default_factory=dict)  # group name -> last collective seq
    p2p_seq: dict = field(default_factory=dict)
    op_id: dict = field(default_factory=dict)
    inited: set = field(default_factory=set)
    connected: set = field(default_factory=set)  # NCCL: (group name, ranks, algorithm) it has connected
    # For a departure that freezes the recorder's progress: records from this index on stay `scheduled`.
    frozen_from: int | None = None
    device_stopped_at: int | None = None  # wedged: the device never runs the unit issued at this action


@dataclass
class Outcome:
    ranks: dict[int, RankRun]
    finished: bool  # every rank ran its actions to the end
    store: set
    errored: bool = False  # gloo refused a collective whose sizes differ: the job fails, it does not hang


class Engine:
    def __init__(
        self, backend: str, actions: dict[int, list[Action]], eager_init: bool = True, mismatch_completes: bool = True
    ) -> None:
        self.backend = backend
        self.nccl = backend == "nccl"
        self.lenient = self.nccl and mismatch_completes
        self.eager_init = eager_init or not self.nccl
        self.ranks = {r: RankRun(r, list(a)) for r, a in actions.items()}
        self.collectives: dict[tuple, dict[int, Unit]] = {}
        self.p2p: dict[tuple, dict[str, tuple[Unit, Record]]] = {}  # key -> {"send"|"recv": (unit, record)}
        self.pair_counts: dict[tuple, int] = {}
        self.store: set[str] = set()
        self.arrived: dict[tuple, set[int]] = {}  # lazy init: group -> ranks waiting to create it
        self.connecting: dict[tuple, set[int]] = {}  # (group, ranks, algorithm) -> ranks that reached its first op
        self.record_ids: dict[int, int] = {}
        self.dead: set[int] = set()
        self.errored = False

    # ------------------------------------------------------------------------------------------- driving

    def run(self) -> Outcome:
        for _ in range(MAX_EVENTS):
            moved = any([self._advance(run) for run in self.ranks.values()])
            moved = self._complete() or moved
            if not moved:
                break
        else:
            raise RuntimeError("the simulation does not settle")
        finished = all(run.wait is not None and run.wait.kind == "exited" for run in self.ranks.values())
        return Outcome(self.ranks, finished, self.store, self.errored)

    def _advance(self, run: RankRun) -> bool:
        """Run this rank's CPU until it blocks; whether it moved."""
        moved = False
        while True:
            if run.wait is not None:
                if not self._released(run):
                    return moved
                run.wait = self._once_released(run, run.wait)
                moved = True
                continue
            if run.pc >= len(run.actions):
                run.wait = Wait("exited")
                return True
            action = run.actions[run.pc]
            run.pc += 1
            moved = True
            run.wait = self._execute(run, action)

    # ------------------------------------------------------------------------------------------ actions

    def _execute(self, run: RankRun, action: Action) -> Wait | None:
        kind = action.kind
        if kind == "stuck":
            return Wait("stuck", action, detail=action.key)
        if kind == "die":
            self.dead.add(run.rank)
            return Wait("dead", action)
        if kind == "exit":
            run.pc = len(run.actions)
            return Wait("exited", action)
        if kind == "store_set":
            self.store.add(action.key)
            return None
        if kind == "store_get":
            return Wait("store", action, detail=action.key)
        if kind == SYNC:
            return Wait("sync", action) if self.nccl else None
        if kind == "wedge":  # the device stops before this rank's next op; its recorder stops seeing completions
            next_id = self.record_ids.get(run.rank, 0)
            run.device_stopped_at = next_id
            run.frozen_from = max(0, next_id - int(action.key or 0))
            return None
        init = self._needs_init(run, action)
        if init is not None:
            run.pc -= 1  # the op is issued (and recorded) once its communicator exists
            return init
        units = self._issue(run, action)
        if self.nccl and not self._connected(run, units):
            for unit in units:
                for record in unit.records:
                    record.launched = False
            return Wait("connect", action, tuple(units))
        return self._launch(run, action, units)

    def _launch(self, run: RankRun, action: Action, units: list[Unit]) -> Wait | None:
        """NCCL queues the op on the device; either backend's thread then waits as the call does."""
        if self.nccl:
            run.queue.extend(units)
        return self._wait_after_issue(run, action, units)

    def _once_released(self, run: RankRun, wait: Wait) -> Wait | None:
        """Where a thread goes once its wait is over: on, or, after connecting, into the op it launches."""
        if wait.kind != "connect":
            return None
        for unit in wait.units:
            for record in unit.records:
                record.launched = True
        return self._launch(run, wait.action, list(wait.units))

    def _connected(self, run: RankRun, units: list[Unit]) -> bool:
        """NCCL connects a communicator for an algorithm at its first op that uses it (NCCL_RUNTIME_CONNECT=1, the
        default since 2.22): its launch exchanges connection details with the peers, which only answer once
        they launch an op of that algorithm themselves. Until every member has, the op is recorded (its start
        and end events never are) but not launched."""
        key = _connection(units[0])
        if key is None or key in run.connected:
            return True
        self.connecting.setdefault(key, set()).add(run.rank)
        return self._released_connect(run, key)

    def _released_connect(self, run: RankRun, key: tuple) -> bool:
        if self.connecting[key] >= set(key[1]):
            run.connected.add(key)
            return True
        return False

    def _needs_init(self, run: RankRun, action: Action) -> Wait | None:
        """NCCL without eager init: a group's first op blocks its CPU until every member creates the
        communicator, and only then is it recorded."""
        if self.eager_init or action.kind not in COLLECTIVES or action.group.name in run.inited:
            return None
        key = (action.group.name, action.group.ranks)
        self.arrived.setdefault(key, set()).add(run.rank)
        if self.arrived[key] >= set(action.group.ranks):
            run.inited.add(action.group.name)
            return None
        return Wait("init", action)

    def _wait_after_issue(self, run: RankRun, action: Action, units: list[Unit]) -> Wait | None:
        if self.nccl:
            # The CPU goes on, except where the call itself reads the result back.
            if action.kind in ("barrier", "all_gather_object") and action.via != BACKWARD:
                return Wait("op", action, tuple(units))
            return None
        if action.via == BACKWARD:
            run.pending += units  # DDP: issued now, waited for at the end of backward
            following = run.actions[run.pc] if run.pc < len(run.actions) else None
            if following is not None and following.via == BACKWARD and following.step == action.step:
                return None
            waiting, run.pending = tuple(run.pending), []
            return Wait("backward", action, waiting)
        return Wait("op", action, tuple(units))

    def _released(self, run: RankRun) -> bool:
        wait = run.wait
        if wait.kind in ("stuck", "exited", "dead"):
            return False
        if wait.kind == "store":
            return wait.detail in self.store
        if wait.kind == "sync":
            return all(u.done for u in run.queue)
        if wait.kind == "connect":
            return self._released_connect(run, _connection(wait.units[0]))
        if wait.kind == "init":
            key = (wait.action.group.name, wait.action.group.ranks)
            if self.arrived.get(key, set()) >= set(wait.action.group.ranks):
                run.inited.add(wait.action.group.name)
                return True
            return False
        return all(u.done for u in wait.units)

    # -------------------------------------------------------------------------------------------- issue

    def _next(self, table: dict, name: str) -> int:
        table[name] = table.get(name, 0) + 1
        return table[name]

    def _next_p2p_seq(self, run: RankRun, group: Group) -> int:
        """NCCL numbers a group's sends, recvs and batches; gloo keeps no such count (its entries say 0)."""
        return self._next(run.p2p_seq, group.name) if self.nccl else 0

    def _record(self, run: RankRun, record: Record) -> Record:
        record.record_id = self.record_ids.get(run.rank, 0)
        self.record_ids[run.rank] = record.record_id + 1
        record.python = record.action.via != BACKWARD or not self.nccl
        run.records.append(record)
        return record

    def _issue(self, run: RankRun, action: Action) -> list[Unit]:
        if action.kind in P2P:
            return [self._issue_p2p(run, action, [action])]
        if action.kind == "batch":
            return [self._issue_p2p(run, action, list(action.batch))]
        return [self._issue_collective(run, action, action.part)]

    def _issue_collective(self, run: RankRun, action: Action, part: int) -> Unit:
        group = action.group
        name, ins, outs, dtypes = _shape(action, part, len(group.ranks), self.backend)
        seq = self._next(run.seq, group.name)
        op_id = self._next(run.op_id, group.name)
        p2p_seq = run.p2p_seq.get(group.name, 0)
        record = Record(action, name, group, seq, p2p_seq, op_id, ins, outs, dtypes, False, part=part)
        self._record(run, record)
        # The signature peers must agree on; NCCL runs ops of one kind whatever their sizes (or roots).
        signature = (name,) if self.lenient else (name, str(ins), str(outs), tuple(dtypes), action.root)
        unit = Unit(run.rank, "collective", [record], (group.name, group.ranks, seq), signature=signature)
        self.collectives.setdefault(unit.key, {})[run.rank] = unit
        return unit

    def _issue_p2p(self, run: RankRun, action: Action, ops: list[Action]) -> Unit:
        group = action.group
        records, keys, sends = [], [], set()
        batch_seq = self._next_p2p_seq(run, group) if action.kind == "batch" else None
        for op in ops:
            me, peer = group.local(run.rank), group.local(op.peer)
            src, dst = (me, peer) if op.kind == "send" else (peer, me)
            count_key = (group.name, op.kind, src, dst)
            k = self.pair_counts[count_key] = self.pair_counts.get(count_key, 0) + 1
            key = (group.name, src, dst, k)
            keys.append(key)
            if op.kind == "send":
                sends.add(key)
            op_id = self._next(run.op_id, group.name)
            p2p_seq = batch_seq if batch_seq is not None else self._next_p2p_seq(run, group)
            sizes = [[op.numel]]
            record = Record(op, op.kind, group, run.seq.get(group.name, 0), p2p_seq, op_id, sizes, sizes,
                            [op.dtype], True, src, dst, batched=action.kind == "batch")  # fmt: skip
            if self.nccl:  # gloo records no sends or recvs; they only take op ids
                self._record(run, record)
            else:
                run.hidden.append(record)
            records.append(record)
        if action.kind == "batch" and self.nccl:
            marker = Record(action, "coalesced", group, run.seq.get(group.name, 0), batch_seq,
                            run.op_id[group.name], [], [], [], False)  # fmt: skip
            self._record(run, marker)
            records.append(marker)
        unit = Unit(run.rank, "batch" if action.kind == "batch" else "p2p", records, keys=tuple(keys),
                    sends=frozenset(sends))  # fmt: skip
        for key, record in zip(keys, records, strict=False):
            side = "send" if key in sends else "recv"
            self.p2p.setdefault(key, {})[side] = (unit, record)
        if not self.nccl:
            self._maybe_done(unit)  # a unit of no ops; a gloo send completes only once its recv is posted
        return unit

    # ------------------------------------------------------------------------------------------ completion

    def _complete(self) -> bool:
        moved = False
        if self.nccl:
            while self._complete_heads():
                moved = True
        else:
            for key, units in list(self.collectives.items()):
                if next(iter(units.values())).records[0].name == "broadcast":
                    moved = self._complete_gloo_broadcast(key, units) or moved
                else:
                    moved = self._complete_collective(key, units) or moved
            # A gloo send waits for its recv (measured: a one-element send returned when its peer posted the
            # recv, seconds later), and the recv for the send.
            for unit_pair in list(self.p2p.values()):
                if "recv" in unit_pair and "send" in unit_pair and not unit_pair["recv"][1].done:
                    for unit, record in (unit_pair["send"], unit_pair["recv"]):
                        self._mark(record)
                        self._maybe_done(unit)
                    moved = True
        return moved

    def _heads(self) -> dict[int, Unit]:
        heads = {}
        for run in self.ranks.values():
            while run.queue and run.queue[0].done:
                run.queue.popleft()
            stopped = run.device_stopped_at is not None
            if run.queue and run.rank not in self.dead and not (stopped and self._beyond_stop(run, run.queue[0])):
                heads[run.rank] = run.queue[0]
        return heads

    def _beyond_stop(self, run: RankRun, unit: Unit) -> bool:
        return unit.records[0].record_id >= run.device_stopped_at

    def _complete_heads(self) -> bool:
        heads = self._heads()
        head_units = {id(u) for u in heads.values()}
        for unit in heads.values():
            if unit.kind == "collective":
                if self._complete_collective(unit.key, self.collectives[unit.key], head_units):
                    return True
                continue
            progressed = False
            for key in unit.keys:
                pair = self.p2p.get(key, {})
                if "send" in pair and "recv" in pair and not pair["send"][1].done:
                    if id(pair["send"][0]) in head_units and id(pair["recv"][0]) in head_units:
                        self._mark(pair["send"][1])
                        self._mark(pair["recv"][1])
                        self._maybe_done(pair["send"][0])
                        self._maybe_done(pair["recv"][0])
                        progressed = True
            if progressed:
                return True
        return False

    def _complete_collective(self, key: tuple, units: dict[int, Unit], heads: set | None = None) -> bool:
        members = key[1]
        if len(units) < len(members) or any(u.done for u in units.values()):
            return False
        if heads is not None and any(id(u) not in heads for u in units.values()):
            return False
        if len({u.signature for u in units.values()}) > 1:
            # gloo checks the bytes it receives against what it expects and raises ("Received data size
            # doesn't match expected size"): the ranks fail. Another kind of op at this seq never completes.
            if not self.nccl and len({u.signature[0] for u in units.values()}) == 1:
                self.errored = True
            return False
        for unit in units.values():
            for record in unit.records:
                self._mark(record)
            unit.done = True
        return True

    def _complete_gloo_broadcast(self, key: tuple, units: dict[int, Unit]) -> bool:
        """Each member's own tree from the root it was given: it completes once its receive and its sends are
        matched by the members that have arrived."""
        members = key[1]
        plans = {}
        for rank, unit in units.items():
            steps = binomial_tree(members.index(rank), unit.records[0].action.root, len(members))
            plans[rank] = [(op, members[peer]) for op, peer in steps]
        reached = _reached(plans)
        moved = False
        for rank, unit in units.items():
            if unit.done:
                continue
            blockers = _tree_blockers(rank, plans, reached)
            unit.blockers = frozenset(blockers)
            if not blockers:
                for record in unit.records:
                    self._mark(record)
                unit.done = moved = True
        return moved

    def _maybe_done(self, unit: Unit) -> None:
        if all(r.done for r in unit.records if r.name != "coalesced"):
            unit.done = True
            for record in unit.records:
                self._mark(record)

    @staticmethod
    def _mark(record: Record) -> None:
        record.done = True


def binomial_tree(me: int, root: int, size: int) -> list[tuple[str, int]]:
    """gloo::broadcast's steps for group rank `me` given `root`: ("send" | "recv", peer), in order; a recv
    blocks until its peer's send is posted, a send is posted at once and waited for at the end."""
    vrank = (me - root) % size
    dim = max(1, (size - 1).bit_length())
    mask = (1 << dim) - 1
    steps = []
    for i in range(dim):
        mask ^= 1 << i
        if vrank & mask:
            continue
        vpeer = vrank ^ (1 << i)
        if vpeer >= size:
            continue
        steps.append(("send" if not vrank & (1 << i) else "recv", (vpeer + root) % size))
    return steps


def _reached(plans: dict[int, list]) -> dict[int, int]:
    """How far each member gets through its steps: past every send, up to a recv whose send is not posted."""
    reached = dict.fromkeys(plans, 0)
    moved = True
    while moved:
        moved = False
        for rank, plan in plans.items():
            while reached[rank] < len(plan):
                op, peer = plan[reached[rank]]
                if op == "recv" and not _posted(plans, reached, peer, ("send", rank), inclusive=False):
                    break
                reached[rank] += 1
                moved = True
    return reached


def _posted(plans: dict, reached: dict, rank: int, step: tuple, inclusive: bool) -> bool:
    """Whether `rank` has posted `step` (a send once passed; a recv once reached)."""
    if rank not in plans or step not in plans[rank]:
        return False
    at = plans[rank].index(step)
    return at <= reached[rank] if inclusive else at < reached[rank]


def _tree_blockers(rank: int, plans: dict, reached: dict) -> set[int]:
    plan = plans[rank]
    if reached[rank] < len(plan):
        return {plan[reached[rank]][1]}  # its receive: the parent has not sent
    return {peer for op, peer in plan if op == "send" and not _posted(plans, reached, peer, ("recv", rank), True)}


# NCCL's choice for an all_reduce, measured with NCCL 2.28.9 over its socket transport, one rank a host
# (tests/fixtures/fr_cross_group_nccl's setup): two ranks take the ring at every size; four take the tree up to
# 1 KiB and the ring from 2 KiB; eight the tree up to 4 KiB and the ring from 8 KiB (both: 64 bytes times the
# ranks squared). Every other collective takes the ring.
_ALL_REDUCES = ("all_reduce", "all_reduce_barrier")
_DTYPE_BYTES = {"Float": 4, "Long": 8, "Byte": 1, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4}


def nccl_algorithm(name: str, numel: int, dtype: str, ranks: int) -> str:
    """The algorithm NCCL runs a collective of `numel` elements per rank with, on `ranks` ranks."""
    if name not in _ALL_REDUCES or ranks <= 2:
        return "ring"
    return "tree" if numel * _DTYPE_BYTES.get(dtype, 4) <= 64 * ranks * ranks else "ring"


def _connection(unit: Unit) -> tuple | None:
    """(group name, ranks, algorithm) a collective needs connected; None for sends and recvs (their peers are
    connected by the warm-up steps' own, which every departure repeats)."""
    if unit.kind != "collective":
        return None
    record = unit.records[0]
    numel = record.input_sizes[0][0] if record.input_sizes and record.input_sizes[0] else 1
    dtype = record.dtypes[0] if record.dtypes else "Float"
    algorithm = nccl_algorithm(record.name, numel, dtype, len(record.group.ranks))
    return (record.group.name, record.group.ranks, algorithm)


def _shape(action: Action, part: int, size: int, backend: str) -> tuple[str, list, list, list]:
    """The profiling name, sizes and dtypes the recorder writes for one collective (or one part of it)."""
    n, dtype, kind = action.numel, action.dtype, action.kind
    if kind == "all_reduce":
        return "all_reduce", [[n]], [[n]], [dtype]
    if kind == "broadcast":
        return "broadcast", [[n]], [[n]], [dtype]
    if kind == "all_gather_into_tensor":
        if backend == "nccl":
            return "_all_gather_base", [[n]], [[n * size]], [dtype]
        return "all_gather", [[n]], [[size, n]], [dtype]
    if kind == "reduce_scatter_tensor":
        return "_reduce_scatter_base", [[n]], [[n // size]], [dtype]
    if kind == "all_to_all_single":
        return "all_to_all", [[n]], [[n]], [dtype]
    if kind == "barrier":
        if backend == "nccl":
            return "all_reduce_barrier", [[1]], [[1]], ["Float"]
        return "barrier", [], [], []
    if kind == "all_gather_object":
        if part == 0:
            return "all_gather", [[1]], [[size, 1]], ["Long"]
        return "all_gather", [[n]], [[size, n]], ["Byte"]
    raise ValueError(f"not a collective: {kind}")


__all__ = ["binomial_tree", "Engine", "Outcome", "Record", "RankRun", "Unit", "Wait", "STORE", "nccl_algorithm"]
