"""The shared vocabulary of a diagnosis: what a source says, what an analysis finds, and the verdict.

One name for one concept, everywhere:

- `Frame` is one frame of a stack, whoever printed it: a Python traceback in a log, py-spy, a
  faulthandler dump, the flight recorder's call sites, the hang watchdog's own dumps.
- `RankPosition` is where one rank is: its state (in a collective, waiting for the GPU, in the data
  loader, ...), the op and process group it waits in, the frame that decided it and the user's line.
- `Finding` is one thing an analyzer found, with the ranks it is about, its evidence and facts;
  `Verdict` is what fusion makes of all findings. Every `Action` comes from the knowledge base.

The JSON form of a verdict (`Verdict.to_json`) is a public, versioned interface: add keys freely, but
never rename or remove one without bumping `SCHEMA`. The enums below are `str`s, so they compare with
and serialise as their plain values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

SCHEMA = "torchtriage.verdict/1"


class _Vocabulary(str, Enum):
    """A closed set of names that is also a plain string (in comparisons, f-strings and JSON)."""

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


class Category(_Vocabulary):
    """What kind of failure a verdict or finding is about."""

    HANG = "hang"
    NCCL_TIMEOUT = "nccl_timeout"
    OOM = "oom"
    NAN_INF = "nan_inf"
    DEEPEP = "deepep"
    NCCL_TRANSPORT = "nccl_transport"
    GPU_FAULT = "gpu_fault"
    RENDEZVOUS = "rendezvous"
    HOST_OOM = "host_oom"
    ENVIRONMENT = "environment"
    USAGE = "usage"
    STRAGGLER = "straggler"
    UNKNOWN = "unknown"  # nothing recognised: not a sign of health
    OK = "ok"  # a check that read everything and found it healthy (a snapshot, traces, NVLink)


class Role(_Vocabulary):
    """How much a finding explains, from most to least: a root cause in itself, a failure whose cause
    may lie elsewhere, or the aftermath of another rank's failure."""

    PRIMARY = "primary"
    SYMPTOM = "symptom"
    COLLATERAL = "collateral"


class Confidence(_Vocabulary):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"

    def lowered(self) -> Confidence:
        order = list(Confidence)
        return order[max(0, order.index(self) - 1)]


class SourceKind(_Vocabulary):
    """The kinds of artifact torchtriage reads (see `sources.registry`)."""

    LOG = "log"
    PYSPY = "pyspy"
    FAULTHANDLER = "faulthandler"
    DEBUG_SERVER_STACKS = "debug_server_stacks"  # every rank's stack in one file (PyTorch's debug server)
    FLIGHT_RECORDER = "flight_recorder"
    PROFILER_TRACE = "profiler_trace"
    MEMORY_SNAPSHOT = "memory_snapshot"
    MEMORY_TIMELINE = "memory_timeline"
    NVIDIA = "nvidia"
    IDENTITY = "identity"  # a rank's record of where it runs: host, pid, GPU (runtime/identity.py)
    TORCHTRIAGE_OUTPUT = "torchtriage_output"
    DOCUMENT = "document"  # notes, pages, pictures, source code: not evidence
    UNKNOWN = "unknown"


class RankState(_Vocabulary):
    """What a rank's main thread is doing, as its stack (or its flight recorder) shows."""

    COLLECTIVE = "collective"  # inside a collective or p2p op (or Work.wait)
    GPU_WAIT = "gpu_wait"  # waiting for the GPU, typically right after an asynchronous collective
    DATALOADER = "dataloader"  # waiting for, or fetching, a DataLoader batch
    LOCK = "lock"  # blocked on a lock, condition, event, queue or thread join
    STORE = "store_wait"  # waits in the job's c10d store for a key another rank sets (store.get / wait)
    SLEEPING = "sleeping"  # time.sleep, or idle in user code in a C call py-spy cannot see without --native
    BLOCKED = "blocked"  # idle in a system call that is none of the above (I/O, a socket)
    COMPUTING = "computing"  # active: running Python or C code
    NO_STACK = "no_stack"  # no main thread, or no Python frame in it
    BETWEEN = "between_collectives"  # the flight recorder saw its last collective complete: where it is, it cannot say

    @property
    def waiting(self) -> bool:
        """Waiting for its peers: in a collective, or for the GPU to finish one."""
        return self in (RankState.COLLECTIVE, RankState.GPU_WAIT)


