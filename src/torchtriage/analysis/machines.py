"""The culprit's machine: which host, process and GPU each culprit rank ran on, from every source that says.

An operator acts on machines (drain a host, reset a GPU), so a verdict names the culprit's besides its rank.
Each of these sources places a rank, each trusted for what it saw itself:

- a live capture's `summary.json` (collect/capture.py): the host and pid of each process it found, now; for a
  pod's capture (`diagnose --pods`), the node kubectl placed the pod on;
- the ranks' identity records (`DIR/identity/rank<N>.json`, sources/identity.py): host, pid and local rank
  from the rank itself at start, and its GPU (index, UUID, PCI bus id) once CUDA was in use;
- the debug servers' registrations in the job's store (`diagnose --store`, sources/registrations.py): the host
  each rank's worker registered its URL under;
- a stack dump's header (py-spy's `Process 4242: ...`): the pid of the process dumped;
- torchrun's failure report in a log (`host : node-07`, `exitcode : 1 (pid: 4242)` under each failed rank,
  the verdict's fact `launcher_processes`): where the launcher saw each failed child run;
- NCCL's set-up lines in a log (`node-07:4242:4301 [3] NCCL INFO comm 0x... rank 11 nranks 16 ... Init
  COMPLETE`, the verdict's fact `nccl_processes`, for its culprits): where each rank set its communicator up;
- the host a launcher put before a culprit's own lines in a log (pdsh's or clush's `node-07: [rank3]: ...`,
  Ray's `ip=`; the verdict's fact `prefix_hosts`): the machine that printed them.

What one says first is kept and the others fill what it left unknown; each machine names the sources that
told. A culprit no source placed keeps a Machine with nothing known, which every renderer says as such.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from torchtriage.model import Machine, SourceKind, Verdict
from torchtriage.sources.captures import CAPTURE_SUMMARY, NodeCapture, read_capture
from torchtriage.sources.identity import read_identities
from torchtriage.sources.registrations import REGISTRATIONS_FILE, read_registrations


def from_captures(captures: Iterable[NodeCapture]) -> dict[int, Machine]:
    """Rank -> host and pid, from live captures' summaries (a pod's: its node, and the pid in the pod)."""
    return {
        rank: Machine(
            rank,
            host=capture.machine,
            pid=pid if pid > 0 else None,
            sources=("capture",),
            pod=capture.pod,
        )
        for capture in captures
        for rank, pid in capture.pids.items()
    }


def from_registrations(paths: Iterable[str], problems: list[str]) -> dict[int, Machine]:
    """Rank -> host, from the hosts the ranks' debug servers registered in the job's store."""
    return {
        rank: Machine(rank, host=host, sources=("debug_server",))
        for path in paths
        for rank, host in read_registrations(path, problems).items()
    }


def from_stacks(stacks: Mapping[int, Any] | None) -> dict[int, Machine]:
    """Rank -> pid, from the stack dumps read (a py-spy dump's header names its process)."""
    found = {}
    for rank, stack in (stacks or {}).items():
        pid = getattr(stack, "pid", None)
        if isinstance(pid, int) and pid > 0:
            found[rank] = Machine(rank, pid=pid, sources=("stacks",))
    return found


# The log analysis's facts that place ranks, and the source each names: torchrun's failure report, NCCL's set-up
# lines (`host:pid:tid [dev] NCCL INFO comm ... rank R nranks N ... Init COMPLETE`, for the culprits), and the host a
# launcher put before the culprit's own lines (pdsh's "node-07: [rank3]: ...").
_PLACING_FACTS = (("launcher_processes", "launcher"), ("nccl_processes", "nccl"), ("prefix_hosts", "host_prefix"))


def from_log_facts(facts: Mapping[str, Any]) -> dict[int, Machine]:
    """Rank -> host and pid, from what the log analysis read: torchrun's report first, then NCCL's lines."""
    return merge(*(_placed_by(facts, key, source) for key, source in _PLACING_FACTS))


def _placed_by(facts: Mapping[str, Any], key: str, source: str) -> dict[int, Machine]:
    found = {}
    processes = facts.get(key)
    for rank, process in processes.items() if isinstance(processes, Mapping) else ():
        host, pid = process.get("host"), process.get("pid")
        if (
            str(rank).isascii()
            and str(rank).isdigit()
            and len(str(rank)) <= 9
            and (isinstance(host, str) or isinstance(pid, int))
        ):
            found[int(rank)] = Machine(
                int(rank), host=host if isinstance(host, str) and host else None,
                pid=pid if isinstance(pid, int) and pid > 0 else None, sources=(source,),
            )  # fmt: skip
    return found


def merge(*layers: Mapping[int, Machine]) -> dict[int, Machine]:
    """Rank -> machine: the first layer that places a rank decides, the later ones fill what it left unknown. A
    later layer that names another process for the rank fills nothing (it saw another process: a restart)."""
    merged: dict[int, Machine] = {}
    for layer in layers:
        for rank, machine in layer.items():
            known = merged.get(rank)
            if known is None:
                merged[rank] = machine
            elif known.pid is None or machine.pid is None or known.pid == machine.pid:
                merged[rank] = known.filled_from(machine)
    return merged


def culprit_machines(culprits: Iterable[int], machines: Mapping[int, Machine]) -> list[Machine]:
    """One machine per culprit rank, in the verdict's order; a rank no source placed has nothing known."""
    return [machines.get(rank, Machine(rank)) for rank in culprits]


def machines_of(inputs: Iterable[Any], stacks: Mapping[int, Any] | None, problems: list[str]) -> dict[int, Machine]:
    """Rank -> machine from the inputs a run analysis found (registry `Input`s) and the stacks it read."""
    inputs = list(inputs)
    ours = [i.path for i in inputs if i.kind == SourceKind.TORCHTRIAGE_OUTPUT]
    captures = [c for c in map(read_capture, _named(ours, CAPTURE_SUMMARY)) if c is not None]
    identities = read_identities([i.path for i in inputs if i.kind == SourceKind.IDENTITY], problems)
    registered = from_registrations(_named(ours, REGISTRATIONS_FILE), problems)
    return merge(from_captures(captures), identities, registered, from_stacks(stacks))


def _named(paths: Iterable[str], name: str) -> list[str]:
    return [path for path in paths if Path(path).name == name]


def attach_machines(
    verdict: Verdict, inputs: Iterable[Any], stacks: Mapping[int, Any] | None = None, facts: Iterable[Mapping] = ()
) -> Verdict:
    """The verdict with its culprits' machines, from the inputs and stacks its analysis read, then from the
    launcher's report its logs hold (the verdict's facts, and `facts`: those of the assessments it was fused
    from, whose facts fusion may not carry)."""
    problems: list[str] = []
    reports = [from_log_facts(f) for f in (verdict.facts, *facts)]
    machines = merge(machines_of(inputs, stacks, problems), *reports)
    verdict.culprit_machines = culprit_machines(verdict.culprit_ranks, machines)
    verdict.problems.extend(problems)
    return verdict
