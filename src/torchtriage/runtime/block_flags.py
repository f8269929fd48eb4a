"""The always-on tier of the non-finite locator: one device-side flag per block, read only on a skip.

`NonFiniteGuard(..., watch="blocks")` hooks the model's top-level blocks (the children of its largest
`ModuleList` / `Sequential`, such as a transformer's `layers`; else the model's own children; or the
names given in `watch=[...]`). Each forward of a block keeps the fp32 sum of its output as a 0-d
device tensor; with `gradients=True`, a gradient hook on the output keeps the sum of the gradient
arriving at it too (the guard leaves that off: it doubles the cost, and its replay places backward
origins exactly). A sum
is non-finite exactly when a value is (NaN, or infinities), or when finite values add up past fp32's
range (3.4e38, which healthy activations never approach); it is one reduction kernel, where
`isfinite(x).all()` is several and writes a mask as large as the activation. No value is copied to
the host: the guard reads the sums only when the step was already skipped.

From the flags, in execution order:

- forward: the first block whose output is non-finite is where the value was born (its input is
  the previous block's output, which was finite);
- backward (with `gradients=True`, every forward output finite): gradients flow from the last block to the first, so the
  block whose *output* gradient is finite but whose input gradient (the previous block's output
  gradient) is not is the origin. A non-finite gradient already at the last block's output comes
  from after the blocks: the head or the loss.

Cost: one reduction kernel per block output in the forward (and, with gradients, one per output
gradient and one gradient hook per block); benchmarks/nonfinite_overhead.py measures it.
"""

from __future__ import annotations

from typing import Any

from torchtriage.runtime.locate import unwrap_model


def pick_blocks(model, names: list[str] | None = None) -> list[tuple[str, Any]]:
    """The blocks to watch: `names`, else the children of the largest ModuleList/Sequential, else children."""
    import torch

    inner, _ = unwrap_model(model)
    modules = dict(inner.named_modules())
    if names is not None:
        missing = [n for n in names if n not in modules]
        if missing:
            raise ValueError(f"watch names modules the model does not have: {missing[:4]}")
        return [(n, modules[n]) for n in names]

    def size(module) -> int:
        return sum(p.numel() for p in module.parameters())

    containers = [
        (name, m)
        for name, m in modules.items()
        if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)) and len(m) > 1 and m is not inner
    ]
    if containers:
        name, container = max(containers, key=lambda item: (size(item[1]), -item[0].count(".")))
        prefix = f"{name}." if name else ""
        return [(f"{prefix}{child_name}", child) for child_name, child in container.named_children()]
    return list(inner.named_children())


def _first_tensor(output):
    import torch

    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (list, tuple)):
        for item in output:
            found = _first_tensor(item)
            if found is not None:
                return found
    if isinstance(output, dict):
        for item in output.values():
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


class BlockFlags:
    """Device-side sums of the outputs (and output gradients) of a model's blocks: finite or not."""

    def __init__(self, model, names: list[str] | None = None, *, gradients: bool = False):
        self.blocks = pick_blocks(model, names)
        self.gradients = gradients
        self._forward: list[Any] = [None] * len(self.blocks)
        self._backward: list[Any] = [None] * len(self.blocks)
        self._handles = [
            module.register_forward_hook(self._forward_hook(index)) for index, (_, module) in enumerate(self.blocks)
        ]

    def _forward_hook(self, index: int):
        import torch

        def hook(module, args, output):
            tensor = _first_tensor(output)
            if tensor is None or not (tensor.is_floating_point() or tensor.is_complex()):
                return
            local = getattr(tensor, "_local_tensor", tensor)
            total = local.detach().sum(dtype=torch.float32)
            previous = self._forward[index]
            self._forward[index] = total if previous is None else previous + total
            if self.gradients and tensor.requires_grad and torch._C._current_autograd_node() is None:
                tensor.register_hook(self._gradient_hook(index))

        return hook

    def _gradient_hook(self, index: int):
        import torch

        def hook(grad):
            local = getattr(grad, "_local_tensor", grad)
            total = local.sum(dtype=torch.float32)
            previous = self._backward[index]
            self._backward[index] = total if previous is None else previous + total

        return hook

    def reset(self) -> None:
        """Start a new step (no device work: the old flags are dropped)."""
        self._forward = [None] * len(self.blocks)
        self._backward = [None] * len(self.blocks)

    def take(self) -> tuple[list, list]:
        """This step's sums, and a new step begun: for a guard that reads them a step later."""
        taken = (self._forward, self._backward)
        self.reset()
        return taken

    def read(self, taken: tuple[list, list] | None = None) -> dict[str, Any] | None:
        """The origin block from this step's flags, or from `take()`'s (one host copy); None when all are finite."""
        import torch

        def values(flags: list) -> list[bool | None]:
            present = [i for i, f in enumerate(flags) if f is not None]
            if not present:
                return [None] * len(flags)
            sums = torch.stack([flags[i].to(flags[present[0]].device) for i in present])
            out: list[bool | None] = [None] * len(flags)
            for i, finite in zip(present, torch.isfinite(sums).tolist(), strict=True):
                out[i] = bool(finite)
            return out

        forward_sums, backward_sums = taken if taken is not None else (self._forward, self._backward)
        forward, backward = values(forward_sums), values(backward_sums)
        names = [name for name, _ in self.blocks]
        for i, finite in enumerate(forward):
            if finite is False:
                return {"phase": "forward", "block": names[i], "index": i}
        seen = [i for i, finite in enumerate(backward) if finite is not None]
        bad = [i for i in seen if backward[i] is False]
        if not bad:
            return None
        last = max(seen)
        if backward[last] is False:
            return {"phase": "backward", "block": "after the last block (the head or the loss)", "index": None}
        # The highest block whose output gradient is still finite passed a non-finite one down.
        top_bad = max(bad)
        origin = min(i for i in seen if i > top_bad)
        return {"phase": "backward", "block": names[origin], "index": origin}

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.reset()
