"""What check_collectives() and assert_rank_uniform cost per call, on CPU with gloo.

Run: torchrun --standalone --nproc_per_node 2 benchmarks/fingerprint_cost.py [iterations]

Rank 0 prints microseconds per small all_reduce without and with the fingerprint check, the added cost
per collective, and the cost of assert_rank_uniform on a small and a 4 MiB bf16 tensor.
"""

import sys
import time

import torch
import torch.distributed as dist

from torchtriage import assert_rank_uniform, check_collectives, init_distributed


def per_call_us(fn, iterations: int) -> float:
    for _ in range(min(50, iterations)):  # warm up
        fn()
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iterations):
        fn()
    return (time.perf_counter() - started) / iterations * 1e6


def main() -> None:
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    info = init_distributed(arm_flight_recorder=False)
    small = torch.ones(1024)
    plain = per_call_us(lambda: dist.all_reduce(small), iterations)
    with check_collectives():
        checked = per_call_us(lambda: dist.all_reduce(small), iterations)
    big = torch.ones(2 << 20, dtype=torch.bfloat16)  # 4 MiB
    uniform_small = per_call_us(lambda: assert_rank_uniform(small, label="small"), iterations // 4)
    uniform_big = per_call_us(lambda: assert_rank_uniform(big, label="big"), 50)
    if info.rank == 0:
        print(f"world size {info.world_size}, {iterations} iterations, gloo on CPU")
        print(f"all_reduce(4 KiB) plain:           {plain:8.1f} us")
        print(
            f"all_reduce(4 KiB) checked:         {checked:8.1f} us  (+{checked - plain:.1f} us, x{checked / plain:.2f})"
        )
        print(f"assert_rank_uniform(4 KiB fp32):   {uniform_small:8.1f} us")
        print(f"assert_rank_uniform(4 MiB bf16):   {uniform_big:8.1f} us")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
