"""Where a rank is, from any stack of it: the one classifier every stack source goes through.

A py-spy dump, a faulthandler dump, a Python traceback in a log and the hang watchdog's own dumps all
become `Frame`s, innermost first; `classify_frames` says what the thread is doing (its `RankState`) and which
frame decided it, from the tables in `knowledge/frames.toml`.

On NCCL a collective is asynchronous: a rank waiting for a peer shows `torch.cuda.synchronize`,
`Event.synchronize` (or, with native frames, cudaStreamSynchronize under `.item()` / `.cpu()`) right
after the collective, not the collective itself. That state, `gpu_wait`, counts as waiting.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from torchtriage.knowledge.frames import StackKnowledge, stack_knowledge
from torchtriage.model import Frame, RankPosition, RankState, SourceKind


def _path(frame: Frame) -> str:
    return frame.file.replace("\\", "/")


def _short(frame: Frame) -> str:
    return (frame.short_file or frame.file).replace("\\", "/")


def _matches(frame: Frame, suffix: str) -> bool:
    return _path(frame).endswith(suffix) or _short(frame).endswith(suffix)


def _function(frame: Frame) -> str:
    return frame.function.rsplit(".", 1)[-1]  # "Condition.wait" -> "wait" (qualified names in 3.11+)


def innermost_user_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost Python frame in the user's code (`frames` innermost first)."""
    library = stack_knowledge().is_library_file
    return next((f for f in frames if not f.native and not library(f.file)), None)


def collective_of(frames: Sequence[Frame], known: StackKnowledge | None = None) -> tuple[str, Frame] | None:
    """The collective the user called and its frame: the outermost frame inside a known collective."""
    known = known or stack_knowledge()
    return _outermost(frames, known.collectives) or _outermost(frames, known.generic_collectives)


def all_rank_call_of(frames: Sequence[Frame]) -> str | None:
    """The call every rank must make that these frames wait inside: the outermost such library frame above the
    user's line (frames innermost first), the one the user called."""
    known = stack_knowledge()
    found = None
    for frame in frames:
        if frame.native:
            continue
        if not known.is_library_file(frame.file):
            return found
        found = known.all_rank_call(frame.file, _function(frame)) or found
    return found


def _outermost(frames: Sequence[Frame], table) -> tuple[str, Frame] | None:
    found = None
    for frame in frames:  # innermost first: keep the outermost match, the call the user made
        if frame.native:
            continue
        name = _function(frame)
        for suffixes, ops in table:
            if name in ops and any(_matches(frame, s) for s in suffixes):
                found = (ops[name], frame)
    return found


def _native_until_python(frames: Sequence[Frame]) -> list[Frame]:
    """The native frames above the innermost Python frame: what the thread is blocked in now."""
    native = []
    for frame in frames:
        if not frame.native:
            break
        native.append(frame)
    return native


BACKWARD_OP = "backward"  # the gradient collectives autograd's hooks issue inside loss.backward()


def _waiting(
    frames: Sequence[Frame], python: list[Frame], native_top: list[Frame], known: StackKnowledge, active: bool | None
):
    """A collective, Work.wait, backward's gradient collectives or a GPU wait on the stack, or None."""
    found = collective_of(python, known)
    if found:
        return RankState.COLLECTIVE, found[0], found[1]
    in_backward = _in_backward(python, known)
    if in_backward is not None and active is not True:
        # Idle inside loss.backward(): DDP's reducer waits for its all_reduces there (Work::wait under
        # Reducer::finalize_backward), FSDP's hooks for their reduce-scatters, or the engine for the device.
        return RankState.COLLECTIVE, BACKWARD_OP, in_backward
    for frame in frames:
        if frame.native and known.native_p2p_wait.match(frame.function):
            return RankState.COLLECTIVE, "send" if "Send" in frame.function else "recv", frame
        if frame.native and known.native_work_wait.match(frame.function):
            return RankState.COLLECTIVE, "Work.wait", frame
    for frame in python:
        for (suffix, function), op in known.gpu_waits.items():
            if _function(frame) == function and _matches(frame, suffix):
                return RankState.GPU_WAIT, op, frame
    for frame in native_top:
        if known.native_gpu_wait.match(frame.function):
            return RankState.GPU_WAIT, frame.function, frame
    return None


def _in_backward(python: list[Frame], known: StackKnowledge) -> Frame | None:
    suffix, functions = known.backward
    return next((f for f in python if _function(f) in functions and _matches(f, suffix)), None) if suffix else None


