"""srun's account of its step's tasks, read from a log: which tasks were still running when srun ended the step.

srun reports how each task ended (SchedMD/slurm src/srun, its task-exit handler): "srun: error: <hosts>: task<s>
<list>: Exited with exit code <n>" or "...: <strsignal>" ("Terminated", "Killed", "Segmentation fault (core
dumped)"), the list ranged ("0,2-63"). Once a task fails under --kill-on-bad-exit, srun ends the step itself and says
so, "srun: Terminating StepId=<id>" (some releases "srun: launch/slurm: _step_signal: Terminating StepId=<id>"), then
reports the tasks it ended: SIGTERM's "Terminated", SIGKILL's "Killed". Those tasks were running when the first one
failed: none of them left first. Where srun started the ranks themselves its task numbers are ranks; where it
started torchrun's agent on each node they are nodes, and the reader drops them (sources/log_records.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from torchtriage.sources import limits

# The prefilter passes these lines to the reader (knowledge/prefilter.py STRUCTURE_MARKERS).
TASK_MARKER = "srun: error: "
TERMINATING_MARKERS = ("srun: Terminating ", "_step_signal: Terminating ")
_TASKS = re.compile(r"srun: error: [^:\s]{1,255}: tasks? (?P<tasks>\d[\d,-]{0,4000}): (?P<state>\S.{0,200})")
# The signals srun sends the tasks of a step it ends (SIGTERM, then SIGKILL after KillWait), as strsignal names them.
_ENDED_BY_SRUN = ("Terminated", "Killed")


@dataclass
class SrunTasks:
    """One file's srun task reports, as their lines stream by."""

    terminating: bool = False  # srun said it ends the step
    ended: set[int] = field(default_factory=set)  # tasks srun reported ended by its own signal after saying so

    def read(self, text: str) -> None:
        if not self.terminating and any(marker in text for marker in TERMINATING_MARKERS):
            self.terminating = True
            return
        if not self.terminating or TASK_MARKER not in text:
            return
        found = _TASKS.search(text)
        if found is not None and found.group("state").strip() in _ENDED_BY_SRUN:
            self.ended |= task_list(found.group("tasks"))


def task_list(spec: str) -> set[int]:
    """The tasks of srun's ranged list ("0,2-63"); nothing where a number passes the largest rank read or a range
    runs backwards (a line cut or garbled: no census is better than a wrong one)."""
    tasks: set[int] = set()
    largest = limits.active().rank
    for part in spec.strip(",").split(","):
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()) or len(first) > 7 or len(last) > 7:
            return set()
        low, high = int(first), int(last or first)
        if high < low or high > largest or len(tasks) + high - low > largest:
            return set()
        tasks.update(range(low, high + 1))
    return tasks
