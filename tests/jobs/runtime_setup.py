"""Job: init_distributed's timeouts, flight-recorder variables and the store helpers under torchrun + gloo.

Prints one `RESULT {json}` line per rank.
"""

import json
import os
import sys
import time

import torch.distributed as dist

from torchtriage import init_distributed, store_barrier, store_set, store_wait
from torchtriage.runtime.setup import StoreTimeoutError, process_group_timeout


def main() -> None:
    info = init_distributed()
    sub = dist.new_group([0, 1])
    result = {
        "rank": info.rank,
        "world_size": info.world_size,
        "backend": info.backend,
        "launcher": info.launcher,
        "timeout_s": info.timeout.total_seconds(),
        "pg_timeout_s": process_group_timeout().total_seconds(),
        "subgroup_timeout_s": process_group_timeout(sub).total_seconds(),
        "fr": {
            name: os.environ.get(name) for name in sorted(os.environ) if name.startswith(("TORCH_FR_", "TORCH_NCCL_"))
        },
    }
    if info.rank == 0:
        time.sleep(1.0)  # one rank prepares something while the others wait on the store
        store_set("dataset_ready", b"v1")
    result["store_value"] = store_wait("dataset_ready").decode()
    store_barrier("checkpoint")
    store_barrier("checkpoint")  # a name may be reused: each call is its own barrier
    try:
        store_wait("never_set", timeout=0.5)
    except StoreTimeoutError as err:
        result["store_timeout"] = str(err)
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
