"""How one rank departs from the program its peers run, at one step: every way real jobs hang.

- `skip`: it does not issue one op (a collective, a send or recv, an op of a batch, its store.set).
- `extra`: it issues one op more (a collective its peers do not call then).
- `world_for_subgroup`: it calls a collective on the world group where its peers use their subgroup.
- `swap`: it issues two ops in the other order (two groups' collectives, a send and a recv), from their own
  lines or from a function of its own (`new_site`).
- `subgroup_barrier`: it waits in a barrier on its subgroup where its peers go on (to that subgroup's op, or
  to another group's op after it: `other`).
- `size`: it calls a collective with other sizes (NCCL runs it, so the hang comes later).
- `early_exit`: it leaves the training loop and waits in the end-of-training barrier.
- `exit`: it returns from the program (its process ends) while its peers go on.
- `die`: its process is killed (SIGKILL, the OOM killer): no dump, no stack.
- `stuck`: its main thread blocks outside any collective: asleep, computing, on a lock, joining a thread,
  in a queue, in a socket's recv, in the data loader.
- `wedge` (NCCL): its device stops before an op, and its recorder stops seeing completions a few ops
  earlier: its dump still lists as pending ops its peers completed.

Drawn only when asked for (`draw(..., kinds=...)`, so that every seed of the kinds above stays the case it was):

- `wrong_root`: it calls a broadcast with another source than its peers (a leader it chose alone, an
  off-by-one shard owner).
- `wrong_peer`: it sends to, or receives from, another rank of the group than its program's neighbour (a
  stage index taken for a rank, a ring hop computed wrongly).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from .mesh import WORLD
from .program import COLLECTIVES, P2P, SYNC, Action, Program, Site

KINDS = (
    "skip",
    "extra",
    "world_for_subgroup",
    "swap",
    "subgroup_barrier",
    "size",
    "early_exit",
    "exit",
    "die",
    "stuck",
    "wedge",
)
ON_REQUEST = ("wrong_root", "wrong_peer")  # kinds drawn only when asked for
STUCK_STATES = ("sleep", "compute", "lock", "join", "queue", "socket", "dataloader")
TERMINAL = ("early_exit", "exit", "die", "stuck")
EXTRA_STEPS = 2  # steps every rank would run after the departing one, had nothing hung


@dataclass(frozen=True)
class Departure:
    kind: str
    rank: int
    step: int
    at: int  # index into the culprit's actions of that step
    # swap: the second index; extra: the index of the op repeated; subgroup_barrier: the op whose group the
    # barrier is on, when not the op at `at`
    other: int = -1
    detail: str = ""  # stuck: the state; wedge: how many earlier completions its recorder missed
    new_site: Site | None = None  # where the departing call is made, when not from the program's own line


def _comm(action: Action) -> bool:
    return action.kind in COLLECTIVES or action.kind in P2P or action.kind == "batch"


def candidates(program: Program, rank: int, step: int, backend: str) -> list[tuple[str, int, int]]:
    """(kind, at, other) of every departure this rank could make at this step."""
    actions = program.actions(rank, step)
    found = []
    for i, action in enumerate(actions):
        if action.kind == SYNC:
            continue
        if (_comm(action) and action.part == 0) or action.kind == "store_set":
            found.append(("skip", i, -1))
        if action.kind in COLLECTIVES and action.part == 0:
            found.append(("extra", i, i))
            found += [("early_exit", i, -1), ("exit", i, -1), ("die", i, -1), ("stuck", i, -1)]
            if action.group.dim != WORLD and action.kind != "all_gather_object":
                found.append(("world_for_subgroup", i, -1))
                found.append(("subgroup_barrier", i, -1))
            if backend == "nccl" and action.kind in ("all_reduce", "all_gather_into_tensor", "broadcast"):
                found.append(("size", i, -1))
            if backend == "nccl":
                found.append(("wedge", i, -1))
        if action.kind == "batch" and len(action.batch) > 1:
            found.append(("skip", i, -1))  # an op of the batch (which one: `_apply`)
        if action.kind == "broadcast" and action.root >= 0 and len(action.group.ranks) > 1:
            found.append(("wrong_root", i, -1))
        if _other_peers(action, rank):
            found.append(("wrong_peer", i, -1))
        for j in range(i + 1, len(actions)):
            other = actions[j]
            if other.kind == SYNC or not (_comm(action) and _comm(other)):
                continue
            if other.part or action.part:
                continue
            if action.identity[:3] != other.identity[:3]:
                found.append(("swap", i, j))
    return found


def _other_peers(action: Action, rank: int) -> list[tuple[int, int]]:
    """(op of its batch or -1, peer) for every wrong peer a send or recv of this action could name: another
    rank of its group than itself and its neighbour."""
    ops = list(enumerate(action.batch)) if action.kind == "batch" else [(-1, action)]
    found = []
    for index, op in ops:
        if op.kind in P2P and op.peer is not None:
            found += [(index, r) for r in op.group.ranks if r not in (rank, op.peer)]
    return found


def draw(rng: random.Random, program: Program, backend: str, kinds: tuple[str, ...] = ()) -> Departure | None:
    """One rank's departure at the departing step: of any kind but those drawn on request, or of `kinds`
    (None when this program offers none of them)."""
    rank = rng.randrange(program.mesh.size)
    step = program.steps
    options = candidates(program, rank, step, backend)
    by_kind: dict[str, list] = {}
    wanted = set(kinds) if kinds else set(KINDS)
    for option in options:
        if option[0] in wanted:
            by_kind.setdefault(option[0], []).append(option)
    if not by_kind:
        return None
    kind = rng.choice(sorted(by_kind))
    _, at, other = rng.choice(by_kind[kind])
    action = program.actions(rank, step)[at]
    detail = ""
    if kind == "stuck":
        detail = rng.choice(STUCK_STATES)
    elif kind == "wedge":
        detail = str(rng.randint(0, 2))
    elif kind == "skip" and action.kind == "batch":
        detail = str(rng.randrange(len(action.batch)))
    elif kind == "wrong_root":
        detail = str(rng.choice([r for r in range(len(action.group.ranks)) if r != action.root]))
    elif kind == "wrong_peer":
        index, peer = rng.choice(_other_peers(action, rank))
        detail = f"{index}:{peer}"
    new_site = _departing_site(rng, program, kind, action, detail)
    return Departure(kind, rank, step, at, other, detail, new_site)


_STUCK_FUNCTIONS = {
    "sleep": "wait_for_data",
    "compute": "evaluate",
    "lock": "update_shared_state",
    "join": "wait_for_checkpoint_thread",
    "queue": "next_batch_from_queue",
    "socket": "receive_side_channel",
    "dataloader": "next_batch",
}


def _departing_site(rng: random.Random, program: Program, kind: str, action: Action, detail: str) -> Site | None:
    """The line the departing call is made from: its own branch of the job's code, as real bugs are."""
    line = 500 + rng.randrange(0, 80) * 3
    callers = action.site.callers
    if kind == "world_for_subgroup":
        return Site(f"{action.kind}_on_the_world_instead", line, callers)
    if kind == "subgroup_barrier":
        return Site("wait_for_subgroup", line, callers)
    if kind == "extra" and rng.random() < 0.5:
        return Site(f"another_{action.site.function}", line, callers)
    if kind == "stuck":
        return Site(_STUCK_FUNCTIONS[detail], line, callers)
    if kind == "size":
        return Site(f"{action.site.function}_resized", line, callers)
    return None


