"""Process-group setup with one watchdog window for every group, and bounded c10d-store waits.

`init_distributed()` creates the default process group from the launcher's environment:

- **torchrun** (or any env:// launcher) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
- **SLURM** (`srun python train.py`, one task per GPU): when RANK/WORLD_SIZE are absent, RANK, WORLD_SIZE
  and LOCAL_RANK come from SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID; MASTER_ADDR from the first host
  of SLURM_JOB_NODELIST (simple `node[01-04]` forms) and MASTER_PORT from the job id
  (10000 + its last four digits). Every variable set goes through `set_env`: a value you set wins.
- **nothing** (plain `python train.py`): no process group is created; the result says so and the other
  runtime helpers are no-ops.

The watchdog window is `DIST_NCCL_TIMEOUT_MINUTES` (default 30, PyTorch's own default for NCCL is 10),
the one setting for it: it is passed to `init_process_group` and becomes torch's default for every later
`new_group`, `split_group` and DeviceMesh subgroup (torch reads `distributed_c10d.default_pg_timeout` /
`default_pg_nccl_timeout` whenever a group is created without an explicit timeout).

`DIST_STORE_TIMEOUT_HOURS` (default 4) bounds `store_wait` / `store_barrier`: waits on the c10d store
for work one rank does while the others wait (dataset preparation, a checkpoint write). They wait on a
store key, not inside a collective, so long single-rank work cannot trip the collective watchdog.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from torchtriage.protocol import (
    FR_BUFFER_ENV,
    FR_DUMP_FILE_ENV,
    FR_DUMP_ON_TIMEOUT_ENV,
    FR_PREFIX,
    FR_SUBDIR,
    RUN_DIR_ENV,
    fr_spellings,
    release,
)
from torchtriage.runtime.env import (
    NCCL_TIMEOUT_ENV,
    env_str,
    nccl_timeout,
    set_env,
    set_env_aliases,
    store_timeout,
)

FR_BUFFER_SIZE = 20000

STORE_PREFIX = "torchtriage/store/"

LAUNCH_HELP = (
    "launch one process per GPU with torchrun, e.g. "
    "`torchrun --nproc_per_node 8 train.py` on one node, or on each of N nodes "
    "`torchrun --nnodes N --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29500 train.py`; "
    "under SLURM run one torchrun per node (`srun --ntasks-per-node 1 torchrun ...`), or export MASTER_ADDR "
    "(the first node's hostname) and MASTER_PORT (a free port) before `srun`"
)


class LaunchError(RuntimeError):
    """The environment does not describe a distributed launch that can rendezvous."""


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands after `init_distributed`."""

    rank: int
    world_size: int
    local_rank: int
    backend: str | None
    timeout: timedelta
    initialized: bool
    launcher: str  # "torchrun" (any env:// launcher), "slurm", "existing" (already initialised) or "none"


