"""Matching normalised log lines against the rules, and the prefilter that makes it cheap.

Every line that holds a rule's anchor reaches the matcher, whether or not it is that rule's message, so a
line must cost little when it matches nothing. A search through RE2's Python wrapper costs microseconds
before it reads a byte: searching each candidate rule's patterns in turn, and finding the anchors with
Python's engine, made such a line cost dozens of times an ordinary one. So calls into C decide first: an RE2
set of the anchors says which the line holds (the candidate rules), and a set of each candidate's patterns
says which of them match; only those are searched from Python, for their groups.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchtriage.knowledge.linear_regex import is_linear
from torchtriage.knowledge.may_match import Gate, gate_alternatives
from torchtriage.knowledge.prefilter import STRUCTURE_MARKERS, compile_prefilter, longest_literal_regex
from torchtriage.knowledge.rules import MIN_PHRASE, Rule

# Room for the anchors' automaton and its cached states (a thousand anchors need far less).
_ANCHOR_SET_MEMORY = 32 << 20
# A rule's set saves the cost of calls, which a short line's search is mostly; on a longer line reading it is
# the cost, and a set reads all of it where a search of a pattern that matches stops at the match.
_SET_LINE_BYTES = 1024


class AnchorSet:
    """The anchors, literal text, in one RE2 set.

    `found(text)` is the indexes of the anchors `text` holds, or None where the set cannot say: RE2 gives up
    on a text only where one state of its automaton would not fit its memory, never for a literal set this
    size, but an answer of nothing then would silently lose every match. The set holds one more anchor, the
    empty text, found in every text, so a set that gave up is told from one that found nothing."""

    def __init__(self, compiled, always: int):
        self._compiled = compiled
        self._always = always

    @classmethod
    def of(cls, anchors: list[str]) -> AnchorSet | None:
        """The set of `anchors`, or None without RE2."""
        re2 = _re2()
        if re2 is None:
            return None
        options = re2.Options()
        options.max_mem = _ANCHOR_SET_MEMORY
        options.literal = True
        options.log_errors = False  # a line RE2 gives up on is matched without the set, not reported
        compiled = re2.Set.SearchSet(options)
        try:
            for anchor in anchors:
                compiled.Add(anchor)
            always = compiled.Add("")
            compiled.Compile()
        except re2.error:  # pragma: no cover - literal text always compiles
            return None
        return cls(compiled, always)

    def found(self, text: bytes) -> list[int] | None:
        indexes = self._compiled.Match(text)
        if not indexes or self._always not in indexes:
            return None
        return [index for index in indexes if index != self._always]


class PatternSet:
    """One rule's patterns in one RE2 set: which of them match a text, in one call into C.

    `matching(text)` is their indexes, or None where the set cannot say (RE2 gave up: one state of its
    automaton would not fit its memory); it holds one more pattern, the empty one, which matches every text,
    so a set that gave up is told from one that found nothing. Each rule has a set of its own: one set of
    every rule's patterns would be one call per line, but its automaton has so many states that a long line
    of varied text builds new ones at nearly every byte: several times the cost of searching every pattern."""

    def __init__(self, compiled, always: int):
        self._compiled = compiled
        self._always = always

    @classmethod
    def of(cls, patterns: tuple) -> PatternSet | None:
        """The set of `patterns`, or None where they are not RE2's with the same options (Python's engine has
        no set; a set runs its patterns with one set of options)."""
        re2 = _re2()
        if re2 is None or not patterns or not all(is_linear(p) for p in patterns):
            return None
        if len({_options_key(re2, p.options) for p in patterns}) != 1:
            return None
        options = re2.Options()
        for name in re2.Options.NAMES:
            setattr(options, name, getattr(patterns[0].options, name))
        options.log_errors = False  # a line RE2 gives up on is searched pattern by pattern, not reported
        compiled = re2.Set.SearchSet(options)
        try:
            for pattern in patterns:
                compiled.Add(pattern.pattern)
            always = compiled.Add("")
            compiled.Compile()
        except re2.error:  # pragma: no cover - each pattern compiled alone
            return None
        return cls(compiled, always)

    def matching(self, text: bytes) -> frozenset[int] | None:
        indexes = self._compiled.Match(text)
        if not indexes or self._always not in indexes:
            return None
        return frozenset(indexes)


def _options_key(re2, options) -> tuple:
    return tuple(getattr(options, name) for name in re2.Options.NAMES)


def _re2():
    try:
        import re2
    except ImportError:  # pragma: no cover - google-re2 is a dependency
        return None
    return re2


class SearchCounter:
    """The regex searches a matcher ran over lines and the characters they read. Tests hold the work a line
    costs to a bound (a count, not a time), so a path that searches a line once per anchor it holds fails."""

    __slots__ = ("searches", "characters")

    def __init__(self) -> None:
        self.searches = 0
        self.characters = 0

    def add(self, characters: int, searches: int = 1) -> None:
        self.searches += searches
        self.characters += characters


def _first_match(pattern, text: str, unless: tuple, counter: SearchCounter):
    """The first match of `pattern` in `text` that none of the `unless` patterns finds in."""
    counter.add(len(text))
    if not unless:
        return pattern.search(text)
    for found in pattern.finditer(text):
        matched = found.group(0)
        counter.add(len(matched) * len(unless), len(unless))
        if not any(veto.search(matched) for veto in unless):
            return found
    return None


def _distinctive_phrases(rules: tuple[Rule, ...]) -> dict[str, tuple[str, ...]]:
    """Each rule's phrases that name it alone: no other rule's example holds the phrase without being
    this rule's message too (a phrase every loader prints, "cannot open shared object file", names no
    library; a message quoted inside another, as a communicator abort quotes the watchdog's, is still it).
    An example the rule's `unless` vetoes after the phrase is one it already tells apart."""
    examples = [(rule.id, example) for rule in rules for example in rule.examples]

    def reached(rule: Rule, phrase: str, example: str) -> bool:
        at = example.find(phrase)
        if at < 0 or any(p.search(example) for p in rule.patterns):
            return False
        return not any(veto.search(example[at:]) for veto in rule.unless)

    def distinctive(rule: Rule, phrase: str) -> bool:
        return not any(reached(rule, phrase, example) for owner, example in examples if owner != rule.id)

    return {rule.id: tuple(p for p in rule.phrases if distinctive(rule, p)) for rule in rules}


