"""Job: where a non-finite value was born, under torchrun + gloo, with NonFiniteGuard(locate=True).

A small residual MLP ("layers.N" blocks, each fc → act → proj; the first normalises its input, an
RMS-style norm without an epsilon) trains on a sharded dataset of
numbered samples. WRAP picks how the model is distributed; FAULTS lists "step:fault" pairs, each
injected on its step only (FAULT_RANK picks the rank for one-rank faults):

  exp_sample    one sample of FAULT_RANK's shard is scaled by 300: layers.2.act (exp) overflows
  zero_sample   one sample of FAULT_RANK's shard is all zeros: layers.0.norm divides 0 by 0
  log_loss      one sample's target makes the likelihood loss take log(0) (a loss module outside the model)
  fp16          every rank's forward runs under fp16 autocast, layers.2.fc scaled by 10: exp overflows fp16
  bf16          every rank's forward runs under bf16 autocast, layers.2.fc scaled by 100: exp overflows bf16
  grad_inf      FAULT_RANK's layers.1.fc.weight gradient gets an inf after the backward: nothing to reproduce
  weight_nan    FAULT_RANK's layers.1.fc.weight becomes nan before the forward (one replica only)

WRAP: ddp | fsdp2 | ddp_checkpoint | ddp_compile. Rank 0 writes nonfinite.jsonl to $GUARD_OUT
(report_dir), or with REPORT_DIR=default to the guard's default (the run folder under `torchtriage
run`); every rank writes `SKIP {...}` per skipped step and `DONE {...}` at the end to $GUARD_OUT.
"""

import json
import os

import _common as C
import torch

from torchtriage import NonFiniteGuard, NonFiniteStepsError

WRAP = os.environ.get("WRAP", "ddp")
FAULTS = dict(
    (int(step), fault) for step, fault in (item.split(":") for item in os.environ["FAULTS"].split(",") if item)
)
FAULT_RANK = C.env_int("FAULT_RANK", 1)
STEPS = C.env_int("STEPS", max(FAULTS) + 1)
FEATURES = 16
BATCH = 8
BAD_POSITION = 5  # where in its batch the bad sample sits


class Normalize(torch.nn.Module):
    def forward(self, x):
        return x / x.norm(dim=-1, keepdim=True)


class Exp(torch.nn.Module):
    def forward(self, x):
        return torch.exp(x)


class Block(torch.nn.Module):
    def __init__(self, act: torch.nn.Module, normalize: bool = False):
        super().__init__()
        self.norm = Normalize() if normalize else torch.nn.Identity()
        self.fc = torch.nn.Linear(FEATURES, FEATURES)
        self.act = act
        self.proj = torch.nn.Linear(FEATURES, FEATURES)

    def forward(self, x):
        return x + self.proj(self.act(self.fc(self.norm(x))))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [Block(torch.nn.Tanh(), normalize=True), Block(torch.nn.Tanh()), Block(Exp())]
        )
        self.head = torch.nn.Linear(FEATURES, 1)
        self.checkpoint = False

    def forward(self, x):
        for layer in self.layers:
            if self.checkpoint:
                x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        return self.head(x)


class LikelihoodLoss(torch.nn.Module):
    """A Poisson-like negative log-likelihood: softplus keeps the rate positive, until it underflows."""

    def forward(self, output, target):
        rate = torch.nn.functional.softplus(output + target)
        return (rate - torch.log(rate)).mean()


def sample_ids(rank: int, world: int, step: int) -> list[int]:
    first = (step * world + rank) * BATCH
    return list(range(first, first + BATCH))


def batch(rank: int, world: int, step: int, fault: str | None):
    ids = sample_ids(rank, world, step)
    gen = torch.Generator().manual_seed(ids[0])
    x = torch.randn(BATCH, FEATURES, generator=gen)
    target = torch.zeros(BATCH, 1)
    if rank == FAULT_RANK and fault == "exp_sample":
        x[BAD_POSITION] = x[BAD_POSITION] * 300.0  # the residual stream keeps its scale: layers.2.act overflows
    if rank == FAULT_RANK and fault == "zero_sample":
        x[BAD_POSITION] = 0.0
    if rank == FAULT_RANK and fault == "log_loss":
        target[BAD_POSITION] = -1000.0  # softplus(-1000) is exactly 0 in fp32
    return x, target, ids


def make(rank: int, world: int):
    torch.manual_seed(0)
    net = Net()
    model = net
    if WRAP in ("ddp", "ddp_checkpoint", "ddp_compile"):
        net.checkpoint = WRAP == "ddp_checkpoint"
        model = torch.nn.parallel.DistributedDataParallel(net)
        if WRAP == "ddp_compile":
            model = torch.compile(model, backend="aot_eager")
    elif WRAP == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in net.layers:
            fully_shard(layer)
        fully_shard(net)
    return net, model


def emit(kind: str, **fields) -> None:
    line = f"{kind} {json.dumps(fields, sort_keys=True, default=repr)}"
    print(line, flush=True)
    with open(os.path.join(os.environ["GUARD_OUT"], f"rank{fields['rank']}.jsonl"), "a") as out:
        out.write(line + "\n")


def main() -> None:
    rank, world = C.init(timeout_s=60)
    net, model = make(rank, world)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    report_dir = None if os.environ.get("REPORT_DIR") == "default" else os.environ["GUARD_OUT"]
    guard = NonFiniteGuard(opt, model=model, locate=True, report_dir=report_dir, watch="blocks")
    loss_fn = LikelihoodLoss()
    try:
        for step in range(1, STEPS + 1):
            fault = FAULTS.get(step)
            x, target, ids = batch(rank, world, step, fault)
            if fault == "weight_nan" and rank == FAULT_RANK:
                with torch.no_grad():
                    weight = net.layers[1].fc.weight
                    (weight.to_local() if hasattr(weight, "to_local") else weight)[0, 0] = float("nan")
            fp16_saved = None
            if fault in ("fp16", "bf16"):
                fp16_saved = net.layers[2].fc.weight.detach().clone()
                with torch.no_grad():
                    net.layers[2].fc.weight.mul_(10.0 if fault == "fp16" else 100.0)

            def forward_loss(x=x, target=target, fault=fault):
                dtype = torch.bfloat16 if fault == "bf16" else torch.float16
                with torch.autocast("cpu", dtype=dtype, enabled=fault in ("fp16", "bf16")):
                    return loss_fn(model(x).float(), target)

            opt.zero_grad()
            loss = forward_loss()
            loss.backward()
            if fault == "grad_inf" and rank == FAULT_RANK:
                grad = net.layers[1].fc.weight.grad
                (grad.to_local() if hasattr(grad, "to_local") else grad).view(-1)[0] = float("inf")
            outcome = guard.step(loss=loss, batch_index=step, sample_ids=ids, replay=forward_loss)
            if fp16_saved is not None:
                with torch.no_grad():
                    net.layers[2].fc.weight.copy_(fp16_saved)
            if not outcome.applied:
                record = guard.skipped_batches[-1]
                emit("SKIP", rank=rank, step=step, fault=fault, suspect=record.suspect, evidence=record.evidence)
    except NonFiniteStepsError as err:
        emit("RAISED", rank=rank, step=guard.step_count, message=str(err))
    emit("DONE", rank=rank, skipped=guard.nonfinite_steps_skipped)
    C.finish()


if __name__ == "__main__":
    C.exit_when_orphaned()
    main()