def _int_env(name: str) -> int | None:
    value = env_str(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError as err:
        raise LaunchError(f"{name}={value!r} is not an integer; {LAUNCH_HELP}") from err


def first_slurm_host(nodelist: str) -> str | None:
    """The first hostname of a SLURM node list: `gpu[03-05,9],cpu1` -> `gpu03`; None if unparseable."""
    nodelist = nodelist.strip()
    if not nodelist:
        return None
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?([^,]*)", nodelist)
    if match is None:
        return None
    prefix, ranges, suffix = match.groups()
    if ranges is None:
        return prefix + suffix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first + suffix


def _apply_slurm_env() -> bool:
    """Map SLURM's task variables to torch's when no env:// launcher set them. True if SLURM was used."""
    if env_str("RANK") is not None or env_str("SLURM_PROCID") is None:
        return False
    reason = "mapped from SLURM for an srun launch"
    set_env("RANK", env_str("SLURM_PROCID"), reason=reason)
    set_env("WORLD_SIZE", env_str("SLURM_NTASKS", "1"), reason=reason)
    set_env("LOCAL_RANK", env_str("SLURM_LOCALID", "0"), reason=reason)
    host = first_slurm_host(env_str("SLURM_JOB_NODELIST") or env_str("SLURM_NODELIST") or "")
    if env_str("MASTER_ADDR") is None and host is not None:
        set_env("MASTER_ADDR", host, reason="the first node of SLURM_JOB_NODELIST")
    job_id = env_str("SLURM_JOB_ID")
    if env_str("MASTER_PORT") is None and job_id is not None and job_id[-4:].isdigit():
        set_env("MASTER_PORT", 10000 + int(job_id[-4:]), reason="derived from SLURM_JOB_ID")
    return True


def inherit_timeout(timeout: timedelta) -> None:
    """Make `timeout` torch's default for every process group created later without an explicit one.

    torch resolves a missing timeout in `new_group`, `split_group` and DeviceMesh through the module
    globals `default_pg_timeout` (gloo and others) and `default_pg_nccl_timeout` (NCCL) of
    `torch.distributed.distributed_c10d`, read at call time; both are set here.
    """
    from torch.distributed import distributed_c10d as c10d

    if not hasattr(c10d, "default_pg_timeout"):
        raise RuntimeError(
            "this torch has no distributed_c10d.default_pg_timeout: subgroups would not inherit "
            f"{NCCL_TIMEOUT_ENV}; pass timeout= to every new_group explicitly"
        )
    c10d.default_pg_timeout = timeout
    if getattr(c10d, "default_pg_nccl_timeout", None) is not None:
        c10d.default_pg_nccl_timeout = timeout


def process_group_timeout(group=None) -> timedelta | None:
    """The timeout a process group runs its collectives under (private torch API; None if unreadable)."""
    import torch
    import torch.distributed as dist

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    for device in ("cpu", "cuda"):
        try:
            backend = pg._get_backend(torch.device(device))
            return backend.options._timeout
        except Exception:  # noqa: BLE001 - this device has no backend in the group, or torch changed
            continue
    return None


def set_flight_recorder_env(dump_dir: str | os.PathLike | None = None) -> Path:
    """Set the flight-recorder variables (unless you set them) before a process group is created.

    Buffer of 20000 collectives, a dump on a collective timeout, and dumps written as
    `<dump_dir>/nccl_trace_rank_<rank>`; `dump_dir` defaults to `$TORCHTRIAGE_RUN_DIR/fr` when that is
    set, else `<tmp>/torchtriage-fr`. Returns the dump directory.
    """
    if dump_dir is None:
        run_dir = env_str(RUN_DIR_ENV)
        dump_dir = Path(run_dir) / FR_SUBDIR if run_dir else Path(tempfile.gettempdir()) / "torchtriage-fr"
    dump_dir = Path(dump_dir)
    dump_dir.mkdir(parents=True, exist_ok=True)
    reason = "torchtriage arms the flight recorder so a hang leaves a dump"
    version = torch_version()
    for (new, old, since), value in (
        (FR_BUFFER_ENV, FR_BUFFER_SIZE),
        (FR_DUMP_ON_TIMEOUT_ENV, 1),
        (FR_DUMP_FILE_ENV, str(dump_dir / FR_PREFIX)),
    ):
        names = fr_spellings((new, old, since), version) if env_str(old) is None else (new, old)
        set_env_aliases(names, value, reason=reason)
    return dump_dir


def torch_version() -> tuple[int, int]:
    import torch

    return release(torch.__version__)


def init_distributed(
    backend: str | None = None,
    *,
    arm_flight_recorder: bool = True,
    flight_recorder_dir: str | os.PathLike | None = None,
    **kwargs,
) -> DistInfo:
    """Initialise the default process group from the launcher's environment; returns where this rank stands.

    - backend: "nccl" when CUDA is available, else "gloo" (pass e.g. "cpu:gloo,cuda:nccl" for both).
    - timeout: `DIST_NCCL_TIMEOUT_MINUTES` (default 30) unless `timeout=` is passed; every later subgroup
      inherits it.
    - arm_flight_recorder: set TORCH_FR_BUFFER_SIZE=20000, dump on timeout and a dump path (both the
      TORCH_FR_* and TORCH_NCCL_* spellings), leaving any you set alone.
    - other keyword arguments go to `torch.distributed.init_process_group`.
    - `TORCHTRIAGE_CHECK_COLLECTIVES=1` turns on `check_collectives()` for the whole run.

    Raises `LaunchError` when WORLD_SIZE > 1 but MASTER_ADDR or MASTER_PORT is missing (and no other
    rendezvous was passed), saying how to launch. Without any launcher environment it creates nothing.
    """
    import torch
    import torch.distributed as dist

    timeout = kwargs.pop("timeout", None) or nccl_timeout()
    if not dist.is_available():
        return DistInfo(0, 1, 0, None, timeout, False, "none")
    if dist.is_initialized():
        inherit_timeout(timeout)
        return DistInfo(
            dist.get_rank(), dist.get_world_size(), _int_env("LOCAL_RANK") or 0,
            str(dist.get_backend()), timeout, True, "existing",
        )  # fmt: skip

    launcher = "slurm" if _apply_slurm_env() else "torchrun"
    explicit_rendezvous = any(key in kwargs for key in ("init_method", "store"))
    rank = kwargs.get("rank", _int_env("RANK"))
    world_size = kwargs.get("world_size", _int_env("WORLD_SIZE"))
    if rank is None and not explicit_rendezvous:
        if (world_size or 1) > 1:
            raise LaunchError(f"WORLD_SIZE={world_size} but RANK is not set; {LAUNCH_HELP}")
        return DistInfo(0, 1, 0, None, timeout, False, "none")
    if (world_size or 1) > 1 and not explicit_rendezvous:
        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if env_str(name) is None]
        if missing:
            raise LaunchError(
                f"WORLD_SIZE={world_size} but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                f"not set, so the ranks cannot find each other; {LAUNCH_HELP}"
            )
    local_rank = _int_env("LOCAL_RANK") or 0

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "nccl" in backend and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        kwargs.setdefault("device_id", torch.device("cuda", local_rank))
    if arm_flight_recorder:
        set_flight_recorder_env(flight_recorder_dir)

    inherit_timeout(timeout)
    dist.init_process_group(backend=backend, timeout=timeout, **kwargs)
    if arm_flight_recorder:
        from torchtriage.runtime import gloo_exit

        gloo_exit.register()  # an armed recorder must not abort a gloo rank at exit (gloo_exit.py)

    from torchtriage.runtime import fingerprint

    fingerprint.enable_from_env()
    return DistInfo(
        dist.get_rank(), dist.get_world_size(), local_rank, str(dist.get_backend()), timeout, True, launcher
    )


