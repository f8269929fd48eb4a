"""The files a hung job leaves, written from a simulation as real ones are laid out.

- flight-recorder dumps: torch's pickle (`_dump_nccl_trace` / `_dump_fr_trace`), version 2.10: NCCL's with
  `pg_config` (name, desc, ranks of each group whose communicator exists) and sends, recvs and `coalesced`
  markers; gloo's with collectives only, the op ids of its sends and recvs skipped, every entry `scheduled`, a
  nameless `pg_config` placeholder holding the world's ranks until the rank makes a group of its own (then none, as
  tests/fixtures' gloo recordings show); `pg_status`
  keyed by the process-local pg id of each group the rank recorded an op of; a ring buffer that may have dropped
  the oldest entries;
- stacks: `py-spy dump` text (short file names, native frames with --native) and `--json --locals`, as
  `torchtriage diagnose --pid` captures them beside its `summary.json`; or the hang watchdog's own text
  form (full paths, the c10d call's arguments), as `torchtriage run` leaves them in `hang/`, beside the identity
  record each rank wrote as it started (`identity/rank<N>.json`, the dead and exited ranks' too);
- logs: NCCL's watchdog timeout line of every rank whose op timed out.

`Layout` says which of these a case writes: what a user has after `diagnose --pid` (bare), after
`torchtriage run` (armed), or from a scheduler's folder (dumps and logs).
"""

from __future__ import annotations

import json
import os
import pickle
import random
from dataclasses import dataclass, replace
from pathlib import Path

from torchtriage.protocol import IDENTITY_SCHEMA
from torchtriage.runtime.identity import write_identity

from .engine import Outcome, RankRun, Record, Wait
from .frames import LOGGER, TORCH, blocked_frames, call_frames, short, waiting_frames
from .mesh import WORLD
from .program import Program

VERSION = "2.10"
PID_BASE = 4100
PYTHON = "/opt/venv/bin/python3"


@dataclass(frozen=True)
class Layout:
    stacks: str | None  # "pyspy" (diagnose --pid), "watchdog" (torchtriage run), or None
    dumps: bool
    logs: bool = False  # NCCL's timeout lines (the job ran past its timeout)
    native: bool = False  # py-spy --native
    buffer: int = 2000  # the flight recorder's ring buffer (entries)
    item_sync: bool = False  # the step reads its loss (.item()) rather than calling torch.cuda.synchronize()
    # NCCL with TORCH_NCCL_ENABLE_TIMING=1: each op's start event is recorded, so the recorder tells the op a
    # rank's device began (`started`) from the ops queued behind it (`scheduled`).
    timing: bool = False
    # One living rank's dump lost (a dump that timed out, a node's folder never gathered): where in the ranks that
    # dumped it falls, in [0, 1); None when every dump is there.
    lost_at: float | None = None

    @property
    def name(self) -> str:
        parts = [self.stacks or "no-stacks", "dumps" if self.dumps else "", "logs" if self.logs else ""]
        flags = ("+timing" if self.timing else "") + ("+lost" if self.lost_at is not None else "")
        return "+".join(p for p in parts if p) + flags + ("+native" if self.native else "")

    def lost(self, alive: list[int]) -> int | None:
        """The rank whose dump is lost, of the ranks that dumped."""
        return alive[int(self.lost_at * len(alive))] if self.lost_at is not None and len(alive) > 1 else None


# The share of layouts with dumps that lose one living rank's dump (0: none; the draw is then skipped).
LOST_DUMPS = float(os.environ.get("TORCHTRIAGE_SIM_LOST_DUMPS", "0"))
LAYOUTS = {
    "bare": Layout("pyspy", False),
    "armed": Layout("watchdog", True),
    "dumps": Layout(None, True),
    "full": Layout("pyspy", True, logs=True),
}


def draw_layout(rng: random.Random, backend: str, name: str) -> Layout:
    base = LAYOUTS[name]
    native = base.stacks == "pyspy" and rng.random() < 0.5
    buffer = rng.choice((2000, 2000, 2000, rng.randint(6, 24)))
    logs = base.logs and backend == "nccl"
    item_sync = backend == "nccl" and rng.random() < 0.4
    timing = backend == "nccl" and base.dumps and rng.random() < 0.3  # drawn last: earlier seeds keep their cases
    lost = rng.random() if LOST_DUMPS and base.dumps and rng.random() < LOST_DUMPS else None
    return Layout(base.stacks, base.dumps, logs, native, buffer, item_sync, timing, lost)


