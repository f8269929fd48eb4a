"""Job: gloo training steps with one injected collective bug, then each rank writes its flight-recorder dump.

Run with `TORCH_FR_BUFFER_SIZE=200 CASE=<case> FR_OUT=<prefix> torchrun --nproc_per_node N fr_cases.py`.
Every rank dumps its ring buffer (torch's in-process dump, which works for gloo) to `<prefix><rank>` when
its collective times out, when it fails, or at the end — the way the watchdog dumps on NCCL.

Cases (the culprit is CULPRIT, default 1):
  skip      the culprit sleeps instead of joining the all_reduce of step 4
  op        the culprit calls all_gather where its peers call all_reduce at step 4
  size      the culprit all_reduces twice as many elements at step 4
  dtype     the culprit all_reduces float64 where its peers use float32 at step 4
  subgroup  every step: a world all_reduce, then an all_reduce in the subgroup of ranks 1..N-1; at step 3 the
            culprit (a subgroup member) skips the subgroup all_reduce and goes on to step 4
FR_JSON=1 writes the JSON form (`_dump_fr_trace_json`) instead of the pickle.

In `size` and `dtype`, gloo's transport thread aborts the receiving process (std::terminate: "Received data
size doesn't match expected size") before any dump could be written, so at step 4 every rank enqueues its
collective asynchronously and dumps right then, before waiting on it (the culprit a second after its peers, as
the first byte it sends aborts them): the recorder holds the entry from the moment the op is enqueued, so the
dump is the one the watchdog would have written. Run these with FR_JSON=1: a pickle dump with stack traces
blocks for seconds while a gloo op is in flight (symbolizing), the JSON form (no frames) returns at once.
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

CASE = os.environ.get("CASE", "skip")
CULPRIT = int(os.environ.get("CULPRIT", "1"))
TIMEOUT_S = 3
STEPS = 6
BUG_STEP = 4


def dump(rank: int) -> None:
    data = c10d._dump_fr_trace_json() if os.environ.get("FR_JSON") else c10d._dump_fr_trace()
    with open(f"{os.environ['FR_OUT']}{rank}", "wb") as out:
        out.write(data)


def grads(step: int) -> torch.Tensor:
    return torch.full((4096,), float(step))


def sync_grads(flat: torch.Tensor, dump_now: bool = False) -> None:
    work = dist.all_reduce(flat, async_op=True)  # the call site every step uses
    if dump_now:
        dump(dist.get_rank())
    work.wait()


def train_step(rank: int, world: int, step: int, sub) -> None:
    flat = grads(step)
    if CASE == "subgroup":
        sync_grads(flat)
        if step == 3 and rank == CULPRIT:
            return  # the bug: skips the subgroup all_reduce
        if sub is not None:
            dist.all_reduce(flat[:1024], group=sub)
        return
    if step == BUG_STEP and rank == CULPRIT:
        if CASE == "skip":
            time.sleep(TIMEOUT_S + 3)  # the bug: busy elsewhere, never joins
            raise TimeoutError("culprit stalled")
        if CASE == "op":
            gathered = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(gathered, flat)
            return
        if CASE in ("size", "dtype"):
            bad = torch.cat([flat, flat]) if CASE == "size" else flat.double()
            time.sleep(1.0)  # let the peers dump first: the first byte it sends aborts them
            work = dist.all_reduce(bad, async_op=True)
            dump(rank)
            work.wait()
            return
    sync_grads(flat, dump_now=step == BUG_STEP and CASE in ("size", "dtype"))


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    sub = None
    if CASE == "subgroup":
        members = list(range(1, world))
        group = dist.new_group(members)
        sub = group if rank in members else None
    try:
        for step in range(1, STEPS + 1):
            train_step(rank, world, step, sub)
    except Exception as err:  # noqa: BLE001 - the timeout is the point; dump as the watchdog would
        print(f"rank {rank}: {type(err).__name__}: {str(err)[:120]}", flush=True)
    finally:
        dump(rank)
    os._exit(0)  # skip the teardown barrier: the peers are gone or hung


if __name__ == "__main__":
    main()
