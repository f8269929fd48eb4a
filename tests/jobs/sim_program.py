"""Job: a program of the hang simulator (tests/sim) run for real on torchrun + gloo, until it is killed.

    SEED=<seed> [SIM_JOB_DIR=<folder>] torchrun --standalone --nproc_per_node <world> tests/jobs/sim_program.py

It builds what `sim.case.make(SEED, backend="gloo")` builds, with the simulator's own functions: the program
(`program.generate`), the departure (`departures.draw`) and every rank's actions (`departures.schedule`),
and plays this rank's actions with real calls:

- the mesh's process groups: every rank calls `dist.new_group(ranks, group_desc=...)` for every group of
  `mesh.groups` after the world, in that order, so gloo names them as the simulator does ("1", "2", ...);
- collectives on the action's group (a world op passes no group), on tensors of `numel` floats; sends,
  recvs and `batch_isend_irecv` with the action's peer; store set/get of the action's key on the default
  store; `sync` is nothing on gloo (the result is on the host);
- gradient collectives (`via == "backward"`) from inside a real `loss.backward()`: each is the backward of an
  autograd Function of its own, issued asynchronously, and the end of backward waits for them all (the
  engine's final callbacks are the works' own `wait`, so the waiting stack is autograd's frames and no
  Python frame of the job, as DDP's reducer waits in `finalize_backward`);
- the departure: `stuck` really blocks (asleep, computing, on a held lock, joining a thread that never
  ends, on an empty queue, in a socket's recv, in a DataLoader whose worker never delivers), `exit` leaves
  with status 0, `die` SIGKILLs itself; and the barrier of the end of training.

Each action is called from a function of its own named after the action's call site (`Site.function`),
which calls torch.distributed itself, so stacks and flight-recorder frames carry the simulator's names (their
lines are this job's). Those functions are written from one template into `train.py` in SIM_JOB_DIR
(default: a folder under the temporary directory), one per name the program uses, and imported from there.

Every rank prints `READY rank=<r> pid=<pid>` (flushed) at the start of the departing step. The process-group
timeout is HANG_TIMEOUT_S (600 s by default), so the job hangs until it is killed; a worker whose agent is
gone exits within a second (`exit_when_orphaned`). Programs of more than MAX_RANKS ranks are refused.
"""

# ruff: noqa: E402 - the launcher's pid is read before the imports
from __future__ import annotations

import os

LAUNCHER = os.getppid()  # before the imports (torch's take seconds): a launcher gone by then is noticed too

import importlib.util
import queue
import random
import socket
import sys
import tempfile
import threading
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from _common import env_int, exit_when_orphaned  # the job folder is on sys.path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: the simulator
from sim.departures import Departure, draw, schedule
from sim.mesh import WORLD
from sim.program import BACKWARD, Action, Program, generate

BACKEND = "gloo"
MAX_RANKS = 8
TIMEOUT = timedelta(seconds=env_int("HANG_TIMEOUT_S", 600))
# What the simulator may draw that this job cannot run on gloo (NCCL's features).
UNSUPPORTED = ("reduce_scatter_tensor", "wedge")


def build(seed: int) -> tuple[Program, Departure]:
    """The program and departure of `sim.case.make(seed, backend="gloo")`, drawn in the same order."""
    rng = random.Random(seed)
    program = generate(rng, BACKEND)
    return program, draw(rng, program, BACKEND)


def unsupported(program: Program, departure: Departure) -> str | None:
    """Why this job cannot run the program for real, or None."""
    if program.mesh.size > MAX_RANKS:
        return f"{program.mesh.size} ranks (at most {MAX_RANKS})"
    if program.mesh.hashed_names or not program.eager_init:
        return "NCCL's group names or lazy communicators"
    kinds = {a.kind for actions in schedule(program, departure).values() for a in actions}
    kinds |= {b.kind for actions in schedule(program, departure).values() for a in actions for b in a.batch}
    found = sorted(kinds & set(UNSUPPORTED)) or ([departure.kind] if departure.kind in UNSUPPORTED else [])
    return f"NCCL only: {', '.join(found)}" if found else None


# --- the call sites ------------------------------------------------------------------------------------

HEADER = '''"""The call sites of the simulated program of seed {seed} (tests/sim), written by tests/jobs/sim_program.py:
one function per site name, each calling torch.distributed itself. A site function is called as
`site(call)` from the training step, or as the backward of an autograd Function (`site(ctx, grad)`)
while `loss.backward()` runs; either way `ctx.job` and `ctx.a` are the job and the action."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

SITES = {{}}


def _compute(job):
    while True:
        job.matrix = torch.tanh(job.matrix @ job.matrix)
'''

