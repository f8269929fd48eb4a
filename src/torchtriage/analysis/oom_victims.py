"""Whose process the Linux OOM killer killed, from the pid both sides print (pure: reads log events).

The kernel names its victim by pid and name (mm/oom_kill.c: "Killed process 48213 (python3) total-vm:...",
"oom-kill:...,task=python3,pid=48213,..."); NCCL's set-up lines give each rank's pid (`host:pid:tid [dev] NCCL
INFO comm ... rank 5 nranks 8 ... Init COMPLETE`, the world communicator's). Together they say:

- the victim is one rank's process: that rank is the one killed;
- every victim the file names is none of the job's ranks and carries none of the names a process of a PyTorch
  job carries (Python's, torch's `pt_` threads', its launchers'): another program's kill (a monitoring agent at
  its own cgroup's limit), which says nothing of the job. A DataLoader worker is a child with its own pid but
  Python's name, so it is never taken for another program's; a line that names no victim (the first of a kill's,
  "python3 invoked oom-killer") follows its file's victims.

A host on the kernel's line (syslog's `host kernel:`) must be the NCCL line's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from torchtriage.analysis.xid_buses import FOREIGN, by_pid
from torchtriage.sources.log_records import LogEvent

KILLER_RULE = "host_oom.kernel_oom_killer"
_JOB_NAMES = re.compile(r"^(?:python[\d.]*|pt_\w*|torchrun|deepspeed|accelerate)$", re.IGNORECASE)


def victims(events: Sequence[LogEvent], pids: dict[tuple[str, int], int]) -> dict[int, int | str]:
    """For each OOM killer's line (event index): the rank whose process it killed, or FOREIGN for a line of a file
    whose every named victim is another program's. Lines nothing places are left out. `pids`: each rank's (host,
    pid), xid_buses.job_pids."""
    kills = [(i, e) for i, e in enumerate(events) if e.rule.id == KILLER_RULE]
    placed: dict[int, int | str] = {}
    foreign_by_file: dict[str, list[bool]] = {}
    for index, event in kills:
        if not event.facts.get("pid", "").isdigit() or not event.facts.get("task", "").strip():
            continue
        rank = by_pid(event, pids)
        if rank is not None:
            placed[index] = rank
        foreign = rank is None and not _JOB_NAMES.match(event.facts["task"].strip())
        foreign_by_file.setdefault(event.file, []).append(foreign)
    for index, event in kills:
        if index not in placed and all(foreign_by_file.get(event.file) or [False]):
            placed[index] = FOREIGN
    return placed
