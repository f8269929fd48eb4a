"""Job: DDP training on CPU + gloo with the step monitor, one rank made slow in one way.

MONITOR_MODE picks the slowdown, on rank SLOW_RANK from step SLOW_FROM on:
  data      its dataset takes SLOW_MS longer to read each sample batch
  compute   its forward does SLOW_MS of extra matrix products
  comm      every rank's gradient all-reduce takes SLOW_MS longer (a DDP communication hook that
            waits before it all-reduces: a slower link, the same for all)
  even      nothing: every rank alike
MONITOR_IN: "code" (StepMonitor in the loop, monitor.step() per step) or "run" (no monitor in the
code: `torchtriage run --monitor` injects it). STEPS steps, WINDOW steps per window; the run folder
is $MONITOR_OUT. Every rank writes `DONE {...}` with its monitor's decisions to $MONITOR_OUT/rank<r>.jsonl.
"""

import json
import os
import time

import _common as C
import torch
import torch.distributed as dist

MODE = os.environ.get("MONITOR_MODE", "even")
WHERE = os.environ.get("MONITOR_IN", "code")
STEPS = C.env_int("STEPS", 60)
WINDOW = C.env_int("WINDOW", 10)
SLOW_RANK = C.env_int("SLOW_RANK", 1)
SLOW_FROM = C.env_int("SLOW_FROM", 1)
SLOW_MS = C.env_int("SLOW_MS", 40)
BATCH = 16
FEATURES = 64


class Samples(torch.utils.data.Dataset):
    def __init__(self, rank: int):
        self.rank = rank
        self.reads = 0

    def __len__(self):
        return 10**6

    def __getitem__(self, index):
        return torch.randn(FEATURES, generator=torch.Generator().manual_seed(index)), torch.tensor([index % 7.0])


class SlowBatches:
    """Wraps the batches of one rank's loader: each batch costs SLOW_MS more from SLOW_FROM on."""

    def __init__(self, dataset, rank):
        self.dataset, self.rank, self.batches = dataset, rank, 0

    def __call__(self, samples):
        self.batches += 1
        if MODE == "data" and self.rank == SLOW_RANK and self.batches >= SLOW_FROM:
            time.sleep(SLOW_MS / 1000)  # a slow disk or a slow decode
        return torch.utils.data.default_collate(samples)


class Net(torch.nn.Module):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank
        self.steps = 0
        self.body = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU()
        )
        self.head = torch.nn.Linear(256, 1)
        self.extra = torch.randn(256, 256)

    def forward(self, x):
        self.steps += 1
        h = self.body(x)
        if MODE == "compute" and self.rank == SLOW_RANK and self.steps >= SLOW_FROM:
            ends = time.perf_counter() + SLOW_MS / 1000
            while time.perf_counter() < ends:  # extra work in this rank's forward only
                h = torch.tanh(h @ self.extra) + h
        return self.head(h)


def slow_link(state, bucket):
    """DDP's all-reduce of one bucket, SLOW_MS later from step SLOW_FROM on (one bucket per step here)."""
    state["calls"] += 1
    if state["calls"] >= SLOW_FROM:
        time.sleep(SLOW_MS / 1000)
    tensor = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])


def main() -> None:
    rank, world = C.init(timeout_s=60)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Net(rank))
    if MODE == "comm":
        model.register_comm_hook(state={"calls": 0}, hook=slow_link)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    dataset = Samples(rank)
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=BATCH, sampler=sampler, collate_fn=SlowBatches(dataset, rank)
    )
    monitor = None
    if WHERE == "code":
        from torchtriage import StepMonitor

        monitor = StepMonitor(os.environ["MONITOR_OUT"], window=WINDOW, samples_per_step=BATCH).start()
    for step, (x, y) in enumerate(loader, start=1):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if monitor is not None:
            monitor.step()
        if step >= STEPS:
            break
    if monitor is not None:
        monitor.close()
        decisions = monitor.decisions
    else:
        from torchtriage.runtime import monitor as injected

        running = injected._ACTIVE[0] if injected._ACTIVE else None
        if running is not None:
            running.close()
        decisions = running.decisions if running is not None else None
    with open(os.path.join(os.environ["MONITOR_OUT"], f"rank{rank}.jsonl"), "a") as out:
        out.write("DONE " + json.dumps({"rank": rank, "decisions": decisions}) + "\n")
    dist.barrier()
    C.finish()


if __name__ == "__main__":
    C.exit_when_orphaned()
    main()
