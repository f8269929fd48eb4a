"""Which CUDA errors are generic and which libraries' own failures explain them, read from `cascades.toml`
(the reasoning is `analysis.cascades`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from torchtriage.knowledge.linear_regex import compile_linear
from torchtriage.knowledge.loader import (
    KNOWLEDGE_DIR,
    STRING,
    STRING_TABLE,
    STRINGS,
    TABLE,
    TABLES,
    KnowledgeError,
    check_table,
    read_toml,
)
from torchtriage.knowledge.rules import Rule
from torchtriage.model import CATEGORIES

CASCADES_FILE = KNOWLEDGE_DIR / "cascades.toml"


@dataclass(frozen=True)
class Library:
    name: str
    categories: frozenset[str]
    rules: frozenset[str]  # single rules of a shared category that read this library's own status
    not_failures: frozenset[str]
    frames: str | None  # the category frames.toml gives its Python frames
    printed: tuple[Any, ...]  # lines it prints when it fails, whatever their exact format
    traps: frozenset[str] = frozenset()  # generic errors its own kernels leave when they stop themselves

    def reports(self, rule: Rule) -> bool:
        """Whether a line of `rule` is this library's report of its own failure."""
        if rule.id in self.not_failures:
            return False
        return rule.id in self.rules or rule.category in self.categories

    def printed_failure(self, text: str) -> bool:
        return any(p.search(text) for p in self.printed)


@dataclass(frozen=True)
class CascadeKnowledge:
    generic_rules: dict[str, dict[str, str]]  # rule id -> the facts its line needs to be generic ({}: always)
    generic_facts: dict[str, tuple[Any, ...]]  # fact -> patterns of the values that make any rule's line generic
    libraries: tuple[Library, ...]
    # Answers already given: a log repeats a few messages thousands of times.
    _generic: dict = field(default_factory=dict, compare=False, repr=False)
    _reporting: dict = field(default_factory=dict, compare=False, repr=False)

    def is_generic(self, rule: Rule, facts: dict[str, str]) -> bool:
        """Whether a line says only that a kernel failed (or the context broke), not why."""
        needed = self.generic_rules.get(rule.id)
        key = (rule.id, *(facts.get(k) for k in needed or ()), *(facts.get(k) for k in self.generic_facts))
        if key not in self._generic:
            self._generic[key] = (needed is not None and all(facts.get(k) == v for k, v in needed.items())) or any(
                any(p.search(facts[fact]) for p in patterns)
                for fact, patterns in self.generic_facts.items()
                if fact in facts
            )
        return self._generic[key]

    def library_reporting(self, rule: Rule) -> Library | None:
        """The library whose own failure a line of `rule` reports, if any."""
        if rule.id not in self._reporting:
            self._reporting[rule.id] = next((lib for lib in self.libraries if lib.reports(rule)), None)
        return self._reporting[rule.id]

    def library_of_frames(self, category: str | None) -> Library | None:
        return next((lib for lib in self.libraries if category and lib.frames == category), None)


def _library(raw: dict, where: str) -> Library:
    table = check_table(
        raw,
        where,
        {"name": STRING},
        {
            "categories": STRINGS,
            "rules": STRINGS,
            "not_failures": STRINGS,
            "frames": STRING,
            "printed": STRINGS,
            "traps": STRINGS,
        },
    )
    unknown = [c for c in [*table.get("categories", []), table.get("frames")] if c and c not in CATEGORIES]
    if unknown:
        raise KnowledgeError(f"{where}: unknown category {unknown[0]!r}")
    if not table.get("categories") and not table.get("rules"):
        raise KnowledgeError(f"{where}: give `categories` or `rules`: the lines that are the library's own failure")
    return Library(
        table["name"],
        frozenset(table.get("categories", [])),
        frozenset(table.get("rules", [])),
        frozenset(table.get("not_failures", [])),
        table.get("frames"),
        tuple(compile_linear(p, where) for p in table.get("printed", [])),
        frozenset(table.get("traps", [])),
    )


@lru_cache(maxsize=1)
def cascade_knowledge() -> CascadeKnowledge:
    return load_cascade_knowledge()


def load_cascade_knowledge(path: Path = CASCADES_FILE) -> CascadeKnowledge:
    """The generic errors and the libraries of `path`; a KnowledgeError names the table that is wrong."""
    name = path.name
    raw = check_table(read_toml(path), name, {"generic": TABLES, "library": TABLES}, {"generic_facts": TABLE})
    generic_rules = {}
    for index, item in enumerate(raw["generic"]):
        entry = check_table(item, f"{name} [[generic]] #{index + 1}", {"rule": STRING}, {"facts": STRING_TABLE})
        generic_rules[entry["rule"]] = {k: str(v) for k, v in entry.get("facts", {}).items()}
    facts_where = f"{name} [generic_facts]"
    facts_table = check_table(raw.get("generic_facts", {}), facts_where, {}, {"cuda_error": STRINGS})
    generic_facts = {
        fact: tuple(compile_linear(p, facts_where) for p in patterns) for fact, patterns in facts_table.items()
    }
    libraries = tuple(_library(item, f"{name} [[library]] #{index + 1}") for index, item in enumerate(raw["library"]))
    return CascadeKnowledge(generic_rules, generic_facts, libraries)
