"""What really happened, from the simulation alone: who departed, where, and what the artifacts can show.

- `culprit`, `kind`: the departure drawn.
- `sites`: the lines a user should read as the culprit's departure point, any of which a verdict may name: the
  call site of the first op it issued that its program would not have issued there (the other group's
  collective, the barrier, the op it went on to) and of the op it skipped or moved; else where its main thread
  waits (asleep, on a lock, ...), when a stack shows it. Empty for a rank whose process is gone, a device
  that stopped, or a wait only a stack would show where no stack was taken.
- `visible_by`: what in the artifacts of a layout shows that the culprit left its program: its own
  flight-recorder entries (they stop being a prefix of what its program records), its stack (it waits
  outside any collective, or in a collective its recorded history never issued), its absence (a rank of a
  known world has no process), its recorder's states (ops its peers completed still pending). Empty when
  nothing does: then no analysis can tell the culprit from the ranks it deadlocked with, and the right
  answer is `candidates`, the deadlocked ranks (the terminal cycle of who waits for whom). Empty too where
  another story leaves the same artifacts: the culprit healthy in a loop of another length and one other rank
  of its deadlock departing by running the loop as long as this program has it (a loop that ended a step
  sooner on one rank, and one that ran longer or made one op more on its peer, are one record).
- `waits_for`: rank -> the ranks it waits for (its group's members that never reached its op, the peer
  of its send or recv, the rank that should set the store key it waits for).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .artifacts import Layout
from .departures import EXTRA_STEPS, Departure, schedule
from .engine import Engine, Outcome, RankRun, Record
from .frames import waiting_frames
from .program import SYNC, Program


@dataclass
class Truth:
    culprit: int
    kind: str
    detail: str
    sites: tuple[tuple[str, int], ...]
    visible_by: str
    candidates: tuple[int, ...]
    gone: dict[int, str] = field(default_factory=dict)
    waits_for: dict[int, frozenset] = field(default_factory=dict)

    @property
    def decidable(self) -> bool:
        return bool(self.visible_by)


def find(program: Program, departure: Departure, outcome: Outcome, backend: str, layout: Layout) -> Truth:
    healthy = Engine(backend, schedule(program, None), program.eager_init, program.mismatch_completes).run()
    culprit = departure.rank
    run = outcome.ranks[culprit]
    gone = {r: x.wait.kind for r, x in outcome.ranks.items() if x.wait and x.wait.kind in ("dead", "exited")}
    waits = waits_for(outcome, healthy)
    visible = _visible_by(program, departure, outcome, healthy, backend, layout, gone)
    candidates = _terminal(waits, culprit)
    if visible == "record" and _another_loop_length(program, departure, outcome, backend, candidates):
        visible = ""  # two stories leave these records: the candidates are the answer
    sites = () if departure.kind == "wedge" else _sites(program, departure, run, healthy.ranks[culprit], gone, layout)
    return Truth(culprit, departure.kind, departure.detail, sites, visible, candidates, gone, waits)


# ------------------------------------------------------------------------------------------------- the site


_SILENT = (SYNC, "store_set")  # actions no artifact shows where they were issued (gloo's sync is nothing at all)


def _sites(program, departure, run: RankRun, healthy: RankRun, gone: dict, layout: Layout) -> tuple:
    if run.rank in gone:
        return ()
    found = []
    executed = run.actions[: run.pc]
    for at, (mine, usual) in enumerate(zip(executed, healthy.actions, strict=False)):
        if mine.identity != usual.identity:
            shown = next((a for a in executed[at:] if a.kind not in _SILENT), None)  # the first a dump can show
            if shown is not None and shown.kind not in ("stuck", "wedge"):
                found.append(_at(shown.site))
            changed = ("skip", "swap", "world_for_subgroup", "size", "wrong_root", "wrong_peer")
            if departure.kind in changed and usual.kind not in _SILENT:
                found.append(_at(usual.site))  # the op it skipped, moved or changed
            break
    wait = run.wait
    if wait is not None and wait.kind == "stuck" and layout.stacks is not None:
        python, _, _ = waiting_frames(wait.detail, wait.action.site)
        found += [(file, line) for _, file, line in python if file.startswith("/srv/job/")][:2]
    elif wait is not None and wait.action is not None and wait.kind not in ("stuck",) and not found:
        found.append(_at(wait.action.site))
    return tuple(dict.fromkeys(found))


def _at(site) -> tuple[str, int]:
    return (site.file, site.line)


# --------------------------------------------------------------------------------------------- visibility


def _token(record: Record, backend: str) -> tuple:
    site = (record.action.site.file, record.action.site.line) if record.python else None
    token = (record.group.name, record.group.ranks, record.name, str(record.input_sizes), tuple(record.dtypes), site)
    token += (record.is_p2p, record.src, record.dst)
    return token + ((record.op_id,) if backend != "nccl" else ())


def _visible_by(program, departure, outcome: Outcome, healthy: Outcome, backend: str, layout: Layout, gone) -> str:
    culprit = departure.rank
    if culprit in gone:
        # py-spy's capture knows the node's ranks, `run` has each rank record itself as it starts, NCCL's dumps
        # list each group's ranks; gloo's dumps alone know no rank that left none.
        knows_world = layout.stacks is not None or (layout.dumps and backend == "nccl")
        in_a_gap = culprit < max(outcome.ranks)  # a rank below the highest one that left artifacts
        return "absence" if knows_world or in_a_gap else ""
    run, usual = outcome.ranks[culprit], healthy.ranks[culprit]
    if layout.dumps:
        mine = [_token(r, backend) for r in run.records]
        expected = [_token(r, backend) for r in usual.records[: len(mine)]]
        if mine != expected or _extra_hidden(run, usual):
            return "record"
        if departure.kind == "wedge" and (int(departure.detail or 0) > 0 or _began_by_peers(outcome, run, layout)):
            return "states"
    wait = run.wait
    if layout.stacks is not None and wait is not None and wait.kind == "stuck":
        return "stack"  # it waits outside any collective, for nothing its peers do
    if layout.dumps and wait is not None and wait.kind == "stuck" and all(r.done for r in run.records):
        return "sink"  # every op it issued completed, while its peers wait in one it never issued
    return ""


def _another_loop_length(program, departure, outcome: Outcome, backend: str, candidates: tuple[int, ...]) -> bool:
    """Whether another story leaves the same artifacts: the culprit healthy in a loop of another length, and one
    other rank of its deadlock departing by running the loop as long as the program really had it (its actions
    as they were). A loop that ended a step sooner on one rank and a loop that ran longer (or one op more) on its
    peer are then one record: where no third rank shows the count, no artifact tells them apart."""
    if departure.kind in ("exit", "die", "stuck", "wedge"):
        return False  # its last act (an exit, a wait outside any collective) is no loop's end
    actual = schedule(program, departure)
    seen = _observed(outcome, backend)
    length = program.steps + 1 + EXTRA_STEPS
    run = outcome.ranks[departure.rank]
    issued = _shown(run.actions[: run.pc])
    # Only loops whose healthy run begins with what the culprit issued, as far as an artifact shows it (a few
    # engine runs, not one per length).
    lengths = [n for n in range(1, length + 3) if n != length and _begins(_loop(program, departure.rank, n), issued)]
    for other in (r for r in candidates if r != departure.rank):
        for steps in lengths:
            actions = {rank: _loop(program, rank, steps) for rank in actual}
            actions[other] = actual[other]
            alternative = Engine(backend, actions, program.eager_init, program.mismatch_completes).run()
            if not alternative.finished and _observed(alternative, backend) == seen:
                return True
    return False


def _shown(actions: list) -> list:
    return [a.identity for a in actions if a.kind not in _SILENT]


def _begins(actions: list, issued: list) -> bool:
    shown = _shown(actions)
    return len(shown) >= len(issued) and shown[: len(issued)] == issued


def _loop(program, rank: int, steps: int) -> list:
    """The rank's healthy actions in a loop of `steps` steps, then the end of training."""
    return [a for step in range(steps) for a in program.actions(rank, step)] + [program.end_action(rank)]


