"""What a live capture found on its node: `summary.json` of `torchtriage dump` / `diagnose --pid`.

The capture lists every rank process it found (rank, local rank, pid, host) with the launcher's counts from
each process's environment (WORLD_SIZE, LOCAL_WORLD_SIZE). A launcher numbers a node's ranks in one block
(torchrun: the node's first rank plus LOCAL_RANK), so the ranks the node should run are that block: a rank of
the block with no process has died or exited. Ranks of other nodes were never looked for, and are not gone.

A process the capture found stopped (state T or t in /proc) has `"state"` in its entry: it was not sampled, and
its peers wait for it.

A pod's capture (`diagnose --pods`) also names the pod and the node kubectl placed it on (`"kubernetes"`): the
node is the machine its ranks ran on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torchtriage.sources import limits
from torchtriage.sources.fields import as_int, strict_json
from torchtriage.sources.streams import read_whole

CAPTURE_SCHEMA = "torchtriage.dump"
CAPTURE_SUMMARY = "summary.json"  # what collect.capture writes
# /proc/<pid>/stat states of a stopped process (fs/proc/array.c): T stopped by a signal, t by a tracer.
STOPPED_STATES = ("T", "t")
_NODE_CHARS = 253  # a Kubernetes node's name is a DNS-1123 subdomain


@dataclass(frozen=True)
class NodeCapture:
    path: str
    host: str
    pids: dict[int, int]  # rank -> pid, of the processes found
    expected: frozenset[int]  # the ranks the launcher started on this node, as far as the counts say
    world_size: int | None
    stopped: dict[int, str] = field(default_factory=dict)  # rank -> its state (T or t), of the stopped processes
    node: str | None = None  # a pod's capture: the Kubernetes node the pod ran on, as kubectl named it
    restarted: bool = False  # torchrun had restarted the captured workers (TORCHELASTIC_RESTART_COUNT > 0)
    pod: str | None = None  # a pod's capture: the pod's name

    @property
    def machine(self) -> str:
        """The host the captured ranks ran on: a pod's node, else the host the capture ran on."""
        return self.node or self.host


def read_capture(path: str) -> NodeCapture | None:
    """The capture's node and ranks, or None when the file is not a capture summary (or cannot be read)."""
    try:
        data, _ = read_whole(path, "the capture summary")
        summary = strict_json(data)
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("schema") != CAPTURE_SCHEMA:
        return None
    listed = summary.get("processes")
    processes = [p for p in listed if isinstance(p, dict)] if isinstance(listed, list) else []
    top = limits.active().rank  # a crafted count must not make a block of a billion ranks
    pids, bases, local_sizes, world, stopped, restarted = {}, set(), set(), None, {}, False
    for process in processes:
        rank, local = as_int(process.get("rank"), None, 0, top), as_int(process.get("local_rank"), None, 0, top)
        if rank is None:
            continue
        pids[rank] = as_int(process.get("pid"), -1)
        if process.get("state") in STOPPED_STATES:
            stopped[rank] = process["state"]
        if local is not None and local <= rank:
            bases.add(rank - local)
        local_sizes.add(as_int(process.get("local_world_size"), None, 1, top + 1))
        world = as_int(process.get("world_size"), None, 1, top + 1) or world
        restarted = restarted or bool(as_int(process.get("restart_count"), 0, 0, 1 << 20))
    host = _name(summary.get("host")) or "this node"
    expected = _expected(pids, bases, local_sizes)
    return NodeCapture(path, host, pids, expected, world, stopped, _pod_node(summary), restarted, _pod(summary))


def _name(value: object) -> str | None:
    """A host's or node's name: text of one line, else unknown."""
    if isinstance(value, str) and 0 < len(value) <= _NODE_CHARS and value.isprintable() and " " not in value:
        return value
    return None


def _pod_node(summary: dict) -> str | None:
    """The node of a pod's capture: a name of one line, else unknown."""
    return _kubernetes(summary, "node")


def _pod(summary: dict) -> str | None:
    """The pod a capture ran in, as its summary names it."""
    return _kubernetes(summary, "pod")


def _kubernetes(summary: dict, field_name: str) -> str | None:
    kubernetes = summary.get("kubernetes")
    return _name(kubernetes.get(field_name)) if isinstance(kubernetes, dict) else None


def _expected(pids: dict[int, int], bases: set[int], local_sizes: set[int | None]) -> frozenset[int]:
    """The node's block of ranks: from its first rank and LOCAL_WORLD_SIZE when every process agrees on them;
    else only the ranks between the lowest and highest found (a gap in a block is a rank of the node)."""
    if not pids:
        return frozenset()
    if len(bases) == 1 and len(local_sizes) == 1 and None not in local_sizes:
        (base,), (size,) = bases, local_sizes
        return frozenset(range(base, min(base + size, limits.active().rank + 1))) | frozenset(pids)
    return frozenset(range(min(pids), max(pids) + 1))


def gone_ranks(captures: list[NodeCapture]) -> dict[int, str]:
    """Rank -> why it is taken to have no process: a rank of a captured node's block that no capture found."""
    found = {rank for capture in captures for rank in capture.pids}
    gone: dict[int, str] = {}
    for capture in captures:
        for rank in sorted(capture.expected - found):
            gone[rank] = f"no process on {capture.host}, which runs ranks {_span(capture.expected)}"
    return gone


@dataclass(frozen=True)
class JobShape:
    """What the captures say of the whole job: its world size, and whether torchrun had restarted its workers."""

    world_size: int | None = None
    restarted: bool = False


def job_shape(captures: list[NodeCapture]) -> JobShape:
    worlds = {c.world_size for c in captures if c.world_size is not None}
    return JobShape(worlds.pop() if len(worlds) == 1 else None, any(c.restarted for c in captures))


@dataclass(frozen=True)
class StoppedProcess:
    """A rank's process that a capture found stopped."""

    pid: int
    host: str
    state: str  # T or t

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host}, state {self.state}"


def stopped_ranks(captures: list[NodeCapture]) -> dict[int, StoppedProcess]:
    """Rank -> its process, for the ranks a capture found stopped."""
    return {
        rank: StoppedProcess(capture.pids[rank], capture.host, state)
        for capture in captures
        for rank, state in sorted(capture.stopped.items())
    }


def _span(ranks: frozenset[int]) -> str:
    low, high = min(ranks), max(ranks)
    return f"{low}-{high}" if high > low else str(low)
