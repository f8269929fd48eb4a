"""`torchtriage fr PATH...`: per-rank flight-recorder dumps in; the first disagreement and its culprit out."""

from __future__ import annotations

import argparse

from torchtriage import exit_codes
from torchtriage.cli.common import add_json, add_paths, number, print_verdict, verdict_exit
from torchtriage.sources.flight_recorder import load_dumps


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    add_paths(
        parser, "dump files or folders of them (pickle or JSON, any naming: nccl_trace_rank_N, <prefix>N, host names)"
    )
    add_json(parser)
    parser.add_argument(
        "-j",
        "--jobs",
        type=number(int, 1, 4096, "a number of processes"),
        default=None,
        metavar="N",
        help="processes for loading (default: every core)",
    )


def run(args: argparse.Namespace) -> int:
    # The analysis is imported while the other processes start loading (a cold import takes tens of ms).
    load = load_dumps(args.paths, args.jobs, meanwhile=_import_analysis).require_dumps()
    from torchtriage.analysis.flight_recorder import build_verdict

    verdict = build_verdict(load)
    print_verdict(verdict, args.json)
    if not verdict.facts.get("compared", True) and verdict.facts.get("missing_ranks"):
        # One rank's dump of a job of several: nothing could be judged; the other dumps would let it be.
        return exit_codes.BAD_INPUT
    return verdict_exit(verdict)


def _import_analysis() -> None:
    import torchtriage.analysis.flight_recorder  # noqa: F401
    import torchtriage.report.json_report  # noqa: F401
