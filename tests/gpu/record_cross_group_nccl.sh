#!/usr/bin/env bash
# Record tests/fixtures/fr_cross_group_nccl on a GPU host: the cross-group hangs of tests/jobs/cross_group.py
# on NCCL, under `torchtriage run` (its hang watchdog writes every rank's stack and NCCL flight-recorder dump).
# Four ranks per job; with fewer GPUs than ranks the ranks share them (see the job's docstring).
#
#   bash tests/gpu/record_cross_group_nccl.sh OUT_DIR [CASE:CULPRIT:RANKS ...]   (default: every family)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?the folder to write the recordings to}
shift
cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
    cases=(world_for_subgroup:1:4 world_for_subgroup:0:4 opposite_order:1:4 subgroup_barrier:1:4 early_exit:1:4
        skip_send:1:4 recv_before_send:0:4 batch_missing_op:1:4 split_mismatch:2:4)
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# NVLink multicast stays off: a program that uses it can take the host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L
python3 -c 'import torch; print("torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))'

# A probe first: four ranks' NCCL all_reduce, or nothing is recorded.
probe=$(mktemp --suffix=.py)
cat >"$probe" <<'EOF'
import os, torch, torch.distributed as dist
local, count = int(os.environ["LOCAL_RANK"]), torch.cuda.device_count()
if local >= count:
    os.environ["NCCL_HOSTID"] = f"probe-rank-{os.environ['RANK']}"
torch.cuda.set_device(local % count)
dist.init_process_group("nccl")
t = torch.ones(4, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
print("probe rank", dist.get_rank(), "sum", t[0].item(), flush=True)
dist.destroy_process_group()
EOF
if ! timeout 120 torchrun --standalone --nproc_per_node 4 "$probe"; then
    echo "the NCCL probe failed: nothing recorded"
    exit 1
fi

mkdir -p "$out"
timeout 500 python3 tests/fixtures/fr_cross_group/record.py --backend nccl --out "$out" "${cases[@]}"
