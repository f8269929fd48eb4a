"""Where a non-finite value was born: `locate_nonfinite(model, closure)`.

It replays one step — `closure()` returns the loss of a forward on the same batch, then the locator
runs its backward — and returns the first place, in execution order, where a NaN or Inf appears::

    origin = locate_nonfinite(model, lambda: loss_fn(model(batch), target))
    # {"phase": "forward", "module": "layers.7.mlp.act", "op": "aten.exp", "dtype": "float32", ...}

How it finds the first value, exactly and in order:

- before anything runs, the weights (the local shards of DTensors) and, when given, the optimizer's
  state are checked: a non-finite weight is phase "parameters", named by its qualified name;
- a `TorchDispatchMode` sees every aten op of the forward and the backward. The first op whose
  output holds a non-finite value while every input was finite is the origin. Since every output
  before it was finite, a non-finite *input* can only have come from outside the replay: the batch
  (phase "input") or a buffer of the model (phase "parameters");
- the module is the innermost module running when the op ran, from global module hooks (so a loss
  module outside the model is named too, by its type). In the backward, the autograd node that runs
  the op (`torch._C._current_autograd_node`) carries the module that created it in the forward,
  which a `TorchFunctionMode` wrote into the node's metadata;
- activation checkpointing recomputes forwards inside the backward: those ops are still checked,
  but their phase stays "forward (recomputed)" and they can only be an origin if the recomputation
  differs from the original forward;
- a `torch.compile`d model is replayed eagerly (`torch.compiler.set_stance("force_eager")`), and the
  origin says so: compiled graphs have no per-op location.

Nothing is left behind, also when the closure raises: hooks and modes are removed, gradients,
buffers (batch-norm statistics) and the random number generators are restored. The replay is not
free (one device-to-host copy per op), which is why it runs only when a step was already non-finite.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

# Ops whose outputs hold no values yet, and the namespaces of collectives (filled by other ranks).
_ALLOCATIONS = ("aten.empty", "aten.new_empty", "aten.resize_", "aten.resize_as_")
# (`fsdp` holds FSDP2's copy-in/copy-out ops around its all-gathers: their buffers hold other ranks' shards.)
_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional", "_dtensor", "fsdp")
# Where a tensor's values came from, as the dispatch mode saw it (absent: from outside the replay).
_KNOWN = "known"  # made by an op of the replay from known values, and checked
_UNWRITTEN = "unwritten"  # allocated, no value yet
_TAINTED = "tainted"  # made from values whose source is unknown: never an origin
# (any other status: the name of the collective that filled it from other ranks)

ORIGIN_KEYS = ("phase", "module", "op", "dtype", "shape", "inputs_finite", "input_max_abs", "detail")
_ROWS_SHOWN = 16


def _torch():
    import torch

    return torch


def peel_wrappers(model) -> tuple[Any, list[tuple[str, Any]]]:
    """The user's module under DDP / FSDP1 / `torch.compile` wrappers, and (name, wrapper) outermost first."""
    wrappers = []
    while True:
        name = type(model).__name__
        if hasattr(model, "_orig_mod") and name == "OptimizedModule":
            wrappers.append(("torch.compile", model))
            model = model._orig_mod
        elif name in ("DistributedDataParallel", "FullyShardedDataParallel", "DataParallel") and hasattr(
            model, "module"
        ):
            wrappers.append((name, model))
            model = model.module
        else:
            return model, wrappers


def unwrap_model(model) -> tuple[Any, list[str]]:
    """The user's module under its wrappers, and the wrappers' names."""
    inner, wrappers = peel_wrappers(model)
    return inner, [name for name, _ in wrappers]


def _local(tensor):
    """The tensor whose values this rank holds: a DTensor's local shard, else the tensor itself."""
    local = getattr(tensor, "_local_tensor", None)
    return local if local is not None else tensor


def _checkable(tensor) -> bool:
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        return False
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return False
    return not tensor.is_meta and tensor.layout == torch.strided and tensor.numel() > 0