def apply(program: Program, departure: Departure, rank: int, step: int) -> tuple[list[Action], bool]:
    """This rank's actions at this step with the departure applied (when it is the culprit's), and whether
    its program ends there."""
    actions = program.actions(rank, step)
    if rank != departure.rank or step != departure.step:
        return actions, False
    return _apply(program, departure, actions)


def _apply(program: Program, d: Departure, actions: list[Action]) -> tuple[list[Action], bool]:
    at = actions[d.at]
    site = d.new_site or at.site
    kind = d.kind
    if kind == "skip":
        if at.kind == "batch" and d.detail:
            kept = tuple(op for i, op in enumerate(at.batch) if i != int(d.detail))
            # A batch left empty is no call at all (torch refuses an empty batch_isend_irecv list).
            rest = [replace(at, batch=kept)] if kept else []
            return actions[: d.at] + rest + actions[d.at + 1 :], False
        drop = {d.at, d.at + 1} if at.kind == "all_gather_object" else {d.at}
        return [a for i, a in enumerate(actions) if i not in drop], False
    if kind == "extra":
        copy = replace(at, site=site, spec=-1)
        extra = [copy, replace(copy, part=1)] if at.kind == "all_gather_object" else [copy]
        return actions[: d.at] + extra + actions[d.at :], False
    if kind == "world_for_subgroup":
        moved = replace(at, group=program.mesh.groups[0], site=site, spec=-1)
        return actions[: d.at] + [moved] + actions[d.at + 1 :], False
    if kind == "swap":
        swapped = list(actions)
        first, second = actions[d.other], actions[d.at]
        if d.new_site is not None:  # the two calls made from a function of their own (a `receive_first`)
            first, second = replace(first, site=d.new_site, spec=-1), replace(second, site=d.new_site, spec=-1)
        swapped[d.at], swapped[d.other] = first, second
        return swapped, False
    if kind == "subgroup_barrier":
        group = actions[d.other].group if d.other >= 0 else at.group
        barrier = Action("barrier", group, site, at.step)
        return actions[: d.at] + [barrier] + actions[d.at :], False
    if kind == "size":
        resized = replace(at, numel=at.numel * 2, site=site, spec=-1)
        return actions[: d.at] + [resized] + actions[d.at + 1 :], False
    if kind == "early_exit":
        return actions[: d.at] + [program.end_action(d.rank)], True
    if kind == "exit":
        return actions[: d.at] + [Action("exit", None, at.site, at.step)], True
    if kind == "die":
        return actions[: d.at] + [Action("die", None, at.site, at.step)], True
    if kind == "stuck":
        return actions[: d.at] + [Action("stuck", None, site, at.step, key=d.detail)], True
    if kind == "wedge":
        return actions[: d.at] + [Action("wedge", None, at.site, at.step, key=d.detail)] + actions[d.at :], False
    if kind == "wrong_root":
        return actions[: d.at] + [replace(at, root=int(d.detail), spec=-1)] + actions[d.at + 1 :], False
    if kind == "wrong_peer":
        index, peer = (int(x) for x in d.detail.split(":"))
        if index < 0:
            moved = replace(at, peer=peer, spec=-1)
        else:
            ops = tuple(replace(op, peer=peer) if i == index else op for i, op in enumerate(at.batch))
            moved = replace(at, batch=ops, spec=-1)
        return actions[: d.at] + [moved] + actions[d.at + 1 :], False
    raise ValueError(kind)


def schedule(program: Program, departure: Departure | None) -> dict[int, list[Action]]:
    """Every rank's actions, step after step, then the end of training; the culprit's departs."""
    found = {}
    for rank in range(program.mesh.size):
        actions: list[Action] = []
        ended = False
        for step in range(program.steps + 1 + EXTRA_STEPS):
            if departure is None:
                these, ended = program.actions(rank, step), False
            else:
                these, ended = apply(program, departure, rank, step)
            actions += these
            if ended:
                break
        if not ended:
            actions.append(program.end_action(rank))
        found[rank] = actions
    return found
