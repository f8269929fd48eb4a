"""What one pass over every gradient costs on a GPU, by the way it is computed: the guard's own
(`sum_of_squares_on_device`: torch._foreach_norm, then one dot), the same compiled by torch.compile, and
one norm over a single contiguous buffer of the same size (the memory-bandwidth floor a fused kernel can reach).

Usage: python benchmarks/norm_pass_cost.py [--params-m 92] [--repeats 50] [--rounds 7]

The gradients are fp32 tensors of a GPT-style model's shapes (per block: qkv, attention out, two MLP matrices,
their biases, two norms), as many blocks as make `--params-m` million values. Each way runs `--repeats` times
between CUDA events, queued behind a sleeping kernel (the device's time, not the host's launches), interleaved
in rounds (A B C A B C ...); prints each way's median microseconds, the bandwidth it reaches reading the
gradients once, and its ratio to the guard's own with min and max over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from torchtriage.runtime.grad_norms import sum_of_squares_on_device  # noqa: E402


def gradients(params_m: float, hidden: int = 768) -> list[torch.Tensor]:
    block = [(3 * hidden, hidden), (3 * hidden,), (hidden, hidden), (hidden,), (4 * hidden, hidden), (4 * hidden,)]
    block += [(hidden, 4 * hidden), (hidden,), (hidden,), (hidden,), (hidden,), (hidden,)]
    per_block = sum(torch.Size(s).numel() for s in block)
    blocks = max(1, int(params_m * 1e6 // per_block))
    return [torch.randn(s, device="cuda") for _ in range(blocks) for s in block]


def timed(fn, repeats: int) -> float:
    """The device's time per pass: the passes are queued behind a sleeping kernel, so the host's launch time
    (which a training step hides behind the device's work) is not in it."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # about 0.1 s of device cycles: time to queue every pass
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / repeats  # µs per pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params-m", type=float, default=92)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    grads = gradients(args.params_m)
    flat = torch.cat([g.reshape(-1) for g in grads])
    nbytes = flat.numel() * 4
    compiled = torch.compile(sum_of_squares_on_device)

    def flat_norm():
        return torch.linalg.vector_norm(flat, dtype=torch.float32)

    def foreach_plain():  # no dtype argument: fp32 gradients need no cast
        norms = torch._foreach_norm(grads, 2.0)
        stacked = torch.stack(norms)
        return torch.dot(stacked, stacked)

    def per_tensor():
        norms = [torch.linalg.vector_norm(g) for g in grads]
        stacked = torch.stack(norms)
        return torch.dot(stacked, stacked)

    def foreach_max():  # non-finite exactly where the largest magnitude is: no sum to overflow
        return torch.stack(torch._foreach_norm(grads, float("inf"))).max()

    ways = {"guard (foreach_norm + dot)": lambda: sum_of_squares_on_device(grads), "compiled": lambda: compiled(grads)}
    ways |= {"foreach_norm, no dtype": foreach_plain, "one vector_norm a tensor": per_tensor}
    ways |= {"foreach_norm inf (max)": foreach_max, "one contiguous buffer": flat_norm}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, fn in ways.items():
            times[name].append(timed(fn, args.repeats))
    base = times["guard (foreach_norm + dot)"]
    print(f"{torch.cuda.get_device_name()}: {len(grads)} tensors, {flat.numel() / 1e6:.1f}M fp32 values")
    for name, values in times.items():
        ratios = [v / b for v, b in zip(values, base, strict=True)]
        median = statistics.median(values)
        print(
            f"{name:28s} {median:8.1f} µs  {nbytes / median / 1e3:7.0f} GB/s  ratio {statistics.median(ratios):.3f} "
            f"(min {min(ratios):.3f}, max {max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