def _phrase_match(rule: Rule, phrases: tuple[tuple[str, tuple[str, ...]], ...], text: str) -> RuleMatch | None:
    """A line that holds a rule's distinctive phrase but none of its full patterns: the message cut short
    (a truncated paste, a terminal's wrap) or printed with other fields. It reaches the rule without the
    facts the rest of the message would have given; the `unless` vetoes and a ratio condition still hold."""
    if rule.ratio is not None:
        return None
    for phrase, heads in phrases:
        at = text.find(phrase)
        if at < 0:
            at = _cut_inside(heads, text)
        if at >= 0 and not any(veto.search(text[at:]) for veto in rule.unless):
            return RuleMatch(rule, {"message_cut": phrase})
    return None


def _heads_of(phrase: str) -> tuple[str, ...]:
    """The beginnings of `phrase` a cut line may end with, longest first: cut at a word's end ("... operation
    timeout:" of "... operation timeout: WorkNCCL("), long enough to name the message alone."""
    heads = []
    for size in range(len(phrase) - 1, MIN_PHRASE - 1, -1):
        if phrase[size - 1].isalnum() and phrase[size].isalnum():
            continue  # mid-word: the head of another word could be anything
        heads.append(phrase[:size].rstrip())
    return tuple(heads)


def _cut_inside(heads: tuple[str, ...], text: str) -> int:
    """Where `text` ends with the longest of a phrase's `heads`; else -1."""
    end = text.rstrip()
    if not end.endswith(heads):  # one test in C for the usual line, which ends with none
        return -1
    for head in heads:
        if end.endswith(head):
            return len(end) - len(head)
    return -1  # pragma: no cover - endswith(heads) said one of them ends it


@dataclass(frozen=True)
class RuleMatch:
    rule: Rule
    facts: dict[str, str]


