"""Job: real hangs written with the real framework APIs (DDP, FSDP2, pipelining, DTensor, DCP, ZeRO, ...).

    CASE=<case> [CULPRIT=<rank>] torchrun --standalone --nproc_per_node N tests/jobs/api_hangs.py

Each case is a tiny training loop on CPU/gloo, written as a user would write it with one bug. It runs
WARMUP_STEPS healthy steps (so flight recorders and logs have a history), then every rank prints
`READY rank=<r> pid=<pid>` (flushed) right before the faulty step, in which the culprit departs and the job
hangs until it is killed (process-group timeout HANG_TIMEOUT_S, default 600 s). A worker whose agent is gone
exits within a second (`exit_when_orphaned`).

Each case's docstring says what departs and which rank is the culprit. In the code, the line where the
culprit departs carries the comment `# [<case>] departure`, and the line where the culprit then waits (what
a stack of the culprit shows, if it differs) carries `# [<case>] culprit waits`; a harness finds them there
(benchmarks/live_api.py). CASES below gives each case's number of ranks and its culprits.

Gloo does not hang on every mismatch: the same collective with different sizes aborts both ranks
("op.preamble.length <= op.nbytes"); different collectives (all_reduce against broadcast, all_gather,
barrier, ...) wait for each other until the timeout. Every case below departs into a different collective,
a point-to-point op, or something that is no collective at all.

Two of DDP's classics do not hang on gloo, so they are not here: a parameter left unused on one rank with
find_unused_parameters=False (the culprit raises "Expected to have finished reduction in the prior
iteration" at its next forward, and the job fails), and one rank accumulating one micro-batch more under
`no_sync()` (the ranks' all-reduces stay paired, one micro-batch apart). Nor does a DDP forward on rank 0
alone hang (its buffer broadcast is rooted at rank 0, which sends without waiting).
"""

import os
import queue
import signal
import socket
import sys
import tempfile
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _common import BATCH, FEATURES, batches, env_int, exit_when_orphaned  # the job folder is on sys.path
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

WARMUP_STEPS = 3
HIDDEN = 32
LR = 0.05
# BACKEND=nccl runs the cases marked for it on GPUs (tests/gpu/record_api_hangs_nccl.sh); with more ranks than
# GPUs the ranks share them, each another host to NCCL (NCCL_HOSTID), as tests/jobs/cross_group.py does.
BACKEND = os.environ.get("BACKEND", "gloo")
NCCL_CASES = (
    "ddp_skip_backward",
    "fsdp2_skip_block",
    "dtensor_mesh_skip",
    "all_gather_object_skip",
    "store_get",
    "gpu_wedged",
    "dcp_save_skip",
    "zero_consolidate",
)
NCCL_ONLY = ("gpu_wedged",)  # a GPU's stream is the point of these


def device() -> torch.device:
    if BACKEND != "nccl":
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())


def on_device(pairs):
    for x, y in pairs:
        yield x.to(device()), y.to(device())


def read_back(loss: torch.Tensor) -> None:
    """A training loop that logs its loss reads it back every step: on NCCL, where collectives return at once,
    that is where a rank waits for a peer."""
    if BACKEND == "nccl":
        loss.item()


# --- scaffolding -------------------------------------------------------------------------------------


def ready(rank: int) -> None:
    # One write, newline included, so the lines of concurrent ranks never interleave.
    sys.stdout.write(f"READY rank={rank} pid={os.getpid()}\n")
    sys.stdout.flush()


def mlp(norm: bool = False) -> nn.Sequential:
    torch.manual_seed(0)
    layers = [nn.Linear(FEATURES, HIDDEN)]
    if norm:
        layers.append(nn.BatchNorm1d(HIDDEN))  # buffers: DDP broadcasts them from rank 0 at every forward
    layers += [nn.ReLU(), nn.Linear(HIDDEN, 1)]
    return nn.Sequential(*layers).to(device())


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR)


