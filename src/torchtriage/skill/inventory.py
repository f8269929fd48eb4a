"""What exists, read from the tool itself: the verbs' options, the rules, the helpers and the verdict's keys.

Nothing here imports torch: parsers are built one verb at a time (as `torchtriage VERB` builds them), the
helpers' one-line descriptions are read from their source with `ast`, never by importing the runtime.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from functools import cache

import torchtriage
from torchtriage import exit_codes
from torchtriage.knowledge.rules import Rule, default_rules
from torchtriage.model import ROLES, Action, Category, Evidence, Finding, Machine, Verdict

_SEE_ALSO = re.compile(r"\s*\(see [^)]*\)")


class SkillError(Exception):
    """The skill names something the tool does not have: a bug in the skill's table, never the user's."""


# The command line's parser of each verb: the CLI hands it in (`use_parsers`), so that this package, below the CLI,
# never imports it.
ParserOf = Callable[[str], "argparse.ArgumentParser | None"]
_parser_of: list[ParserOf] = []


def use_parsers(parser_of: ParserOf) -> None:
    """Read the command line through `parser_of(verb)`: the verb's parser, or None for a verb the tool lacks."""
    _parser_of[:] = [parser_of]
    verb_parser.cache_clear()


@cache
def verb_parser(verb: str) -> argparse.ArgumentParser:
    """The parser `torchtriage VERB` uses."""
    if not _parser_of:
        raise SkillError("no command line to check the skill against (use_parsers was not called)")
    parser = _parser_of[0](verb)
    if parser is None:
        raise SkillError(f"the skill names `torchtriage {verb}`, which is not a verb")
    return parser


def option_help(verb: str, option: str) -> str:
    action = verb_parser(verb)._option_string_actions.get(option)
    if action is None:
        raise SkillError(f"`torchtriage {verb}` has no option {option}")
    return action.help or ""


def check_command(line: str) -> None:
    """Raise SkillError unless `torchtriage LINE` names a verb and only options it has (up to `--`)."""
    verb, *rest = line.split()
    verb_parser(verb)
    for token in rest:
        if token == "--":
            break
        if token.startswith("-") and token != "-":
            option_help(verb, token)


def rules_by_category() -> dict[str, list[Rule]]:
    """The built-in rules of each category, most explanatory first: causes, then by priority."""
    grouped: dict[str, list[Rule]] = defaultdict(list)
    for rule in sorted(default_rules(), key=lambda r: (ROLES.index(r.role), -r.priority, r.id)):
        grouped[rule.category].append(rule)
    return dict(grouped)


@dataclass(frozen=True)
class EnvSetting:
    name: str
    value: str  # as the first rule's action gives it (a `<...>` value says what to fill in)
    title: str  # that action's title
    rules: tuple[str, ...]  # every rule whose actions set it, most explanatory first


def env_by_category() -> dict[str, list[EnvSetting]]:
    """The environment variables the rules' actions set, per category, those set by most rules first."""
    found: dict[str, dict[str, list]] = defaultdict(dict)
    for category, rules in rules_by_category().items():
        for rule in rules:
            for action in rule.actions:
                for name in action.env:
                    found[category].setdefault(name, []).append((rule.id, action))
    return {
        category: sorted((_setting(name, setters) for name, setters in names.items()), key=lambda s: -len(s.rules))
        for category, names in found.items()
    }


def _setting(name: str, setters: list) -> EnvSetting:
    """Value and title from one action of the most explanatory rule that sets `name`: the action that names it,
    else the one that sets fewest others (the title is about this variable, not the others beside it)."""
    rules = tuple(dict.fromkeys(rule_id for rule_id, _ in setters))
    first = [action for rule_id, action in setters if rule_id == rules[0]]
    action = min(first, key=lambda a: (name not in a.title, len(a.env)))
    return EnvSetting(name, action.env[name], action.title, rules)


def public_helpers() -> tuple[str, ...]:
    """The helpers a training script imports from `torchtriage` (torch is imported only when one is used)."""
    return tuple(name for name in torchtriage.__all__ if name != "__version__")


def helpers_named_by_rules(category: str) -> list[str]:
    """The public helpers the actions of this category's rules name, most named first."""
    counts: dict[str, int] = defaultdict(int)
    for rule in rules_by_category().get(category, []):
        for action in rule.actions:
            text = " ".join((action.title, action.detail, action.command or ""))
            for name in public_helpers():
                if re.search(rf"\b{re.escape(name)}\b", text):
                    counts[name] += 1
    return sorted(counts, key=lambda name: -counts[name])


@cache
def helper_summary(name: str) -> str:
    """The first sentence of a public helper's docstring, read from its source without importing it."""
    module = torchtriage._LAZY_EXPORTS[name]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise SkillError(f"{name}: its module {module} is not in the package")
    with open(spec.origin, encoding="utf-8") as source:
        tree = ast.parse(source.read())
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            doc = ast.get_docstring(node) or ""
            first = doc.split("\n\n")[0].replace("\n", " ").replace("`", "")
            # "(see the module docstring)" points into the source, which the skill's reader does not have.
            first = _SEE_ALSO.sub("", first).rstrip(":").rstrip(".")
            return first + "."
    raise SkillError(f"{name}: no class or function of that name in {module}")


def categories() -> tuple[str, ...]:
    return tuple(c.value for c in Category)


@dataclass(frozen=True)
class VerdictShape:
    """The keys of the verdict's JSON, in the order it writes them, and of its nested objects."""

    verdict: tuple[str, ...]
    finding: tuple[str, ...]
    evidence: tuple[str, ...]
    action: tuple[str, ...]
    machine: tuple[str, ...]


def verdict_shape() -> VerdictShape:
    empty = Verdict(category=Category.UNKNOWN, culprit_ranks=[0], summary="")
    finding = asdict(Finding(kind="", ranks=[], message=""))
    finding.pop("facts")  # Verdict.to_json leaves a finding's facts out: they fill the actions' templates
    return VerdictShape(
        verdict=tuple(empty.to_json()),
        finding=tuple(finding),
        evidence=tuple(f.name for f in fields(Evidence)),
        action=tuple(f.name for f in fields(Action)),
        machine=tuple(f.name for f in fields(Machine)),
    )


def exit_code_lines() -> list[tuple[int, str]]:
    """Each exit code and its meaning, as `torchtriage --help` states them."""
    return [(int(code), text) for code, text in re.findall(r"^\s*(\d+)\s+(.+)$", exit_codes.HELP, re.MULTILINE)]
