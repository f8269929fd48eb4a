"""SPMD programs: one step's ops written once, every rank running them on its own groups.

A `Program` is a mesh and a step template (`OpSpec`s, each called from a `Site` of the job's code). Each
rank instantiates the template with its own groups and pipeline neighbours (`actions`), step after step.
`generate(rng)` draws a program the way real jobs are shaped: pipeline stages exchanging activations and
gradients (blocking sends and recvs, or a `batch_isend_irecv`), tensor-parallel collectives in the
forward, expert-parallel all_to_alls, data-parallel gradient collectives issued from autograd hooks (as
DDP's reducer and FSDP's hooks do: no Python frame of the job on that op), and world ops some steps only
(the loss, a barrier, an object collective, a store handshake).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from .mesh import WORLD, Group, Mesh

JOB_FILE = "/srv/job/train.py"

# Collectives a simulated job issues; "batch" is a batch_isend_irecv of `OpSpec.batch`.
COLLECTIVES = (
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "broadcast",
    "all_to_all_single",
    "barrier",
    "all_gather_object",
)
P2P = ("send", "recv")
STORE = ("store_set", "store_get")
SYNC = "sync"  # the step's end reads a result back: on NCCL the CPU waits for the device here
# How an op is issued: from the job's Python code, from autograd hooks during backward (DDP's reducer,
# FSDP2's post-backward), or from module hooks during forward (FSDP2's all-gathers).
MAIN, BACKWARD, FORWARD_HOOK = "main", "backward", "forward_hook"


@dataclass(frozen=True)
class Site:
    """Where in the job's code an op is called: the innermost user frame, then its callers."""

    function: str
    line: int
    callers: tuple[tuple[str, int], ...] = ()  # (function, line), innermost first
    file: str = JOB_FILE

    def frames(self) -> list[tuple[str, str, int]]:
        """(function, file, line), innermost first."""
        return [(self.function, self.file, self.line)] + [(f, self.file, line) for f, line in self.callers]


@dataclass(frozen=True)
class OpSpec:
    kind: str  # a collective, "send", "recv", "batch", "store_set", "store_get", "sync"
    dim: str  # the mesh dimension whose group it runs on, or WORLD
    site: Site
    numel: int = 1024
    dtype: str = "Float"
    offset: int = 0  # p2p: the peer's offset along `dim` (+1: the next stage, -1: the previous)
    # p2p on another group than its stages' (a job sending to its neighbour's global rank on the world): the
    # dimension the peer is the neighbour along, when it is not `dim`
    peer_dim: str = ""
    via: str = MAIN
    every: int = 1  # issued on steps divisible by `every` only
    batch: tuple[OpSpec, ...] = ()
    key: str = ""  # store ops: the key (the step is appended)
    root: int = -1  # a broadcast: its source, as a rank of its group (group_src)


@dataclass(frozen=True)
class Action:
    """One op as one rank issues it at one step."""

    kind: str
    group: Group | None
    site: Site
    step: int
    numel: int = 1024
    dtype: str = "Float"
    peer: int | None = None  # p2p: the peer's global rank
    via: str = MAIN
    batch: tuple[Action, ...] = ()
    key: str = ""
    spec: int = -1  # index of the OpSpec in the step template (-1: not from the template)
    part: int = 0  # all_gather_object's two all_gathers (the sizes, then the bytes), each waited for
    root: int = -1  # a broadcast: its source, as a rank of its group

    @property
    def identity(self) -> tuple:
        """What makes two actions the same op of a program (never its step)."""
        inner = tuple(a.identity for a in self.batch)
        name = self.group.name if self.group else None
        fields = (self.kind, name, self.peer, self.numel, self.dtype, self.site, self.via, inner, self.key, self.part)
        return fields + (self.root,)


