"""From findings to the actions a verdict carries, through the knowledge base only.

A rule's actions are templates: `{name}` is a fact of the finding, `[[ ... ]]` an optional part dropped
when a fact it names is missing, and `when = "fact"` keeps an action only for findings that carry that
fact. Every finding offers `who` ("rank 3", "ranks 0-2") and `rank` (its first rank) besides its own
facts, and `culprits` (the same as `who`) when it blames its ranks. An action whose required facts are
missing is not given: a fix is never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torchtriage.model import Action, Finding
from torchtriage.ranks import format_ranks

_FIELD = re.compile(r"\{(\w+)\}")
_OPTIONAL = re.compile(r"\[\[(.*?)\]\]", re.DOTALL)


@dataclass(frozen=True)
class ActionTemplate:
    title: str
    detail: str = ""
    command: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    when: str | None = None  # a fact the finding must carry for this action to apply


def _present(value: Any) -> bool:
    return value is not None and value is not False and value != "" and value != [] and value != {}


def fill(text: str, facts: Mapping[str, Any]) -> str | None:
    """`text` with its fields filled from `facts`; None when a required field is missing."""

    def optional(match: re.Match) -> str:
        inner = match.group(1)
        return inner if all(_present(facts.get(name)) for name in _FIELD.findall(inner)) else ""

    text = _OPTIONAL.sub(optional, text)
    if any(not _present(facts.get(name)) for name in _FIELD.findall(text)):
        return None
    return _FIELD.sub(lambda m: str(facts[m.group(1)]), text)


def template_facts(finding: Finding) -> dict[str, Any]:
    """What an action's template may name: the finding's facts, `who`, `rank` and `culprits`."""
    facts: dict[str, Any] = {"who": format_ranks(finding.ranks, none="")}
    if finding.ranks:
        facts["rank"] = finding.ranks[0]
        if finding.blames:
            facts["culprits"] = facts["who"]
    facts.update(finding.facts)
    return facts


def render(rule_id: str, template: ActionTemplate, facts: Mapping[str, Any]) -> Action | None:
    if template.when is not None and not _present(facts.get(template.when)):
        return None
    title = fill(template.title, facts)
    detail = fill(template.detail, facts) if template.detail else ""
    command = fill(template.command, facts) if template.command else None
    env = {name: fill(value, facts) for name, value in template.env.items()}
    if title is None or detail is None or (template.command and command is None) or None in env.values():
        return None
    return Action(rule_id, title, detail, command, env)  # type: ignore[arg-type]


def _names_the_culprit(template: ActionTemplate) -> bool:
    fields = set(_FIELD.findall(template.title)) | set(_FIELD.findall(template.detail))
    return bool(fields & {"culprits", "culprit_rank"})


def placeholder_facts() -> Mapping[str, Any]:
    """Facts that show every field as `<name>`: how `explain` prints a template."""

    class Placeholders(dict):
        def get(self, key, default=None):
            return f"<{key}>"

        def __getitem__(self, key):
            return f"<{key}>"

    return Placeholders()


def route(
    findings: Iterable[Finding],
    rules: Mapping[str, Any],
    *,
    skip_commands: tuple[str, ...] = (),
    env_in_effect: Mapping[str, str] | None = None,
) -> list[Action]:
    """The actions of `findings`, those that name the culprit first, then in the findings' order, each once.

    `rules` maps a finding kind to its rule. `skip_commands` drops actions whose command starts with one
    of them: what the user has just run (`torchtriage triage` after a triage) adds nothing. `env_in_effect`
    drops actions that only set what the evidence shows the job already had set.
    """
    in_effect = env_in_effect or {}
    seen: set = set()
    actions: list[Action] = []
    candidates = []
    for finding in findings:
        rule = rules.get(finding.kind)
        if rule is not None:
            facts = template_facts(finding)
            candidates += [(rule.id, template, facts) for template in rule.actions]
    # What the analysis found about this job's culprit comes first; the rules' general advice follows.
    candidates.sort(key=lambda c: not _names_the_culprit(c[1]))
    for rule_id, template, facts in candidates:
        action = render(rule_id, template, facts)
        if action is None or (action.command or "").startswith(skip_commands):
            continue
        if action.env and not action.command and all(in_effect.get(k) == v for k, v in action.env.items()):
            continue
        # Rules of one family repeat a fix under their own titles (arming the flight recorder, say): an
        # action whose command and environment were already given adds nothing.
        keys = {("title", action.title)}
        if action.command or action.env:
            keys.add(("fix", action.command, tuple(sorted(action.env.items()))))
        if keys & seen:
            continue
        seen |= keys
        actions.append(action)
    return actions
