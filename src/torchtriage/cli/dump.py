"""`torchtriage dump`: every rank's Python stack on this node, captured at once with py-spy."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchtriage import exit_codes
from torchtriage.cli.common import PID, SECONDS, emit
from torchtriage.collect.capture import DEFAULT_DUMP_TIMEOUT_S, CaptureResult, capture_stacks, default_out_dir
from torchtriage.collect.pyspy import sigterm_as_interrupt
from torchtriage.report.json_report import json_text
from torchtriage.report.tables import capture_summary

INTERRUPTED = 130  # the shell's code for Ctrl-C


def add_targeting(parser: argparse.ArgumentParser) -> None:
    """--pid and --out, shared by `dump` and `record`."""
    parser.add_argument(
        "--pid",
        type=PID,
        action="append",
        metavar="PID",
        help="a rank's pid, or a torchrun agent's (expanded to its workers); repeatable. Default: the workers "
        "of the torchrun job on this node",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help=f"write <DIR>/<host>-<YYYYmmdd-HHMMSS>/ (default {default_out_dir()}, node-local; on a cluster "
        "give a shared directory to gather every node's folder)",
    )
    parser.add_argument(
        "--native", action="store_true", help="include native (C/C++/CUDA) frames (py-spy --native; slower)"
    )


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    add_targeting(parser)
    parser.add_argument(
        "--timeout",
        type=SECONDS,
        default=DEFAULT_DUMP_TIMEOUT_S,
        metavar="S",
        help=f"bound on each py-spy run (a rank gets two: text, then JSON); default {DEFAULT_DUMP_TIMEOUT_S:g}",
    )
    parser.add_argument("--json", action="store_true", help="print summary.json to standard output")


def exit_code(result: CaptureResult) -> int:
    if result.interrupted:
        return INTERRUPTED
    return exit_codes.OK if result.ok else exit_codes.PROBLEM_FOUND


def run(args: argparse.Namespace) -> int:
    with sigterm_as_interrupt():
        result = capture_stacks(args.pid, args.out, native=args.native, timeout_s=args.timeout)
    emit(json_text(result.to_json()) if args.json else capture_summary(result, "captured the stacks of"))
    return exit_code(result)