@dataclass
class Program:
    mesh: Mesh
    template: list[OpSpec]
    steps: int  # healthy steps before the departing one (which is step `steps`)
    # NCCL creates a communicator at a group's first use unless the job initialised eagerly (device_id=...).
    eager_init: bool = True
    # NCCL runs each rank's own count: a collective whose sizes differ may complete (garbage) or hang,
    # by algorithm and protocol.
    mismatch_completes: bool = True
    end_site: Site = field(default_factory=lambda: Site("end_of_training", 400, (("main", 420),)))

    def actions(self, rank: int, step: int) -> list[Action]:
        """This rank's ops at `step`, in the order it issues them."""
        found = []
        for index, spec in enumerate(self.template):
            if (step + 1) % spec.every:
                continue  # a periodic op (logging, a checkpoint): first after `every` steps, as jobs do
            action = self._instantiate(spec, rank, step, index)
            if action is None:
                continue
            found.append(action)
            if action.kind == "all_gather_object":
                found.append(replace(action, part=1))
        return found

    def _instantiate(self, spec: OpSpec, rank: int, step: int, index: int) -> Action | None:
        group = self.mesh.group_of(rank, spec.dim)
        base = Action(
            spec.kind, group, spec.site, step, spec.numel, spec.dtype, via=spec.via, spec=index, root=spec.root
        )
        if spec.kind in P2P:
            peer = _neighbour(self.mesh, rank, spec.peer_dim or spec.dim, spec.offset)
            return None if peer is None else replace(base, peer=peer)
        if spec.kind == "batch":
            inner = [self._instantiate(s, rank, step, index) for s in spec.batch]
            inner = tuple(a for a in inner if a is not None)
            return replace(base, batch=inner) if inner else None
        if spec.kind in STORE:
            setter = group.ranks[0] == rank
            kind = "store_set" if setter else "store_get"
            return replace(base, kind=kind, key=f"{spec.key}/{step}")
        if spec.kind == SYNC:
            return replace(base, group=None)
        return base

    def end_action(self, rank: int) -> Action:
        """The barrier a rank that leaves the training loop waits in (the end of training)."""
        return Action("barrier", self.mesh.groups[0], self.end_site, self.steps + 1)


def _neighbour(mesh: Mesh, rank: int, dim: str, offset: int) -> int | None:
    coords = mesh.coords(rank)
    at = coords[dim] + offset
    if not 0 <= at < mesh.size_of(dim):
        return None
    return mesh.rank_at(coords | {dim: at})


# ---------------------------------------------------------------------------------------------- generation


_WORLD_SIZES = (2, 4, 4, 4, 8, 8, 8, 16)
_DIM_ORDER = ("pp", "dp", "ep", "cp", "tp")  # outermost first, as 3D-parallel jobs lay their meshes out


def _mesh(rng: random.Random, backend: str) -> Mesh:
    size = rng.choice(_WORLD_SIZES)
    names = [d for d in _DIM_ORDER if rng.random() < 0.5] or ["dp"]
    sizes = {name: 1 for name in names}
    left = size
    while left > 1:  # spread the factors of two over the chosen dimensions
        sizes[rng.choice(names)] *= 2
        left //= 2
    dims = tuple((name, n) for name, n in sizes.items() if n > 1) or (("dp", size),)
    hashed = backend == "nccl" and rng.random() < 0.5
    return Mesh(dims, hashed_names=hashed, mesh_descs=rng.random() < 0.7)