def write(folder: Path, program: Program, outcome: Outcome, backend: str, layout: Layout, rng: random.Random) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    alive = living(outcome)
    if layout.dumps:
        where = folder / ("hang/fr" if layout.stacks == "watchdog" else "fr")
        where.mkdir(parents=True, exist_ok=True)
        lost = layout.lost(alive)
        for rank in (r for r in alive if r != lost):
            dump = fr_dump(program, outcome.ranks[rank], backend, layout.buffer, layout.timing)
            (where / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump, protocol=4))
    if layout.stacks == "pyspy":
        places: set[tuple] = set()
        for rank in alive:
            threads = _threads(program, outcome.ranks[rank], backend, layout, rng)
            (folder / f"rank{rank:02d}.txt").write_text(pyspy_text(rank, threads, layout.native))
            (folder / f"rank{rank:02d}.json").write_text(json.dumps(pyspy_json(rank, threads, layout.native)))
            main = threads[0]
            if not layout.native and _unclear(main) and (place := (tuple(main.python), main.active)) not in places:
                # As `diagnose --pid` does: --native once per place where the Python frames do not name the call.
                places.add(place)
                main = _main_thread(program, outcome.ranks[rank], backend, replace(layout, native=True))
                native = [main, *threads[1:]]
                (folder / f"rank{rank:02d}.native.txt").write_text(pyspy_text(rank, native, True))
        (folder / "summary.json").write_text(json.dumps(_summary(program, alive), indent=1))
    elif layout.stacks == "watchdog":
        hang = folder / "hang"
        hang.mkdir(parents=True, exist_ok=True)
        for rank in outcome.ranks:  # every rank recorded where it runs as it started, the dead and exited too
            write_identity(folder, identity(program, rank))
        for rank in alive:
            threads = _threads(program, outcome.ranks[rank], backend, layout, rng, watchdog=True)
            (hang / f"rank{rank:02d}.txt").write_text(watchdog_text(rank, threads))
    if layout.logs:
        for rank in alive:
            lines = timeout_lines(program, outcome.ranks[rank], backend)
            (folder / f"rank{rank}.log").write_text("".join(lines) or f"[rank{rank}]: step {program.steps}\n")


_GONE = ("dead", "exited")


def living(outcome: Outcome) -> list[int]:
    """The ranks still alive when the job hung: those that leave stacks and dumps."""
    return [r for r, run in sorted(outcome.ranks.items()) if run.wait is not None and run.wait.kind not in _GONE]


# ------------------------------------------------------------------------------------------ flight recorder


def _state(record: Record, run: RankRun, backend: str, timing: bool = False) -> str:
    if backend != "nccl":
        return "scheduled"
    if not record.launched:
        return "completed"  # its end event was never recorded, and CUDA says such an event has completed
    frozen = run.frozen_from is not None and record.record_id >= run.frozen_from
    # A batch's own ops stay `scheduled` (only its coalesced work is watched), as real dumps show.
    if record.done and not frozen and not record.batched:
        return "completed"
    if timing and not frozen and not record.batched and _device_began(record, run):
        return "started"
    return "scheduled"


def _device_began(record: Record, run: RankRun) -> bool:
    """The device runs a rank's ops in order: it began the first one not done, unless it stopped before."""
    head = next((unit for unit in run.queue if not unit.done), None)
    stopped = run.device_stopped_at is not None and record.record_id >= run.device_stopped_at
    return head is not None and any(r is record for r in head.records) and not stopped


def _frames(record: Record) -> list[dict]:
    if not record.python:
        return []
    if record.batched:
        frames = call_frames(record.action, in_batch=record.name)
    else:
        frames = call_frames(record.action, record.part)
    return [{"name": f, "filename": file, "line": line} for f, file, line in frames]


def _profiling_name(record: Record, backend: str) -> str:
    if record.name == "send":
        return f"{backend}:send {record.src}->{record.dst}"
    if record.name == "recv":
        return f"{backend}:recv {record.dst}<-{record.src}"
    return f"{backend}:{record.name}"


