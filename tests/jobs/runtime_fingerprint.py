"""Job: check_collectives under torchrun + gloo. FP_MODE picks the injected mismatch:

- ok: a run of matching collectives of every kind passes.
- size: rank 1 all-reduces 17 elements, its peers 16.
- op: rank 1 calls all_gather_into_tensor where its peers call all_reduce.
- groups: rank 0 all-reduces on one group while rank 1 all-reduces on another (a deadlock).
- env: like size, enabled by TORCHTRIAGE_CHECK_COLLECTIVES=1 through init_distributed, no context manager.

Prints `RESULT {json}` per rank: passed, or raised with the message.
"""

import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from torchtriage import CollectiveMismatchError, check_collectives, init_distributed


def all_kinds(rank: int, world: int) -> None:
    x = torch.ones(4)
    dist.all_reduce(x)
    out = torch.zeros(4 * world)
    dist.all_gather_into_tensor(out, x)
    parts = [torch.zeros(4) for _ in range(world)]
    dist.all_gather(parts, x)
    dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2 * world))
    dist.broadcast(x, src=0)
    splits = [1 + (rank + peer) % 2 for peer in range(world)]  # uneven but consistent splits
    recv = [1 + (peer + rank) % 2 for peer in range(world)]
    dist.all_to_all_single(torch.zeros(sum(recv), 3), torch.ones(sum(splits), 3), recv, splits)
    dist.reduce(x, dst=0)
    dist.barrier()


def mismatch(mode: str, rank: int, world: int) -> None:
    if mode in ("size", "env"):
        dist.all_reduce(torch.ones(17 if rank == 1 else 16))
    elif mode == "op":
        if rank == 1:
            dist.all_gather_into_tensor(torch.zeros(16 * world), torch.ones(16))
        else:
            dist.all_reduce(torch.ones(16))
    elif mode == "groups":
        first, second = dist.new_group([0, 1]), dist.new_group([0, 1])
        dist.all_reduce(torch.ones(2), group=first if rank == 0 else second)


def main() -> None:
    mode = os.environ["FP_MODE"]
    info = init_distributed()
    rank, world = info.rank, info.world_size
    started = time.monotonic()
    result = {"rank": rank, "mode": mode}
    checking = contextlib.nullcontext() if mode == "env" else check_collectives()
    try:
        with checking:
            all_kinds(rank, world)
            if mode != "ok":
                mismatch(mode, rank, world)
        result["passed"] = True
    except CollectiveMismatchError as err:
        result.update(raised=type(err).__name__, message=str(err))
    result["seconds"] = round(time.monotonic() - started, 2)
    result["restored"] = not hasattr(dist.all_reduce, "__torchtriage_original__")
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()
    if mode == "ok":
        dist.barrier()
        dist.destroy_process_group()
    else:
        os._exit(0)  # the peers' communicators may be mid-mismatch: do not wait on them


if __name__ == "__main__":
    main()
