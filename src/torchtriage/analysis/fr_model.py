"""The vocabulary of the flight recorder's analysis: a process group as the dumps show it, and the first
point where its ranks disagree. Shared by the per-group comparison (`analysis.flight_recorder`) and the p2p
check (`analysis.fr_p2p`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from torchtriage.sources.flight_recorder import RankDump

ABSENT = "<not enqueued>"  # the rank never enqueued this seq


@dataclass
class Group:
    name: str
    desc: str
    members: tuple[int, ...]
    inferred: bool  # members guessed (no pg_config for it)
    digest: str | None

    @property
    def label(self) -> str:
        if self.desc and self.desc not in ("undefined", self.name):
            return f"{self.desc} (pg {self.name})"
        return f"pg {self.name}"


@dataclass
class Disagreement:
    group: Group
    seq: int
    p2p: bool
    sides: dict[str, list[int]]  # value (comparison key or ABSENT) -> ranks
    expected: str | None  # the value the culprits depart from; None when undecided
    culprits: list[int]
    decided_by: str  # "majority" | "call-site history" | "stopped issuing" | "sizes" | "undecided"
    kind: str = ""  # the finding kind of the culprits' side
    note: str = ""
    detail: dict = field(default_factory=dict)


def group_key(dump: RankDump, name: str) -> tuple[str, str | None]:
    """A process group is its name and its ranks, never its name alone (DeviceMesh names every TP group
    alike): the key of the group `name` of this dump."""
    info = dump.pg_config.get(name)
    return (name, info.ranks_digest if info and info.ranks_digest else None)