def fr_dump(program: Program, run: RankRun, backend: str, buffer: int, timing: bool = False) -> dict:
    mesh = program.mesh
    entries = []
    for record in run.records[-buffer:]:
        state = _state(record, run, backend, timing)
        created = 1_796_000_000_000_000_000 + record.record_id * 1_000_000 + run.rank * 977
        entries.append(
            {
                "record_id": record.record_id,
                "pg_id": mesh.pg_id(run.rank, record.group),
                "process_group": (record.group.name, record.group.desc),
                "thread_name": "python3" if record.python else "pt_autograd_0",
                "thread_id": str(140000000000000 + run.rank * 4096 + (0 if record.python else 1)),
                "collective_seq_id": record.seq,
                "p2p_seq_id": record.p2p_seq,
                "op_id": record.op_id,
                "profiling_name": _profiling_name(record, backend),
                "time_created_ns": created,
                "input_sizes": record.input_sizes,
                "input_dtypes": record.dtypes,
                "output_sizes": record.output_sizes,
                "output_dtypes": record.dtypes,
                "state": state,
                "time_discovered_started_ns": created + 200_000 if timing and state != "scheduled" else None,
                "time_discovered_completed_ns": created + 500_000 if state == "completed" else None,
                "retired": record.done,
                "timeout_ms": 600000,
                "is_p2p": record.is_p2p,
                "frames": _frames(record),
            }
        )
    return {
        "version": VERSION,
        "pg_config": _pg_config(program, run, backend),
        "comm_lib_version": "2.28.9" if backend == "nccl" else "",
        "pg_status": _pg_status(program, run, backend, timing),
        "entries": entries,
    }


def _pg_config(program: Program, run: RankRun, backend: str) -> dict:
    """NCCL registers a group's ranks when it creates its communicator: at once with eager init, else at the
    group's first op (groups the job made and never used are absent)."""
    if backend != "nccl":
        # gloo records no group, but a nameless placeholder: the world's ranks until the rank makes a group it is a
        # member of besides the world, then none (as the recordings show: tests/test_sim_reality.py)
        own = any(g.dim != WORLD for g in program.mesh.groups_of(run.rank))
        return {"": {"name": "", "desc": "", "ranks": "[]" if own else str(list(range(program.mesh.size)))}}
    groups = program.mesh.groups_of(run.rank) if program.eager_init else _recorded_groups(program, run)
    return {g.name: {"name": g.name, "desc": g.desc, "ranks": str(list(g.ranks))} for g in groups}


def _recorded_groups(program: Program, run: RankRun) -> list:
    """The rank's groups it recorded an op of (the recorder keeps a group's status from its first entry on)."""
    names = {r.group.name for r in run.records}
    return [g for g in program.mesh.groups_of(run.rank) if g.name in names]


def _pg_status(program: Program, run: RankRun, backend: str, timing: bool = False) -> dict:
    """Per group, the last op enqueued, started (only with timing: NCCL sees a start only through its start
    event) and completed, as each backend counts them (-1: none yet)."""
    status = {}
    for group in _recorded_groups(program, run):
        mine = [r for r in run.records if r.group.name == group.name]
        count = _nccl_status if backend == "nccl" else _gloo_status
        enqueued, completed = count(mine, run)
        began = [r for r in mine if not r.batched and r.launched and _state(r, run, backend, timing) != "scheduled"]
        status[str(program.mesh.pg_id(run.rank, group))] = {
            "last_enqueued_collective": enqueued,
            "last_completed_collective": completed,
            "last_started_collective": _work_seq(began[-1]) if timing and began else -1,
        }
    return status


def _gloo_status(records: list[Record], run: RankRun) -> tuple[int, int]:
    """gloo counts its collectives by op id: its sends and recvs take op ids but are never enqueued there."""
    enqueued = records[-1].op_id if records else -1
    done = [r.op_id for r in records if r.done]
    return enqueued, max(done, default=-1)


def _nccl_status(records: list[Record], run: RankRun) -> tuple[int, int]:
    """NCCL counts works by their own sequence number (a send's, a recv's, a batch's: the p2p one), as its
    watchdog enqueues and retires them: a batch is one work (its coalesced marker), its ops none; an op still
    connecting was never enqueued; a wedged device's last completions were never seen."""
    works = [r for r in records if not r.batched and r.launched]
    frozen = run.frozen_from
    completed = [r for r in works if r.done and (frozen is None or r.record_id < frozen)]
    return _work_seq(works[-1]) if works else -1, _work_seq(completed[-1]) if completed else -1


