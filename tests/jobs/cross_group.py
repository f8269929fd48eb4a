"""Job: a hang that crosses process groups, the way 3D-parallel jobs hang, until it is killed.

    CASE=<case> CULPRIT=<rank> [GROUP_SIZE=<n>] [BACKEND=nccl] torchrun --nproc_per_node N tests/jobs/cross_group.py

The world is cut into subgroups of GROUP_SIZE consecutive ranks (default: half the world), made with
`dist.new_group` by every rank. Each training step all_reduces the gradients in the rank's subgroup
(`sync_subgroup`, a data-parallel group) and then the loss on the world group (`sync_world`). After
WARMUP_STEPS healthy steps every rank prints `READY rank=<r> pid=<pid>` and runs one more step, in which
the culprit departs as CASE says:

    world_for_subgroup   it all_reduces on the world group where its subgroup peers use the subgroup
    opposite_order       it calls the world all_reduce before the subgroup one (its peers the reverse)
    subgroup_barrier     it enters a barrier on its subgroup (`wait_for_subgroup`) where its peers
                         call the world all_reduce
    early_exit           it leaves the loop and waits in the world barrier of the end of training

Two more cases run a pipeline instead: the world is cut into pairs of stages (2k sends its activations to
2k+1 and receives the gradients back, `forward_stage` / `backward_stage`), then every rank all_reduces on
the world (`sync_world`). The culprit departs in the pipeline:

    skip_send            the second stage of its pair never sends the gradients back and goes on to
                         the world all_reduce; the first stage waits in its recv
    recv_before_send     the first stage receives the gradients before it sends the activations: both
                         stages of the pair wait in a recv
    batch_missing_op     the stages exchange through batch_isend_irecv; the second stage's batch lacks
                         the send of the gradients

And one where every step also exchanges tokens over the world with all_to_all_single, as an
expert-parallel layer does (on NCCL only: gloo refuses splits that disagree at once):

    split_mismatch       the culprit sends one row more to the next rank than that rank expects from it

No rank is then simply missing from a collective the others wait in: the culprit waits in one group for
peers that wait in another group for it (a cycle), and the other subgroups wait in the world all_reduce
for the culprit's peers, which a majority rule per group would blame. The process-group timeout is 600 s,
so the job hangs until it is killed; a worker whose agent is gone exits within a second.

With BACKEND=nccl the tensors are on the GPUs and each step ends by waiting for the device, as a training
loop that reads its loss does (NCCL's collectives return at once). With more ranks than GPUs the ranks share
them: each rank is then another host to NCCL (NCCL_HOSTID), which lets two ranks use one device and connects
them through its network transport, so one GPU records what several would.
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import env_int, exit_when_orphaned  # the job folder is on sys.path

WARMUP_STEPS = 3
SIZE = 1024
DEVICE = torch.device("cpu")
CASES = (
    "world_for_subgroup",
    "opposite_order",
    "subgroup_barrier",
    "early_exit",
    "skip_send",
    "recv_before_send",
    "batch_missing_op",
    "split_mismatch",
)
PIPELINE = ("skip_send", "recv_before_send", "batch_missing_op")


def sync_subgroup(grads: torch.Tensor, subgroup) -> None:
    dist.all_reduce(grads, group=subgroup)


def sync_world(loss: torch.Tensor) -> None:
    dist.all_reduce(loss)


def all_reduce_on_the_world_instead(grads: torch.Tensor) -> None:
    dist.all_reduce(grads)  # the bug: the world group, where the subgroup peers use the subgroup


def wait_for_subgroup(subgroup) -> None:
    dist.barrier(group=subgroup)  # the bug: a barrier where the peers all_reduce


def end_of_training() -> None:
    dist.barrier()  # the bug: it left the loop early, the others are still training


def forward_stage(rank: int, activations: torch.Tensor, grads: torch.Tensor) -> None:
    dist.send(activations, rank + 1)
    dist.recv(grads, rank + 1)


def backward_stage(rank: int, activations: torch.Tensor, grads: torch.Tensor, skip_send: bool) -> None:
    dist.recv(activations, rank - 1)
    if not skip_send:  # the bug when skip_send: the gradients never go back
        dist.send(grads, rank - 1)


def receive_first(rank: int, activations: torch.Tensor, grads: torch.Tensor) -> None:
    dist.recv(grads, rank + 1)  # the bug: waits for the gradients of activations it has not sent
    dist.send(activations, rank + 1)


def exchange_in_a_batch(rank: int, activations: torch.Tensor, grads: torch.Tensor, missing_send: bool) -> None:
    if rank % 2 == 0:
        ops = [dist.P2POp(dist.isend, activations, rank + 1), dist.P2POp(dist.irecv, grads, rank + 1)]
    else:
        ops = [dist.P2POp(dist.irecv, activations, rank - 1)]
        if not missing_send:  # the bug when missing_send: the batch lacks the send of the gradients
            ops.append(dist.P2POp(dist.isend, grads, rank - 1))
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def pipeline_step(rank: int, culprit: int, case: str | None) -> bool:
    activations, grads, loss = (torch.ones(SIZE, device=DEVICE) for _ in range(3))
    if case == "batch_missing_op" or os.environ.get("CASE") == "batch_missing_op":
        exchange_in_a_batch(rank, activations, grads, missing_send=rank == culprit and case is not None)
    elif rank % 2 == 0:
        if rank == culprit and case == "recv_before_send":
            receive_first(rank, activations, grads)
        else:
            forward_stage(rank, activations, grads)
    else:
        backward_stage(rank, activations, grads, skip_send=rank == culprit and case == "skip_send")
    sync_world(loss)
    finish_step()
    return True


def finish_step() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()  # the loss read back: where a GPU rank waits for its collectives


def exchange_tokens(rank: int, world: int, one_more_to: int | None) -> None:
    """An expert-parallel layer's all_to_all_single: one row to every rank, and one more to `one_more_to` (the
    bug: that rank expects one)."""
    sent = [1 + (peer == one_more_to) for peer in range(world)]
    tokens, received = torch.ones(sum(sent), 4, device=DEVICE), torch.empty(world, 4, device=DEVICE)
    dist.all_to_all_single(received, tokens, [1] * world, sent)


def step(rank: int, culprit: int, case: str | None, subgroup) -> bool:
    """One training step; False when this rank leaves the loop."""
    # One size: gloo aborts on a size mismatch, NCCL would hang.
    grads, loss = torch.ones(SIZE, device=DEVICE), torch.ones(SIZE, device=DEVICE)
    if os.environ.get("CASE") == "split_mismatch":
        world = dist.get_world_size()
        exchange_tokens(rank, world, (rank + 1) % world if rank == culprit and case is not None else None)
    if rank == culprit and case == "world_for_subgroup":
        all_reduce_on_the_world_instead(grads)
    elif rank == culprit and case == "opposite_order":
        sync_world(loss)
        sync_subgroup(grads, subgroup)
        finish_step()
        return True
    elif rank == culprit and case == "subgroup_barrier":
        sync_subgroup(grads, subgroup)
        wait_for_subgroup(subgroup)
        finish_step()
        return True
    elif rank == culprit and case == "early_exit":
        return False
    else:
        sync_subgroup(grads, subgroup)
    sync_world(loss)
    finish_step()
    return True


def use_backend() -> str:
    """The backend the job runs on, and its device (the GPU of its local rank, shared if there are fewer)."""
    global DEVICE
    backend = os.environ.get("BACKEND", "gloo")
    if backend == "nccl":
        local, count = env_int("LOCAL_RANK", 0), torch.cuda.device_count()
        if local >= count:  # another host to NCCL: it refuses two ranks of one host on one device
            os.environ["NCCL_HOSTID"] = f"cross-group-rank-{env_int('RANK', 0)}"
        DEVICE = torch.device("cuda", local % count)
        torch.cuda.set_device(DEVICE)
    return backend


def main() -> None:
    case = os.environ.get("CASE", "world_for_subgroup")
    if case not in CASES:
        raise SystemExit(f"CASE={case!r} is not one of {', '.join(CASES)}")
    culprit = env_int("CULPRIT", 1)
    exit_when_orphaned()
    dist.init_process_group(use_backend(), timeout=timedelta(seconds=env_int("HANG_TIMEOUT_S", 600)))
    rank, world = dist.get_rank(), dist.get_world_size()
    size = env_int("GROUP_SIZE", max(1, world // 2))
    subgroups = [dist.new_group(list(range(s, min(s + size, world)))) for s in range(0, world, size)]
    subgroup = subgroups[rank // size]

    one_step = (
        (lambda bug: pipeline_step(rank, culprit, bug))
        if case in PIPELINE
        else (lambda bug: step(rank, culprit, bug, subgroup))
    )
    for _ in range(WARMUP_STEPS):
        one_step(None)
    # One write, newline included, so the lines of concurrent ranks never interleave.
    sys.stdout.write(f"READY rank={rank} pid={os.getpid()}\n")
    sys.stdout.flush()
    if one_step(case):
        one_step(None)  # the next step: where ranks the bug did not stop go on to
    else:
        end_of_training()
    print(f"UNHUNG rank={rank} case={case}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