# One body for every site: the call an action makes is on a line of the site's own function.
SITE = """

def {name}(ctx, grad=None):
    job, a = ctx.job, ctx.a
    x, on, work = job.tensor(a), job.group_kwargs(a), None
    if a.kind == "all_reduce":
        work = dist.all_reduce(x, **on)
    elif a.kind == "all_gather_into_tensor":
        work = dist.all_gather_into_tensor(job.gathered(a), x, **on)
    elif a.kind == "broadcast":
        work = dist.broadcast(x, src=a.group.ranks[0], **on)
    elif a.kind == "all_to_all_single":
        work = dist.all_to_all_single(torch.empty_like(x), x, **on)
    elif a.kind == "barrier":
        work = dist.barrier(**on)
    elif a.kind == "all_gather_object":
        dist.all_gather_object([None] * len(a.group.ranks), job.metrics(a), **on)
    elif a.kind == "send":
        dist.send(x, dst=a.peer, **on)
    elif a.kind == "recv":
        dist.recv(x, src=a.peer, **on)
    elif a.kind == "batch":
        for each in dist.batch_isend_irecv(job.p2p_ops(a)):
            each.wait()
    elif a.kind == "store_set":
        job.store.set(a.key, str(job.rank))
    elif a.kind == "store_get":
        job.store.get(a.key)
    elif a.kind == "sync":
        pass  # gloo: the step's result is on the host already
    elif a.kind == "stuck" and a.key == "sleep":
        time.sleep(10**6)
    elif a.kind == "stuck" and a.key == "compute":
        _compute(job)
    elif a.kind == "stuck" and a.key == "lock":
        job.lock.acquire()
    elif a.kind == "stuck" and a.key == "join":
        job.helper.join()
    elif a.kind == "stuck" and a.key == "queue":
        job.requests.get()
    elif a.kind == "stuck" and a.key == "socket":
        job.side_channel.recv(8)
    elif a.kind == "stuck" and a.key == "dataloader":
        next(job.loader)
    elif a.kind == "exit":
        sys.stdout.flush()
        os._exit(0)
    elif a.kind == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        raise ValueError(f"no real call for {{a.kind}}")
    job.issued(work)
    return grad, None


SITES["{name}"] = {name}
"""


def site_names(program: Program, actions: dict[int, list[Action]]) -> list[str]:
    names = {a.site.function for each in actions.values() for a in each}
    return sorted(names | {program.end_site.function})


def write_sites(seed: int, names: list[str], folder: Path) -> Path:
    """train.py with one function per site name; every rank writes the same text (atomically)."""
    for name in names:
        if not name.isidentifier() or name.startswith("_"):
            raise ValueError(f"site function {name!r} is not a plain name")
    text = HEADER.format(seed=seed) + "".join(SITE.format(name=name) for name in names)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train.py"
    if not path.exists() or path.read_text() != text:
        partial = folder / f".train.py.{os.getpid()}"
        partial.write_text(text)
        os.replace(partial, path)
    return path


def load_sites(path: Path):
    spec = importlib.util.spec_from_file_location("train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the job -------------------------------------------------------------------------------------------


class Call:
    """What a site function reads when it is called from the step rather than from autograd."""

    def __init__(self, job: Job, action: Action) -> None:
        self.job, self.a = job, action


class _Blocking(torch.utils.data.Dataset):
    """A dataset whose worker never delivers a sample (a stuck file system, a dead remote reader)."""

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, index: int):
        threading.Event().wait()