def _work_seq(record: Record) -> int:
    return record.p2p_seq if record.is_p2p or record.name == "coalesced" else record.seq


# ------------------------------------------------------------------------------------------------- stacks


@dataclass
class Thread:
    name: str
    ident: int
    active: bool
    python: list  # (function, file, line), innermost first
    native: list  # symbols above the innermost Python frame
    locals_at: dict  # index of a Python frame -> [(name, repr, is_argument)]
    blocked: tuple | None = None  # the C call the watchdog reads from the frame (runtime/blocked_call.py)


# What the hang watchdog names of the C call a main thread waits in (its own reading of the frame).
_BLOCKED = {
    "store": ("c10d::PrefixStore::get", "Store.cpp"),
    "socket": ("sock_recv", "socketmodule.c"),
    "sleep": ("time_sleep", "timemodule.c"),
    "lock": ("lock_PyThread_acquire_lock", "_threadmodule.c"),
    "join": ("lock_PyThread_acquire_lock", "_threadmodule.c"),
    "queue": ("lock_PyThread_acquire_lock", "_threadmodule.c"),
    "dataloader": ("lock_PyThread_acquire_lock", "_threadmodule.c"),
    "item": ("at::native::_local_scalar_dense", "Scalar.cpp"),
    "work": ("c10d::Work::wait", "Work.cpp"),  # gloo: every blocking call waits in its Work's wait()
}


def _main_thread(program: Program, run: RankRun, backend: str, layout: Layout) -> Thread:
    wait: Wait = run.wait
    ident = PID_BASE + run.rank
    action = wait.action
    if wait.kind in ("op", "init", "connect"):
        return _in_a_call(wait, ident, backend, layout)
    if wait.kind == "backward":
        native = waiting_frames("backward_wait", action.site)[1]
        return Thread("MainThread", ident, False, call_frames(action), native if layout.native else [], {})
    kind = {"sync": "item" if layout.item_sync else "sync", "store": "store"}.get(wait.kind, wait.detail)
    python, native, active = waiting_frames(kind, action.site)
    return Thread("MainThread", ident, active, python, native if layout.native else [], {}, _BLOCKED.get(kind))


def _in_a_call(wait: Wait, ident: int, backend: str, layout: Layout) -> Thread:
    """A main thread inside a torch.distributed call. Waiting for its op, it has left the frames that only
    issued it (an isend under send) and, on gloo, waits in the Work's wait(); creating the communicator or
    connecting it, it is still where the op was issued."""
    action = wait.action
    if wait.kind == "op":
        python = blocked_frames(action, action.part)
        native_kind = "gloo_wait" if backend != "nccl" else "sync"
    else:
        python = call_frames(action, action.part)
        native_kind = {"init": "nccl_init", "connect": "nccl_connect"}[wait.kind]
    native = waiting_frames(native_kind, action.site)[1] if layout.native else []
    blocked = _BLOCKED["work"] if wait.kind == "op" and backend != "nccl" else None
    return Thread("MainThread", ident, False, python, native, _call_locals(action, python), blocked)


def _call_locals(action, python) -> dict:
    """What py-spy --locals shows of the c10d call: the wrapper's args and kwargs, a send's dst, a recv's src, a
    broadcast's source."""
    found = {}
    for i, (function, file, _) in enumerate(python):
        if file.endswith("c10d_logger.py"):
            world = action.group is not None and action.group.dim == "world"
            kwargs = "{}" if world else '{"group": <torch.distributed.distributed_c10d.ProcessGroup at 0x7f3a2c>}'
            args = "()" if action.kind == "barrier" else "(<torch.Tensor at 0x7f3a10>,)"  # a barrier takes no tensor
            found[i] = [("args", args, True), ("kwargs", kwargs, True)]
        elif function in ("send", "isend") and action.peer is not None:
            found[i] = [("dst", str(action.peer), True)]
        elif function in ("recv", "irecv") and action.peer is not None:
            found[i] = [("src", str(action.peer), True)]
        elif function == "broadcast" and action.root >= 0:  # the source as the job gave it, and as its group's rank
            found[i] = [("src", str(action.group.ranks[action.root]), True), ("group_src", str(action.root), True)]
    return found


