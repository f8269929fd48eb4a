"""The signs of a stall, read from `stall.toml`: what says a job was interrupted, finished, or where its
log stopped. Data for the lowest layer of triage (`analysis.stall`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from torchtriage.knowledge.linear_regex import compile_linear
from torchtriage.knowledge.loader import KNOWLEDGE_DIR, NUMBER, STRING, STRINGS, TABLE, TABLES, check_table, read_toml

STALL_FILE = KNOWLEDGE_DIR / "stall.toml"


@dataclass(frozen=True)
class StallKnowledge:
    interrupt: tuple[Any, ...]
    finished: tuple[Any, ...]
    noise: tuple[Any, ...]
    failure: tuple[Any, ...]
    world_size: tuple[Any, ...]
    last_line: tuple[tuple[str, tuple[Any, ...]], ...]  # (what the job was doing, patterns)
    loss: tuple[Any, ...] = ()
    loss_factor: float = 1000.0
    loss_at_least: float = 1000.0
    warning: tuple[Any, ...] = ()
    succeeded: tuple[Any, ...] = ()
    completed: tuple[Any, ...] = ()

    def loss_in(self, text: str) -> float | None:
        """The loss a step line states, or None."""
        for pattern in self.loss:
            found = pattern.search(text)
            if found:
                try:
                    return float(found.group("value"))
                except (OverflowError, ValueError):
                    return None
        return None

    def interrupted(self, text: str) -> bool:
        return any(p.search(text) for p in self.interrupt)

    def finished_by(self, text: str) -> bool:
        return any(p.search(text) for p in self.finished) or self.completed_by(text)

    def completed_by(self, text: str) -> bool:
        """The job's own words that its training ran to the end."""
        return any(p.search(text) for p in self.completed)

    def succeeded_by(self, text: str) -> bool:
        """A launcher's own report that every worker it ran exited 0."""
        return any(p.search(text) for p in self.succeeded)

    def shows_failure(self, text: str) -> bool:
        """A line that looks like a failure (its level, read with the line, is the caller's to weigh)."""
        return any(p.search(text) for p in self.failure)

    def world_size_in(self, text: str) -> int | None:
        """The size of the world a line states, or None."""
        for pattern in self.world_size:
            found = pattern.search(text)
            if found:
                return int(found.group("world"))
        return None

    def is_noise(self, text: str) -> bool:
        return any(p.search(text) for p in self.noise)

    def warns(self, text: str) -> bool:
        """A warning of Python's warnings module, whose next, indented line echoes the source it points at."""
        return any(p.search(text) for p in self.warning)

    def doing(self, text: str) -> str | None:
        """What a log's last line says the job was doing, or None."""
        return next((what for what, patterns in self.last_line if any(p.search(text) for p in patterns)), None)


def _patterns(table: dict, where: str) -> tuple[Any, ...]:
    return tuple(compile_linear(p, where) for p in table["patterns"])


@lru_cache(maxsize=1)
def stall_knowledge() -> StallKnowledge:
    raw = check_table(
        read_toml(STALL_FILE),
        STALL_FILE.name,
        {
            "interrupt": TABLE,
            "finished": TABLE,
            "noise": TABLE,
            "failure": TABLE,
            "world_size": TABLE,
            "loss": TABLE,
            "warning": TABLE,
            "succeeded": TABLE,
            "completed": TABLE,
            "last_line": TABLES,
        },
    )
    sections = {}
    for name in ("interrupt", "finished", "noise", "failure", "world_size", "warning", "succeeded", "completed"):
        where = f"{STALL_FILE.name} [{name}]"
        sections[name] = _patterns(check_table(raw[name], where, {"patterns": STRINGS}), where)
    loss_where = f"{STALL_FILE.name} [loss]"
    loss = check_table(raw["loss"], loss_where, {"patterns": STRINGS, "factor": NUMBER, "at_least": NUMBER})
    last = []
    for index, item in enumerate(raw["last_line"]):
        where = f"{STALL_FILE.name} [[last_line]] {index + 1}"
        table = check_table(item, where, {"what": STRING, "patterns": STRINGS})
        last.append((table["what"], _patterns(table, where)))
    return StallKnowledge(
        sections["interrupt"],
        sections["finished"],
        sections["noise"],
        sections["failure"],
        sections["world_size"],
        tuple(last),
        _patterns(loss, loss_where),
        float(loss["factor"]),
        float(loss["at_least"]),
        sections["warning"],
        sections["succeeded"],
        sections["completed"],
    )
