"""Job: hangs on purpose, one rank (the culprit) departing from its peers, until it is killed.

    HANG_MODE=<mode> HANG_CULPRIT=<rank> torchrun --nproc_per_node N tests/jobs/hang.py

Every rank first runs WARMUP_STEPS healthy all_reduces (so flight recorders and logs have history),
then prints one line `READY rank=<r> pid=<pid>` (flushed) right before it enters the hang point. A
test waits for N READY lines, gives the ranks a moment to block, then attaches py-spy.

At the hang point the peers all_reduce on the world group (`peer_all_reduce`), except in `subgroup`
mode; the culprit does what HANG_MODE says:

    skip        sleeps instead of joining the all_reduce
    op          broadcasts where the peers all_reduce
    size        all_reduces a tensor of a different length (gloo may raise instead of hanging)
    barrier     enters a barrier where the peers all_reduce
    subgroup    all_reduces on the world group while the peers all_reduce on a subgroup
                (a second process group over the same ranks, like a data-parallel group)
    dataloader  waits for a batch that a DataLoader worker is stuck fetching
    lock        deadlocks itself on a threading.Lock it already holds
    busy        computes forever in Python instead of joining (its main thread moves: it is not stalled)
    exit        returns from the job and exits 0 (no error of its own): the job does not hang, its peers'
                connections to it close and they fail ("Connection closed by peer")

HANG_CULPRIT defaults to 1; HANG_CULPRIT=0 gives the rank-0 variants. The process-group timeout is
600 s (HANG_TIMEOUT_S), so the job hangs until it is killed. torchrun starts each worker in a session
of its own, so killing the agent's process group does not reach the workers: kill each worker's
process group (its pid is in its READY line; the group holds its DataLoader workers too), then the
agent's. As a safety net, a worker whose agent is gone exits within a second.

Gloo does not hang on every mismatch: in `size` mode it aborts both ranks ("op.preamble.length <=
op.nbytes ... Is there a distributed collective mismatch in your code?") right after READY.
"""

import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import env_int, exit_when_orphaned  # the job folder is on sys.path

WARMUP_STEPS = 3
SIZE = 1024
FOREVER_S = 3600
MODES = ("skip", "op", "size", "barrier", "subgroup", "dataloader", "lock", "busy", "exit")


def peer_all_reduce(tensor: torch.Tensor, group=None) -> None:
    dist.all_reduce(tensor, group=group)  # the peers wait here


def culprit_skip(tensor: torch.Tensor) -> None:
    time.sleep(FOREVER_S)  # the culprit never joins the all_reduce


def culprit_exit(tensor: torch.Tensor) -> None:
    sys.exit(0)  # leaves the loop early and ends, as a rank whose data ran out first would


def culprit_op(tensor: torch.Tensor) -> None:
    dist.broadcast(tensor, src=0)  # a different collective from the peers'


def culprit_size(tensor: torch.Tensor) -> None:
    dist.all_reduce(torch.ones(SIZE // 2))  # half the peers' length


def culprit_barrier(tensor: torch.Tensor) -> None:
    dist.barrier()  # a barrier against the peers' all_reduce


def culprit_subgroup(tensor: torch.Tensor) -> None:
    dist.all_reduce(tensor)  # the world group, where the peers use the subgroup


class SlowDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(FOREVER_S)  # a fetch that never returns (a dead file system, a stuck download)
        return torch.ones(SIZE)


def culprit_dataloader(tensor: torch.Tensor) -> None:
    loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=1, num_workers=1)
    for batch in loader:  # the main process waits for the worker's batch
        tensor += batch[0]


class Counter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def bump(self) -> None:
        with self._lock:
            self.value += 1
            self.log()  # calls back into a method that takes the same (non-reentrant) lock

    def log(self) -> None:
        with self._lock:  # the culprit deadlocks here
            print(f"value={self.value}", flush=True)


def culprit_lock(tensor: torch.Tensor) -> None:
    Counter().bump()


# A busy rank's work: many small steps, each its own code object, each letting go of the GIL for a moment
# (as real work does: I/O, a kernel launch). The watchdog sees the main thread where it lets go of the GIL:
# across these steps, that place keeps moving. A tight pure-Python loop would not do: it lets go at its one
# jump back, always the same place, and looks stalled.
BUSY_STEPS = []
for _k in range(24):
    _namespace: dict = {"time": time}
    exec(f"def busy_step_{_k}(x):\n    time.sleep(0.001)\n    return (x * 31 + {_k}) % 1_000_003\n", _namespace)  # noqa: S102
    BUSY_STEPS.append(_namespace[f"busy_step_{_k}"])


def culprit_busy(tensor: torch.Tensor) -> None:
    # A loop that never ends (a wrong stop condition): busy, never reaching the all_reduce, and never
    # stalled in its own watchdog's eyes.
    total = 0
    while True:
        for step in BUSY_STEPS:
            total = step(total)


def main() -> None:
    mode = os.environ.get("HANG_MODE", "skip")
    if mode not in MODES:
        raise SystemExit(f"HANG_MODE={mode!r} is not one of {', '.join(MODES)}")
    culprit = env_int("HANG_CULPRIT", 1)
    exit_when_orphaned()
    dist.init_process_group("gloo", timeout=timedelta(seconds=env_int("HANG_TIMEOUT_S", 600)))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # Created by every rank (new_group is collective), before the hang point.
    subgroup = dist.new_group(list(range(world_size))) if mode == "subgroup" else None

    tensor = torch.ones(SIZE)
    for _ in range(WARMUP_STEPS):
        dist.all_reduce(tensor)
        tensor /= world_size

    # One write, newline included, so the lines of concurrent ranks never interleave.
    sys.stdout.write(f"READY rank={rank} pid={os.getpid()}\n")
    sys.stdout.flush()
    if rank == culprit:
        globals()[f"culprit_{mode}"](tensor)
    else:
        peer_all_reduce(tensor, group=subgroup)
    # Reached only if the mismatch did not hang (for example gloo completed it anyway).
    print(f"UNHUNG rank={rank} mode={mode}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