_BENIGN = (
    ("pin_memory", [("wait", "/usr/lib/python3.11/threading.py", 331), ("get", "/usr/lib/python3.11/queue.py", 180),
                    ("do_one_step", f"{TORCH}/utils/data/_utils/pin_memory.py", 30)]),
    ("Thread-1 (_monitor)", [("wait", "/usr/lib/python3.11/threading.py", 331),
                             ("run", "/srv/venv/tqdm/_monitor.py", 60)]),
)  # fmt: skip


def _threads(program: Program, run: RankRun, backend: str, layout: Layout, rng, watchdog: bool = False) -> list:
    threads = [_main_thread(program, run, backend, layout)]
    for k, (name, frames) in enumerate(_BENIGN):
        if rng.random() < 0.4:
            threads.append(Thread(name, PID_BASE + 100 + k, False, list(frames), [], {}))
    if watchdog:
        frames = [("_dump", "/opt/venv/lib/python3.11/site-packages/torchtriage/runtime/watchdog.py", 277)]
        threads.append(Thread("torchtriage-watchdog", PID_BASE + 200, True, frames, [], {}))
    return threads


def _unclear(thread: Thread) -> bool:
    """Idle where its Python frames do not name the call it waits in: the innermost frame is the job's own
    (a C call under it: store.get, recv, .item(), time.sleep, a lock) or autograd's backward."""
    if thread.active or not thread.python:
        return not thread.active
    innermost = thread.python[0]
    return innermost[1].startswith("/srv/job/") or innermost[0] == "_engine_run_backward"


def _status(thread: Thread) -> str:
    return "active" if thread.active else "idle"


def pyspy_text(rank: int, threads: list[Thread], native: bool) -> str:
    pid = PID_BASE + rank
    lines = [f"Process {pid}: {PYTHON} -u /srv/job/train.py", f"Python v3.11.7 ({PYTHON})", ""]
    for thread in threads:
        lines.append(f'Thread {thread.ident} ({_status(thread)}): "{thread.name}"')
        for symbol in thread.native:
            lines.append(f"    {symbol} ({_library(symbol)})")
        for function, file, line in thread.python:
            lines.append(f"    {function} ({short(file)}:{line})")
        lines.append("")
    return "\n".join(lines) + "\n"


def pyspy_json(rank: int, threads: list[Thread], native: bool) -> list[dict]:
    pid = PID_BASE + rank
    found = []
    for thread in threads:
        frames = [_json_frame(symbol, _library(symbol), 0, True, None) for symbol in thread.native]
        for i, (function, file, line) in enumerate(thread.python):
            shown = [{"name": n, "addr": 0, "arg": a, "repr": r} for n, r, a in thread.locals_at.get(i, [])]
            frames.append(_json_frame(function, file, line, False, shown or None))
        found.append(
            {
                "pid": pid,
                "thread_id": 139900000000000 + thread.ident,
                "thread_name": thread.name,
                "os_thread_id": thread.ident,
                "active": thread.active,
                "owns_gil": False,
                "frames": frames,
                "process_info": None,
            }
        )
    return found


def _json_frame(name: str, file: str, line: int, native: bool, locals_: list | None) -> dict:
    return {
        "name": name,
        "filename": file,
        "module": file if native else None,
        "short_filename": file if native else short(file),
        "line": line,
        "locals": locals_,
        "is_entry": False,
        "is_shim_entry": False,
    }


def _library(symbol: str) -> str:
    if symbol.startswith(("cuda", "cu")):
        return "libcudart.so.12"
    if symbol.startswith(("c10d::", "at::", "c10::", "torch::")):
        return "libtorch_cpu.so"
    if symbol.startswith("nccl"):
        return "libnccl.so.2"
    if symbol.startswith(("sock_", "lock_", "acquire_", "PyThread", "pysleep", "time_sleep")):
        return "python3.11"
    return "libc.so.6"


