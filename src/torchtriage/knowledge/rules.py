"""Loading and validating the knowledge base: `rules/*.toml`, one `[[rule]]` table per failure mode.

The format is documented in docs/rules.md. A rule that does not validate stops loading with a message
naming the file and the rule: a broken knowledge base must never silently drop a failure mode.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from torchtriage.model import CATEGORIES, ROLES, Action

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

RULES_DIR = Path(__file__).parent / "rules"
_MIN_ANCHOR = 4


class RuleError(ValueError):
    """The knowledge base is malformed; the message names the file and rule."""


@dataclass(frozen=True)
class Rule:
    id: str
    category: str
    title: str
    role: str
    cause: str
    source: str
    patterns: tuple[re.Pattern[str], ...]
    anchors: tuple[str, ...]
    actions: tuple[Action, ...]
    priority: int = 50
    examples: tuple[str, ...] = ()
    example_facts: dict[str, str] = field(default_factory=dict)
    # Categories whose presence (on any rank) makes this rule's lines the aftermath, not the cause:
    # e.g. peers' NCCL errors after one rank ran out of memory.
    collateral_of: tuple[str, ...] = ()
    # Literal text that, appearing later in the same file, withdraws this rule's lines: for rules that
    # describe where a log stops ("NCCL initialised, then nothing"), a later sign of progress refutes them.
    superseded_by: tuple[str, ...] = ()
    # The fact that names the rank a line is about, when that is not the rank that printed it
    # (a rank-0 report naming the slowest rank).
    rank_fact: str | None = None
    # A line counts only when facts[numerator] / facts[denominator] >= at_least.
    ratio: tuple[str, str, float] | None = None
    file: str = ""

    def accepts(self, facts: dict[str, str]) -> bool:
        """Whether a matching line's facts meet the rule's condition, if it has one."""
        if self.ratio is None:
            return True
        numerator, denominator, at_least = self.ratio
        try:
            return float(facts[numerator]) >= at_least * float(facts[denominator])
        except (KeyError, ValueError):
            return False


def _regex_internals():
    """The regex parser and its opcode constants (private modules; renamed in Python 3.11)."""
    if hasattr(re, "_parser"):
        return re._parser, re._constants
    import sre_constants  # pragma: no cover - Python 3.10
    import sre_parse  # pragma: no cover

    return sre_parse, sre_constants  # pragma: no cover


def required_literal(pattern: str) -> str | None:
    """The longest literal text every match of `pattern` must contain, if one exists.

    Only top-level literal runs count: text inside alternations or optional groups is not required.
    """
    parser, literal_op = _regex_internals()
    try:
        parsed = parser.parse(pattern)
    except re.error:
        return None
    if parsed.state.flags & re.IGNORECASE:
        return None
    best, run = "", []
    for op, arg in list(parsed) + [(None, None)]:
        if op == literal_op.LITERAL:
            run.append(chr(arg))
            continue
        if op == literal_op.SUBPATTERN and arg[-1] is not None:
            # a capture group around plain literals still requires them
            inner = arg[-1]
            if all(sub_op == literal_op.LITERAL for sub_op, _ in inner) and not (arg[1] or 0) & re.IGNORECASE:
                run.extend(chr(sub_arg) for _, sub_arg in inner)
                continue
        candidate = "".join(run)
        if len(candidate) > len(best):
            best = candidate
        run = []
    return best or None


def _actions(rule_id: str, raw: list[dict]) -> tuple[Action, ...]:
    actions = []
    for item in raw:
        env = {str(k): str(v) for k, v in (item.get("env") or {}).items()}
        actions.append(
            Action(
                rule=rule_id,
                title=item["title"],
                detail=item.get("detail", ""),
                command=item.get("command"),
                env=env,
            )
        )
    return tuple(actions)


def _ratio(raw: dict | None, where: str) -> tuple[str, str, float] | None:
    if raw is None:
        return None
    try:
        return str(raw["numerator"]), str(raw["denominator"]), float(raw["at_least"])
    except (KeyError, TypeError, ValueError):
        raise RuleError(f"{where}: `ratio` needs numerator, denominator and at_least") from None


def _build_rule(raw: dict, file: str) -> Rule:
    rule_id = raw.get("id", "<no id>")
    where = f"{file}: rule {rule_id}"
    for key in ("id", "category", "title", "role", "cause", "source"):
        if not raw.get(key):
            raise RuleError(f"{where}: missing `{key}`")
    if raw["category"] not in CATEGORIES:
        raise RuleError(f"{where}: unknown category {raw['category']!r}")
    if raw["role"] not in ROLES:
        raise RuleError(f"{where}: role must be one of {ROLES}")
    patterns = []
    for text in raw.get("patterns", []):
        try:
            patterns.append(re.compile(text))
        except re.error as err:
            raise RuleError(f"{where}: pattern {text!r} does not compile: {err}") from None
    anchors = list(raw.get("anchors", []))
    if patterns and not anchors:
        for text in raw["patterns"]:
            literal = required_literal(text)
            if not literal or len(literal) < _MIN_ANCHOR:
                raise RuleError(
                    f"{where}: pattern {text!r} has no literal run of {_MIN_ANCHOR}+ characters; "
                    "give `anchors` explicitly"
                )
            anchors.append(literal)
    return Rule(
        id=rule_id,
        category=raw["category"],
        title=raw["title"],
        role=raw["role"],
        cause=raw["cause"].strip(),
        source=raw["source"],
        patterns=tuple(patterns),
        anchors=tuple(dict.fromkeys(anchors)),
        actions=_actions(rule_id, raw.get("actions", [])),
        priority=int(raw.get("priority", 50)),
        examples=tuple(raw.get("examples", [])),
        example_facts={str(k): str(v) for k, v in (raw.get("example_facts") or {}).items()},
        collateral_of=tuple(raw.get("collateral_of", [])),
        superseded_by=tuple(raw.get("superseded_by", [])),
        rank_fact=raw.get("rank_fact"),
        ratio=_ratio(raw.get("ratio"), where),
        file=file,
    )


def load_rules(directory: Path = RULES_DIR) -> list[Rule]:
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    for path in sorted(directory.glob("*.toml")):
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as err:
            raise RuleError(f"{path.name}: not valid TOML: {err}") from None
        for raw in data.get("rule", []):
            rule = _build_rule(raw, path.name)
            if rule.id in seen:
                raise RuleError(f"{path.name}: rule id {rule.id} is also defined in {seen[rule.id]}")
            seen[rule.id] = path.name
            rules.append(rule)
    return rules


@lru_cache(maxsize=1)
def default_rules() -> tuple[Rule, ...]:
    return tuple(load_rules())


def rule_by_id(rule_id: str) -> Rule | None:
    return next((rule for rule in default_rules() if rule.id == rule_id), None)
