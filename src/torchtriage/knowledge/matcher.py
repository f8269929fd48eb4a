"""Matching normalised log lines against the rules, and the prefilter that makes it cheap."""

from __future__ import annotations

import re
from dataclasses import dataclass

from torchtriage.knowledge.rules import Rule
from torchtriage.sources.logs import STRUCTURE_MARKERS, literal_trie_regex


@dataclass(frozen=True)
class RuleMatch:
    rule: Rule
    facts: dict[str, str]


class Matcher:
    """Holds the rules of one knowledge base with the indexes that make matching fast."""

    def __init__(self, rules: tuple[Rule, ...] | list[Rule]):
        self.rules = tuple(rules)
        self._anchored: list[tuple[str, list[Rule]]] = []
        by_anchor: dict[str, list[Rule]] = {}
        for rule in self.rules:
            for anchor in rule.anchors:
                by_anchor.setdefault(anchor, []).append(rule)
        self._anchored = list(by_anchor.items())
        self.prefilter: re.Pattern[bytes] = literal_trie_regex(list(by_anchor) + list(STRUCTURE_MARKERS))

    def match(self, text: str) -> list[RuleMatch]:
        """Every rule that matches `text`, each with the facts its named groups captured."""
        candidates: dict[str, Rule] = {}
        for anchor, rules in self._anchored:
            if anchor in text:
                for rule in rules:
                    candidates[rule.id] = rule
        matches = []
        for rule in candidates.values():
            for pattern in rule.patterns:
                found = pattern.search(text)
                if found:
                    facts = {k: v.strip() for k, v in found.groupdict().items() if v is not None}
                    matches.append(RuleMatch(rule, facts))
                    break
        return matches