def _observed(outcome: Outcome, backend: str) -> dict:
    """What the artifacts can show of each rank: its records (as `_token` compares them) and where it waits."""
    found = {}
    for rank, run in outcome.ranks.items():
        wait = run.wait
        where = (wait.kind, wait.action.kind, wait.action.site) if wait and wait.action else (wait and wait.kind)
        found[rank] = ([_token(r, backend) for r in run.records], len(run.hidden), where)
    return found


def _began_by_peers(outcome: Outcome, run: RankRun, layout: Layout) -> bool:
    """With the recorder timing ops (TORCH_NCCL_ENABLE_TIMING=1): the culprit's device never began the collective
    at the head of its queue, and a peer's device began the same one (its own head)."""
    if not layout.timing or run.device_stopped_at is None:
        return False
    head = next((unit for unit in run.queue if not unit.done), None)
    if head is None or head.kind != "collective" or head.records[0].record_id < run.device_stopped_at:
        return False
    for member in head.key[1]:
        peer = outcome.ranks[member]
        peer_head = next((unit for unit in peer.queue if not unit.done), None) if member != run.rank else None
        if peer_head is not None and peer_head.key == head.key:
            return True
    return False


def _extra_hidden(run: RankRun, usual: RankRun) -> bool:
    """gloo: more unrecorded ops (sends, recvs) issued than the program had issued by then."""
    return len(run.hidden) > len([h for h in usual.hidden if h.op_id <= max((r.op_id for r in run.hidden), default=0)])


