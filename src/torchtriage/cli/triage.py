"""`torchtriage triage PATH... | -`: failure logs in, one verdict out."""

from __future__ import annotations

import argparse

from torchtriage import exit_codes
from torchtriage.analysis.log_records import read_logs
from torchtriage.analysis.triage import build_verdict
from torchtriage.errors import InputError, UsageError
from torchtriage.knowledge.matcher import Matcher
from torchtriage.knowledge.rules import RuleError, default_rules, load_rules
from torchtriage.report.json_report import render_json
from torchtriage.report.text import render_text
from torchtriage.sources.files import discover


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="log files, folders (read recursively), .gz logs, or - for standard input",
    )
    parser.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    parser.add_argument("--rules-dir", metavar="DIR", help="add the rules in DIR/*.toml to the built-in knowledge base")


def load_matcher(extra_dir: str | None) -> Matcher:
    from pathlib import Path

    rules = list(default_rules())
    if extra_dir:
        try:
            extra = load_rules(Path(extra_dir))
        except RuleError as err:
            raise UsageError(f"the rules in {extra_dir} do not load: {err}") from None
        known = {rule.id for rule in rules}
        rules += [rule for rule in extra if rule.id not in known]
    return Matcher(rules)


def run(args: argparse.Namespace) -> int:
    if args.paths.count("-") > 1:
        raise UsageError("standard input (-) can be read only once.")
    problems: list[str] = []
    artifacts = discover(args.paths, problems)
    records = read_logs(artifacts, load_matcher(args.rules_dir))
    records.problems[:0] = problems
    if not records.files_read:
        reasons = "\n  ".join(records.problems) or "no input"
        raise InputError(f"nothing could be read:\n  {reasons}")
    verdict = build_verdict(records)
    print(render_json(verdict) if args.json else render_text(verdict))
    return exit_codes.PROBLEM_FOUND if verdict.diagnosed_problem else exit_codes.OK
