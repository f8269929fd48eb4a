"""Job: one rank stops where its peers all_reduce, by a fault of a machine or of the program.

    FAULT=rank:1       rank 1 stops: a bug of the program, at the same line on whatever machine the rank runs
    FAULT=host:node-b  the rank on the machine named node-b stops, whatever its number: a fault of that machine.
                       The machine's name is TORCHTRIAGE_TEST_HOSTNAME, the test-only stand-in for a node's host
                       name; of several ranks on it, the one whose local rank is the attempt's number (modulo)

Every rank runs a few healthy all_reduces, prints `READY rank=<r> pid=<pid>` (flushed), then the culprit sleeps
in `stuck_rank` while its peers wait in `peer_all_reduce`, until the test kills the job. A worker whose agent is
gone exits within a second. With FAULT_ON_GPU=1 each rank first holds memory on GPU (local rank modulo the GPUs
seen), as a training rank does; the collectives stay on gloo, so that several ranks may share one GPU. With
OWN_WATCHDOG=DIR each rank starts a HangWatchdog itself (stall after 3 s, into DIR), as a program run without
`torchtriage run` does.
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import env_int, exit_when_orphaned  # the job folder is on sys.path

WARMUP_STEPS = 3
FOREVER_S = 3600


def stuck_rank() -> None:
    time.sleep(FOREVER_S)  # the culprit never joins the all_reduce


def peer_all_reduce(tensor: torch.Tensor) -> None:
    dist.all_reduce(tensor)  # the peers wait here


def is_culprit(rank: int, fault: str) -> bool:
    kind, _, value = fault.partition(":")
    if kind == "rank":
        return rank == int(value)
    if kind == "host" and os.environ.get("TORCHTRIAGE_TEST_HOSTNAME") == value:
        attempt = env_int("TORCHTRIAGE_FIRST_ATTEMPT", 0) + env_int("TORCHELASTIC_RESTART_COUNT", 0)
        return env_int("LOCAL_RANK", 0) == attempt % env_int("LOCAL_WORLD_SIZE", 1)
    return False


def main() -> None:
    fault = os.environ["FAULT"]
    exit_when_orphaned()
    if os.environ.get("OWN_WATCHDOG"):
        from torchtriage import HangWatchdog

        HangWatchdog(stall_seconds=3, out_dir=os.environ["OWN_WATCHDOG"]).start()
    if os.environ.get("FAULT_ON_GPU") == "1":
        torch.cuda.set_device(env_int("LOCAL_RANK", 0) % torch.cuda.device_count())
        held = torch.ones(1 << 20, device="cuda")  # noqa: F841 - memory this rank holds on its GPU
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    tensor = torch.ones(1024)
    for _ in range(WARMUP_STEPS):
        peer_all_reduce(tensor)
    print(f"READY rank={rank} pid={os.getpid()}", flush=True)
    if is_culprit(rank, fault):
        stuck_rank()
    peer_all_reduce(tensor)


if __name__ == "__main__":
    main()
