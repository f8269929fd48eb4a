"""Which rank's GPU an Xid is about, from the PCI bus both sides print (pure: reads log events).

The driver's Xid lines name a GPU by its PCI address (`NVRM: Xid (PCI:0000:ab:00): 79, ...`, NVIDIA's kernel
module); NCCL's `Init COMPLETE` line gives each rank's GPU by the same address, packed into one number
(`rank 5 nranks 8 cudaDev 5 busId ab000`: src/misc/utils.cc int64ToBusId, domain << 20 | bus << 12 |
device << 4 | function). Read from the communicator that spans the most ranks (the world's: its rank is the
global one), they say:

- the Xid's GPU is one rank's: that rank is where the fault is, whatever the launcher reported first;
- the Xid's GPU is none of the job's, on a node where every rank's GPU is known: another tenant's GPU (or one
  the job did not use); the Xid says nothing of this job.

A host on the Xid line (syslog's `host kernel:`) must be the NCCL line's (`host:pid:tid [dev]`); where the
Xid line has none, its GPU is placed only when one node's ranks could hold it. Where the address cannot place
it, the pid the driver names (the process whose GPU context faulted) can: the rank whose pid NCCL's prefix or
torchrun's failure report gives.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from torchtriage.sources.lines import NCCL_HEADER
from torchtriage.sources.log_records import ChildFailure, LogEvent

INIT_RULE = "nccl.init_progress_only"
FOREIGN = "foreign"  # not the job's: a GPU none of its ranks used, a process none of its ranks is
_KERNEL_HOST = re.compile(r"(?P<host>[\w.-]{1,255}) kernel: (?:\[[\s\d.]+\] )?NVRM: ")
_HOST_BEFORE_KERNEL = re.compile(r"(?P<host>[\w.-]{1,255}) kernel: ")
_PCI = re.compile(
    r"(?:PCI:)?(?P<domain>[0-9A-Fa-f]{4,8}):(?P<bus>[0-9A-Fa-f]{2}):(?P<device>[0-9A-Fa-f]{2})(?:\.(?P<fn>[0-9A-Fa-f]))?$"
)


@dataclass(frozen=True)
class JobGpus:
    """Each rank's GPU, as (host or None, bus number), from the world communicator's set-up lines."""

    world: int
    by_gpu: dict[tuple[str | None, int], int]

    @property
    def complete(self) -> bool:
        return len(set(self.by_gpu.values())) == self.world

    @property
    def hosts(self) -> set[str | None]:
        return {host for host, _ in self.by_gpu}


def _world_inits(events: Sequence[LogEvent]) -> list[LogEvent]:
    """NCCL's set-up lines of the communicators ("comm 0x... rank 3 nranks 16 cudaDev 3 busId ... Init COMPLETE")."""
    return [e for e in events if e.rule.id == INIT_RULE and "world_size" in e.facts]


def world_communicator_size(events: Sequence[LogEvent]) -> int | None:
    """The size of the largest communicator NCCL set up: the world's, whose ranks are the job's."""
    return max((int(e.facts["world_size"]) for e in _world_inits(events)), default=None)


def job_gpus(events: Sequence[LogEvent]) -> JobGpus | None:
    inits = [e for e in _world_inits(events) if "bus_id" in e.facts]
    world = world_communicator_size(inits)
    if world is None:
        return None
    by_gpu = {}
    for event in inits:
        if int(event.facts["world_size"]) != world or not event.facts.get("rank", "").isdigit():
            continue
        host = NCCL_HEADER.match(event.text)
        by_gpu[(short_host(host.group("host")) if host else None, int(event.facts["bus_id"], 16))] = int(
            event.facts["rank"]
        )
    return JobGpus(world, by_gpu) if by_gpu else None


def job_pids(events: Sequence[LogEvent], failures: Sequence[ChildFailure] = ()) -> dict[tuple[str, int], int]:
    """Each rank's (host, pid), from the world communicator's set-up lines (NCCL's `host:pid:tid [dev]` prefix)
    and torchrun's failure report (`host : node-07`, `rank : 6 (local_rank: 2)`, `exitcode : -6 (pid: 4242)`)."""
    pids = {
        (short_host(f.host) if f.host else "", f.pid): f.rank
        for f in failures
        if f.rank is not None and f.pid is not None
    }
    inits = _world_inits(events)
    world = world_communicator_size(inits)
    if world is None:
        return pids
    for event in inits:
        prefix = NCCL_HEADER.match(event.text)
        if prefix and int(event.facts["world_size"]) == world and event.facts.get("rank", "").isdigit():
            pids[(short_host(prefix.group("host")), int(prefix.group("pid")))] = int(event.facts["rank"])
    return pids


def xid_bus(event: LogEvent) -> int | None:
    """The bus number of an Xid line's GPU, as NCCL packs it."""
    found = _PCI.match(event.facts.get("device", ""))
    if found is None:
        return None
    domain, bus, device = (int(found.group(k), 16) for k in ("domain", "bus", "device"))
    return domain << 20 | bus << 12 | device << 4 | int(found.group("fn") or "0", 16)


def place(
    event: LogEvent,
    gpus: JobGpus | None,
    pids: dict[tuple[str, int], int] | None = None,
    erring: frozenset[int] = frozenset(),
) -> int | str | None:
    """The rank whose GPU the Xid names; FOREIGN for a GPU none of the job's ranks used on a node the job's
    every rank is known on; None where the lines cannot say. Where the address places nothing, the Xid's pid
    (the process whose context faulted) places it on the rank whose pid NCCL's lines give (`pids`). Where the
    Xid's node is not said and its bus is a GPU of ranks on several nodes, the one of them among the ranks whose
    own lines report a CUDA error (`erring`) is its: a GPU's fault is raised in the processes that use it."""
    bus = xid_bus(event)
    if bus is None or gpus is None:
        return by_pid(event, pids or {})
    host = _KERNEL_HOST.search(event.text)
    host = short_host(host.group("host")) if host else None
    if host is None and len(gpus.hosts) > 1:
        # Which node's kernel printed it is not said: its pid may say whose it is, or the one rank on that bus
        # whose GPU failed under it.
        if (rank := by_pid(event, pids or {})) is not None:
            return rank
        users = {r for (_, b), r in gpus.by_gpu.items() if b == bus} & erring
        return users.pop() if len(users) == 1 else None
    ranks = [r for (h, b), r in gpus.by_gpu.items() if b == bus and (host is None or h is None or h == host)]
    if len(ranks) == 1:
        return ranks[0]
    if not ranks and (rank := by_pid(event, pids or {})) is not None:
        return rank
    on_a_job_node = host is None or host in gpus.hosts
    return FOREIGN if not ranks and gpus.complete and on_a_job_node else None


def by_pid(event: LogEvent, pids: dict[tuple[str, int], int]) -> int | None:
    """The rank whose (host, pid) a kernel line's `pid` fact names, the host its syslog prefix gives where it
    gives one."""
    pid = event.facts.get("pid", "")
    if not pid.isdigit():
        return None
    host = _HOST_BEFORE_KERNEL.search(event.text)
    host = short_host(host.group("host")) if host else None
    ranks = {r for (h, p), r in pids.items() if p == int(pid) and (host is None or h in (host, ""))}
    return ranks.pop() if len(ranks) == 1 else None


def short_host(host: str) -> str:
    return host.split(".", 1)[0]
