"""`torchtriage rules` and `torchtriage explain RULE`: the knowledge base, browsable."""

from __future__ import annotations

import argparse
from dataclasses import replace

from torchtriage import exit_codes
from torchtriage.cli.common import emit
from torchtriage.errors import UsageError
from torchtriage.knowledge.actions import placeholder_facts, render
from torchtriage.knowledge.rules import Rule, default_rules
from torchtriage.model import CATEGORIES
from torchtriage.report.json_report import json_text


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    if verb == "explain":
        parser.add_argument("rule", metavar="RULE", help="a rule id, as `torchtriage rules` lists them")
    else:
        parser.add_argument("--category", choices=CATEGORIES, help="only the rules of this category")
    parser.add_argument("--json", action="store_true", help="print JSON")


def _as_dict(rule: Rule) -> dict:
    return {
        "id": rule.id,
        "category": rule.category,
        "title": rule.title,
        "role": rule.role,
        "priority": rule.priority,
        "cause": rule.cause,
        "source": rule.source,
        "patterns": [p.pattern for p in rule.patterns],
        "found_by": rule.found_by,
        "examples": list(rule.examples),
        "collateral_of": list(rule.collateral_of),
        "actions": [
            {"title": a.title, "detail": a.detail, "command": a.command, "env": a.env, "when": a.when}
            for a in rule.actions
        ],
    }


def _explain(rule: Rule) -> str:
    lines = [f"{rule.id}  [{rule.category}, {rule.role}]", rule.title, "", "cause:", f"  {rule.cause}", ""]
    if rule.found_by:
        lines += ["found by:", f"  {rule.found_by}"]
    else:
        lines += ["matches lines like:"] + [f"  {example}" for example in rule.examples[:3]]
    if rule.actions:
        lines += ["", "what to do:"]
    # Templates are shown with their facts as <name>: what a verdict fills in from the job.
    shown = placeholder_facts()
    for index, template in enumerate(rule.actions, 1):
        action = render(rule.id, replace(template, when=None), shown)
        when = f"  (when {template.when.replace('_', ' ')})" if template.when else ""
        lines.append(f"  {index}. {action.title}{when}")
        if action.detail:
            lines.append(f"     {action.detail}")
        lines += [f"     export {k}={v}" for k, v in action.env.items()]
        if action.command:
            lines.append(f"     $ {action.command}")
    lines += ["", f"{'reads' if rule.found_by else 'message format from'}: {rule.source}"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    rules = default_rules()
    if args.verb == "explain":
        rule = next((r for r in rules if r.id == args.rule), None)
        if rule is None:
            close = [r.id for r in rules if args.rule.lower() in r.id]
            hint = f" Did you mean: {', '.join(close[:5])}?" if close else " `torchtriage rules` lists them."
            raise UsageError(f"no rule {args.rule!r}.{hint}")
        emit(json_text(_as_dict(rule)) if args.json else _explain(rule), styled=args.json)
        return exit_codes.OK
    selected = [r for r in rules if not args.category or r.category == args.category]
    if args.json:
        emit(json_text([_as_dict(r) for r in selected]), styled=True)
        return exit_codes.OK
    width = max((len(r.id) for r in selected), default=10)
    lines = []
    for category in CATEGORIES:
        group = [r for r in selected if r.category == category]
        if group:
            lines.append(f"{category}")
            lines += [f"  {rule.id:<{width}}  {rule.title}" for rule in group]
    emit("\n".join(lines))
    return exit_codes.OK