def _outside_wait(native: Sequence[Frame], known: StackKnowledge) -> tuple[RankState, str, Frame] | None:
    """A wait for another process outside torch.distributed's collectives, by the native frames it is in: a key
    of the job's store (another rank sets it), or a socket's bytes."""
    in_store = [frame for frame in native if known.native_store.match(frame.function)]
    if in_store:
        # The outermost store frame is the call the job made (TCPStore::get over its client's socket wait).
        call = in_store[-1].function.rsplit("::", 1)[-1]
        return RankState.STORE, f"store {call}" if call in ("get", "wait", "check") else "store", in_store[-1]
    for frame in native[:8]:
        if known.native_socket.match(frame.function):
            return RankState.BLOCKED, "socket recv", frame
    return None


def _native_only(frames: Sequence[Frame], known: StackKnowledge) -> tuple[RankState, str | None, Frame | None]:
    """A stack of native frames alone (gdb's backtrace, py-spy --native of a thread without Python): a
    wait anywhere on it decides; else a lock or a sleep at its top."""
    outside = _outside_wait(frames, known)
    if outside is not None:
        return outside
    for frame in frames:
        if known.native_p2p_wait.match(frame.function):
            return RankState.COLLECTIVE, "send" if "Send" in frame.function else "recv", frame
        if known.native_work_wait.match(frame.function):
            return RankState.COLLECTIVE, "Work.wait", frame
        if known.native_gpu_wait.match(frame.function):
            return RankState.GPU_WAIT, frame.function, frame
    for frame in frames:
        if known.native_c10d.match(frame.function):
            return RankState.COLLECTIVE, frame.function, frame
    top = [f for f in frames[:8] if not f.function.startswith(("0x", "??"))]
    for frame in top:
        if known.native_lock.match(frame.function):
            return RankState.LOCK, frame.function, frame
        if known.native_sleep.match(frame.function):
            return RankState.SLEEPING, "sleep", frame
    if not top:
        return RankState.NO_STACK, None, None  # addresses only: nothing says where it is
    return RankState.BLOCKED, top[0].function, top[0]


def classify_frames(frames: Sequence[Frame], active: bool | None) -> tuple[RankState, str | None, Frame | None]:
    """(state, op, the deciding frame) of one thread, from its frames innermost first.

    `active` is py-spy's status (False: idle in a system call); None when the source does not say (a
    traceback in a log), in which case a thread in the user's code counts as computing.
    """
    known = stack_knowledge()
    python = [f for f in frames if not f.native]
    if not python:
        return _native_only(frames, known)
    native_top = _native_until_python(frames)
    waiting = _waiting(frames, python, native_top, known, active)
    if waiting:
        return waiting
    outside = _outside_wait(native_top, known)
    if outside is not None:
        return outside
    for frame in python:
        if known.dataloader_path in _short(frame) or known.dataloader_path in _path(frame):
            fetching = not any(_function(f) in known.dataloader_waits for f in python)
            return RankState.DATALOADER, "fetching a batch" if fetching else "waiting for a worker's batch", frame
    for frame in native_top:
        if known.native_c10d.match(frame.function):
            return RankState.COLLECTIVE, frame.function, frame
    innermost = python[0]
    for suffix, functions in known.locks.items():
        if _function(innermost) in functions and _matches(innermost, suffix):
            return RankState.LOCK, innermost.function, innermost
    for frame in native_top:
        if known.native_lock.match(frame.function):
            return RankState.LOCK, "Lock.acquire" if "acquire_lock" in frame.function else frame.function, frame
    if _function(innermost) == "sleep" or any(known.native_sleep.match(f.function) for f in native_top):
        return RankState.SLEEPING, "sleep", innermost
    if active or (active is None and not known.is_library_file(innermost.file)):
        return RankState.COMPUTING, None, innermost
    if native_top or known.is_library_file(innermost.file):
        # Idle in a C call we can name (with native frames) or in library code we do not classify.
        named = next((f for f in native_top if not f.function.startswith("0x")), None)
        return RankState.BLOCKED, named.function if named else None, named or innermost
    # Idle in user code without native frames: time.sleep, or another blocking C call.
    return RankState.SLEEPING, None, innermost


def position_of(
    rank: int,
    frames: Sequence[Frame],
    *,
    active: bool | None,
    source: SourceKind,
    file: str,
    thread_name: str | None = None,
) -> RankPosition:
    """One rank's position from one thread's frames (innermost first)."""
    state, op, where = classify_frames(frames, active)
    given = group_given(frames) if state == RankState.COLLECTIVE else None
    peer = p2p_peer(frames, op) if state == RankState.COLLECTIVE and op in P2P_OPS else None
    root = collective_root(frames, op) if state == RankState.COLLECTIVE and op in ROOTED_OPS else None
    group = created_group(frames) if op == "new_group" else None
    inside = all_rank_call_of(frames) if state == RankState.COLLECTIVE else None
    return RankPosition(
        rank,
        state,
        op,
        where,
        innermost_user_frame(frames),
        source,
        file,
        thread_name,
        process_group=group,
        group_given=given,
        peer=peer,
        root=root,
        all_rank_call=inside,
    )


def created_group(frames: Sequence[Frame]) -> str | None:
    """The name of the group a rank is creating (`new_group`), from py-spy's locals: c10d names groups from one
    counter every rank advances for every group, so ranks creating groups of other names have not called
    new_group the same number of times."""
    for frame in frames:
        if frame.native or _function(frame) != "_new_process_group_helper" or not _matches(frame, _C10D):
            continue
        for local in frame.locals:
            if local.name == "group_name" and local.repr:
                return local.repr.strip().strip("'\"")
    return None


# Point-to-point ops wait for one peer, not for a group: `src` of a recv, `dst` of a send (global ranks; the
# `group_src` / `group_dst` forms are ranks of the group and are not read).
_PEER_OF = {
    "batch_isend_irecv": "",  # several peers: no one argument names them
    "send": "dst",
    "isend": "dst",
    "send_object_list": "dst",
    "recv": "src",
    "irecv": "src",
    "recv_object_list": "src",
}
P2P_OPS = frozenset(_PEER_OF)


def p2p_peer(frames: Sequence[Frame], op: str | None) -> int | None:
    name = _PEER_OF.get(op or "")
    for frame in frames:
        if frame.native or not frame.locals or _function(frame) != op:
            continue
        for local in frame.locals:
            value = (local.repr or "").strip()
            # ASCII digits, a few: py-spy quotes the process's own value ('²' is a digit to isdigit(), not to int())
            if local.name == name and value.isascii() and value.isdigit() and len(value) <= 9:
                return int(value)
    return None


# Rooted collectives: every rank of the group must name the same source or destination. The collective's own
# locals hold it (py-spy --locals, the watchdog's stacks) as the group's rank (`group_src`, `group_dst`, which
# torch 2.5+ resolves before it waits). The global `src` a caller passed is not read: ranks of different groups
# calling one line give different global roots rightly.
_ROOT_OF = {
    **dict.fromkeys(("broadcast", "broadcast_object_list", "scatter", "scatter_object_list"), ("group_src",)),
    **dict.fromkeys(("reduce", "gather", "gather_object"), ("group_dst",)),
}
ROOTED_OPS = frozenset(_ROOT_OF)


def collective_root(frames: Sequence[Frame], op: str | None) -> int | None:
    """The root a rooted collective on this stack was given, from its frame's locals; None when not shown."""
    for frame in frames:
        if frame.native or not frame.locals or _function(frame) != op or not _matches(frame, _C10D):
            continue
        values = {local.name: (local.repr or "").strip() for local in frame.locals}
        for name in _ROOT_OF[op]:
            value = values.get(name, "")
            if value.isascii() and value.isdigit() and len(value) <= 9:
                return int(value)
    return None


# torch.distributed's collectives are wrapped by c10d_logger's `_exception_logger`, whose `args` and `kwargs`
# are what the caller passed: py-spy --locals shows them (the hang watchdog their type names). The outermost
# wrapper is the user's call; an object collective calls others inside it with `group=group`, whatever it was
# given. A `group` among the keyword arguments is a group the caller chose (`group=None` is the default);
# else the positional value at the group's place in the signature, and none there is the default group.
# (The collective's own `group` local is the resolved group either way: it cannot tell.)
_WRAPPER = "c10d_logger.py"
_C10D = "torch/distributed/distributed_c10d.py"
_GROUP_KEYWORD = re.compile(r"""["']group["']\s*:\s*(?P<value>[^,}]*)""")
_NONE = ("None", "<NoneType>")  # py-spy's repr and the watchdog's type name of `group=None`
# Where `group` sits among each c10d collective's parameters (torch.distributed.distributed_c10d's signatures,
# unchanged since torch 2.0): for stacks that do not list the wrapped function's arguments (the watchdog's).
_GROUP_PLACE = {
    **dict.fromkeys(("barrier", "monitored_barrier"), 0),
    **dict.fromkeys(
        ("all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_coalesced",
         "all_gather_object", "broadcast", "broadcast_object_list", "all_to_all", "send", "recv", "isend", "irecv",
         "send_object_list", "recv_object_list", "_all_gather_base"),
        2,
    ),
    **dict.fromkeys(
        ("reduce_scatter", "reduce_scatter_tensor", "reduce", "gather", "gather_object", "scatter",
         "scatter_object_list", "_reduce_scatter_base"),
        3,
    ),
    "all_to_all_single": 4,
}  # fmt: skip
_OPENERS, _CLOSERS = "([{<", ")]}>"
_ELIDED = re.compile(r"(?:^|[,{]\s*)\.\.\.\s*}?$")  # py-spy's `{"output": <Tensor at 0x1>, ...}`


