"""DeepSpeed's launcher's account of its processes, read from a log: whether every process it spawned exited 0.

`deepspeed.launcher.launch` (one per node; `deepspeed`'s runner starts them over pdsh or MPI) logs its node before
it spawns anything, "nnodes=2, num_local_procs=4, node_rank=1", then polls its processes: one that exits 0 is
logged "Process 4121 exits successfully.", one that does not makes it kill the rest and log "... exits with
return code = 1" (an error line, which the rules read). It never says that the job finished: that is read here,
once every node it names has logged its header and as many distinct processes exited 0 as its nodes spawned.
A second header of a node already seen is a new launch (a restart in the same file): the count starts again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The prefilter passes these lines to the reader (knowledge/prefilter.py STRUCTURE_MARKERS).
_HEADER = re.compile(r"\bnnodes=(?P<nnodes>\d{1,6}), num_local_procs=(?P<procs>\d{1,6}), node_rank=(?P<node>\d{1,6})\b")
_EXITED_0 = re.compile(r"\bProcess (?P<pid>\d{1,10}) exits successfully\.")


@dataclass
class DeepSpeedLaunch:
    """One file's launches, as their lines stream by."""

    nnodes: int = 0
    spawned: dict[int, int] = field(default_factory=dict)  # node_rank -> processes it spawned
    exited_0: set[str] = field(default_factory=set)  # pids logged as exiting 0 since the last launch began
    finished_at: tuple[int, str] | None = None  # (line, text) of the exit that completed the count

    def read(self, line_no: int, text: str) -> None:
        header = _HEADER.search(text)
        if header is not None:
            node = int(header.group("node"))
            if node in self.spawned:
                self.spawned.clear()
                self.exited_0.clear()
            self.nnodes = int(header.group("nnodes"))
            self.spawned[node] = int(header.group("procs"))
            self.finished_at = None
            return
        exited = _EXITED_0.search(text)
        if exited is None or not self.spawned:
            return
        self.exited_0.add(exited.group("pid"))
        if self._all_exited_0():
            self.finished_at = (line_no, text.strip())

    def _all_exited_0(self) -> bool:
        every_node = set(self.spawned) == set(range(self.nnodes))
        return every_node and len(self.exited_0) >= sum(self.spawned.values()) > 0