def _all_finite(tensors: list) -> bool:
    torch = _torch()
    flags = [torch.isfinite(t).all() for t in tensors]
    return bool(torch.stack(flags).all().item()) if flags else True


def _describe_values(tensor) -> dict[str, Any]:
    """Counts of nan/+inf/-inf in `tensor` and the rows (dim 0) that hold them."""
    torch = _torch()
    t = tensor.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    nan = torch.isnan(t)
    posinf = torch.isposinf(t)
    neginf = torch.isneginf(t)
    bad = nan | posinf | neginf
    rows: list[int] = []
    if t.dim() >= 1 and t.shape[0] > 1:
        rows = torch.nonzero(bad.reshape(t.shape[0], -1).any(dim=1)).flatten()[:_ROWS_SHOWN].tolist()
    return {
        "nan": int(nan.sum().item()),
        "posinf": int(posinf.sum().item()),
        "neginf": int(neginf.sum().item()),
        "numel": int(t.numel()),
        "rows": rows,
        "rows_of": int(t.shape[0]) if t.dim() >= 1 else 0,
    }


def _max_abs(tensors: list) -> float | None:
    """The largest finite magnitude among `tensors` (what overflowed, or how close it came)."""
    torch = _torch()
    best = None
    for t in tensors:
        values = t.detach()
        if values.is_complex():
            values = values.abs()
        values = values.float().abs()
        finite = torch.where(torch.isfinite(values), values, torch.zeros_like(values))
        top = float(finite.max().item())
        best = top if best is None else max(best, top)
    return best


def _counts_text(values: dict[str, Any]) -> str:
    parts = [
        f"{values[k]} {label}" for k, label in (("nan", "nan"), ("posinf", "inf"), ("neginf", "-inf")) if values[k]
    ]
    return ", ".join(parts) or "non-finite values"


def _op_name(func) -> str:
    schema = getattr(func, "_schema", None)
    name = getattr(schema, "name", None) or str(func)
    return name.replace("::", ".")


class _Search:
    """What the replay has seen so far: the module stack, the phase, and the first non-finite value."""

    def __init__(self, names: dict[int, str], buffers: dict[int, str]):
        self.names = names  # id(module) -> qualified name in the user's model
        self.buffers = buffers  # storage data_ptr -> qualified buffer name
        self.stack: list[Any] = []
        self.phase = "forward"
        self.origin: dict[str, Any] | None = None
        from torch.utils.weak import WeakTensorKeyDictionary

        self.status = WeakTensorKeyDictionary()  # tensor -> _KNOWN, _UNWRITTEN, _TAINTED or a collective
        # storage -> the collective that wrote it: wrappers re-expose gathered memory as new tensors
        # (FSDP2's unsharded parameters), which have no status of their own
        self.received: dict[int | None, str] = {}

    def status_of(self, tensor) -> str | None:
        return self.status.get(tensor)

    def received_through(self, tensor) -> str | None:
        status = self.status.get(tensor)
        if status not in (None, _KNOWN, _UNWRITTEN, _TAINTED):
            return status
        return self.received.get(_storage_ptr(tensor)) if status is None else None

    def mark(self, tensors: list, status: str | None) -> None:
        if status not in (None, _KNOWN, _UNWRITTEN, _TAINTED):
            for t in tensors:
                self.received[_storage_ptr(t)] = status
        for t in tensors:
            if status is None:
                self.status.pop(t, None)
            else:
                self.status[t] = status

    # -- modules --------------------------------------------------------------------------------
    def module_label(self, module) -> tuple[str | None, str]:
        return self.names.get(id(module)), type(module).__name__

    def current(self) -> tuple[str | None, str] | None:
        return self.module_label(self.stack[-1]) if self.stack else None

    # -- the origin ------------------------------------------------------------------------------
    def found(self, **fields) -> None:
        if self.origin is None:
            self.origin = fields

    def where(self) -> dict[str, Any]:
        """The module (name, type), the phase and, in the backward, the autograd node of the op running now."""
        torch = _torch()
        phase = self.phase
        label = self.current()
        node_name = None
        if phase == "backward":
            node = torch._C._current_autograd_node()
            meta = getattr(node, "metadata", None) if node is not None else None
            node_name = node.name() if node is not None else None
            if label is not None:
                phase = "forward (recomputed)"  # a module forward inside the backward: checkpointing
            elif isinstance(meta, dict) and "torchtriage_module" in meta:
                label = meta["torchtriage_module"]
        module, module_type = label if label is not None else (None, None)
        return {"phase": phase, "module": module, "module_type": module_type, "autograd_node": node_name}