def end_of_training() -> None:
    dist.barrier()
    print(f"UNHUNG rank={dist.get_rank()} case={os.environ.get('CASE')}", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's threads sometimes abort the interpreter's teardown (tests/jobs/_common.py)


# --- DDP -----------------------------------------------------------------------------------------------


def ddp_skip_backward(rank: int, world: int, culprit: int) -> None:
    """DDP, a NaN guard: the culprit's batch of the faulty step holds a NaN, so it skips the batch (`continue`)
    before `loss.backward()`; it goes on to the next forward, where DDP broadcasts the BatchNorm buffers
    (broadcast_buffers=True), while its peers wait in DDP's gradient all-reduce inside backward.
    Culprit: CULPRIT (default 1)."""
    model = DDP(mlp(norm=True))
    opt = sgd(model)
    for step, (x, y) in enumerate(on_device(batches(rank, WARMUP_STEPS + 2))):
        if step == WARMUP_STEPS:
            ready(rank)
            if rank == culprit:
                x[0, 0] = float("nan")  # one bad sample in the culprit's shard
        loss = F.mse_loss(model(x), y)  # [ddp_skip_backward] culprit waits
        if not torch.isfinite(loss):
            continue  # [ddp_skip_backward] departure
        loss.backward()
        opt.step()
        opt.zero_grad()
    end_of_training()


def gpu_wedged(rank: int, world: int, culprit: int) -> None:
    """DDP on NCCL, and the culprit's GPU stops making progress in the faulty step: a kernel that never ends
    (a device spin, as a hung kernel or a wedged GPU leaves it) runs on its stream before the backward, so its
    gradient all-reduce is enqueued behind it and never starts. Every rank's Python then waits alike, in the
    loss read back: only the flight recorder tells the culprit's op from its peers' (never started against
    started). NCCL only. Culprit: CULPRIT (default 1)."""
    model = DDP(mlp())
    opt = sgd(model)
    for step, (x, y) in enumerate(on_device(batches(rank, WARMUP_STEPS + 2))):
        if step == WARMUP_STEPS:
            ready(rank)
        loss = F.mse_loss(model(x), y)
        if step == WARMUP_STEPS and rank == culprit:
            torch.cuda._sleep(1 << 62)  # [gpu_wedged] departure
        loss.backward()
        opt.step()
        read_back(loss)  # [gpu_wedged] culprit waits
        opt.zero_grad()
    end_of_training()


def ddp_uneven_inputs(rank: int, world: int, culprit: int) -> None:
    """DDP with uneven inputs and no `Join`: the culprit's shard is one batch short, so it leaves the loop and
    waits in the barrier at the end of training, while its peers wait in DDP's gradient all-reduce of their
    extra step. Culprit: CULPRIT (default 1)."""
    model = DDP(mlp())
    opt = sgd(model)
    steps = WARMUP_STEPS + 1 if rank == culprit else WARMUP_STEPS + 2
    for step, (x, y) in enumerate(batches(rank, steps)):  # [ddp_uneven_inputs] departure
        if step == WARMUP_STEPS:
            ready(rank)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()  # [ddp_uneven_inputs] culprit waits
    end_of_training()


def rank0_barrier(rank: int, world: int, culprit: int) -> None:
    """DDP, and rank 0 saves a checkpoint followed by a barrier meant to hold the others until the file is
    written, but the barrier sits inside `if rank == 0:`; rank 0 waits in it, the others in the next step's
    gradient all-reduce. Culprit: rank 0 (CULPRIT is ignored)."""
    model = DDP(mlp())
    opt = sgd(model)
    for step, (x, y) in enumerate(batches(rank, WARMUP_STEPS + 2)):
        if step == WARMUP_STEPS:
            ready(rank)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step == WARMUP_STEPS and rank == 0:
            torch.save(model.module.state_dict(), os.devnull)
            dist.barrier()  # [rank0_barrier] departure
    end_of_training()


# --- FSDP2 ----------------------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.relu(self.fc(h))


class Tower(nn.Module):
    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(FEATURES, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.out = nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor, drop: int | None = None) -> torch.Tensor:
        h = self.inp(x)
        for i, block in enumerate(self.blocks):
            if i == drop:
                continue  # [fsdp2_skip_block] departure
            h = block(h)
        return self.out(h)


def fsdp2_skip_block(rank: int, world: int, culprit: int) -> None:
    """FSDP2 (`fully_shard` on each block, then on the root) with stochastic depth drawn from a per-rank RNG:
    on the faulty step the culprit drops block 1, so its all-gathers (forward and backward) and
    reduce-scatters run one block short of its peers'; the ops of the ranks shift against each other until
    an all-gather meets a reduce-scatter. Culprit: CULPRIT (default 1)."""
    from torch.distributed.fsdp import fully_shard

    model = Tower().to(device())
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = sgd(model)
    for step, (x, y) in enumerate(on_device(batches(rank, WARMUP_STEPS + 2))):
        if step == WARMUP_STEPS:
            ready(rank)
        drop = 1 if (step == WARMUP_STEPS and rank == culprit) else None  # layer drop, unsynchronised RNG
        loss = F.mse_loss(model(x, drop=drop), y)
        loss.backward()  # [fsdp2_skip_block] culprit waits
        opt.step()
        opt.zero_grad()
        read_back(loss)
    end_of_training()


# --- pipelining -----------------------------------------------------------------------------------------


def pipeline_skip_send(rank: int, world: int, culprit: int) -> None:
    """torch.distributed.pipelining, 2 stages (PipelineStage + ScheduleGPipe, 2 microbatches): on the faulty
    step the last stage finds its targets bad and skips `schedule.step` (it never receives the activations
    nor sends the gradients back), then joins the loss broadcast that logs the step; the first stage waits
    in the schedule's recv of the gradients. Culprit: the last stage, rank 1 (CULPRIT is ignored)."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    if world != 2:
        raise SystemExit("pipeline_skip_send runs on 2 ranks")
    torch.manual_seed(0)
    stages = [nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU()), nn.Linear(HIDDEN, 1)]
    module = stages[rank]
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=F.mse_loss)
    opt = sgd(module)
    last = world - 1
    for step, (x, y) in enumerate(batches(0, WARMUP_STEPS + 2)):  # the same batch on both stages
        if step == WARMUP_STEPS:
            ready(rank)
        loss = torch.zeros(1)
        if rank == 0:
            schedule.step(x)  # [pipeline_skip_send] victim waits
        else:
            if step == WARMUP_STEPS:
                y = y.clone().fill_(float("nan"))  # a corrupt batch of targets
            if torch.isfinite(y).all():  # [pipeline_skip_send] departure
                losses: list[torch.Tensor] = []
                schedule.step(target=y, losses=losses)
                loss = torch.stack(losses).mean().detach().reshape(1)
        opt.step()
        opt.zero_grad()
        dist.broadcast(loss, src=last)  # [pipeline_skip_send] culprit waits
    end_of_training()


# --- DTensor / DeviceMesh -------------------------------------------------------------------------------


def dtensor_mesh_skip(rank: int, world: int, culprit: int) -> None:
    """A 2-D DeviceMesh (dp=2, tp=2 over 4 ranks): the MLP is tensor-parallel on "tp" (ColwiseParallel /
    RowwiseParallel), its gradients all-reduced on "dp", and every step logs the norm of the full first
    weight (`full_tensor()`, an all-gather on "tp"). On the faulty step the culprit skips that log (a
    rank-local condition): its tp peer waits in that all-gather, the culprit goes on to the next step's tp
    all-reduce (RowwiseParallel's output), where it waits for that peer; the other tp group finishes the
    step and waits in the next step's dp all-reduce for the two. Culprit: CULPRIT (default 1)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh(device().type, (2, 2), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(mlp(), mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = sgd(model)
    dp_group = mesh.get_group("dp")
    dp_rank = mesh.get_local_rank("dp")
    for step, (x, y) in enumerate(on_device(batches(dp_rank, WARMUP_STEPS + 2))):  # one batch per tp group
        if step == WARMUP_STEPS:
            ready(rank)
        loss = F.mse_loss(model(x), y)  # [dtensor_mesh_skip] culprit waits
        loss.backward()
        for p in model.parameters():
            local = p.grad.to_local()
            dist.all_reduce(local, group=dp_group)
            local /= mesh["dp"].size()
        opt.step()
        opt.zero_grad()
        log_this_step = not (step == WARMUP_STEPS and rank == culprit)  # a rank-local condition
        if log_this_step:  # [dtensor_mesh_skip] departure
            norm = model[0].weight.full_tensor().norm()
            if rank == 0:
                print(f"step {step} | loss {loss.item():.4f} | w0 norm {norm.item():.4f}", flush=True)
    end_of_training()


# --- object collectives, DCP, ZeRO --------------------------------------------------------------------


def all_gather_object_skip(rank: int, world: int, culprit: int) -> None:
    """DDP, and every step the ranks gather their stats with `dist.all_gather_object`; on the faulty step the
    culprit has no stats to report and skips the gather, going on to the next step's backward (DDP's
    gradient all-reduce) while its peers wait in the gather. Culprit: CULPRIT (default 1)."""
    model = DDP(mlp())
    opt = sgd(model)
    for step, (x, y) in enumerate(on_device(batches(rank, WARMUP_STEPS + 2))):
        if step == WARMUP_STEPS:
            ready(rank)
        loss = F.mse_loss(model(x), y)
        loss.backward()  # [all_gather_object_skip] culprit waits
        opt.step()
        opt.zero_grad()
        stats = None if (step == WARMUP_STEPS and rank == culprit) else {"rank": rank, "loss": loss.item()}
        if stats is not None:  # [all_gather_object_skip] departure
            gathered: list = [None] * world
            dist.all_gather_object(gathered, stats)
    end_of_training()


def dcp_save_skip(rank: int, world: int, culprit: int) -> None:
    """DDP, and a distributed checkpoint (`torch.distributed.checkpoint.save`) on the faulty step that the
    culprit does not call (its checkpoint decision is rank-local); it goes on training (the next step's
    gradient all-reduce) while its peers wait in DCP's planning collectives. Culprit: CULPRIT (default 1)."""
    import torch.distributed.checkpoint as dcp

    model = DDP(mlp())
    opt = sgd(model)
    folder = os.environ.get("CKPT_DIR") or os.path.join(
        tempfile.gettempdir(), f"api_hangs_ckpt_{os.environ.get('MASTER_PORT', 'x')}"
    )
    for step, (x, y) in enumerate(on_device(batches(rank, WARMUP_STEPS + 2))):
        if step == WARMUP_STEPS:
            ready(rank)
        loss = F.mse_loss(model(x), y)
        loss.backward()  # [dcp_save_skip] culprit waits
        opt.step()
        opt.zero_grad()
        time_to_save = step == WARMUP_STEPS and rank != culprit  # decided per rank (a local clock, say)
        if time_to_save:  # [dcp_save_skip] departure
            dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(folder, f"step{step}"))
    end_of_training()


def zero_consolidate(rank: int, world: int, culprit: int) -> None:
    """DDP + ZeroRedundancyOptimizer, and the classic checkpoint bug: `consolidate_state_dict(to=0)` called on
    rank 0 only (every rank must call it). Rank 0 waits in its broadcasts; the other ranks go on to the
    next step's gradient all-reduce. Culprits: every rank but 0, the ranks that skip the call (CULPRIT is
    ignored); with 2 ranks, which rank departed is a matter of view: rank 0 made the call no other rank
    makes."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = DDP(mlp())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=LR)
    for step, (x, y) in enumerate(on_device(batches(rank, WARMUP_STEPS + 2))):
        if step == WARMUP_STEPS:
            ready(rank)
        loss = F.mse_loss(model(x), y)
        loss.backward()  # [zero_consolidate] culprit waits
        opt.step()
        opt.zero_grad()
        if step == WARMUP_STEPS and rank == 0:  # [zero_consolidate] departure
            opt.consolidate_state_dict(to=0)
            torch.save(opt.state_dict(), os.devnull)
    end_of_training()


# --- processes, sockets, the store, threads --------------------------------------------------------


def sigkill_rank(rank: int, world: int, culprit: int) -> None:
    """DDP: the culprit is SIGKILLed in the faulty step, after its forward (as the host's OOM killer would);
    its peers wait in DDP's gradient all-reduce, but not for long: torchrun stops them. Culprit: CULPRIT (default 1)."""
    model = DDP(mlp())
    opt = sgd(model)
    for step, (x, y) in enumerate(batches(rank, WARMUP_STEPS + 2)):
        if step == WARMUP_STEPS:
            ready(rank)
        loss = F.mse_loss(model(x), y)
        if step == WARMUP_STEPS and rank == culprit:
            time.sleep(1)  # let the peers reach the all-reduce
            os.kill(os.getpid(), signal.SIGKILL)  # [sigkill_rank] departure
        loss.backward()
        opt.step()
        opt.zero_grad()
    end_of_training()


def socket_recv(rank: int, world: int, culprit: int) -> None:
    """DDP, with a side channel: rank 0 serves each other rank its data-shard assignment over a TCP socket
    before every step. On the faulty step rank 0 has no new assignment for the culprit and sends nothing,
    so the culprit blocks in `sock.recv` while the others wait in DDP's gradient all-reduce for it.
    Culprit: the rank blocked in recv, CULPRIT (default 1, never 0); what it waits for is rank 0's send."""
    if culprit == 0:
        raise SystemExit("socket_recv: the culprit is a receiver, not rank 0")
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        server = socket.create_server(("127.0.0.1", 0))
        store.set("side_channel/port", str(server.getsockname()[1]))
        peers = {}
        for _ in range(world - 1):
            conn, _ = server.accept()
            peers[int(conn.recv(4).decode())] = conn
    else:
        sock = socket.create_connection(("127.0.0.1", int(store.get("side_channel/port").decode())))
        sock.sendall(f"{rank:04d}".encode())
    model = DDP(mlp())
    opt = sgd(model)
    for step, (x, y) in enumerate(batches(rank, WARMUP_STEPS + 2)):
        if step == WARMUP_STEPS:
            ready(rank)
        if rank == 0:
            for peer, conn in peers.items():
                if not (step == WARMUP_STEPS and peer == culprit):  # [socket_recv] departure
                    conn.sendall(step.to_bytes(8, "little"))
        else:
            shard = int.from_bytes(sock.recv(8), "little")  # [socket_recv] culprit waits
            assert shard == step
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    end_of_training()


def store_get(rank: int, world: int, culprit: int) -> None:
    """DDP, and rank 0 publishes each step's plan in the job's store (the default store) for the others to
    `store.get`. On the faulty step rank 0 thinks the plan unchanged and does not `store.set` it; it goes
    on to the gradient all-reduce, the others wait in `store.get`. Culprit: rank 0 (CULPRIT is ignored)."""
    store = dist.distributed_c10d._get_default_store()
    model = DDP(mlp())
    opt = sgd(model)
    for step, (x, y) in enumerate(on_device(batches(rank, WARMUP_STEPS + 2))):
        if step == WARMUP_STEPS:
            ready(rank)
        if rank == 0:
            plan_changed = step != WARMUP_STEPS
            if plan_changed:  # [store_get] departure
                store.set(f"plan/{step}", f"lr={LR}")
        else:
            store.get(f"plan/{step}")  # [store_get] victim waits
        loss = F.mse_loss(model(x), y)
        loss.backward()  # [store_get] culprit waits
        opt.step()
        opt.zero_grad()
        read_back(loss)
    end_of_training()


class AsyncCheckpointer:
    """Writes checkpoints from a thread of its own; the lock keeps two saves from overlapping."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: queue.Queue = queue.Queue()
        self.states: queue.Queue = queue.Queue()
        threading.Thread(target=self._write, name="ckpt-writer", daemon=True).start()

    def _write(self) -> None:
        while True:
            self.requests.get()
            with self.lock:
                state = self.states.get()  # waits for the main thread, holding the lock
                torch.save(state, os.devnull)

    def save(self, model: nn.Module) -> None:
        self.requests.put(True)  # the writer wakes, takes the lock and waits for the state
        state = {k: v.clone() for k, v in model.state_dict().items()}
        time.sleep(0.5)  # stands in for the copy of a large state to pinned memory
        with self.lock:  # [checkpoint_thread_deadlock] departure
            self.states.put(state)


def checkpoint_thread_deadlock(rank: int, world: int, culprit: int) -> None:
    """DDP, and the culprit (the rank that writes checkpoints) saves through a background writer thread; the
    writer takes the lock and waits for the state, the main thread waits for the lock before it hands the
    state over: a deadlock, so the culprit never reaches the next step's gradient all-reduce, where its
    peers wait. Culprit: CULPRIT (default 1)."""
    model = DDP(mlp())
    opt = sgd(model)
    writer = AsyncCheckpointer() if rank == culprit else None
    for step, (x, y) in enumerate(batches(rank, WARMUP_STEPS + 2)):
        if step == WARMUP_STEPS:
            ready(rank)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if writer is not None and step == WARMUP_STEPS:
            writer.save(model.module)
    end_of_training()


CACHE_LOCK = threading.Lock()


class CachedDataset(torch.utils.data.Dataset):
    def __init__(self, rank: int) -> None:
        self.x, self.y = next(batches(rank, 1))

    def __len__(self) -> int:
        return BATCH

    def __getitem__(self, i: int):
        with CACHE_LOCK:  # inherited locked by a worker forked while another thread held it
            return self.x[i], self.y[i]


def refresh_cache() -> None:
    with CACHE_LOCK:
        time.sleep(3)  # rebuilds the dataset's cache


def dataloader_fork_lock(rank: int, world: int, culprit: int) -> None:
    """DDP with a DataLoader (1 worker, forked anew each epoch): on the faulty epoch the culprit refreshes its
    dataset's cache in a background thread, which holds the cache lock when the DataLoader forks its
    worker; the worker inherits the lock held and blocks in `__getitem__` forever, the culprit's main
    thread waits for the batch, its peers in DDP's gradient all-reduce. Culprit: CULPRIT (default 1)."""
    model = DDP(mlp())
    opt = sgd(model)
    data = CachedDataset(rank)
    for epoch in range(WARMUP_STEPS + 2):
        if epoch == WARMUP_STEPS:
            ready(rank)
            if rank == culprit:  # its cache is stale on this node
                threading.Thread(target=refresh_cache, name="cache-refresh", daemon=True).start()
                time.sleep(0.2)
        loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=1, multiprocessing_context="fork")
        for x, y in loader:  # [dataloader_fork_lock] departure
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    end_of_training()


def new_group_skip(rank: int, world: int, culprit: int) -> None:
    """DDP, and on the faulty step the ranks make a subgroup of every rank but the culprit, which only its
    members call `dist.new_group` for (every rank of the world must: groups are named by a counter every
    rank keeps). Nothing hangs there; right after, every rank makes a group for checkpointing, which the
    culprit numbers one lower than its peers, so its peers and it wait for each other in new_group's
    rendezvous in the store under two names. Culprit: CULPRIT (default 1); run it on 3 ranks."""
    model = DDP(mlp())
    opt = sgd(model)
    members = [r for r in range(world) if r != culprit]
    for step, (x, y) in enumerate(batches(rank, WARMUP_STEPS + 2)):
        if step == WARMUP_STEPS:
            ready(rank)
            if rank in members:  # [new_group_skip] departure
                dist.new_group(members)
            dist.new_group(list(range(world)))  # [new_group_skip] culprit waits
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    end_of_training()


# --- the cases ----------------------------------------------------------------------------------------

# name -> (function, ranks, culprits: None for CULPRIT, a list, or "all but 0")
CASES = {
    "ddp_skip_backward": (ddp_skip_backward, 2, None),
    "ddp_uneven_inputs": (ddp_uneven_inputs, 2, None),
    "gpu_wedged": (gpu_wedged, 2, None),
    "rank0_barrier": (rank0_barrier, 2, [0]),
    "fsdp2_skip_block": (fsdp2_skip_block, 2, None),
    "pipeline_skip_send": (pipeline_skip_send, 2, [1]),
    "dtensor_mesh_skip": (dtensor_mesh_skip, 4, None),
    "all_gather_object_skip": (all_gather_object_skip, 2, None),
    "dcp_save_skip": (dcp_save_skip, 2, None),
    "zero_consolidate": (zero_consolidate, 2, "all but 0"),
    "sigkill_rank": (sigkill_rank, 2, None),
    "socket_recv": (socket_recv, 2, None),
    "store_get": (store_get, 2, [0]),
    "checkpoint_thread_deadlock": (checkpoint_thread_deadlock, 2, None),
    "dataloader_fork_lock": (dataloader_fork_lock, 2, None),
    "new_group_skip": (new_group_skip, 3, None),
}


def main() -> None:
    case = os.environ.get("CASE", "")
    if case not in CASES:
        raise SystemExit(f"CASE={case!r} is not one of {', '.join(CASES)}")
    culprit = env_int("CULPRIT", 1)
    exit_when_orphaned()
    timeout = timedelta(seconds=env_int("HANG_TIMEOUT_S", 600))
    if BACKEND != "nccl" and case in NCCL_ONLY:
        raise SystemExit(f"CASE={case} runs on NCCL only (BACKEND=nccl)")
    if BACKEND == "nccl":
        if case not in NCCL_CASES:
            raise SystemExit(f"CASE={case} runs on gloo only (BACKEND=nccl: {', '.join(NCCL_CASES)})")
        if int(os.environ.get("LOCAL_RANK", "0")) >= torch.cuda.device_count():
            os.environ["NCCL_HOSTID"] = f"api-hangs-rank-{os.environ['RANK']}"  # a GPU shared: another host
        torch.cuda.set_device(device())
    dist.init_process_group(BACKEND, timeout=timeout)
    CASES[case][0](dist.get_rank(), dist.get_world_size(), culprit)


if __name__ == "__main__":
    main()
