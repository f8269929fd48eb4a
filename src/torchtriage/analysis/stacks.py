"""Where each rank of a hung job is, from its py-spy stack, and which rank is not where the others wait.

A hang is almost always a collective mismatch: the healthy ranks wait in one collective, and the
culprit is elsewhere — in no collective at all (sleeping, stuck in a data loader, deadlocked on a
lock), or in a different collective or the same one called from another line (often another process
group). Each rank's main thread gets a state; ranks are grouped by state and call site; the culprit
is the rank, or the minority, outside the waiting majority. With two ranks in two different
collectives nothing says which one departed, and this says so rather than guess; no rank is ever
blamed for being rank 0.

On NCCL a collective is asynchronous: a rank waiting for a peer shows `torch.cuda.synchronize`,
`Event.synchronize` (or, with --native, cudaStreamSynchronize under `.item()` / `.cpu()`) right
after the collective, not the collective itself. That state, `gpu_wait`, counts as waiting.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from torchtriage.analysis.ranks import format_ranks
from torchtriage.model import Action, Evidence, Finding, Verdict
from torchtriage.sources.pyspy import ProcessStack, StackFrame, ThreadStack

COLLECTIVE = "collective"  # inside a c10d collective or p2p op (or Work.wait)
GPU_WAIT = "gpu_wait"  # waiting for the GPU, typically right after an asynchronous collective
DATALOADER = "dataloader"  # waiting for, or fetching, a DataLoader batch
LOCK = "lock"  # blocked on a lock, condition, event, queue or thread join
SLEEPING = "sleeping"  # time.sleep, or idle in user code in a C call py-spy cannot see without --native
BLOCKED = "blocked"  # idle in a system call that is none of the above (I/O, a socket)
COMPUTING = "computing"  # active: running Python or C code
NO_STACK = "no_stack"  # no main thread, or no Python frame in it
WAITING_STATES = (COLLECTIVE, GPU_WAIT)

# --- classification tables: data, because upstream renames functions -------------------------------

# c10d front-end functions -> the collective's canonical name. The outermost match is what the user called.
_C10D_FILES = ("torch/distributed/distributed_c10d.py", "torch/distributed/_functional_collectives.py")
_C10D_OPS = {
    name: name
    for name in (
        "all_reduce",
        "all_reduce_coalesced",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_coalesced",
        "all_gather_object",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "monitored_barrier",
        "all_to_all",
        "all_to_all_single",
        "reduce",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "send",
        "recv",
        "isend",
        "irecv",
        "batch_isend_irecv",
        "send_object_list",
        "recv_object_list",
        "new_group",
        "new_subgroups",
        "wait_tensor",
    )
} | {"_all_gather_base": "all_gather_into_tensor", "_reduce_scatter_base": "reduce_scatter_tensor"}
# Other torch helpers that are collectives (DDP's construction-time broadcasts).
_OTHER_COLLECTIVES = {
    ("torch/distributed/utils.py", "_verify_param_shape_across_processes"): "all_gather",
    ("torch/distributed/utils.py", "_sync_module_states"): "broadcast",
    ("torch/distributed/utils.py", "_sync_params_and_buffers"): "broadcast",
}
_NATIVE_WORK_WAIT = re.compile(r"^c10d::.*Work\w*::(wait|synchronize)")
_NATIVE_C10D = re.compile(r"^(c10d|gloo)::")

_GPU_SYNC_PY = {
    ("torch/cuda/__init__.py", "synchronize"): "torch.cuda.synchronize",
    ("torch/cuda/streams.py", "synchronize"): "Stream/Event.synchronize",
    ("torch/cuda/streams.py", "wait"): "Event.wait",
    ("torch/cuda/streams.py", "query"): "Stream/Event.query",
}
_GPU_SYNC_NATIVE = re.compile(
    r"^(cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|cuCtxSynchronize|cuStreamSynchronize"
    r"|cuEventSynchronize|cudaMemcpy\w*|cuMemcpy\w*|c10::cuda::device_synchronize|at::native::_local_scalar_dense"
    r"|hipDeviceSynchronize|hipStreamSynchronize|hipMemcpy\w*)"
)
_DATALOADER_FILE = "torch/utils/data/"
_DATALOADER_WAIT = {"_next_data", "_get_data", "_try_get_data"}

_LOCK_PY = {
    "threading.py": {"acquire", "wait", "wait_for", "join", "_wait_for_tstate_lock"},
    "queue.py": {"get", "put", "join"},
    "multiprocessing/synchronize.py": {"acquire", "wait", "__enter__"},
    "concurrent/futures/_base.py": {"result", "wait", "exception"},
}
_LOCK_NATIVE = re.compile(
    r"^(lock_PyThread_acquire_lock|rlock_acquire|PyThread_acquire_lock\w*|pthread_mutex_(timed)?lock"
    r"|__lll_lock_wait\w*|sem_wait|sem_timedwait|sem_clock_wait|do_futex_wait\w*|acquire_timed)"
)
_SLEEP_NATIVE = re.compile(r"^(clock_nanosleep|__clock_nanosleep\w*|nanosleep|__nanosleep|usleep|time_sleep|pysleep)$")

# Top-level packages that are libraries when py-spy prints short file names (the text form).
KNOWN_LIBRARIES = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "torchdata",
        "triton",
        "numpy",
        "transformers",
        "accelerate",
        "deepspeed",
        "lightning",
        "pytorch_lightning",
        "lightning_fabric",
        "apex",
        "datasets",
        "safetensors",
        "huggingface_hub",
        "tqdm",
        "wandb",
        "fsspec",
        "multiprocess",
        "ray",
        "pytest",
        "_pytest",
        "pluggy",
        "importlib_metadata",
        "typing_extensions",
    }
)
_STDLIB = frozenset(sys.stdlib_module_names)
_LIBRARY_PATH = re.compile(r"/(site|dist)-packages/|/lib/python\d\.\d+/|/torch/")


def is_library_file(path: str) -> bool:
    """Library code: site-/dist-packages, the standard library, torch; else the user's code.

    Full paths (JSON, `--full-filenames`) are judged by their directories; py-spy's short names
    (`torch/cuda/__init__.py`, `threading.py`) by their top-level package.
    """
    if path.startswith("<"):
        return True  # <frozen importlib._bootstrap>, <string> ...
    if path.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", path):
        return bool(_LIBRARY_PATH.search(path.replace("\\", "/")))
    top = re.split(r"[\\/]", path, maxsplit=1)[0]
    top = top[:-3] if top.endswith(".py") else top
    return top in _STDLIB or top in KNOWN_LIBRARIES


def _short(frame: StackFrame) -> str:
    return (frame.short_file or frame.file).replace("\\", "/")


def _matches(frame: StackFrame, suffix: str) -> bool:
    path = frame.file.replace("\\", "/")
    return path.endswith(suffix) or _short(frame).endswith(suffix)


def _function(frame: StackFrame) -> str:
    return frame.function.rsplit(".", 1)[-1]  # "Condition.wait" -> "wait" (qualified names in 3.11+)


# --- per rank -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankPosition:
    """Where one rank's main thread is."""

    rank: int
    state: str  # one of COLLECTIVE, GPU_WAIT, DATALOADER, LOCK, SLEEPING, BLOCKED, COMPUTING, NO_STACK
    op: str | None  # the collective ("all_reduce") or the wait ("torch.cuda.synchronize"), else None
    where: StackFrame | None  # the frame that decided the state
    user_frame: StackFrame | None  # the innermost frame in user code
    source: str  # the dump file
    thread_name: str | None = None

    @property
    def waiting(self) -> bool:
        return self.state in WAITING_STATES

    @property
    def signature(self) -> tuple:
        """Ranks with equal signatures are at the same place: same state, op and call site."""
        # py-spy's short name, so text and JSON dumps of different ranks still group together.
        site = (_short(self.user_frame), self.user_frame.line) if self.user_frame else None
        return (self.state, self.op, site)

    def describe(self, plural: bool = False) -> str:
        """The predicate after 'rank 3': 'waits in all_reduce, called from step at train.py:63'."""
        be, wait, have = ("are", "wait", "have") if plural else ("is", "waits", "has")
        frame = self.user_frame
        site = f"{frame.function} at {_site(frame)}" if frame else "library code"
        where = self.where.function if self.where else "?"
        return {
            COLLECTIVE: f"{wait} in {self.op}, called from {site}",
            GPU_WAIT: f"{wait} for the GPU in {self.op}, called from {site}",
            DATALOADER: f"{be} {self.op} in the DataLoader, called from {site}",
            LOCK: f"{be} blocked on a lock ({self.op}) in {site}",
            SLEEPING: f"{be} sleeping in {site}"
            if self.op
            else f"{be} idle in {site} (time.sleep or another blocking call; a --native dump tells which)",
            BLOCKED: f"{be} blocked in {self.op or where}, called from {site}",
            COMPUTING: f"{be} running {site}",
            NO_STACK: f"{have} no Python stack in {self.thread_name or 'the main thread'}",
        }[self.state]


