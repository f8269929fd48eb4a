"""`torchtriage trace PATH...`: per-rank profiler traces in; step breakdown, collective skew and the straggler out."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchtriage import exit_codes
from torchtriage.analysis.trace import build_trace_verdict, read_traces
from torchtriage.cli.common import add_html, add_json, add_paths, check_html_target, emit, print_verdict, verdict_exit
from torchtriage.cli.progress import counting
from torchtriage.errors import InputError
from torchtriage.model import SourceKind
from torchtriage.report.tables import trace_tables
from torchtriage.sources.registry import discover, for_reader


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    add_paths(parser, "Chrome traces from torch.profiler (.json or .json.gz), one per rank, or folders of them")
    add_json(parser, "the verdict and every number")
    add_html(parser, "a self-contained HTML page with the plots")


def run(args: argparse.Namespace) -> int:
    check_html_target(args.html, "trace.html")
    problems: list[str] = []
    files = for_reader(discover(args.paths, problems), SourceKind.PROFILER_TRACE, problems)
    if not files:
        raise InputError("no profiler trace to read:\n  " + ("\n  ".join(problems) or "none given"))
    analysis = read_traces(files, progress=counting)
    analysis.problems[:0] = problems
    verdict = build_trace_verdict(analysis)
    if args.html:
        from torchtriage.report.html import render_trace_html

        try:
            Path(args.html).write_text(
                render_trace_html(verdict, {r.rank: r.timeline for r in analysis.ranks}), encoding="utf-8"
            )
        except OSError as err:
            raise InputError(f"--html {args.html}: cannot write it ({err.strerror or err}).") from None
    print_verdict(verdict, args.json, "" if args.json else trace_tables(verdict))
    if args.html and not args.json:
        emit(f"\nHTML report: {args.html}")
    if (analysis.incomplete or problems) and verdict.category != "straggler":
        return exit_codes.BAD_INPUT
    return verdict_exit(verdict)