def _supersedes(marker: str, text: str) -> bool:
    """Whether a line holds a rule's `superseded_by` marker: anywhere, or, for a marker ending in "$", at its end
    ("exits with return code = 1$" is not "... = 137")."""
    if marker.endswith("$"):
        return text.rstrip().endswith(marker[:-1])
    return marker in text


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
            for length in range(1, len(anchor)):  # each of its prefixes looked up: linear in the anchors
                other_rules = by_anchor.get(anchor[:length])
                if other_rules is not None:
                    rules.update(other_rules)
        self._rules_by_anchor = by_anchor
        self._anchor_finder = longest_literal_regex(by_anchor) if by_anchor else None
        self.superseding = {
            text: [r.id for r in self.rules if text in r.superseded_by]
            for rule in self.rules
            for text in rule.superseded_by
        }
        self.aftermath_markers = {
            text: [r.id for r in self.rules if text in r.aftermath_after]
            for rule in self.rules
            for text in rule.aftermath_after
        }
        # "$": the marker ends the line; the text before it is what the line holds
        self._superseding_words = [marker.removesuffix("$") for marker in self.superseding] + list(
            self.aftermath_markers
        )
        self._prefilter_words = list(by_anchor) + self._superseding_words + list(STRUCTURE_MARKERS)
        self.prefilter = compile_prefilter(self._prefilter_words)
        self._phrase_heads = {
            rule_id: tuple((phrase, _heads_of(phrase)) for phrase in phrases)
            for rule_id, phrases in self.phrases.items()
        }
        self._anchors = list(by_anchor)
        self._anchor_set: AnchorSet | None = None
        self._anchor_set_built = False  # built at the first line matched
        self._pattern_sets: dict[str, PatternSet | None] = {}  # built at the first line a rule is a candidate
        self._gate: Gate | None = None
        self._gate_built = False  # built at the first line asked about
        self.counter = SearchCounter()

    def could_match(self, raw: bytes) -> bool:
        """False only where no rule can match the raw line `raw` and it holds none of the markers the reader
        follows besides rules (knowledge.may_match): such a line costs one call into C."""
        gate = self.gate()
        return gate is None or gate.could_match(raw)

    def gate(self) -> Gate | None:
        """The gate before the matcher (knowledge.may_match), built at the first call; None without RE2."""
        if not self._gate_built:
            self._gate, self._gate_built = self._build_gate(), True
        return self._gate

    def _build_gate(self) -> Gate | None:
        rules = [
            ([p.pattern if isinstance(p.pattern, str) else p.pattern.decode() for p in r.patterns], r.anchors)
            for r in self.rules
            if r.patterns
        ]
        phrases = [(phrase, heads) for heads_of in self._phrase_heads.values() for phrase, heads in heads_of]
        alternatives = gate_alternatives(rules, phrases, [*self._superseding_words, *STRUCTURE_MARKERS])
        return Gate.of(alternatives, self._prefilter_words)

    def _candidates(self, text: str, encoded: bytes | None) -> dict[str, Rule]:
        """The rules whose anchors `text` holds, in the order their anchors first appear in it."""
        if not self._anchor_set_built:
            self._anchor_set, self._anchor_set_built = AnchorSet.of(self._anchors), True
        found = self._anchor_set.found(encoded) if self._anchor_set is not None and encoded is not None else None
        self.counter.add(len(text))  # one pass for the anchors: the set's, or else the lookahead's
        if found is not None:
            ordered = self._in_order(found, text)
            if ordered is not None:
                return ordered
        candidates: dict[str, Rule] = {}
        for found_anchor in self._anchor_finder.finditer(text):
            candidates.update(self._rules_by_anchor[found_anchor.group(1)])
        return candidates

    def _matching_patterns(self, rule: Rule, text: str, encoded: bytes | None) -> frozenset[int] | None:
        """The indexes of the rule's patterns that match `text` (`encoded`), or None where each must be searched."""
        if encoded is None or len(encoded) > _SET_LINE_BYTES:
            return None
        if rule.id not in self._pattern_sets:
            self._pattern_sets[rule.id] = PatternSet.of(rule.patterns)
        pattern_set = self._pattern_sets[rule.id]
        if pattern_set is None:
            return None
        self.counter.add(len(text))
        return pattern_set.matching(encoded)

    def _in_order(self, anchor_indexes: list[int], text: str) -> dict[str, Rule] | None:
        """The candidates as the lookahead finds them, from the anchors the set found: at each position where
        an anchor first appears, the longest anchor there (any longer one there holds it, so it appears there
        first too) brings its rules; later positions bring no rule not already there."""
        longest_at: dict[int, str] = {}
        for index in anchor_indexes:
            anchor = self._anchors[index]
            at = text.find(anchor)
            if at < 0:  # pragma: no cover - the set found it: engines that disagree leave it to the lookahead
                return None
            if len(anchor) > len(longest_at.get(at, "")):
                longest_at[at] = anchor
        candidates: dict[str, Rule] = {}
        for at in sorted(longest_at):
            candidates.update(self._rules_by_anchor[longest_at[at]])
        return candidates

    def match(self, text: str) -> list[RuleMatch]:
        """Every rule that matches `text`, each with the facts its named groups captured."""
        if self._anchor_finder is None:
            return []
        try:
            encoded = text.encode()  # once for every set
        except UnicodeEncodeError:
            encoded = None  # a lone surrogate: the patterns' own searches say what they make of it
        candidates = self._candidates(text, encoded)
        matches = []
        for rule in candidates.values():
            found_patterns = self._matching_patterns(rule, text, encoded) if rule.patterns else frozenset()
            for index, pattern in enumerate(rule.patterns):
                if found_patterns is not None and index not in found_patterns:
                    continue  # the rule's set found it nowhere in the line
                found = _first_match(pattern, text, rule.unless, self.counter)
                if found:
                    facts = {k: v.strip() for k, v in found.groupdict().items() if v is not None}
                    if rule.accepts(facts):
                        matches.append(RuleMatch(rule, facts))
                    break
            else:
                partial = _phrase_match(rule, self._phrase_heads[rule.id], text)
                if partial is not None:
                    matches.append(partial)
        return matches

    def superseded_rules(self, text: str) -> list[str]:
        """Ids of the rules whose earlier lines `text` withdraws."""
        return [rule_id for marker, ids in self.superseding.items() if _supersedes(marker, text) for rule_id in ids]

    def rules_in_aftermath(self, text: str) -> list[str]:
        """Ids of the rules whose later lines `text` makes the aftermath of what it says (`aftermath_after`)."""
        return [rule_id for marker, ids in self.aftermath_markers.items() if marker in text for rule_id in ids]
