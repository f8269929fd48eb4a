"""Matching normalised log lines against the rules, and the prefilter that makes it cheap."""

from __future__ import annotations

from dataclasses import dataclass

from torchtriage.knowledge.prefilter import STRUCTURE_MARKERS, compile_prefilter, longest_literal_regex
from torchtriage.knowledge.rules import MIN_PHRASE, Rule


def _first_match(pattern, text: str, unless: tuple):
    """The first match of `pattern` in `text` that none of the `unless` patterns finds in."""
    if not unless:
        return pattern.search(text)
    for found in pattern.finditer(text):
        matched = found.group(0)
        if not any(veto.search(matched) for veto in unless):
            return found
    return None


def _distinctive_phrases(rules: tuple[Rule, ...]) -> dict[str, tuple[str, ...]]:
    """Each rule's phrases that name it alone: no other rule's example holds the phrase without being
    this rule's message too (a phrase every loader prints, "cannot open shared object file", names no
    library; a message quoted inside another, as a communicator abort quotes the watchdog's, is still it)."""
    examples = [(rule.id, example) for rule in rules for example in rule.examples]

    def distinctive(rule: Rule, phrase: str) -> bool:
        return not any(
            phrase in example and not any(p.search(example) for p in rule.patterns)
            for owner, example in examples
            if owner != rule.id
        )

    return {rule.id: tuple(p for p in rule.phrases if distinctive(rule, p)) for rule in rules}


def _phrase_match(rule: Rule, phrases: tuple[str, ...], text: str) -> RuleMatch | None:
    """A line that holds a rule's distinctive phrase but none of its full patterns: the message cut short
    (a truncated paste, a terminal's wrap) or printed with other fields. It reaches the rule without the
    facts the rest of the message would have given; the `unless` vetoes and a ratio condition still hold."""
    if rule.ratio is not None:
        return None
    for phrase in phrases:
        at = text.find(phrase)
        if at < 0:
            at = _cut_inside(phrase, text)
        if at >= 0 and not any(veto.search(text[at:]) for veto in rule.unless):
            return RuleMatch(rule, {"message_cut": phrase})
    return None


def _cut_inside(phrase: str, text: str) -> int:
    """Where `text` ends with the beginning of `phrase` cut at a word's end ("... operation timeout:" of
    "... operation timeout: WorkNCCL("), long enough to name the message alone; else -1."""
    end = text.rstrip()
    for size in range(len(phrase) - 1, MIN_PHRASE - 1, -1):
        if phrase[size - 1].isalnum() and phrase[size].isalnum():
            continue  # mid-word: the head of another word could be anything
        if end.endswith(phrase[:size].rstrip()):
            return len(end) - len(phrase[:size].rstrip())
    return -1


@dataclass(frozen=True)
class RuleMatch:
    rule: Rule
    facts: dict[str, str]


class Matcher:
    """Holds the rules of one knowledge base with the indexes that make matching fast."""

    def __init__(self, rules: tuple[Rule, ...] | list[Rule]):
        self.rules = tuple(rules)
        self.rules_by_id = {rule.id: rule for rule in self.rules}
        self.phrases = _distinctive_phrases(self.rules)
        by_anchor: dict[str, dict[str, Rule]] = {}
        for rule in self.rules:
            # A rule's phrases find it too: a line cut before the rule's anchors still holds its phrase.
            for anchor in (*rule.anchors, *self.phrases[rule.id]):
                by_anchor.setdefault(anchor, {})[rule.id] = rule
        # At a position the lookahead reports only the longest anchor that starts there, so each anchor
        # also carries the rules of the anchors that are its prefixes.
        for anchor, rules in by_anchor.items():
            for other, other_rules in by_anchor.items():
                if other != anchor and anchor.startswith(other):
                    rules.update(other_rules)
        self._rules_by_anchor = by_anchor
        self._anchor_finder = longest_literal_regex(by_anchor) if by_anchor else None
        self.superseding = {
            text: [r.id for r in self.rules if text in r.superseded_by]
            for rule in self.rules
            for text in rule.superseded_by
        }
        self.prefilter = compile_prefilter(list(by_anchor) + list(self.superseding) + list(STRUCTURE_MARKERS))

    def match(self, text: str) -> list[RuleMatch]:
        """Every rule that matches `text`, each with the facts its named groups captured."""
        if self._anchor_finder is None:
            return []
        candidates: dict[str, Rule] = {}
        for found_anchor in self._anchor_finder.finditer(text):
            candidates.update(self._rules_by_anchor[found_anchor.group(1)])
        matches = []
        for rule in candidates.values():
            for pattern in rule.patterns:
                found = _first_match(pattern, text, rule.unless)
                if found:
                    facts = {k: v.strip() for k, v in found.groupdict().items() if v is not None}
                    if rule.accepts(facts):
                        matches.append(RuleMatch(rule, facts))
                    break
            else:
                partial = _phrase_match(rule, self.phrases[rule.id], text)
                if partial is not None:
                    matches.append(partial)
        return matches

    def superseded_rules(self, text: str) -> list[str]:
        """Ids of the rules whose earlier lines `text` withdraws."""
        return [rule_id for marker, ids in self.superseding.items() if marker in text for rule_id in ids]