# Kept as tuples for argparse choices and validation messages.
CATEGORIES = tuple(c.value for c in Category)
ROLES = tuple(r.value for r in Role)


@dataclass(frozen=True)
class Local:
    """A local variable or argument of a frame, as py-spy --locals prints it."""

    name: str
    repr: str | None
    is_argument: bool


@dataclass(frozen=True)
class Frame:
    """One frame of a stack."""

    file: str  # as the source gave it: a full path, or py-spy's short form in its text dumps
    line: int  # 0 when unknown (native frames)
    function: str
    native: bool = False  # a C/C++ frame, not Python code
    short_file: str | None = None  # py-spy's short form of `file`, when the source gave both
    locals: tuple[Local, ...] = ()
    printed_at: int | None = None  # the line of the artifact that shows this frame, for evidence

    @property
    def text(self) -> str:
        """The frame the way py-spy prints it: `function (file:line)`."""
        shown = self.short_file or self.file
        return f"{self.function} ({shown}:{self.line})" if self.line else f"{self.function} ({shown})"

    @property
    def site(self) -> str:
        """`file:line` with the short file name where there is one."""
        shown = (self.short_file or self.file).replace("\\", "/")
        return f"{shown}:{self.line}" if self.line else shown

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"

    def to_fact(self, rank: int | None = None) -> dict[str, Any]:
        """The frame as the verdict's `user_frame` fact."""
        return {"file": self.file, "line": self.line, "function": self.function, "rank": rank}


@dataclass(frozen=True)
class RankPosition:
    """Where one rank is, and which source said so."""

    rank: int
    state: RankState
    op: str | None  # the collective ("all_reduce") or the wait ("torch.cuda.synchronize"), else None
    where: Frame | None  # the frame that decided the state
    user_frame: Frame | None  # the innermost frame in the user's code: the line that called it
    source: SourceKind
    file: str  # the artifact it was read from
    thread_name: str | None = None
    process_group: str | None = None  # the process group it waits in, when the source names one
    seq: int | None = None  # that group's sequence number, when the source names one
    group_given: bool | None = None  # the caller passed the collective a group (True) or used the default
    peer: int | None = None  # the rank a send or recv waits for (its dst or src), when the stack shows it
    root: int | None = None  # the source or destination a rooted collective was given (broadcast's src), if shown
    alike: int | None = None  # classified by the native frames of this rank's dump, at the same place
    # It waits inside a call every rank must make (a checkpoint's save: knowledge/frames.toml [[all_rank_calls]])
    all_rank_call: str | None = None

    @property
    def waiting(self) -> bool:
        return self.state.waiting

    @property
    def signature(self) -> tuple:
        """Ranks with equal signatures are at the same place: same state, op and call site."""
        site = (self.user_frame.short_file or self.user_frame.file, self.user_frame.line) if self.user_frame else None
        if site is not None:
            site = (site[0].replace("\\", "/"), site[1])
        return (self.state, self.op, site)


@dataclass(frozen=True)
class Evidence:
    """A pointer to what a finding rests on: one line of one artifact."""

    source: str  # a SourceKind, or "analysis" for what torchtriage derived
    file: str | None = None
    line: int | None = None
    rank: int | None = None
    text: str = ""


@dataclass
class Finding:
    """One thing an analyzer found.

    `kind` is the id of the knowledge-base entry that describes it — a log rule ("nccl.watchdog_timeout")
    or an analysis ("fr.not_joined") — and routes it to its actions. `facts` fill the actions' templates.
    `blames` says that `ranks` are the culprits, not the ranks that reported or suffer the failure.
    """

    kind: str
    ranks: list[int]
    message: str
    role: Role | str = Role.SYMPTOM
    category: Category | str = Category.UNKNOWN
    evidence: list[Evidence] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    blames: bool = False


