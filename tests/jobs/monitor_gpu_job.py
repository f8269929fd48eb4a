"""Job: a GPT-style model trained with DDP under the step monitor, one rank made slow in one way.

Meant for 2 ranks sharing one GPU (NCCL; each rank its own NCCL_HOSTID, so that NCCL accepts two ranks on
one device and joins them through its network transport), and runnable on CPU + gloo (DEVICE=cpu) to check
the job itself. The monitor is the one `torchtriage run --monitor` injects (or, with MONITOR_IN=code, a
StepMonitor started here with `step_on="optimizer"`, as `run` would).

MONITOR_CASE (the cases and what each must be decided as: `monitor_gpu_cases.py`), on rank 1 from the
first step:
  data      its batches take SLOW_MS longer (the collate function sleeps: a slow disk or decode)
  compute   it runs its forward twice (the first without autograd): more device work, not more launches
            than a second forward's
  launch    its host busy-waits SLOW_MS per forward, spread between the blocks' launches: the CPU side of
            its forward is slower, the device's work is the same
  even      nothing: every rank alike
  loss10    as `data`, in a loop that reads its loss every tenth step only (the others read it every step)

The batch comes from a DataLoader (pinned memory, copied with non_blocking): the host waits for its device
only where it reads the loss. STEPS steps; sizes from LAYERS, WIDTH, SEQ, BATCH, VOCAB. Every rank writes
`DONE {...}` with its monitor's decisions to $MONITOR_OUT/rank<r>.jsonl.
"""

import json
import os
import time

import _common as C
import torch
import torch.distributed as dist
from monitor_gpu_cases import EXPECTED, SLOW_RANK

CASE = os.environ.get("MONITOR_CASE", "even")
STEPS = C.env_int("STEPS", 100)
SLOW_MS = C.env_int("SLOW_MS", 30)
LAYERS = C.env_int("LAYERS", 6)
WIDTH = C.env_int("WIDTH", 768)
SEQ = C.env_int("SEQ", 1024)
BATCH = C.env_int("BATCH", 16)
VOCAB = C.env_int("VOCAB", 8192)
DEVICE = os.environ.get("DEVICE", "cuda")


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 10**6

    def __getitem__(self, index):
        return torch.randint(0, VOCAB, (SEQ + 1,), generator=torch.Generator().manual_seed(index))


class Collate:
    """Stacks a batch; on the slow rank of a data case, SLOW_MS later (a slow read, in the loader's call)."""

    def __init__(self, slow: bool):
        self.slow = slow

    def __call__(self, samples):
        if self.slow:
            time.sleep(SLOW_MS / 1000)
        return torch.stack(samples)


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.position = torch.nn.Parameter(torch.zeros(SEQ, WIDTH))
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(WIDTH, WIDTH // 64, 4 * WIDTH, 0.0, batch_first=True, norm_first=True)
            for _ in range(LAYERS)
        )
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.register_buffer("causal", torch.nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, tokens):
        h = self.embed(tokens) + self.position
        for block in self.blocks:
            h = block(h, src_mask=self.causal, is_causal=True)
        return self.head(h)


def slow_launches(model: GPT) -> None:
    """Busy-waits SLOW_MS per forward on the host, a share before each block: the CPU between launches."""
    share = SLOW_MS / 1000 / len(model.blocks)

    def hold(module, args):
        ends = time.perf_counter() + share
        while time.perf_counter() < ends:
            pass

    for block in model.blocks:
        block.register_forward_pre_hook(hold)


def main() -> None:
    if CASE not in EXPECTED:
        raise SystemExit(f"MONITOR_CASE={CASE!r}: one of {', '.join(EXPECTED)}")
    rank = int(os.environ["RANK"])
    cuda = DEVICE == "cuda"
    if cuda:
        # Two ranks on one device: NCCL refuses ranks of one host on one GPU, and takes them as two hosts.
        os.environ.setdefault("NCCL_HOSTID", f"host{rank}")
        torch.cuda.set_device(int(os.environ.get("CUDA_DEVICE", "0")))
        dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        C.init(timeout_s=120)
        device = torch.device("cpu")
    world = dist.get_world_size()
    slow = rank == SLOW_RANK
    torch.manual_seed(0)
    net = GPT().to(device)
    if slow and CASE == "launch":
        slow_launches(net)
    model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[device.index] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    sampler = torch.utils.data.DistributedSampler(Tokens(), num_replicas=world, rank=rank, shuffle=False)
    loader = torch.utils.data.DataLoader(
        Tokens(),
        batch_size=BATCH,
        sampler=sampler,
        pin_memory=cuda,
        collate_fn=Collate(slow and CASE in ("data", "loss10")),
    )
    monitor = None
    if os.environ.get("MONITOR_IN") == "code":
        from torchtriage import StepMonitor

        monitor = StepMonitor(os.environ["MONITOR_OUT"], window=C.env_int("WINDOW", 10), step_on="optimizer").start()
    read_every = 10 if CASE == "loss10" else 1
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    began = time.perf_counter()
    for step, batch in enumerate(loader, start=1):
        batch = batch.to(device, non_blocking=True)
        inputs, targets = batch[:, :-1], batch[:, 1:]
        opt.zero_grad(set_to_none=True)
        with autocast:
            if slow and CASE == "compute":
                with torch.no_grad():
                    net(inputs)  # the forward twice: the device's work of one more forward
            logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        opt.step()
        if step % read_every == 0:
            value = loss.item()
            if rank == 0 and step % 10 == 0:
                print(
                    f"step {step} loss {value:.4f} {(time.perf_counter() - began) / step * 1000:.1f} ms/step",
                    flush=True,
                )
        if step >= STEPS:
            break
    from torchtriage.runtime import monitor as injected

    running = monitor or (injected._ACTIVE[0] if injected._ACTIVE else None)
    if running is not None:
        running.close()
    decisions = running.decisions if running is not None else None
    with open(os.path.join(os.environ["MONITOR_OUT"], f"rank{rank}.jsonl"), "a") as out:
        out.write("DONE " + json.dumps({"rank": rank, "case": CASE, "decisions": decisions}) + "\n")
    C.finish()


if __name__ == "__main__":
    C.exit_when_orphaned()
    main()