def _site(frame: StackFrame) -> str:
    return f"{_short(frame)}:{frame.line}" if frame.line else _short(frame)


def innermost_user_frame(thread: ThreadStack) -> StackFrame | None:
    return next((f for f in thread.python_frames if not is_library_file(f.file)), None)


def _collective(frames: tuple[StackFrame, ...]) -> tuple[str, StackFrame] | None:
    found = None
    for frame in frames:  # innermost first: keep the outermost match, the call the user made
        name = _function(frame)
        if any(_matches(frame, f) for f in _C10D_FILES) and name in _C10D_OPS:
            found = (_C10D_OPS[name], frame)
        for (suffix, function), op in _OTHER_COLLECTIVES.items():
            if name == function and _matches(frame, suffix):
                found = (op, frame)
    return found


def _native_until_python(thread: ThreadStack) -> list[StackFrame]:
    """The native frames above the innermost Python frame: what the thread is blocked in now."""
    frames = []
    for frame in thread.frames:
        if not frame.native:
            break
        frames.append(frame)
    return frames


def classify_thread(thread: ThreadStack | None) -> tuple[str, str | None, StackFrame | None]:
    """(state, op, the deciding frame) of one thread."""
    if thread is None or not thread.python_frames:
        return NO_STACK, None, None
    python = thread.python_frames
    native_top = _native_until_python(thread)

    found = _collective(python)
    if found:
        return COLLECTIVE, found[0], found[1]
    for frame in thread.frames:
        if frame.native and _NATIVE_WORK_WAIT.match(frame.function):
            return COLLECTIVE, "Work.wait", frame
    for frame in python:
        for (suffix, function), op in _GPU_SYNC_PY.items():
            if _function(frame) == function and _matches(frame, suffix):
                return GPU_WAIT, op, frame
    for frame in native_top:
        if _GPU_SYNC_NATIVE.match(frame.function):
            return GPU_WAIT, frame.function, frame
    for frame in python:
        if _DATALOADER_FILE in _short(frame) or _DATALOADER_FILE in frame.file.replace("\\", "/"):
            waiting = any(_function(f) in _DATALOADER_WAIT for f in python)
            return DATALOADER, "waiting for a worker's batch" if waiting else "fetching a batch", frame
    for frame in native_top:
        if _NATIVE_C10D.match(frame.function):
            return COLLECTIVE, frame.function, frame
    innermost = python[0]
    for suffix, functions in _LOCK_PY.items():
        if _function(innermost) in functions and _matches(innermost, suffix):
            return LOCK, innermost.function, innermost
    for frame in native_top:
        if _LOCK_NATIVE.match(frame.function):
            return LOCK, "Lock.acquire" if "acquire_lock" in frame.function else frame.function, frame
    if _function(innermost) == "sleep" or any(_SLEEP_NATIVE.match(f.function) for f in native_top):
        return SLEEPING, "sleep", innermost
    if thread.active:
        return COMPUTING, None, innermost
    if native_top or is_library_file(innermost.file):
        # Idle in a C call we can name (with --native) or in library code we do not classify.
        named = next((f for f in native_top if not f.function.startswith("0x")), None)
        return BLOCKED, named.function if named else None, named or innermost
    # Idle in user code without native frames: time.sleep, or another blocking C call.
    return SLEEPING, None, innermost


