"""The step monitor's CUDA path on one GPU: the device's forward time from CUDA events, read late.

Run on a machine with a GPU, from the repository root:
    PYTHONPATH=src torchrun --standalone --nproc_per_node 1 tests/gpu/check_monitor.py OUT_DIR
Prints one PASS/FAIL line per check; exits 1 if any failed.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from torchtriage import StepMonitor

failed = []


def check(name, ok, detail=""):
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}", flush=True)
    if not ok:
        failed.append(name)


out = Path(sys.argv[1])
dist.init_process_group("nccl")
torch.cuda.set_device(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(8)]).cuda(), device_ids=[0]
)
opt = torch.optim.SGD(model.parameters(), lr=1e-6)
x = torch.randn(4096, 8192, device="cuda")
monitor = StepMonitor(out, window=10, tokens_per_step=4096, model=model, peak_flops=989e12).start()
for _ in range(30):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    monitor.step()
monitor.close()
torch.cuda.synchronize()
windows = [json.loads(line) for line in (out / "monitor" / "steps-rank0.jsonl").read_text().splitlines()]
last = windows[-1]
check("three_windows", len(windows) == 3, [(w["first_step"], w["last_step"]) for w in windows])
check("gpu_forward_from_events", last["gpu_forward_ms"] is not None and last["gpu_forward_ms"] > 0, last)
# The CPU only launches the forward (asynchronous): the device's time for it is longer.
check("cpu_launches_while_the_device_computes", last["gpu_forward_ms"] > last["forward_ms"], last)
check(
    "gpu_step_holds_the_forward", last["gpu_step_ms"] is not None and last["gpu_step_ms"] > last["gpu_forward_ms"], last
)
check("mfu_from_six_times_parameters", last["mfu"] is not None and 0 < last["mfu"] < 1, last["mfu"])
check("peak_memory", last.get("peak_allocated_gib", 0) > 1, last.get("peak_allocated_gib"))
print(json.dumps(last), flush=True)
dist.destroy_process_group()
sys.exit(1 if failed else 0)
