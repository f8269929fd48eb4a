"""The shared model of a diagnosis: evidence, findings, actions and the verdict.

Every diagnosing command ends in a `Verdict`. Its JSON form (`Verdict.to_json`) is a public,
versioned interface: add keys freely, but never rename or remove one without bumping `SCHEMA`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA = "torchtriage.verdict/1"

CATEGORIES = (
    "hang",
    "nccl_timeout",
    "oom",
    "nan_inf",
    "deepep",
    "nccl_transport",
    "gpu_fault",
    "rendezvous",
    "host_oom",
    "environment",
    "usage",
    "straggler",
    "unknown",
)

# How much a finding explains: a root cause in itself, a failure whose cause may lie elsewhere,
# or the aftermath of another rank's failure. Ordered from most to least explanatory.
ROLES = ("primary", "symptom", "collateral")


@dataclass(frozen=True)
class Evidence:
    """A pointer to what a finding rests on: one line of one artifact."""

    source: str  # the kind of artifact: "log", "pyspy", "flight_recorder", ...
    file: str | None = None
    line: int | None = None
    rank: int | None = None
    text: str = ""


@dataclass
class Finding:
    kind: str  # a rule id ("nccl.watchdog_timeout") or an analyzer's kind ("lagging_rank")
    ranks: list[int]
    message: str
    role: str = "symptom"
    category: str = "unknown"
    evidence: list[Evidence] = field(default_factory=list)


@dataclass(frozen=True)
class Action:
    rule: str
    title: str
    detail: str
    command: str | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Verdict:
    category: str
    culprit_ranks: list[int]
    summary: str
    confidence: str = "low"  # "high" | "medium" | "low"
    findings: list[Finding] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # inputs that could not be (fully) read

    @property
    def diagnosed_problem(self) -> bool:
        return bool(self.findings)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["schema"] = SCHEMA
        # Keys in a fixed, readable order: the schema first, then what a person reads first.
        order = ["schema", "category", "culprit_ranks", "summary", "confidence"]
        return {key: data[key] for key in order} | {k: v for k, v in data.items() if k not in order}