def rank_position(rank: int, process: ProcessStack) -> RankPosition:
    thread = process.main_thread()
    state, op, where = classify_thread(thread)
    user = innermost_user_frame(thread) if thread else None
    return RankPosition(rank, state, op, where, user, process.source, thread.name if thread else None)


def positions(dumps: Mapping[int, ProcessStack]) -> dict[int, RankPosition]:
    """Each rank's position, from rank -> its py-spy dump."""
    return {rank: rank_position(rank, dumps[rank]) for rank in sorted(dumps)}


# --- across ranks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StackGroup:
    ranks: tuple[int, ...]
    position: RankPosition  # the lowest rank's, standing for all

    def describe(self) -> str:
        return f"{format_ranks(list(self.ranks))} {self.position.describe(plural=len(self.ranks) > 1)}"


@dataclass
class StackAnalysis:
    positions: dict[int, RankPosition]
    groups: list[StackGroup]  # largest first
    findings: list[Finding]
    culprit_ranks: list[int]
    confidence: str  # "high" | "medium" | "low"


def group_positions(found: Mapping[int, RankPosition]) -> list[StackGroup]:
    by_signature: dict[tuple, list[int]] = {}
    for rank in sorted(found):
        by_signature.setdefault(found[rank].signature, []).append(rank)
    groups = [StackGroup(tuple(ranks), found[ranks[0]]) for ranks in by_signature.values()]
    return sorted(groups, key=lambda g: (-len(g.ranks), g.ranks))