@dataclass
class Assessment:
    """What one analyzer says of one kind of source, before fusion: its findings, most explanatory first.

    `lead` is the finding that explains the most, `culprits` the ranks the source singles out (through
    the finding that blames them), `summary` its one line. When it found nothing, `summary` says what it
    checked and `category` is `ok` for a check that read everything and found it healthy, else `unknown`.
    Fusion alone turns assessments into a Verdict; actions come from the knowledge base there.
    """

    source: str  # "logs", "flight_recorder", "stacks", "profiler_trace", "memory_snapshot", "nvlink"
    findings: list[Finding]
    summary: str
    category: Category | str = Category.UNKNOWN
    culprits: list[int] = field(default_factory=list)
    confidence: Confidence | str = Confidence.LOW
    facts: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # The findings whose actions come first: the one that blames the culprits, then the lead.
    lead: Finding | None = None
    blaming: Finding | None = None
    # Each rank's line in the user's code as this source saw it: fusion names the culprit's own line from
    # whichever source holds it (a flight recorder read as JSON records no frames; a stack does).
    user_frames: dict[int, Frame] = field(default_factory=dict)


@dataclass(frozen=True)
class Machine:
    """Where one rank ran: its host, its process and its GPU, as far as the sources say (None: none said).

    An operator acts on machines (drain a host, reset a GPU), not on ranks: every verdict names the culprit's.
    `gpu_index` is the device's index in the rank's own CUDA_VISIBLE_DEVICES; the UUID and PCI bus id name the
    card as `nvidia-smi` does. `sources` says which kinds of source told (identity, capture, stacks, launcher,
    debug_server, nccl, host_prefix)."""

    rank: int
    host: str | None = None
    pid: int | None = None
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    gpu_pci_bus_id: str | None = None
    local_rank: int | None = None
    attempt: int | None = None
    sources: tuple[str, ...] = ()
    pod: str | None = None  # a Kubernetes pod's name, where the rank ran in one (`host` is then its node)

    @property
    def known(self) -> bool:
        return self.host is not None or self.pid is not None or self.gpu_uuid is not None

    def filled_from(self, other: Machine) -> Machine:
        """This machine, its unknown fields taken from `other` (a source that says less, or says it later)."""
        values = {
            name: getattr(self, name) if getattr(self, name) is not None else getattr(other, name)
            for name in ("host", "pid", "gpu_index", "gpu_uuid", "gpu_pci_bus_id", "local_rank", "attempt", "pod")
        }
        return Machine(self.rank, **values, sources=tuple(dict.fromkeys(self.sources + other.sources)))

    @property
    def text(self) -> str:
        """`host a17, pod trainer-3, pid 4242, GPU 3 (GPU-8f0c..., 00000000:19:00.0)`: what is known, in the order
        one acts."""
        parts = [f"host {self.host}" if self.host is not None else "host not recorded"]
        if self.pod is not None:
            parts.append(f"pod {self.pod}")
        if self.pid is not None:
            parts.append(f"pid {self.pid}")
        card = ", ".join(x for x in (self.gpu_uuid, self.gpu_pci_bus_id) if x)
        if self.gpu_index is not None:
            parts.append(f"GPU {self.gpu_index}" + (f" ({card})" if card else ""))
        elif card:
            parts.append(f"GPU {card}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Action:
    rule: str  # the knowledge-base entry it comes from
    title: str
    detail: str
    command: str | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Verdict:
    category: Category | str
    culprit_ranks: list[int]
    summary: str
    confidence: Confidence | str = Confidence.LOW
    findings: list[Finding] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # inputs that could not be (fully) read
    # Where each culprit rank ran, as far as any source read says (analysis/machines.py).
    culprit_machines: list[Machine] = field(default_factory=list)

    @property
    def diagnosed_problem(self) -> bool:
        """Whether the verdict says something went wrong: it found something, and not that all is well (a job
        that finished, its launcher says, with lines along the way that look like failures)."""
        return bool(self.findings) and self.category != Category.OK

    def machine_of(self, rank: int) -> Machine:
        """Where `rank` ran, as the sources read say; a Machine with nothing known when none said."""
        return next((m for m in self.culprit_machines if m.rank == rank), Machine(rank))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for finding in data["findings"]:
            finding.pop("facts", None)  # the inputs of the actions' templates, not part of the schema
        data["schema"] = SCHEMA
        # One entry per culprit rank, in their order; a rank no source placed has every field null and no sources.
        data["culprit_machines"] = [asdict(self.machine_of(rank)) for rank in self.culprit_ranks]
        # Keys in a fixed, readable order: the schema first, then what a person reads first.
        order = ["schema", "category", "culprit_ranks", "summary", "confidence"]
        return {key: data[key] for key in order} | {k: v for k, v in data.items() if k not in order}