# ---------------------------------------------------------------------------------------------- wait-for


def waits_for(outcome: Outcome, healthy: Outcome) -> dict[int, frozenset]:
    setters = {a.key: r for r, x in healthy.ranks.items() for a in x.actions if a.kind == "store_set"}
    found = {}
    for rank, run in outcome.ranks.items():
        wait = run.wait
        if wait is None or wait.kind in ("stuck", "dead", "exited"):
            found[rank] = frozenset()
        elif wait.kind == "store":
            found[rank] = frozenset({setters[wait.detail]} - {rank}) if wait.detail in setters else frozenset()
        elif wait.kind == "init":
            found[rank] = frozenset(wait.action.group.ranks) - _arrived(outcome, wait.action) - {rank}
        else:
            # On NCCL the device runs a rank's ops in order: it waits in the first that has not completed.
            head = [u for u in run.queue if not u.done][:1]
            units = head if run.queue else list(wait.units)
            found[rank] = frozenset(_blockers(outcome, rank, units))
    return found


def _arrived(outcome: Outcome, action) -> set[int]:
    """The ranks blocked creating the communicator of `action`'s group."""
    waits = {r: x.wait for r, x in outcome.ranks.items() if x.wait is not None}
    return {r for r, w in waits.items() if w.kind == "init" and w.action.group == action.group}


def _blockers(outcome: Outcome, rank: int, units) -> set[int]:
    heads = {r: next((u for u in x.queue if not u.done), None) for r, x in outcome.ranks.items()}
    nccl = any(x.queue for x in outcome.ranks.values())
    found: set[int] = set()
    for unit in units:
        if unit.done:
            continue
        if unit.kind == "collective" and unit.blockers:  # gloo's broadcast: its own tree's peers
            found |= unit.blockers
        elif unit.kind == "collective":
            group_ranks = unit.key[1]
            for member in group_ranks:
                peer_unit = _unit_at(outcome, member, unit.key)
                if peer_unit is None or (nccl and heads.get(member) is not peer_unit):
                    found.add(member)
            if not found:  # every member is there: another kind of op at this seq
                found |= set(group_ranks) - {rank}
        else:
            for record in unit.records:
                if record.done or record.name == "coalesced":
                    continue
                group = record.group
                peer = group.ranks[record.dst if record.name == "send" else record.src]
                found.add(peer)
    return found - {rank} if found != {rank} else found


def _unit_at(outcome: Outcome, rank: int, key: tuple):
    for unit in _units(outcome.ranks[rank]):
        if unit.kind == "collective" and unit.key == key:
            return unit
    return None


def _units(run: RankRun):
    seen = []
    for unit in list(run.queue) + ([u for u in run.wait.units] if run.wait and run.wait.units else []):
        seen.append(unit)
    return seen


def _terminal(waits: dict[int, frozenset], culprit: int) -> tuple[int, ...]:
    """The ranks the culprit's chain of waits ends in, with it: the terminal strongly connected sets it
    reaches (itself, when it waits for nobody)."""
    reach = {r: _reachable(waits, r) for r in _reachable(waits, culprit)}
    terminal = {r for r, mine in reach.items() if all(r in reach[s] for s in mine)}
    return tuple(sorted(terminal | {culprit}))


def _reachable(waits: dict[int, frozenset], start: int) -> set[int]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in waits.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen
