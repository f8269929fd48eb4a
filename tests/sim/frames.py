"""The frames a real job shows: torch's own frames above the job's, for each op and each place a thread
waits, and the native frames `py-spy --native` adds. File paths and line numbers are torch 2.13's
(`torch/distributed/distributed_c10d.py` and friends) as they appear in real dumps; the job's frames
come from its `Site`."""

from __future__ import annotations

from .program import BACKWARD, FORWARD_HOOK, Action, Site

TORCH = "/opt/venv/lib/python3.11/site-packages/torch"
PYTHON_LIB = "/usr/lib/python3.11"
C10D = f"{TORCH}/distributed/distributed_c10d.py"
LOGGER = (("wrapper", f"{TORCH}/distributed/c10d_logger.py", 83),)

# The frames of each call inside torch, innermost first (the c10d_logger wrapper is added after them).
_CALL = {
    "all_reduce": (("all_reduce", C10D, 3245),),
    "broadcast": (("broadcast", C10D, 3145),),
    "all_gather_into_tensor": (("all_gather_into_tensor", C10D, 4413),),
    "reduce_scatter_tensor": (("reduce_scatter_tensor", C10D, 5043),),
    "all_to_all_single": (("all_to_all_single", C10D, 5131),),
    "barrier": (("barrier", C10D, 5349),),
    "send": (("isend", C10D, 2652), ("send", C10D, 2753)),
    "recv": (("irecv", C10D, 2709), ("recv", C10D, 2799)),
}
_OBJECT = (
    (("all_gather", C10D, 4280),) + LOGGER + (("all_gather_object", C10D, 3513),),
    (("all_gather", C10D, 4280),) + LOGGER + (("all_gather_object", C10D, 3525),),
)
_BATCH_OP = {"send": ("isend", C10D, 2652), "recv": ("irecv", C10D, 2709)}
_BATCH = (("batch_isend_irecv", C10D, 3053),)
_COALESCED = (
    ("_coalescing_manager", C10D, 2885),
    ("__exit__", f"{PYTHON_LIB}/contextlib.py", 144),
    ("batch_isend_irecv", C10D, 3051),
)
# DDP's reducer and FSDP's post-backward hooks run inside the autograd engine, called from loss.backward().
BACKWARD_FRAMES = (
    ("_engine_run_backward", f"{TORCH}/autograd/graph.py", 979),
    ("backward", f"{TORCH}/autograd/__init__.py", 395),
    ("backward", f"{TORCH}/_tensor.py", 623),
)
FORWARD_HOOK_FRAMES = (
    ("unshard", f"{TORCH}/distributed/fsdp/_fully_shard/_fsdp_param_group.py", 285),
    ("pre_forward", f"{TORCH}/distributed/fsdp/_fully_shard/_fsdp_state.py", 230),
    ("_call_impl", f"{TORCH}/nn/modules/module.py", 1840),
    ("_wrapped_call_impl", f"{TORCH}/nn/modules/module.py", 1773),
)

Frame = tuple[str, str, int]  # (function, file, line); line 0: a native frame, file its library


def call_frames(action: Action, part: int = 0, in_batch: str | None = None) -> list[Frame]:
    """The Python frames of the call that issued `action`, innermost first, down to the job's entry."""
    user = action.site.frames()
    if action.via == BACKWARD:
        return [*BACKWARD_FRAMES, *user]
    hook = list(FORWARD_HOOK_FRAMES) if action.via == FORWARD_HOOK else []
    if in_batch is not None:
        return [_BATCH_OP[in_batch], *_BATCH, *hook, *user]
    if action.kind == "batch":
        return [*_COALESCED, *hook, *user]
    if action.kind == "all_gather_object":
        return [*_OBJECT[part], *LOGGER, *hook, *user]
    return [*_CALL[action.kind], *LOGGER, *hook, *user]


def blocked_frames(action: Action, part: int = 0) -> list[Frame]:
    """The Python frames of a thread blocked until the op `action` issued completes: a blocking send or recv
    waits in `send`/`recv` itself (its isend/irecv returned the work); a batch's works are waited for by the
    job's own code (`for work in batch_isend_irecv(ops): work.wait()`), so no frame of torch's is left."""
    frames = call_frames(action, part)
    if action.via == BACKWARD:
        return frames
    if action.kind in ("send", "recv"):
        return frames[1:]
    if action.kind == "batch":
        return frames[len(_COALESCED) :]
    return frames


# Where a thread waits outside torch.distributed: the Python frames above the job's, and the native ones.
_WAITS: dict[str, tuple[tuple[Frame, ...], tuple[str, ...], bool]] = {
    # kind: (Python frames, native symbols innermost first, active)
    "sleep": ((), ("clock_nanosleep", "__nanosleep", "pysleep", "time_sleep"), False),
    "compute": ((("_compute", "/srv/job/train.py", 612),), ("at::native::addmm_out_cpu",), True),
    "lock": (
        (),
        (
            "do_futex_wait",
            "__new_sem_wait_slow64",
            "PyThread_acquire_lock_timed",
            "acquire_timed",
            "lock_PyThread_acquire_lock",
        ),
        False,
    ),  # fmt: skip
    "join": (
        (("_wait_for_tstate_lock", f"{PYTHON_LIB}/threading.py", 1119), ("join", f"{PYTHON_LIB}/threading.py", 1096)),
        ("do_futex_wait", "PyThread_acquire_lock_timed", "lock_PyThread_acquire_lock"),
        False,
    ),  # fmt: skip
    "queue": (
        (("wait", f"{PYTHON_LIB}/threading.py", 327), ("get", f"{PYTHON_LIB}/queue.py", 171)),
        ("do_futex_wait", "PyThread_acquire_lock_timed", "lock_PyThread_acquire_lock"),
        False,
    ),
    "socket": ((), ("__libc_recv", "recv", "sock_recv_impl", "sock_call_ex", "sock_recv"), False),
    "dataloader": (
        (
            ("wait", f"{PYTHON_LIB}/threading.py", 331),
            ("get", f"{PYTHON_LIB}/queue.py", 180),
            ("_try_get_data", f"{TORCH}/utils/data/dataloader.py", 1133),
            ("_get_data", f"{TORCH}/utils/data/dataloader.py", 1294),
            ("_next_data", f"{TORCH}/utils/data/dataloader.py", 1332),
            ("__next__", f"{TORCH}/utils/data/dataloader.py", 733),
        ),
        ("do_futex_wait", "PyThread_acquire_lock_timed", "lock_PyThread_acquire_lock"),
        False,
    ),
    "store": (
        (),
        ("__libc_recv", "c10d::detail::TCPClient::receiveBits", "c10d::TCPStore::doGet", "c10d::TCPStore::get"),
        False,
    ),
    "sync": (
        (("synchronize", f"{TORCH}/cuda/__init__.py", 1219),),
        ("cudaStreamSynchronize", "c10::cuda::device_synchronize"),
        False,
    ),
    "item": ((), ("cudaStreamSynchronize", "at::native::_local_scalar_dense_cuda", "at::_ops::item::call"), False),
    "gloo_wait": ((), ("c10d::ProcessGroupGloo::AsyncWork::wait",), False),
    "nccl_init": (
        (),
        ("ncclCommInitRankConfig", "c10d::NCCLComm::create", "c10d::ProcessGroupNCCL::initNCCLComm"),
        False,
    ),  # fmt: skip
    # NCCL's runtime connection of an algorithm, inside the op's launch: waiting for the peers' details.
    "nccl_connect": (
        (),
        (
            "bootstrapRecv",
            "ncclTransportP2pSetup",
            "ncclPrepareTasks",
            "ncclGroupEndInternal",
            "c10d::ProcessGroupNCCL::collective",
        ),
        False,
    ),
    "backward_wait": (
        (),
        (
            "c10d::ProcessGroupGloo::AsyncWork::wait",
            "c10d::Reducer::finalize_backward",
            "torch::autograd::Engine::execute",
        ),
        False,
    ),  # fmt: skip
}


def waiting_frames(kind: str, site: Site) -> tuple[list[Frame], list[str], bool]:
    """(Python frames innermost first, native symbols innermost first, active) of a thread waiting in `kind`
    called from `site`."""
    python, native, active = _WAITS[kind]
    return [*python, *site.frames()], list(native), active


def short(file: str) -> str:
    """py-spy's short form of a file name: from the package, or the script's own name."""
    for prefix in (TORCH.rsplit("/", 1)[0] + "/", PYTHON_LIB + "/"):
        if file.startswith(prefix):
            return file[len(prefix) :]
    return file.rsplit("/", 1)[-1]
