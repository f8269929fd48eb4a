"""`torchtriage triage PATH... | -`: failure logs in, one verdict out."""

from __future__ import annotations

import argparse

from torchtriage import exit_codes
from torchtriage.analysis.pipeline import triage_paths
from torchtriage.errors import UsageError
from torchtriage.report.json_report import render_json
from torchtriage.report.text import render_text


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="log files, folders (read recursively), .gz logs, or - for standard input",
    )
    parser.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    parser.add_argument("--rules-dir", metavar="DIR", help="add the rules in DIR/*.toml to the built-in knowledge base")


def run(args: argparse.Namespace) -> int:
    if args.paths.count("-") > 1:
        raise UsageError("standard input (-) can be read only once.")
    verdict = triage_paths(args.paths, args.rules_dir)
    print(render_json(verdict) if args.json else render_text(verdict))
    return exit_codes.PROBLEM_FOUND if verdict.diagnosed_problem else exit_codes.OK
