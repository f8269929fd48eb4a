"""`torchtriage memory SNAPSHOT`: what holds GPU memory, the OOM, fragmentation, and what to change."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchtriage.analysis.memory import analyse_snapshot, build_memory_verdict, compare_reports, read_snapshot
from torchtriage.cli.common import add_html, add_json, add_limits, check_html_target, emit, print_verdict, verdict_exit
from torchtriage.cli.progress import counting
from torchtriage.errors import InputError
from torchtriage.model import SourceKind, Verdict
from torchtriage.report.tables import memory_tables
from torchtriage.sources.registry import discover, for_reader


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "snapshot", metavar="SNAPSHOT", help="a CUDA memory snapshot (.pickle from torch.cuda.memory._dump_snapshot)"
    )
    add_json(parser, "the verdict and every number")
    parser.add_argument(
        "--compare",
        metavar="OTHER",
        help="a later snapshot of the same job: show what grew, by allocation site (SNAPSHOT is the earlier one)",
    )
    add_html(parser, "a self-contained HTML page: allocation timeline and bytes by site (of SNAPSHOT, and OTHER)")
    add_limits(parser)


def _write_html(path: str, verdict: Verdict, snapshots: list) -> None:
    """The verdict, then per snapshot ((MemorySnapshot, MemoryReport) pairs) and device: timeline and sites."""
    from torchtriage.report.html import esc, memory_sections, memory_series, render_memory_html

    title = " vs ".join(report.path for _, report in snapshots)
    parts = []
    for snapshot, report in snapshots:
        charts = {device.device: memory_series(snapshot, device) for device in report.devices}
        own = verdict if len(snapshots) == 1 else build_memory_verdict(report)
        if len(snapshots) > 1:
            parts.append(f"<h2>{esc(report.path)}</h2><p>{esc(own.summary)}</p>")
        parts += memory_sections(own, charts, level=3 if len(snapshots) > 1 else 2)
    page = render_memory_html(verdict, {}, title).replace("</body>", "".join(parts) + "</body>")
    try:
        Path(path).write_text(page, encoding="utf-8")
    except OSError as err:
        raise InputError(f"--html {path}: cannot write it ({err.strerror or err}).") from None


def _snapshot(path: str) -> str:
    """`path` if it holds a CUDA memory snapshot; otherwise what it is, and the verb that reads it."""
    problems: list[str] = []
    inputs = discover([path], problems)
    if len(inputs) > 1:
        raise InputError(f"{path}: give one snapshot file (torch.cuda.memory._dump_snapshot writes one per process).")
    chosen = for_reader(inputs, SourceKind.MEMORY_SNAPSHOT, problems)
    if not chosen:
        raise InputError(problems[0] if problems else f"{path}: nothing to read.")
    return chosen[0]


def run(args: argparse.Namespace) -> int:
    check_html_target(args.html, "memory.html")
    with counting(args.snapshot, "history events") as progress:
        snapshot = read_snapshot(_snapshot(args.snapshot), progress)
    report = analyse_snapshot(snapshot)
    drawn = [(snapshot, report)]
    if args.compare:
        with counting(args.compare, "history events") as progress:
            other = read_snapshot(_snapshot(args.compare), progress)
        other_report = analyse_snapshot(other)
        drawn.append((other, other_report))
        verdict = compare_reports(report, other_report)
    else:
        verdict = build_memory_verdict(report)
    if args.html:
        _write_html(args.html, verdict, drawn)
    print_verdict(verdict, args.json, "" if args.json else memory_tables(verdict))
    if args.html and not args.json:
        emit(f"\nHTML report: {args.html}")
    return verdict_exit(verdict)
