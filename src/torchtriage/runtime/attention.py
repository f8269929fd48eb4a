"""A numerics probe for attention: `compare_attention(q, k, v, ...)`.

Runs `scaled_dot_product_attention` on the caller's own shapes and dtype through each backend this
torch and device have — math, flash, memory-efficient, cuDNN — and compares each with the math
backend computed in float64 on the same inputs (the reference). For each backend it reports the
largest absolute and relative error of the output and, with `backward=True`, of the gradients of
q, k and v for one fixed random upstream gradient, and how many values are non-finite. A backend
that cannot run these inputs is reported with the reason torch gave (the warnings that
`sdpa_kernel` emits before "No available kernel").

This is the check a training framework runs before trusting a fused kernel on a new head size
(flash attention's parity tests at head dim 256, say), generalised to any shape, mask and dtype:
when a NaN's origin is `aten._scaled_dot_product_*`, it tells whether the kernel itself is at fault.
"""

from __future__ import annotations

import warnings
from typing import Any

_BACKENDS = (
    ("math", "MATH"),
    ("flash", "FLASH_ATTENTION"),
    ("efficient", "EFFICIENT_ATTENTION"),
    ("cudnn", "CUDNN_ATTENTION"),
)


def _attention(q, k, v, options: dict[str, Any], grad_out, backend=None):
    import torch
    import torch.nn.functional as F

    q, k, v = (t.detach().clone().requires_grad_(grad_out is not None) for t in (q, k, v))
    mask = options.get("attn_mask")
    kwargs = {key: value for key, value in options.items() if value is not None and key != "attn_mask"}
    if mask is not None:
        kwargs["attn_mask"] = mask.to(q.dtype) if mask.is_floating_point() else mask
    if backend is None:
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    else:
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    grads = None
    if grad_out is not None:
        grads = torch.autograd.grad(out, (q, k, v), grad_out.to(out.dtype))
    return out.detach(), grads


def _errors(value, reference) -> dict[str, Any]:
    import torch

    value64 = value.double()
    finite = torch.isfinite(value64) & torch.isfinite(reference)  # where the reference itself is not, no error
    nonfinite = int((~torch.isfinite(value64)).sum().item())
    diff = (value64 - reference).abs()
    diff = torch.where(finite, diff, torch.zeros_like(diff))
    magnitude = torch.where(torch.isfinite(reference), reference.abs(), torch.zeros_like(reference))
    scale = float(magnitude.max().item()) if magnitude.numel() else 0.0
    scale = scale or 1.0
    max_abs = float(diff.max().item()) if diff.numel() else 0.0
    return {"max_abs_error": max_abs, "max_rel_error": max_abs / scale, "nonfinite": nonfinite}


def compare_attention(
    q,
    k,
    v,
    *,
    attn_mask=None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    backward: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    """Each SDPA backend's error against float64 math on these inputs, and its non-finite count.

    Returns `{"shape", "dtype", "device", "reference", "backends": [{"backend", "available",
    "reason", "max_abs_error", "max_rel_error", "nonfinite", "grad": {"q"|"k"|"v": {...}}}],
    "worst"}`; `worst` names the available backend with the largest relative error (output or
    gradient), or says that one produced non-finite values.
    """
    import torch
    from torch.nn.attention import SDPBackend

    options = {"attn_mask": attn_mask, "is_causal": is_causal or None, "scale": scale}
    if enable_gqa:
        options["enable_gqa"] = True
    grad_out = None
    if backward:
        generator = torch.Generator(device="cpu").manual_seed(seed)
        out_shape = (*q.shape[:-1], v.shape[-1])
        grad_out = torch.randn(out_shape, generator=generator, dtype=torch.float64).to(q.device)
    ref_mask = attn_mask.double() if attn_mask is not None and attn_mask.is_floating_point() else attn_mask
    ref_options = dict(options, attn_mask=ref_mask)
    reference, reference_grads = _attention(q.double(), k.double(), v.double(), ref_options, grad_out, SDPBackend.MATH)
    results = []
    for name, member in _BACKENDS:
        backend = getattr(SDPBackend, member, None)
        entry: dict[str, Any] = {"backend": name, "available": False, "reason": None}
        if backend is None:
            entry["reason"] = f"this torch has no SDPBackend.{member}"
            results.append(entry)
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out, grads = _attention(q, k, v, options, grad_out, backend)
            except RuntimeError as error:
                reasons = [str(w.message).strip() for w in caught]
                entry["reason"] = "; ".join(dict.fromkeys(reasons)) or str(error).splitlines()[0]
                results.append(entry)
                continue
        entry["available"] = True
        entry.update(_errors(out, reference))
        if grads is not None:
            entry["grad"] = {
                name_: _errors(g, ref) for name_, g, ref in zip("qkv", grads, reference_grads, strict=True)
            }
        results.append(entry)
    return {
        "shape": {"q": list(q.shape), "k": list(k.shape), "v": list(v.shape)},
        "reference_nonfinite": int((~torch.isfinite(reference)).sum().item()),
        "dtype": str(q.dtype).removeprefix("torch."),
        "device": str(q.device),
        "reference": "math backend in float64",
        "backends": results,
        "worst": _worst(results),
    }


def _worst(results: list[dict[str, Any]]) -> str:
    available = [r for r in results if r["available"]]
    if not available:
        return "no backend could run these inputs"

    def nonfinite(r) -> int:
        return r["nonfinite"] + sum(g["nonfinite"] for g in (r.get("grad") or {}).values())

    def rel(r) -> float:
        return max([r["max_rel_error"], *(g["max_rel_error"] for g in (r.get("grad") or {}).values())])

    broken = [r for r in available if nonfinite(r)]
    if broken:
        return ", ".join(f"{r['backend']} produced {nonfinite(r)} non-finite values" for r in broken)
    top = max(available, key=rel)
    return f"{top['backend']} (max relative error {rel(top):.3g})"


def format_attention_report(report: dict[str, Any]) -> str:
    """The report as a small table, one line per backend."""
    shape = report["shape"]
    lines = [
        f"attention q{tuple(shape['q'])} k{tuple(shape['k'])} v{tuple(shape['v'])} {report['dtype']} on "
        f"{report['device']}, against the {report['reference']}",
        f"  {'backend':<10} {'out max abs':>12} {'out max rel':>12} {'grad max rel':>13} {'non-finite':>11}",
    ]
    for entry in report["backends"]:
        if not entry["available"]:
            lines.append(f"  {entry['backend']:<10} unavailable: {entry['reason']}")
            continue
        grads = entry.get("grad") or {}
        grad_rel = f"{max(g['max_rel_error'] for g in grads.values()):.3g}" if grads else "-"
        nonfinite = entry["nonfinite"] + sum(g["nonfinite"] for g in grads.values())
        lines.append(
            f"  {entry['backend']:<10} {entry['max_abs_error']:>12.3g} {entry['max_rel_error']:>12.3g} "
            f"{grad_rel:>13} {nonfinite:>11}"
        )
    lines.append(f"  worst: {report['worst']}")
    return "\n".join(lines)