_MAX_EVIDENCE = 8


def _evidence(position: RankPosition) -> list[Evidence]:
    frames = [position.user_frame] if position.user_frame else []
    if position.where is not None and position.where is not position.user_frame:
        frames.insert(0, position.where)
    return [Evidence("pyspy", position.source, f.dump_line, position.rank, f.text) for f in frames]


def _group_evidence(groups: list[StackGroup]) -> list[Evidence]:
    evidence = []
    for group in groups:
        evidence += _evidence(group.position)
    return evidence[:_MAX_EVIDENCE]


def _groups_text(groups: list[StackGroup]) -> str:
    return "; ".join(g.describe() for g in groups)


def analyze_stacks(dumps: Mapping[int, ProcessStack]) -> StackAnalysis:
    """Findings from every rank's stack: `not_in_collective`, `different_collective`, `stack_groups`."""
    return analyze_positions(positions(dumps))


def analyze_positions(found: Mapping[int, RankPosition]) -> StackAnalysis:
    found = dict(sorted(found.items()))
    groups = group_positions(found)
    waiting = [g for g in groups if g.position.waiting]
    elsewhere = [g for g in groups if not g.position.waiting]
    waiting_ranks = sorted(r for g in waiting for r in g.ranks)
    elsewhere_ranks = sorted(r for g in elsewhere for r in g.ranks)
    findings: list[Finding] = []
    culprits: list[int] = []
    confidence = "low"

    if waiting and elsewhere and len(elsewhere_ranks) <= len(waiting_ranks):
        # The ranks the others wait for are not in any collective.
        culprits = elsewhere_ranks
        confidence = "high" if len(waiting_ranks) >= 2 and len(elsewhere_ranks) < len(waiting_ranks) else "medium"
        findings.append(
            Finding(
                "not_in_collective",
                culprits,
                f"{format_ranks(culprits)} {'is' if len(culprits) == 1 else 'are'} in no collective while the "
                f"others wait: {_groups_text(elsewhere)}; {_groups_text(waiting)}",
                role="primary",
                category="hang",
                evidence=[e for g in elsewhere for e in _evidence(g.position)][:_MAX_EVIDENCE]
                + _group_evidence(waiting)[:2],
            )
        )
        if len(waiting) > 1:
            findings.append(_disagreement(waiting, decided=False))
    elif len(waiting) > 1 and not elsewhere:
        largest, runner_up = len(waiting[0].ranks), len(waiting[1].ranks)
        if largest > runner_up and largest >= 2:
            culprits = sorted(r for g in waiting[1:] for r in g.ranks)
            confidence = "high" if largest > len(found) / 2 else "medium"
            findings.append(_disagreement(waiting, decided=True, culprits=culprits))
        else:
            findings.append(_disagreement(waiting, decided=False))
    findings.append(_stack_groups(groups, found, waiting_ranks, elsewhere_ranks))
    return StackAnalysis(found, groups, findings, culprits, confidence)


