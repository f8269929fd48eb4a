"""Job: assert_rank_uniform under torchrun + gloo, scenario after scenario, on 4 ranks.

Prints one `RESULT {json}` line per rank per scenario; the report itself goes to the log as a warning.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

from torchtriage import RankDivergenceError, assert_rank_uniform, init_distributed


def emit(rank: int, scenario: str, **fields) -> None:
    sys.stdout.write("RESULT " + json.dumps({"rank": rank, "scenario": scenario, **fields}) + "\n")
    sys.stdout.flush()


def outcome(rank: int, scenario: str, value, **kwargs) -> None:
    try:
        ok = assert_rank_uniform(value, label=scenario, **kwargs)
        emit(rank, scenario, ok=ok)
    except RankDivergenceError as err:
        emit(rank, scenario, raised=type(err).__name__, message=str(err))


def main() -> None:
    info = init_distributed()
    rank, world = info.rank, info.world_size
    last = world - 1

    torch.manual_seed(0)  # same values on every rank
    same = {"weights": torch.randn(8, 16).to(torch.bfloat16), "fp8": torch.ones(4).to(torch.float8_e4m3fn)}
    outcome(rank, "uniform_bf16", {**same, "lr": 0.1, "names": ["a", "b"]})

    shape = (8, 15) if rank == last else (8, 16)
    outcome(rank, "shape", torch.zeros(shape, dtype=torch.bfloat16), strict=False)
    # Training continues after a non-strict mismatch: the next collective pairs up normally.
    total = torch.ones(1)
    dist.all_reduce(total)
    emit(rank, "continued", total=total.item())

    fp8 = torch.ones(4).to(torch.float8_e4m3fn)
    if rank == 1:
        fp8[2] = 2.0
    outcome(rank, "bytes_fp8", fp8, strict=False)

    outcome(rank, "strict", torch.zeros(shape, dtype=torch.bfloat16), strict=True)
    # Strictness is agreed: one strict rank makes every rank raise.
    outcome(rank, "strict_one_rank", torch.zeros(shape), strict=(rank == 0))
    # The default comes from TORCHTRIAGE_STRICT.
    os.environ["TORCHTRIAGE_STRICT"] = "1"
    outcome(rank, "strict_env", {"seed": 1234 + (rank == last)})
    os.environ["TORCHTRIAGE_STRICT"] = "0"

    nested = {"cfg": {"hidden": 4096, "layers": 32 + (rank == 2)}, "batch": torch.arange(6)}
    outcome(rank, "nested", nested, strict=False)

    # Subgroups: only members call; the report names global ranks.
    low, high = dist.new_group([0, 1]), dist.new_group([2, 3])
    mine = low if rank < 2 else high
    value = torch.full((3,), 7.0) if rank != 3 else torch.full((3,), 8.0)
    outcome(rank, "subgroup", value, group=mine, strict=False)
    dist.barrier()
    emit(rank, "done")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("TORCHTRIAGE_STRICT", "0")
    main()