def _module_hooks(search: _Search) -> contextlib.AbstractContextManager:
    from torch.nn.modules import module as module_mod

    def pre(module, args):
        search.stack.append(module)

    def post(module, args, output):
        if search.stack and search.stack[-1] is module:
            search.stack.pop()
        elif module in search.stack:  # an exception unwound inner modules without their post hooks
            del search.stack[search.stack.index(module) :]

    stack = contextlib.ExitStack()
    stack.callback(module_mod.register_module_forward_pre_hook(pre).remove)
    stack.callback(module_mod.register_module_forward_hook(post, always_call=True).remove)
    return stack


def _modes(search: _Search):
    """The function mode (tags autograd nodes with their module) and the dispatch mode (checks values)."""
    torch = _torch()
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class TagNodes(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if search.origin is None and search.stack and search.phase == "forward":
                label = search.current()
                for value in tree_flatten(out)[0]:
                    node = getattr(value, "grad_fn", None) if isinstance(value, torch.Tensor) else None
                    meta = getattr(node, "metadata", None)
                    if isinstance(meta, dict):
                        meta.setdefault("torchtriage_module", label)
            return out

    class CheckValues(TorchDispatchMode):
        """Checks each op's values, knowing where each tensor came from (`search.status`)."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if search.origin is not None:
                return func(*args, **kwargs)
            op = _op_name(func)
            in_tensors = [_local(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            if getattr(func, "namespace", "") in _COLLECTIVE_NAMESPACES and not op.endswith(".wait_tensor"):
                # Which arguments a c10d op writes is not in its schema, and an async one fills them
                # later: its tensors are not checked here; a non-finite value read from them
                # afterwards arrived from another rank.
                out = func(*args, **kwargs)
                search.mark(in_tensors + _tensors_of(out), op)
                return out
            if func.is_view:  # a view holds its base's values: it inherits where they came from
                out = func(*args, **kwargs)
                search.mark(_tensors_of(out), search.status_of(in_tensors[0]) if in_tensors else _KNOWN)
                return out
            inputs, tainted = [], False
            for t in in_tensors:
                status = search.status_of(t)
                if status == _UNWRITTEN or not _checkable(t):
                    continue
                if status == _TAINTED:
                    tainted = True
                    continue
                inputs.append((t, status))
            bad = next((t for t, _ in inputs if not _all_finite([t])), None)
            if bad is not None:
                tainted = not self._outside_value(op, bad, search.status_of(bad), [t for t, _ in inputs])
            out = func(*args, **kwargs)
            outputs = [t for t in _tensors_of(out)]
            if op.startswith(_ALLOCATIONS):
                search.mark(outputs, _UNWRITTEN)  # uninitialised memory holds no value yet
                return out
            if tainted:
                search.mark(outputs, _TAINTED)
                return out
            checked = [t for t in outputs if _checkable(t)]
            bad_out = next((t for t in checked if not _all_finite([t])), None)
            if bad_out is not None and search.origin is None:
                received = search.status_of(bad_out) if op.endswith(".wait_tensor") else None
                search.found(
                    **search.where(),
                    op=op,
                    dtype=str(bad_out.dtype).removeprefix("torch."),
                    shape=list(bad_out.shape),
                    inputs_finite=received is None,
                    input_max_abs=_max_abs([t for t, _ in inputs]),
                    values=_describe_values(bad_out),
                    received=received,
                )
            search.mark(outputs, _KNOWN)
            return out

        def _outside_value(self, op: str, bad, status, inputs) -> bool:
            """Report a non-finite input as the origin when its source is known; False when it is not."""
            buffer = search.buffers.get(_storage_ptr(bad))
            received = search.received_through(bad)
            where = search.where()
            if buffer is not None:
                where["phase"] = "parameters"
            elif received is not None:
                pass
            elif status is None and where["phase"] == "forward":
                where["phase"] = "input"  # not made by any op of the replay: the batch, or a captured tensor
            else:
                # Made by the replay and checked finite, or met first in the backward without being
                # made by it: something outside the ops this mode sees wrote it (a wrapper's buffers).
                return False
            search.found(
                **where,
                op=op,
                dtype=str(bad.dtype).removeprefix("torch."),
                shape=list(bad.shape),
                inputs_finite=False,
                input_max_abs=_max_abs(inputs),
                values=_describe_values(bad),
                parameter=buffer,
                received=received,
            )
            return True

    return TagNodes(), CheckValues()


def _tensors_of(value) -> list:
    from torch.utils._pytree import tree_flatten

    torch = _torch()
    return [_local(t) for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _storage_ptr(tensor) -> int | None:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def _nonfinite_parameter(model, optimizer) -> dict[str, Any] | None:
    """The first weight (or optimizer state of it) holding a non-finite value on this rank."""
    params = list(model.named_parameters())
    names = {id(p): name for name, p in params}
    for name, param in params:
        local = _local(param.detach())
        if _checkable(local) and not _all_finite([local]):
            return _parameter_origin(name, local, what="weight")
    if optimizer is not None:
        for param, state in getattr(optimizer, "state", {}).items():
            for key, value in (state or {}).items():
                local = _local(value) if hasattr(value, "dtype") else None
                if local is not None and _checkable(local) and not _all_finite([local]):
                    name = names.get(id(param), "<a parameter outside the model>")
                    return _parameter_origin(name, local, what=f"optimizer state {key!r} of")
    return None


def _parameter_origin(name: str, tensor, what: str) -> dict[str, Any]:
    module, _, _ = name.rpartition(".")
    values = _describe_values(tensor)
    return {
        "phase": "parameters",
        "module": module,
        "module_type": None,
        "op": None,
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "inputs_finite": False,
        "input_max_abs": _max_abs([tensor]),
        "values": values,
        "parameter": name,
        "parameter_what": what,
    }


def _detail(origin: dict[str, Any], compiled: bool) -> str:
    values = origin.get("values") or {}
    counts = _counts_text(values) if values else "non-finite values"
    shape = tuple(origin.get("shape") or ())
    place = origin["module"]
    if place is None:
        place = (
            f"{origin['module_type']} (outside the model)"
            if origin.get("module_type")
            else "the closure, outside any module"
        )
    elif place == "":
        place = f"the model ({origin.get('module_type') or 'root'})"
    if origin["phase"] == "parameters":
        name = origin.get("parameter") or place
        what = origin.get("parameter_what", "buffer" if origin.get("op") else "weight")
        text = f"{what} {name} holds {counts} ({origin['dtype']}, shape {shape}) before the step ran"
    elif origin.get("received"):
        text = (
            f"{counts} ({origin['dtype']}, shape {shape}) arrived through {origin['received']} from another rank "
            f"and reached {origin['op']} in the {origin['phase']} of {place}"
        )
    elif origin["phase"] == "input":
        text = (
            f"the batch reaches {origin['op']} in {place} already holding {counts} ({origin['dtype']}, shape {shape})"
        )
    else:
        where = "recomputed forward" if origin["phase"] == "forward (recomputed)" else origin["phase"]
        max_abs = origin.get("input_max_abs")
        inputs = "from finite inputs" + (f" (max |x| {max_abs:.4g})" if max_abs is not None else "")
        node = f" ({origin['autograd_node']})" if origin.get("autograd_node") else ""
        text = (
            f"{origin['op']}{node} in the {where} of {place} returned {counts} ({origin['dtype']}, shape {shape}) "
            f"{inputs}"
        )
    rows = values.get("rows") or []
    if rows and origin["phase"] in ("input", "forward") and len(rows) < values.get("rows_of", 0):
        text += f"; rows {rows} of {values['rows_of']} along dim 0"
    if compiled:
        text += "; replayed eagerly (the model is torch.compile'd)"
    return text


@contextlib.contextmanager
def _restored_state(model, params: list) -> Iterator[None]:
    """Put back what a replay changes: gradients, buffers (batch-norm statistics), the RNG streams."""
    torch = _torch()
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        with torch.no_grad():
            for buffer, saved in buffers:
                if buffer.shape == saved.shape:
                    buffer.copy_(saved)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def _eager_if_compiled(compiled: bool):
    torch = _torch()
    if compiled and hasattr(torch, "compiler") and hasattr(torch.compiler, "set_stance"):
        return torch.compiler.set_stance("force_eager")
    return contextlib.nullcontext()


def locate_nonfinite(
    model,
    closure: Callable[[], Any],
    *,
    optimizer=None,
    backward: bool = True,
    grad_scale: float | None = None,
) -> dict[str, Any] | None:
    """Replay one step and return the first place a non-finite value appears, or None when all stay finite.

    `closure()` runs the forward and returns the loss (a tensor); the locator then runs its backward
    (`backward=False` to stop after the forward; `grad_scale` multiplies the loss first, as a
    GradScaler would). `optimizer` adds its state to the parameter check. Returns
    `{"phase", "module", "op", "dtype", "shape", "inputs_finite", "input_max_abs", "detail", ...}`.
    Collectives inside the model (FSDP's all-gathers, DDP's all-reduce) run as in a normal step,
    so under them every rank must call this together.
    """
    torch = _torch()
    inner, wrappers = unwrap_model(model)
    compiled = "torch.compile" in wrappers
    in_weights = _nonfinite_parameter(inner, optimizer)
    names = {id(m): name for name, m in inner.named_modules()}
    names[id(model)] = ""
    buffers = {_storage_ptr(b): name for name, b in inner.named_buffers() if _storage_ptr(b)}
    search = _Search(names, buffers)
    if in_weights is not None:
        search.found(**in_weights)  # the replay still runs in full: other ranks' replays need its collectives
    params = list(inner.parameters())
    tag_nodes, check_values = _modes(search)
    with _restored_state(inner, params), _module_hooks(search), _eager_if_compiled(compiled), _quiet_compile():
        with tag_nodes, check_values:
            loss = _loss_of(closure())
        if backward and isinstance(loss, torch.Tensor) and loss.requires_grad:
            # Even once the origin is known the backward runs, so that collectives inside it (DDP's
            # all-reduce, FSDP's reduce-scatter) meet the other ranks' replays.
            search.phase = "backward"
            search.stack.clear()
            scaled = loss if grad_scale is None else loss * grad_scale
            with check_values:
                scaled.backward() if scaled.dim() == 0 else scaled.sum().backward()
    if search.origin is None:
        return None
    return _finish(search.origin, compiled)


def _loss_of(value):
    """The loss in what the closure returned: a tensor, a model output with `.loss`, or a dict's "loss"."""
    torch = _torch()
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict) and isinstance(value.get("loss"), torch.Tensor):
        return value["loss"]
    found = getattr(value, "loss", None)
    return found if isinstance(found, torch.Tensor) else value


@contextlib.contextmanager
def _quiet_compile() -> Iterator[None]:
    """torch.compile warns that global module hooks fire once more for its wrapper; the locator knows."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*global hooks on modules.*")
        yield


def _finish(origin: dict[str, Any], compiled: bool) -> dict[str, Any]:
    origin = dict(origin)
    if isinstance(origin.get("input_max_abs"), float) and not math.isfinite(origin["input_max_abs"]):
        origin["input_max_abs"] = None
    origin["detail"] = _detail(origin, compiled)
    origin["compiled"] = compiled
    return {key: origin.get(key) for key in ORIGIN_KEYS} | {
        k: v for k, v in origin.items() if k not in ORIGIN_KEYS and v is not None
    }