def group_given(frames: Sequence[Frame]) -> bool | None:
    """Whether the collective on this stack was given a group by its caller; None when the stack cannot say
    (no locals captured, arguments cut short, a collective outside torch.distributed)."""
    call = _user_call(frames)
    if call is None:
        return None
    wrapper, wrapped = call
    values = {local.name: local.repr or "" for local in wrapper.locals}
    if "kwargs" not in values:
        return None
    keyword = _GROUP_KEYWORD.search(values["kwargs"])
    if keyword:
        return keyword.group("value").strip() not in _NONE
    positional = _tuple_items(values.get("args", "").strip())
    if positional is None:
        return None
    place = _group_place(wrapped, len(positional))
    if place is not None and place < len(positional):
        return positional[place] not in _NONE
    if _ELIDED.search(values["kwargs"]):
        return None  # py-spy cut the keywords short: `group` may be among those it left out
    if place is None:
        return False if len(positional) <= 1 and _function(wrapped or wrapper) != "barrier" else None
    return False


def _user_call(frames: Sequence[Frame]) -> tuple[Frame, Frame | None] | None:
    """The outermost c10d wrapper with locals (the call the user made) and the function it wraps."""
    found = None
    wrapped = None
    for frame in frames:  # innermost first
        if frame.native:
            continue
        if frame.locals and _matches(frame, _WRAPPER):
            found = (frame, wrapped)
        wrapped = frame
    return found


def _group_place(wrapped: Frame | None, passed: int) -> int | None:
    """The group's index among the wrapped collective's parameters: from its arguments where the stack lists
    them (py-spy --locals), else from torch's signatures. None when unknown, or when more values were passed
    than the arguments listed (a list cut short cannot place them)."""
    if wrapped is None or not _matches(wrapped, _C10D):
        return None
    arguments = [local.name for local in wrapped.locals if local.is_argument]
    if arguments:
        if passed > len(arguments) or "group" not in arguments:
            return None
        return arguments.index("group")
    return _GROUP_PLACE.get(_function(wrapped))


def _tuple_items(text: str) -> list[str] | None:
    """The top-level items of a tuple's repr (`(<Tensor at 0x1>, [1, 2], None)`), or None where it is cut short
    (py-spy prints `(...)` for a long one) or is no tuple."""
    if len(text) < 2 or text[0] != "(" or text[-1] != ")":
        return None
    items, depth, start, quote = [], 0, 1, ""
    for at, char in enumerate(text[1:-1], start=1):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in _OPENERS:
            depth += 1
        elif char in _CLOSERS:
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:at].strip())
            start = at + 1
    last = text[start:-1].strip()
    if last:
        items.append(last)
    return None if "..." in items else items


def _in_group(position: RankPosition) -> str:
    if position.process_group is None:
        return ""
    seq = f" seq {position.seq} of" if position.seq is not None else ""
    return f" ({seq.strip()} pg {position.process_group})" if seq else f" (pg {position.process_group})"


def describe(position: RankPosition, plural: bool = False) -> str:
    """The predicate after 'rank 3': 'waits in all_reduce, called from step at train.py:63'."""
    be, wait, have = ("are", "wait", "have") if plural else ("is", "waits", "has")
    frame = position.user_frame
    if position.alike is not None and position.alike != position.rank:
        text = _described(position, be, wait, have, frame)
        return f"{text} (as rank {position.alike}'s --native dump shows at the same place)"
    return _described(position, be, wait, have, frame)


def _described(position: RankPosition, be: str, wait: str, have: str, frame) -> str:
    site = f"{frame.function} at {frame.site}" if frame else "library code"
    where = position.where.function if position.where else "?"
    op = position.op
    group = {True: " on a group its caller passed", False: " on the default group"}.get(position.group_given, "")
    if position.state == RankState.COLLECTIVE and op == BACKWARD_OP:
        op = "backward (the gradient collectives its autograd hooks issue: DDP's reducer, FSDP)"
    return {
        RankState.COLLECTIVE: f"{wait} in {op}{group}, called from {site}" + _in_group(position),
        RankState.GPU_WAIT: f"{wait} for the GPU in {op}, called from {site}",
        RankState.DATALOADER: f"{be} {op} in the DataLoader, called from {site}",
        RankState.LOCK: f"{be} blocked on a lock ({op}) in {site}",
        RankState.STORE: f"{wait} in the job's store ({op}, for a key another rank sets), called from {site}",
        RankState.SLEEPING: f"{be} sleeping in {site}"
        if op
        else f"{be} idle in {site} (time.sleep or another blocking call; a --native dump tells which)",
        RankState.BLOCKED: f"{be} blocked in {op or where}, called from {site}",
        RankState.COMPUTING: f"{be} running {site}",
        RankState.NO_STACK: f"{have} no Python stack in {position.thread_name or 'the main thread'}",
        RankState.BETWEEN: f"{be} between collectives (its last, {op}, completed)",
    }[position.state]