def watchdog_text(rank: int, threads: list[Thread]) -> str:
    """The hang watchdog's form: full paths, every thread, the c10d call's arguments as type names."""
    pid = PID_BASE + rank
    lines = [f"Process {pid}: /srv/job/train.py", f"Python v3.11.7 ({PYTHON})", ""]
    for thread in threads:
        status = "idle" if thread.name == "MainThread" else "active"
        lines.append(f'Thread {thread.ident:#x} ({status}): "{thread.name}"')
        if thread.blocked is not None:
            lines.append(f"    {thread.blocked[0]} ({thread.blocked[1]}:0)")
        for i, (function, file, line) in enumerate(thread.python):
            lines.append(f"    {function} ({file}:{line})")
            shown = thread.locals_at.get(i)
            if shown:
                lines.append("        Locals:")
                for name, value, _ in shown:
                    if name == "args":
                        value = "()" if value == "()" else "(<Tensor>)"
                    elif name == "kwargs":
                        value = "{}" if value == "{}" else '{"group": <ProcessGroup>}'
                    lines.append(f"            {name}: {value}")
        lines.append("")
    return "\n".join(lines)


def identity(program: Program, rank: int) -> dict:
    """The record `torchtriage run` has each rank write as it starts (runtime/identity.py's fields)."""
    return {
        "schema": IDENTITY_SCHEMA,
        "rank": rank,
        "local_rank": rank,
        "world_size": program.mesh.size,
        "host": "node-a",
        "pid": PID_BASE + rank,
        "attempt": 0,
        "restart_count": 0,
        "run_id": "sim",
        "cuda_visible_devices": None,
        "started_at": "2026-12-01T00:00:00Z",
        "gpu": None,
    }


def _summary(program: Program, alive: list[int]) -> dict:
    """`diagnose --pid`'s summary.json: one entry per process it captured (the world size from its environment)."""
    return {
        "schema": "torchtriage.dump",
        "schema_version": 1,
        "kind": "dump",
        "host": "node-a",
        "ok": True,
        "processes": [
            {
                "rank": rank,
                "local_rank": rank,
                "world_size": program.mesh.size,
                "local_world_size": program.mesh.size,
                "pid": PID_BASE + rank,
                "host": "node-a",
                "cmdline": [PYTHON, "-u", "/srv/job/train.py"],
                "ok": True,
                "error": None,
                "files": [f"rank{rank:02d}.txt", f"rank{rank:02d}.json"],
            }
            for rank in alive
        ],
    }


# --------------------------------------------------------------------------------------------------- logs

_OP_TYPES = {
    "all_reduce": "ALLREDUCE",
    "all_reduce_barrier": "ALLREDUCE",
    "_all_gather_base": "_ALLGATHER_BASE",
    "all_gather": "ALLGATHER",
    "_reduce_scatter_base": "_REDUCE_SCATTER_BASE",
    "broadcast": "BROADCAST",
    "all_to_all": "ALLTOALL_BASE",
    "send": "SEND",
    "recv": "RECV",
    "coalesced": "COALESCED",
}


def timeout_lines(program: Program, run: RankRun, backend: str) -> list[str]:
    """ProcessGroupNCCL's watchdog line for the rank's first op that never completed (logPrefix, then
    `WorkNCCL(...)`'s fields), as glog prints it under torchrun's `[rankN]:` prefix."""
    if backend != "nccl":
        return []
    # The watchdog times out the works it enqueued: never an op still connecting.
    pending = next((r for r in run.records if not r.done and r.launched and r.name != "coalesced"), None)
    if pending is None:
        return []
    group = pending.group
    uid = program.mesh.pg_id(run.rank, group)
    numel_in = sum(s[0] if s else 1 for s in pending.input_sizes) if pending.input_sizes else 0
    numel_out = 1
    for s in pending.output_sizes[:1]:
        for d in s:
            numel_out *= d
    seq = pending.p2p_seq if pending.is_p2p else pending.seq
    prefix = f"[PG ID {uid} PG GUID {group.name}({group.desc}) Rank {group.local(run.rank)}] "
    work = (
        f"WorkNCCL(SeqNum={seq}, OpType={_OP_TYPES.get(pending.name, pending.name.upper())}, "
        f"NumelIn={numel_in}, NumelOut={numel_out}, Timeout(ms)=600000)"
    )
    stamp = f"E1203 10:21:{run.rank % 60:02d}.123456000 {PID_BASE + run.rank}"
    head = f"[rank{run.rank}]:[{stamp} ProcessGroupNCCL.cpp:688] "
    return [
        f"[rank{run.rank}]: step {program.steps} loss 2.31\n",
        head + prefix + f"Watchdog caught collective operation timeout: {work} ran for 600021 milliseconds "
        "before timing out.\n",
    ]


__all__ = ["LAYOUTS", "Layout", "draw_layout", "write", "LOGGER"]
