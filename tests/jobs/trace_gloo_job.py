"""A 2-rank CPU job (gloo) profiled with torch.profiler; rank SLOW_RANK is a straggler on purpose.

Run: OUTDIR=tests/fixtures/traces/gloo_cpu torchrun --nproc_per_node 2 tests/jobs/trace_gloo_job.py
Each step: a `data` range (SLOW_RANK sleeps 40 ms in it), a `forward_backward` range, a `grad_sync`
range with one all_reduce per parameter. Traces: OUTDIR/trace_rank{rank}.json.gz, 5 active steps.
"""

import os
import time

import torch
import torch.distributed as dist

SLOW_RANK = int(os.environ.get("SLOW_RANK", "1"))
SLEEP_S = float(os.environ.get("SLEEP_S", "0.04"))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = os.environ.get("OUTDIR", ".")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 256)
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=5, repeat=1)

    def ready(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(f"{out}/trace_rank{rank}.json.gz")

    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule, on_trace_ready=ready, record_shapes=True
    ) as prof:
        for _ in range(8):
            with torch.profiler.record_function("data"):
                if rank == SLOW_RANK:
                    time.sleep(SLEEP_S)  # this rank's input pipeline is slow
                batch = x + 0.0
            with torch.profiler.record_function("forward_backward"):
                loss = model(batch).pow(2).mean()
                loss.backward()
            with torch.profiler.record_function("grad_sync"):
                for p in model.parameters():
                    dist.all_reduce(p.grad)
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
