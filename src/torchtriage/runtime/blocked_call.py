"""Which C call a Python frame is blocked in, read from the frame itself: what `py-spy --native` would show.

A thread blocked in a C function shows only the Python line that called it: `store.get(key)`, `sock.recv(n)`,
`time.sleep(s)`, `lock.acquire()`, `work.wait()`, `loss.item()` all look like "idle in the job's own line". The
hang watchdog runs inside the rank and can see more without stopping anything: the instruction the frame
stopped at names the method, and the object it was called on is in the frame's locals or globals. Only the
object's type is looked at (and attributes read statically, so no property runs): never its repr, never a
method call.

The answer is a native frame as py-spy prints it (`c10d::TCPStore::get`, `sock_recv`, `time_sleep`,
`lock_PyThread_acquire_lock`, `c10d::Work::wait`, `at::native::_local_scalar_dense`), so the one stack
classifier (`analysis/positions.py`, `knowledge/frames.toml`) reads it like any other.
"""

from __future__ import annotations

import builtins
import dis
import inspect
import socket
import time
from types import FrameType

_LOCAL_LOADS = ("LOAD_FAST", "LOAD_DEREF", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "LOAD_CLOSURE")
_GLOBAL_LOADS = ("LOAD_GLOBAL", "LOAD_NAME")
_METHOD_LOADS = ("LOAD_METHOD", "LOAD_ATTR")
_WITH = ("BEFORE_WITH", "SETUP_WITH")
_LOOK_BACK = 8  # instructions between the call and the load of its callee (its arguments' loads)

_SOCKET_READS = {"recv": "sock_recv", "recv_into": "sock_recv_into", "recvfrom": "sock_recvfrom",
                 "recvfrom_into": "sock_recvfrom", "recvmsg": "sock_recvmsg", "accept": "sock_accept"}  # fmt: skip
_GPU_READS = ("item", "cpu", "tolist", "numpy")  # on a CUDA tensor, each waits for the device


def blocked_call(frame: FrameType) -> tuple[str, str] | None:
    """(native symbol, its source file) of the C call `frame` is blocked in, or None when it cannot tell."""
    try:
        instructions = list(dis.get_instructions(frame.f_code))
        at = next(i for i, ins in enumerate(instructions) if ins.offset >= frame.f_lasti)
        if instructions[at].opname in _WITH:
            owner = _value(frame, instructions, at - 1)
            return _lock_call(owner, "acquire")
        callee = _callee(instructions, at)
        if callee is not None:
            ins = instructions[callee]
            if ins.opname in _METHOD_LOADS and isinstance(ins.argval, str):
                return _method_call(_value(frame, instructions, callee - 1), ins.argval)
            if ins.opname in _GLOBAL_LOADS and callable(function := _global(frame, ins.argval)):
                return _function_call(function)
            return None
        for j in range(at, max(at - _LOOK_BACK, -1), -1):
            ins = instructions[j]
            if ins.opname in _METHOD_LOADS and isinstance(ins.argval, str):
                return _method_call(_value(frame, instructions, j - 1), ins.argval)
            if ins.opname in _GLOBAL_LOADS and callable(callee := _global(frame, ins.argval)):
                return _function_call(callee)
    except Exception:  # noqa: BLE001 - an unusual frame or code object: nothing is said about it
        return None
    return None


_CALLS = {"CALL": 0, "CALL_METHOD": 0, "CALL_FUNCTION": 0, "CALL_FUNCTION_KW": 1}  # extra values: 3.10's names
_BEFORE_CALL = ("PRECALL", "KW_NAMES", "CACHE")  # between a call's arguments and the call (3.11)


def _callee(instructions: list, at: int) -> int | None:
    """The index of the instruction that loads the callee of the call at `at`: walking back over its
    arguments by their net stack effects (an argument may be an attribute, `store.get(a.key)`, or a call
    itself), the instruction before them. None where `at` is no call or the walk leaves the code."""
    call = instructions[at]
    if call.opname not in _CALLS or call.arg is None:
        return None
    pending = call.arg + _CALLS[call.opname]  # values on the stack above the callee
    j = at - 1
    while j >= 0 and instructions[j].opname in _BEFORE_CALL:
        j -= 1
    while j >= 0 and pending > 0:
        ins = instructions[j]
        pending -= dis.stack_effect(ins.opcode, ins.arg if ins.opcode >= dis.HAVE_ARGUMENT else None, jump=False)
        j -= 1
    return j if pending == 0 and j >= 0 else None


_NOTHING = object()


def _value(frame: FrameType, instructions: list, j: int):
    """The object the instruction at j loads: a local, a global, or one attribute of either (read statically)."""
    if j < 0:
        return _NOTHING
    ins = instructions[j]
    if ins.opname in _LOCAL_LOADS:
        return frame.f_locals.get(ins.argval, _NOTHING)
    if ins.opname in _GLOBAL_LOADS:
        return _global(frame, ins.argval)
    if ins.opname == "LOAD_ATTR" and isinstance(ins.argval, str) and j > 0:
        owner = _value(frame, instructions, j - 1)
        return inspect.getattr_static(owner, ins.argval, _NOTHING) if owner is not _NOTHING else _NOTHING
    return _NOTHING


def _global(frame: FrameType, name: str):
    return frame.f_globals.get(name, getattr(builtins, name, _NOTHING))


def _method_call(owner, method: str) -> tuple[str, str] | None:
    if owner is _NOTHING:
        return None
    if owner is time and method == "sleep":
        return "time_sleep", "timemodule.c"
    kind = type(owner)
    module = getattr(kind, "__module__", "") or ""
    names = {k.__name__ for k in kind.__mro__}
    if module.startswith("torch") and "Work" in names and method in ("wait", "synchronize"):
        return f"c10d::Work::{method}", "Work.cpp"
    if module.startswith("torch") and any(n.endswith("Store") for n in names):
        return f"c10d::{kind.__name__}::{method}", "Store.cpp"
    if isinstance(owner, socket.socket) and method in _SOCKET_READS:
        return _SOCKET_READS[method], "socketmodule.c"
    if method in _GPU_READS and "Tensor" in names and getattr(owner, "is_cuda", False) is True:
        return "at::native::_local_scalar_dense", "Scalar.cpp"
    return _lock_call(owner, method)


def _lock_call(owner, method: str) -> tuple[str, str] | None:
    kind = type(owner).__name__
    if method == "acquire" and kind in ("lock", "RLock", "Lock", "_RLock"):
        return "lock_PyThread_acquire_lock", "_threadmodule.c"
    return None


def _function_call(callee) -> tuple[str, str] | None:
    if callee is time.sleep:
        return "time_sleep", "timemodule.c"
    return None
