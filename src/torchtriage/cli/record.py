"""`torchtriage record`: flame graphs (SVG and speedscope) of every rank on this node, over one window."""

from __future__ import annotations

import argparse

from torchtriage.cli.common import SECONDS, emit, number
from torchtriage.cli.dump import add_targeting, exit_code, on_every_node
from torchtriage.collect.capture import RECORD_SLACK_S, record_profiles
from torchtriage.collect.pyspy import sigterm_as_interrupt
from torchtriage.report.json_report import json_text
from torchtriage.report.tables import capture_summary


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    add_targeting(parser)
    parser.add_argument(
        "--duration",
        type=number(int, 1, 86400, "whole seconds"),
        default=30,
        metavar="S",
        help="seconds to sample (default 30)",
    )
    parser.add_argument(
        "--rate",
        type=number(int, 1, 10_000, "samples per second"),
        default=100,
        metavar="HZ",
        help="samples per second (default 100)",
    )
    parser.add_argument(
        "--idle",
        action="store_true",
        help="include idle threads (waiting in a collective, sleeping): needed to see where a stuck rank waits",
    )
    parser.add_argument(
        "--nonblocking",
        action="store_true",
        help="do not pause the ranks to sample (py-spy --nonblocking): less overhead, occasionally torn stacks",
    )
    parser.add_argument(
        "--timeout",
        type=SECONDS,
        default=RECORD_SLACK_S,
        metavar="S",
        help=f"extra seconds beyond --duration before a py-spy is killed (default {RECORD_SLACK_S:g})",
    )
    parser.add_argument("--json", action="store_true", help="print summary.json to standard output")


def run(args: argparse.Namespace) -> int:
    if args.slurm:
        node_args = ["record", "--duration", str(args.duration), "--rate", str(args.rate)]
        node_args += ["--timeout", f"{args.timeout:g}"] if args.timeout is not None else []
        node_args += [flag for flag, on in (("--idle", args.idle), ("--nonblocking", args.nonblocking)) if on]
        return on_every_node(args, node_args, args.duration + RECORD_SLACK_S + (args.timeout or 0))
    with sigterm_as_interrupt():
        result = record_profiles(
            args.pid,
            args.out,
            duration_s=args.duration,
            rate=args.rate,
            native=args.native,
            idle=args.idle,
            nonblocking=args.nonblocking,
            timeout_s=args.timeout,
        )
    emit(json_text(result.to_json()) if args.json else capture_summary(result, "recorded"))
    return exit_code(result)