def _disagreement(waiting: list[StackGroup], decided: bool, culprits: list[int] | None = None) -> Finding:
    ops = {g.position.op for g in waiting}
    how = "different collectives" if len(ops) > 1 else f"{next(iter(ops))} called from different lines"
    if not decided:
        why = "the stacks alone cannot say which side departed; the flight recorder's sequence numbers or the logs can"
        ranks = sorted(r for g in waiting for r in g.ranks)
        return Finding(
            "different_collective",
            ranks,
            f"The ranks wait in {how}: {_groups_text(waiting)}; {why}",
            role="symptom",
            category="hang",
            evidence=_group_evidence(waiting),
        )
    majority, minority = waiting[0], waiting[1:]
    if len(ops) == 1:
        how = "the same collective called from another line (often another process group)"
    else:
        how = "a different collective, or one called from another line,"
    return Finding(
        "different_collective",
        culprits or [],
        f"{_groups_text(minority)}: {how} than the others; {majority.describe()}",
        role="primary",
        category="hang",
        evidence=[e for g in minority for e in _evidence(g.position)][:_MAX_EVIDENCE] + _evidence(majority.position),
    )


def _stack_groups(
    groups: list[StackGroup], found: Mapping[int, RankPosition], waiting: list[int], elsewhere: list[int]
) -> Finding:
    if not found:
        message = "No rank's stack was read"
    elif not waiting:
        message = f"No rank waits in a collective: {_groups_text(groups)}; this does not look like a collective hang"
    elif waiting and elsewhere and len(elsewhere) > len(waiting):
        message = (
            f"Most ranks are not in a collective ({_groups_text(groups)}): the job may still be running; "
            "dump again in a few seconds to see who stays put"
        )
    elif len(groups) == 1:
        message = (
            f"All ranks are at the same place: {_groups_text(groups)}; the stacks cannot tell which rank is "
            "behind (the flight recorder's sequence numbers can)"
        )
    else:
        message = f"{len(groups)} stack groups: {_groups_text(groups)}"
    return Finding(
        "stack_groups", sorted(found), message, role="symptom", category="hang", evidence=_group_evidence(groups)
    )


def stacks_verdict(analysis: StackAnalysis) -> Verdict:
    """A `hang` verdict from the stacks alone, for `diagnose` to fuse with logs and the flight recorder."""
    primary = [f for f in analysis.findings if f.role == "primary"]
    summary = primary[0].message if primary else analysis.findings[0].message if analysis.findings else ""
    facts: dict = {
        "state_by_rank": {str(r): p.state for r, p in analysis.positions.items()},
        "collective_by_rank": {str(r): p.op for r, p in analysis.positions.items() if p.state == COLLECTIVE},
        "stack_groups": [
            {
                "ranks": list(g.ranks),
                "state": g.position.state,
                "op": g.position.op,
                "frame": g.position.user_frame.text if g.position.user_frame else None,
            }
            for g in analysis.groups
        ],
    }
    actions = []
    culprit = next((analysis.positions[r] for r in analysis.culprit_ranks if analysis.positions[r].user_frame), None)
    if culprit:
        frame = culprit.user_frame
        facts["user_frame"] = {"file": frame.file, "line": frame.line, "function": frame.function, "rank": culprit.rank}
        actions.append(
            Action(
                "culprit",
                f"Look at rank {culprit.rank}'s {frame.function} at {_site(frame)}",
                f"Rank {culprit.rank} {culprit.describe()} while its peers wait for it; that line decides "
                "whether it skipped, reordered or never reached the collective the others are in.",
            )
        )
    return Verdict(
        category="hang",
        culprit_ranks=list(analysis.culprit_ranks),
        summary=summary,
        confidence=analysis.confidence,
        findings=list(analysis.findings),
        actions=actions,
        facts=facts,
        sources=["pyspy"],
    )
