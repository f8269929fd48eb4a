"""`torchtriage triage PATH... | -`: failure logs in, one verdict out."""

from __future__ import annotations

import argparse

from torchtriage.analysis.pipeline import triage_paths
from torchtriage.cli.common import add_json, add_paths, print_verdict, verdict_exit
from torchtriage.errors import UsageError


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    add_paths(parser, "log files, folders (read recursively), .gz logs, or - for standard input")
    add_json(parser)
    parser.add_argument("--rules-dir", metavar="DIR", help="add the rules in DIR/*.toml to the built-in knowledge base")


def run(args: argparse.Namespace) -> int:
    if args.paths.count("-") > 1:
        raise UsageError("standard input (-) can be read only once.")
    verdict = triage_paths(args.paths, args.rules_dir)
    print_verdict(verdict, args.json)
    return verdict_exit(verdict)
