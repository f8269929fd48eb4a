#!/usr/bin/env bash
# Record the real-API hangs of tests/jobs/api_hangs.py on NCCL, as a user meets them: bare (`torchtriage
# diagnose --pid` on the torchrun agent, with and without --native) and armed (`torchtriage run`, its watchdog's
# stacks, NCCL flight-recorder dumps and verdict). benchmarks/live_api.py drives each job and scores the verdict.
# With fewer GPUs than ranks the ranks share them (each another host to NCCL, as the job's docstring says).
#
#   bash tests/gpu/record_api_hangs_nccl.sh OUT_DIR [CASE:RANKS ...]   (default: every case the job runs on NCCL)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?the folder to write the recordings to}
shift
cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
    cases=(fsdp2_skip_block:4 ddp_skip_backward:2 dtensor_mesh_skip:4 all_gather_object_skip:2 store_get:2)
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 BACKEND=nccl
# NVLink multicast stays off: a program that uses it can take the host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L
python3 -c 'import torch; print("torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))'
mkdir -p "$out"
for spec in "${cases[@]}"; do
    case=${spec%%:*}
    ranks=${spec#*:}
    timeout 300 python3 benchmarks/live_api.py --out "$out" --modes bare,armed --ranks "$ranks" \
        --stall-seconds 8 --settle 6 "$case"
done
