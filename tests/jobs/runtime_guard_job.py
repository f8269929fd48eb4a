"""Job: NonFiniteGuard under torchrun + gloo. GUARD_MODE picks the scenario; every rank prints JSON lines.

Lines (also appended to $GUARD_OUT/rank<r>.jsonl when GUARD_OUT is set): `STEP {...}` after each
guarded step (rank, step, applied, skipped, grad_norm, weights digest,
whether the weights changed), `RAISED {...}` when the guard raised, `DONE {...}` at the end.

Modes:
  inject_inf    rank 1's gradient gets an inf after the all-reduce at step 3 (one rank only)
  inject_nan    the same with a NaN (a MAX reduction may drop a NaN: gloo's keeps the first rank's value)
  nonblocking   inject_nan with NonFiniteGuard(blocking=False) and a fused SGD: skipped on the device
  consecutive   rank 1's gradient is inf at every step from step 2; max_consecutive_nonfinite_steps=3
  bad_weights   rank 1's weight becomes nan after step 2's update (its gradients stay finite)
  scaler        GradScaler("cpu"); rank 1's (scaled) gradient gets an inf at step 3
  clip          max_grad_norm=0.01
  dtensor       gradients sharded as DTensors (Shard(0)) over a 1-D mesh; rank 1's shard gets an inf at step 3
  pipeline      two stages: each rank owns a different layer; pipeline_group is the world
"""

import hashlib
import json
import math
import os

import _common as C
import torch
import torch.distributed as dist

from torchtriage import NonFiniteGuard, NonFiniteStepsError

MODE = os.environ["GUARD_MODE"]
STEPS = C.env_int("STEPS", 5)


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        local = p.detach().to_local() if hasattr(p, "to_local") else p.detach()
        h.update(repr(local.flatten().tolist()).encode())  # numpy may be absent: exact floats via repr
    return h.hexdigest()[:16]


def emit(kind: str, **fields) -> None:
    line = f"{kind} {json.dumps(fields, sort_keys=True)}"
    print(line, flush=True)
    if os.environ.get("GUARD_OUT"):  # one file per rank: the ranks' stdout lines can interleave
        with open(os.path.join(os.environ["GUARD_OUT"], f"rank{fields['rank']}.jsonl"), "a") as out:
            out.write(line + "\n")


def main() -> None:
    rank, world = C.init(timeout_s=30)
    if MODE == "dtensor":
        return dtensor_mode(rank, world)
    if MODE == "pipeline":
        return pipeline_mode(rank, world)
    model, opt = C.make_model(lr=0.05)
    if MODE == "nonblocking":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1000) if MODE == "scaler" else None
    applied_by_optimizer = []
    opt.register_step_post_hook(lambda *_: applied_by_optimizer.append(1))
    guard = NonFiniteGuard(
        opt,
        scaler=scaler,
        max_grad_norm=0.01 if MODE == "clip" else None,
        max_consecutive_nonfinite_steps=3,
        check_weights_every=1 if MODE == "bad_weights" else 100,
        blocking=MODE != "nonblocking",
    )
    try:
        for step, (x, y) in enumerate(C.batches(rank, STEPS), start=1):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            (scaler.scale(loss) if scaler is not None else loss).backward()
            C.all_reduce_grads(model, world)
            if rank == 1 and (
                (MODE in ("inject_inf", "inject_nan", "nonblocking", "scaler") and step == 3)
                or (MODE == "consecutive" and step >= 2)
            ):
                model.weight.grad[0, 0] = float("nan") if MODE in ("inject_nan", "nonblocking") else float("inf")
            grad_norm_before = math.sqrt(sum(float(p.grad.float().pow(2).sum()) for p in model.parameters()))
            before = digest(model)
            outcome = guard.step(
                loss=loss, batch_index=step - 1, sample_ids=[rank * 1000 + step, rank * 1000 + step + 1]
            )
            clipped_norm = None
            if MODE == "clip":
                clipped_norm = math.sqrt(sum(float(p.grad.float().pow(2).sum()) for p in model.parameters()))
            emit(
                "STEP",
                rank=rank,
                step=step,
                applied=outcome.applied,
                skipped=guard.nonfinite_steps_skipped,
                grad_norm=None if math.isnan(outcome.grad_norm) else outcome.grad_norm,
                local_norm_before=grad_norm_before if math.isfinite(grad_norm_before) else None,
                clipped_norm=clipped_norm,
                changed=digest(model) != before,
                digest=digest(model),
                grads_zeroed=all(p.grad is None or not p.grad.any() for p in model.parameters()),
                scale=None if scaler is None else scaler.get_scale(),
                optimizer_steps=len(applied_by_optimizer),
                window=guard.log_window(),
            )
            if MODE == "bad_weights" and rank == 1 and step == 2:
                with torch.no_grad():
                    model.weight[0, 0] = float("nan")
    except NonFiniteStepsError as err:
        emit("RAISED", rank=rank, step=guard.step_count, message=str(err))
    emit(
        "DONE",
        rank=rank,
        skipped=guard.nonfinite_steps_skipped,
        records=[
            {"step": r.step, "culprits": r.culprit_ranks, "ranks": {str(k): v for k, v in r.ranks.items()}}
            for r in guard.skipped_batches
        ],
    )
    C.finish()


def dtensor_mode(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    full_w = torch.randn(8, 4)
    param = torch.nn.Parameter(distribute_tensor(full_w, mesh, [Shard(0)]))
    opt = torch.optim.SGD([param], lr=0.1)
    guard = NonFiniteGuard(opt, max_consecutive_nonfinite_steps=3)
    for step in range(1, 5):
        gen = torch.Generator().manual_seed(step)  # the same full gradient on every rank
        full_grad = torch.randn(8, 4, generator=gen)
        param.grad = distribute_tensor(full_grad, mesh, [Shard(0)])
        if rank == 1 and step == 3:
            param.grad.to_local()[0, 0] = float("inf")
        before = param.detach().to_local().clone()
        outcome = guard.step(batch_index=step)
        emit(
            "STEP",
            rank=rank,
            step=step,
            applied=outcome.applied,
            skipped=guard.nonfinite_steps_skipped,
            grad_norm=None if math.isnan(outcome.grad_norm) else outcome.grad_norm,
            expected_norm=float(full_grad.norm()),
            changed=not torch.equal(before, param.detach().to_local()),
        )
        opt.zero_grad()
    emit("DONE", rank=rank, skipped=guard.nonfinite_steps_skipped)
    C.finish()


def pipeline_mode(rank: int, world: int) -> None:
    # Each rank is a stage holding a different layer: the global norm adds the stages' sums of squares.
    torch.manual_seed(rank)
    layer = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    guard = NonFiniteGuard(opt, pipeline_group=dist.group.WORLD)
    layer(torch.randn(3, 4, generator=torch.Generator().manual_seed(10 + rank))).pow(2).sum().backward()
    local_sq = sum(float(p.grad.pow(2).sum()) for p in layer.parameters())
    all_sq = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(all_sq, torch.tensor([local_sq], dtype=torch.float64))
    all_sq = [float(t) for t in all_sq]
    outcome = guard.step()
    emit(
        "STEP",
        rank=rank,
        step=1,
        applied=outcome.applied,
        grad_norm=outcome.grad_norm,
        expected_norm=math.sqrt(sum(all_sq)),
        local_norm=math.sqrt(local_sq),
    )
    emit("DONE", rank=rank, skipped=guard.nonfinite_steps_skipped)
    C.finish()


if __name__ == "__main__":
    main()
