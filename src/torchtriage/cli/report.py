"""`torchtriage report DIR --html FILE`: everything a run folder holds, in one HTML file for a bug report.

The folder is read as `diagnose` reads it — every artifact sorted by content through the source registry,
each kind assessed, one fused verdict — and drawn: stacks, the flight-recorder grid, trace charts, memory
timelines. Exit codes: 0 written and nothing wrong found; 1 written and a problem diagnosed; 2 usage;
3 nothing in DIR could be read (no page is written then).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from torchtriage.cli.common import add_html, add_limits, check_html_target, check_paths, emit, verdict_exit
from torchtriage.errors import InputError


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", metavar="DIR", help="a run folder: logs, py-spy dumps, FR dumps, traces, snapshots")
    add_html(parser, "the self-contained HTML page", required=True)
    add_limits(parser)


def build_report(folder: str, skip: set[str] | None = None):
    """The page and the fused verdict it heads. Raises InputError when nothing in the folder could be read."""
    from torchtriage.analysis.postmortem import analyse_run, gather
    from torchtriage.report.html import memory_series
    from torchtriage.report.run_page import MAX_SNAPSHOTS_DRAWN, run_page

    series: dict[str, dict] = {}

    def draw(snapshot, report) -> None:  # while the snapshot is in memory; it is not kept
        if len(series) < MAX_SNAPSHOTS_DRAWN:
            series[report.path] = {device.device: memory_series(snapshot, device) for device in report.devices}

    found = gather([folder], skip or ())
    run = analyse_run(found, on_snapshot=draw)
    generated = f"generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by torchtriage report"
    return run_page(folder, found, run, series, generated), run.verdict


def run(args: argparse.Namespace) -> int:
    check_paths([args.folder])
    check_html_target(args.html, "report.html")
    page, verdict = build_report(args.folder, skip={args.html})
    try:
        Path(args.html).write_text(page, encoding="utf-8")
    except OSError as err:
        raise InputError(f"--html {args.html}: cannot write it ({err.strerror or err}).") from None
    from torchtriage.report.safe_text import visible
    from torchtriage.report.text import render_text

    # The verdict's text is made visible by render_text (and coloured on a terminal): only the name is left.
    emit(render_text(verdict) + f"\nHTML report: {visible(args.html)}", styled=True)
    return verdict_exit(verdict)
