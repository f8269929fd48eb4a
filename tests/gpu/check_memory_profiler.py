"""GPU check of the memory and profiler helpers and the guard on NCCL; run on a 2-GPU machine:

    OUT=${OUT:-/tmp/tt-gpu} torchrun --standalone --nproc_per_node 2 tests/gpu/check_memory_profiler.py

Writes snapshots, traces and a log into $OUT and prints one `PASS <check> rank=R ...` or
`FAIL <check> rank=R ...` line per check and rank; exits 1 if any check failed on this rank.
Keep $OUT: the files are fixtures (snapshot-rank0N.pickle, oom-*.pickle, trace-rank0N.trace.json.gz).
"""

import datetime
import gzip
import json
import logging
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import torchtriage
from torchtriage.sources.safe_pickle import safe_load_file

OUT = Path(os.environ.get("OUT", "/tmp/tt-gpu"))
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
failures = 0


def check(name: str, ok: bool, detail: str = "") -> None:
    global failures
    failures += not ok
    print(f"{'PASS' if ok else 'FAIL'} {name} rank={rank} {detail}".rstrip(), flush=True)


dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dev = torch.device("cuda")
torch.manual_seed(0)


def model():
    return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)


def sync_grads(m):
    for p in m.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


# 1. memory history -> snapshot per rank, loadable by the safe unpickler (what `torchtriage memory` uses)
m = model()
with torchtriage.cuda_memory_history(OUT / "memory", ranks="all") as snap:
    for _ in range(3):
        m(torch.randn(64, 1024, device=dev)).sum().backward()
try:
    data = safe_load_file(str(snap))
    check("memory_history_snapshot", bool(data.get("segments")) and "device_traces" in data, str(snap))
except Exception as err:  # noqa: BLE001
    check("memory_history_snapshot", False, f"{snap}: {type(err).__name__}: {err}")

# 2. log_cuda_memory
stats = torchtriage.log_cuda_memory("after history")
check(
    "log_cuda_memory",
    stats.get("allocated_gib", 0) > 0 and stats["max_allocated_gib"] >= stats["allocated_gib"],
    json.dumps(stats),
)

# 3. profiler: traces on every rank, with CUDA kernels, NCCL collectives, phases and a memory snapshot
opt = torch.optim.AdamW(m.parameters(), 1e-4)
with torchtriage.profile_steps(OUT / "profiler", wait=1, warmup=1, active=3, ranks="all", memory_snapshot=True) as prof:
    for _ in range(7):
        with torchtriage.phase("data"):
            x = torch.randn(64, 1024, device=dev)
        with torchtriage.phase("forward_backward"):
            m(x).sum().backward()
        with torchtriage.phase("grad_sync"):
            sync_grads(m)
        opt.step()
        opt.zero_grad()
        prof.step()
torch.cuda.synchronize()
trace = OUT / "profiler" / f"trace-rank{rank:02d}.trace.json.gz"
try:
    names = {e.get("name", "") for e in json.load(gzip.open(trace, "rt"))["traceEvents"]}
    ok = {"data", "forward_backward", "grad_sync"} <= names and any(n.startswith("ProfilerStep#") for n in names)
    check("profiler_trace", ok and any("nccl" in n.lower() for n in names), str(trace))
except Exception as err:  # noqa: BLE001
    check("profiler_trace", False, f"{trace}: {type(err).__name__}: {err}")
mem = OUT / "profiler" / f"mem-trace-rank{rank:02d}.pickle"
check("profiler_memory_snapshot", mem.exists() and mem.stat().st_size > 0, str(mem))

# 4. guard on NCCL with bf16: an inf on rank 1 only -> both ranks skip, weights identical
mb = model().to(torch.bfloat16)
opt = torch.optim.SGD(mb.parameters(), lr=1e-3)
guard = torchtriage.NonFiniteGuard(opt, max_grad_norm=1.0)
applied = []
for step in range(1, 5):
    mb(torch.randn(16, 1024, device=dev, dtype=torch.bfloat16)).float().pow(2).mean().backward()
    sync_grads(mb)
    if rank == 1 and step == 2:
        next(mb.parameters()).grad[0, 0] = float("inf")
    applied.append(guard.step(batch_index=step).applied)
    opt.zero_grad()
digest = torch.cat([p.detach().float().flatten() for p in mb.parameters()]).sum()
both = [torch.zeros_like(digest) for _ in range(2)]
dist.all_gather(both, digest)
check(
    "guard_nccl_bf16",
    applied == [True, False, True, True] and guard.nonfinite_steps_skipped == 1 and torch.equal(both[0], both[1]),
    f"applied={applied}",
)

# 5. OOM attribution on rank 1 with history on: the line, and a snapshot at the OOM
dist.barrier()
if rank == 1:
    keep = []
    caught = None
    with torchtriage.cuda_memory_history(OUT / "memory", ranks="1", label="oomcase"):
        try:
            with torchtriage.oom_attribution():
                while True:
                    keep.append(torch.empty(8 * 2**30, dtype=torch.uint8, device=dev))
        except torch.OutOfMemoryError as err:
            caught = err
            keep.clear()
    check("oom_attribution_line", caught is not None and getattr(caught, "_torchtriage_reported", False))
    oom_snap = OUT / "memory" / "oom-oomcase-rank01.pickle"
    check("oom_snapshot", oom_snap.exists() and oom_snap.stat().st_size > 0, str(oom_snap))
    check("memory_margin_warning", torchtriage.check_memory_margin())
    torch.cuda.empty_cache()
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if failures else 0)