class Job:
    def __init__(self, program: Program, departure: Departure, rank: int, sites) -> None:
        self.program, self.departure, self.rank, self.sites = program, departure, rank, sites
        self.store = dist.distributed_c10d._get_default_store()
        self.groups = {"0": None}
        for group in program.mesh.groups[1:]:
            made = dist.new_group(list(group.ranks), timeout=TIMEOUT, group_desc=group.desc)
            if rank in group.ranks:
                self.groups[group.name] = made
        self.in_backward = False
        self._tensors: dict[int, torch.Tensor] = {}
        self._functions: dict[str, type] = {}
        self.matrix = torch.rand(256, 256) / 256

    # What the site functions call.
    def tensor(self, a: Action) -> torch.Tensor:
        if a.numel not in self._tensors:
            self._tensors[a.numel] = torch.ones(a.numel)
        return self._tensors[a.numel]

    def group_kwargs(self, a: Action) -> dict:
        """The call's keywords: its group unless it is the world's; inside backward, async_op (as DDP's hooks)."""
        found = {} if a.group is None or a.group.dim == WORLD else {"group": self.groups[a.group.name]}
        return found | ({"async_op": True} if self.in_backward else {})

    def gathered(self, a: Action) -> torch.Tensor:
        return torch.empty(len(a.group.ranks) * a.numel)  # gloo takes the concatenation, not the stack

    def metrics(self, a: Action) -> dict:
        return {"rank": self.rank, "step": a.step, "loss": 2.31}

    def p2p_ops(self, a: Action) -> list:
        ops = []
        for op in a.batch:
            function = dist.isend if op.kind == "send" else dist.irecv
            ops.append(dist.P2POp(function, torch.ones(op.numel), op.peer, group=self.groups[op.group.name]))
        return ops

    def issued(self, work) -> None:
        """A gradient collective issued inside backward: waited for when backward ends, in issue order."""
        if work is not None:
            torch.autograd.Variable._execution_engine.queue_callback(work.wait)

    # The departure's props, made before the step it departs in, so that it blocks in the call itself.
    def prepare(self) -> None:
        d = self.departure
        if d.rank != self.rank or d.kind != "stuck":
            return
        if d.detail == "lock":
            self.lock = threading.Lock()
            self.lock.acquire()  # held, never released: the next acquire blocks
        elif d.detail == "join":
            self.helper = threading.Thread(target=threading.Event().wait, name="checkpoint-writer", daemon=True)
            self.helper.start()
        elif d.detail == "queue":
            self.requests = queue.Queue()
        elif d.detail == "socket":
            self.side_channel, self._other_end = socket.socketpair()
        elif d.detail == "dataloader":
            loader = torch.utils.data.DataLoader(_Blocking(), batch_size=4, num_workers=1)
            self.loader = iter(loader)

    # The steps.
    def backward(self, actions: list[Action]) -> torch.Tensor:
        """The loss whose backward issues `actions` in order (autograd runs the last Function applied first)."""
        x = torch.ones(4, requires_grad=True)
        y = x
        for a in reversed(actions):
            y = self._function(a.site.function).apply(y, Call(self, a))
        return y.sum()

    def _function(self, name: str) -> type:
        """An autograd Function whose backward is the site function itself: between autograd's frames and the
        collective there is no frame of the job but the site's, as DDP's hooks have none."""
        if name not in self._functions:

            def forward(ctx, x, call):
                ctx.job, ctx.a = call.job, call.a
                return x.clone()

            members = {"forward": staticmethod(forward), "backward": staticmethod(self.sites.SITES[name])}
            self._functions[name] = type(name, (torch.autograd.Function,), members)
        return self._functions[name]


def train_step(job: Job, actions: list[Action]) -> None:
    i = 0
    while i < len(actions):
        a = actions[i]
        if a.via == BACKWARD:
            run = [a]
            while i + len(run) < len(actions) and actions[i + len(run)].via == BACKWARD:
                run.append(actions[i + len(run)])
            loss = job.backward(run)
            job.in_backward = True  # the site functions issue their collectives asynchronously, as DDP's hooks
            try:
                loss.backward()
            finally:
                job.in_backward = False
            i += len(run)
            continue
        if a.part == 0:  # all_gather_object's second all_gather is part of its one call
            job.sites.SITES[a.site.function](Call(job, a))
        i += 1


def end_of_training(job: Job, actions: list[Action]) -> None:
    for a in actions:
        job.sites.SITES[a.site.function](Call(job, a))


def main() -> None:
    seed = env_int("SEED", 0)
    program, departure = build(seed)
    why = unsupported(program, departure)
    if why:
        raise SystemExit(f"seed {seed}: not run for real: {why}")
    exit_when_orphaned()
    if os.getppid() != LAUNCHER:  # orphaned before the guard started watching
        os._exit(1)
    torch.set_num_threads(1)
    # torch 2.13 deprecates all_gather_into_tensor (for all_gather_single): the same call, one warning per rank.
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor. is deprecated")
    dist.init_process_group(BACKEND, timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != program.mesh.size:
        raise SystemExit(f"seed {seed}: the program runs on {program.mesh.size} ranks, not {world}")
    healthy = os.environ.get("SIM_HEALTHY") == "1"  # every rank runs the program as written: it must end
    everyone = schedule(program, None if healthy else departure)
    folder = Path(os.environ.get("SIM_JOB_DIR") or Path(tempfile.gettempdir()) / "torchtriage-sim-job" / str(seed))
    sites = load_sites(write_sites(seed, site_names(program, everyone), folder))
    job = Job(program, departure, rank, sites)
    if not healthy:
        job.prepare()
    mine = everyone[rank]
    ending = [a for a in mine if a.site == program.end_site and a.step > program.steps]
    for step in range(max((a.step for a in mine), default=0) + 1):
        if step == departure.step:
            # One write, newline included, so the lines of concurrent ranks never interleave.
            sys.stdout.write(f"READY rank={rank} pid={os.getpid()}\n")
            sys.stdout.flush()
        train_step(job, [a for a in mine if a.step == step and a not in ending])
    end_of_training(job, ending)
    sys.stdout.write(f"UNHUNG rank={rank} seed={seed}\n")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's threads sometimes abort the interpreter's teardown (tests/jobs/_common.py)


if __name__ == "__main__":
    main()
