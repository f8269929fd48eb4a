"""`torchtriage dump`: every rank's Python stack on this node, captured at once with py-spy."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchtriage import exit_codes
from torchtriage.cli.common import PID, SECONDS, emit
from torchtriage.collect.capture import DEFAULT_DUMP_TIMEOUT_S, CaptureResult, capture_stacks, default_out_dir
from torchtriage.collect.pyspy import sigterm_as_interrupt
from torchtriage.errors import UsageError
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
    parser.add_argument(
        "--slurm",
        metavar="JOBID",
        help="every node of this SLURM job, as one extra job step (srun --overlap), into --out: a folder the "
        "nodes share (default: one in the working directory)",
    )


def on_every_node(args: argparse.Namespace, verb_args: list[str], step_s: float) -> int:
    """`--slurm`: this verb on every node of the job; what landed where, and srun's problems."""
    from torchtriage.collect.slurm import on_every_node as run_on_nodes

    if args.pid:
        raise UsageError("--pid names processes of this node: leave it out with --slurm (each node finds its ranks)")
    folder, problems = run_on_nodes(args.slurm, verb_args + (["--native"] if args.native else []), args.out, step_s)
    nodes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    emit(
        f"{len(nodes)} node folder(s) of SLURM job {args.slurm} in {folder}: {', '.join(nodes)}"
        + "".join(f"\n  {p}" for p in problems)
        + f"\nthen: torchtriage diagnose {folder}"
    )
    return exit_codes.PROBLEM_FOUND if problems else exit_codes.OK


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
    if args.slurm:
        return on_every_node(args, ["dump", "--timeout", f"{args.timeout:g}"], 2 * args.timeout)
    with sigterm_as_interrupt():
        result = capture_stacks(args.pid, args.out, native=args.native, timeout_s=args.timeout)
    emit(json_text(result.to_json()) if args.json else capture_summary(result, "captured the stacks of"))
    return exit_code(result)