class _Lines:
    """Call sites of one job file: each function at its own lines."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.next = rng.randrange(20, 60)
        self.step_line = {}

    def site(self, function: str, caller: str = "train_step") -> Site:
        self.next += self.rng.randrange(2, 9)
        line = self.next
        callers = () if caller == "" else ((caller, self._caller_line(f"{caller}:{function}")),)
        return Site(function, line, callers + (("main", 300), ("<module>", 320)))

    def _caller_line(self, call: str) -> int:
        """Where the caller calls the function: one line per (caller, function)."""
        if call not in self.step_line:
            self.step_line[call] = 200 + 3 * len(self.step_line)
        return self.step_line[call]


def generate(rng: random.Random, backend: str) -> Program:
    mesh = _mesh(rng, backend)
    dims = dict(mesh.dims)
    lines = _Lines(rng)
    template: list[OpSpec] = []
    pick = rng.random

    def add(kind: str, dim: str, function: str, **kw) -> None:
        template.append(OpSpec(kind, dim, lines.site(function), **kw))

    if "pp" in dims:  # the forward: activations from the previous stage, to the next
        if pick() < 0.3:
            batch = (
                OpSpec("recv", "pp", lines.site("forward_stage"), offset=-1),
                OpSpec("send", "pp", lines.site("forward_stage"), offset=+1),
            )
            template.append(OpSpec("batch", "pp", lines.site("forward_stage"), batch=batch))
        else:
            add("recv", "pp", "forward_stage", offset=-1)
            add("send", "pp", "forward_stage", offset=+1)
    if "cp" in dims:
        add("all_gather_into_tensor", "cp", "attention")
    if "tp" in dims:
        for _ in range(rng.randint(1, 2)):
            kind = rng.choice(("all_reduce", "all_gather_into_tensor", "all_reduce"))
            add(kind, "tp", rng.choice(("attention", "mlp")))
    if "ep" in dims:
        add("all_to_all_single", "ep", "dispatch_tokens")
        add("all_to_all_single", "ep", "combine_tokens")
    if "pp" in dims:  # the backward: gradients from the next stage, to the previous
        add("recv", "pp", "backward_stage", offset=+1)
        add("send", "pp", "backward_stage", offset=-1)
    _gradient_sync(rng, template, lines, dims, backend)
    if pick() < 0.8:
        add("all_reduce", WORLD, "reduce_loss", numel=1)
    if pick() < 0.3:
        add("all_gather_object", WORLD, "log_metrics", every=rng.choice((1, 2, 3)))
    if pick() < 0.25:
        add("barrier", WORLD, "save_checkpoint", every=rng.choice((2, 3)))
    if pick() < 0.2:
        add("store_get", rng.choice([WORLD, *dims]), "share_config", key="config", every=rng.choice((1, 2)))
    if not any(s.kind not in (SYNC,) and s.every == 1 for s in template):
        add("all_reduce", WORLD, "reduce_loss", numel=1)
    add(SYNC, WORLD, "finish_step")
    eager = backend != "nccl" or pick() < 0.6
    return Program(mesh, template, steps=rng.randint(2, 6), eager_init=eager, mismatch_completes=pick() < 0.5)


def with_broadcasts(program: Program, rng: random.Random) -> Program:
    """The program with rooted collectives added before its step's end, as jobs issue them: a decision one rank
    takes and broadcasts to its peers every few steps (a learning rate, a skip flag), or ZeRO's parameter sync
    (`ZeroRedundancyOptimizer`: each rank of the data-parallel group broadcasts the shard it updated, one
    broadcast per rank, from one line)."""
    dims = dict(program.mesh.dims)
    lines = _Lines(rng)
    lines.next = 700
    template = list(program.template[:-1])
    if "dp" in dims and rng.random() < 0.5:
        site = lines.site("sync_shards", caller="optimizer_step")
        template += [OpSpec("broadcast", "dp", site, numel=4096, root=r) for r in range(dims["dp"])]
    else:
        dim = rng.choice([WORLD, *dims])
        root = rng.randrange(program.mesh.size_of(dim)) if rng.random() < 0.3 else 0
        every = rng.choice((1, 1, 2))
        template.append(OpSpec("broadcast", dim, lines.site("sync_decision"), numel=1, root=root, every=every))
    return replace(program, template=template + program.template[-1:])


def _gradient_sync(rng, template: list[OpSpec], lines: _Lines, dims: dict, backend: str) -> None:
    """Data-parallel gradients: DDP's bucketed all_reduces, or FSDP's reduce-scatter (NCCL; gloo has none),
    issued from autograd hooks while the step's `loss.backward()` runs."""
    if "dp" not in dims:
        return
    backward = lines.site("train_step", caller="")
    style = rng.choice(("ddp", "ddp", "fsdp")) if backend == "nccl" else "ddp"
    if style == "fsdp":
        template.append(OpSpec("reduce_scatter_tensor", "dp", backward, numel=4096, via=BACKWARD))
        return
    for _ in range(rng.randint(1, 3)):
        template.append(OpSpec("all_reduce", "dp", backward, numel=rng.choice((1024, 2048, 4096)), via=BACKWARD))
