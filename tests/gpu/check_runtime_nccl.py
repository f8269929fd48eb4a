"""Runtime helpers on NCCL (2 GPUs): init_distributed, assert_rank_uniform, check_collectives.

Run on a machine with 2 GPUs, from the repository root:
    DIST_NCCL_TIMEOUT_MINUTES=2 PYTHONPATH=src torchrun --standalone --nproc_per_node 2 tests/gpu/check_runtime_nccl.py
Prints one PASS/FAIL line per check and rank; exits 1 if any check failed on this rank.
"""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from torchtriage import CollectiveMismatchError, assert_rank_uniform, check_collectives, init_distributed
from torchtriage.runtime.setup import process_group_timeout

failed = []


def check(name, ok, detail=""):
    print(f"{'PASS' if ok else 'FAIL'} {name} rank={dist.get_rank()} {detail}", flush=True)
    if not ok:
        failed.append(name)


info = init_distributed()
rank = dist.get_rank()
torch.cuda.set_device(rank)
check("backend_nccl", dist.get_backend() == "nccl", dist.get_backend())
check("timeout_from_env", process_group_timeout() == timedelta(minutes=2), str(process_group_timeout()))
sub = dist.new_group([0, 1])
check("subgroup_inherits_timeout", process_group_timeout(sub) == timedelta(minutes=2), str(process_group_timeout(sub)))

same = torch.ones(8, 4096, dtype=torch.bfloat16, device="cuda")
check("uniform_bf16_cuda", assert_rank_uniform(same, label="same", strict=False) is True)
diverged = torch.ones(8, 4096 - rank, dtype=torch.bfloat16, device="cuda")
check("divergent_shape_reported_on_every_rank", assert_rank_uniform(diverged, label="diverged", strict=False) is False)

x = torch.ones(4096 * (1 + rank), device="cuda")  # rank 1 all_reduces twice the size
try:
    with check_collectives():
        dist.all_reduce(x)
    check("size_mismatch_caught_before_nccl_hangs", False, "no error")
except CollectiveMismatchError as err:
    check("size_mismatch_caught_before_nccl_hangs", "4096" in str(err) and "8192" in str(err), str(err)[:200])

dist.barrier()
dist.destroy_process_group()
sys.exit(1 if failed else 0)