# -- bounded waits on the c10d store ------------------------------------------------------------------


class StoreTimeoutError(TimeoutError):
    """A store wait ran past DIST_STORE_TIMEOUT_HOURS (or the timeout passed)."""


def _default_store():
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("store_wait/store_barrier need a process group: call init_distributed() first")
    return dist.distributed_c10d._get_default_store()


def _timedelta(timeout: timedelta | float | None) -> timedelta:
    if timeout is None:
        return store_timeout()
    return timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))


def store_wait(key: str, *, timeout: timedelta | float | None = None) -> bytes:
    """Wait until some rank has set `key` on the default c10d store (`store_set`); returns its value.

    Bounded by `timeout` (seconds or a timedelta), default `DIST_STORE_TIMEOUT_HOURS`; past it raises
    `StoreTimeoutError` naming the key, on this rank.
    """
    store = _default_store()
    limit = _timedelta(timeout)
    full_key = STORE_PREFIX + key
    try:
        store.wait([full_key], limit)
    except Exception as err:  # DistStoreError on timeout; torch's text is about sockets
        raise StoreTimeoutError(
            f"store_wait({key!r}) timed out after {limit.total_seconds():g}s: the rank that should set it "
            f"(store_set) has not. If that work is just slow, raise DIST_STORE_TIMEOUT_HOURS; "
            f"otherwise look at that rank's log."
        ) from err
    return store.get(full_key)


def store_set(key: str, value: str | bytes = b"1") -> None:
    """Set `key` on the default c10d store, releasing every `store_wait(key)`."""
    _default_store().set(STORE_PREFIX + key, value)


_barrier_generations: dict[str, int] = {}
_barrier_lock = threading.Lock()


def store_barrier(name: str, *, group=None, timeout: timedelta | float | None = None) -> None:
    """Wait until every rank of `group` (default: all) has reached `store_barrier(name)`.

    A barrier on the c10d store, not a collective: a long wait does not trip the collective watchdog.
    Every member must call it the same number of times with the same name. Bounded by `timeout`
    (default `DIST_STORE_TIMEOUT_HOURS`); past it raises `StoreTimeoutError` naming the missing ranks.
    """
    import torch.distributed as dist

    store = _default_store()
    limit = _timedelta(timeout)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    me = dist.get_rank()
    group_tag = "world" if group is None else f"pg{group.group_name}"
    with _barrier_lock:
        generation = _barrier_generations.get(f"{group_tag}/{name}", 0)
        _barrier_generations[f"{group_tag}/{name}"] = generation + 1
    base = f"{STORE_PREFIX}barrier/{group_tag}/{name}/{generation}"
    store.set(f"{base}/arrived/{me}", "1")
    if int(store.add(f"{base}/count", 1)) == len(ranks):
        store.set(f"{base}/done", "1")
    started = time.monotonic()
    try:
        store.wait([f"{base}/done"], limit)
    except Exception as err:  # noqa: BLE001 - DistStoreError on timeout
        missing = [r for r in ranks if not store.check([f"{base}/arrived/{r}"])]
        raise StoreTimeoutError(
            f"store_barrier({name!r}) waited {time.monotonic() - started:.0f}s (limit "
            f"{limit.total_seconds():g}s) and rank(s) {missing} never arrived. Look at their logs; "
            f"if their work is just slow, raise DIST_STORE_TIMEOUT_HOURS."
        ) from err
