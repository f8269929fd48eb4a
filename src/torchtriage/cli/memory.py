"""`torchtriage memory SNAPSHOT`: what holds GPU memory, the OOM, fragmentation, and what to change."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from torchtriage import exit_codes
from torchtriage.analysis.memory import (
    analyse_snapshot,
    build_memory_verdict,
    compare_reports,
    format_bytes,
    read_snapshot,
)
from torchtriage.cli.progress import counting
from torchtriage.errors import InputError, UsageError
from torchtriage.model import Verdict
from torchtriage.report.json_report import render_json
from torchtriage.report.text import render_text


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "snapshot", metavar="SNAPSHOT", help="a CUDA memory snapshot (.pickle from torch.cuda.memory._dump_snapshot)"
    )
    parser.add_argument("--json", action="store_true", help="print the verdict and every number as one JSON object")
    parser.add_argument(
        "--compare",
        metavar="OTHER",
        help="a later snapshot of the same job: show what grew, by allocation site (SNAPSHOT is the earlier one)",
    )
    parser.add_argument(
        "--html",
        metavar="FILE",
        help="also write a self-contained HTML page: allocation timeline and bytes by site (of SNAPSHOT, and OTHER)",
    )


def _tables(verdict: Verdict) -> str:
    lines: list[str] = []
    for device in verdict.facts.get("devices", []):
        lines += ["", f"device {device['device']}"]
        lines.append(
            f"  now       allocated {format_bytes(device['allocated'])}   reserved {format_bytes(device['reserved'])}"
            f"   reserved-unallocated {format_bytes(device['reserved_unallocated'])}   segments {device['segments']}"
        )
        if device["peak_allocated"] is not None:
            lines.append(
                f"  peak      allocated {format_bytes(device['peak_allocated'])}   "
                f"reserved {format_bytes(device['peak_reserved'])}   ({device['history_events']} history events)"
            )
        if device["oom"]:
            oom = device["oom"]
            free = format_bytes(oom["device_free"]) if oom["device_free"] is not None else "unknown"
            requested = format_bytes(oom["requested"])
            lines.append(f"  OOM       requested {requested}   device free {free}   at {oom['site']}")
        moment = {"oom": "at the OOM", "peak": "at the peak", "now": "now"}[device["reference"]]
        if device["top_sites"]:
            lines.append(f"  top allocation sites, by bytes alive {moment} ({format_bytes(device['reference_bytes'])})")
            for site in device["top_sites"]:
                lines.append(
                    f"    {format_bytes(site['bytes']):>11}  {site['share']:>5.0%}  {site['count']:>6} blocks  "
                    f"{site['site']}"
                )
        if device["largest_blocks"]:
            lines.append("  largest live blocks")
            for block in device["largest_blocks"][:5]:
                lines.append(f"    {format_bytes(block['size']):>11}  {block['address']}  {block['site']}")
        if device["fragmented_segments"]:
            lines.append("  segments with the most reserved-but-unallocated memory")
            for seg in device["fragmented_segments"][:5]:
                lines.append(
                    f"    {format_bytes(seg['free']):>11} free of {format_bytes(seg['total'])}  "
                    f"(largest free block {format_bytes(seg['largest_free_block'])})  {seg['address']}"
                )
    if "totals" in verdict.facts:
        lines += ["", "what changed, by site (before → after)"]
        for row in verdict.facts["sites"][:15]:
            lines.append(
                f"  {'+' if row['delta'] > 0 else ''}{format_bytes(row['delta']):>11}  "
                f"{format_bytes(row['before'])} → {format_bytes(row['after'])}  {row['site']}"
            )
    return "\n".join(lines)


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


def run(args: argparse.Namespace) -> int:
    if args.html and os.path.isdir(args.html):
        raise UsageError(f"--html {args.html}: a folder; give a file name (e.g. memory.html).")
    with counting(args.snapshot, "history events") as progress:
        snapshot = read_snapshot(args.snapshot, progress)
    report = analyse_snapshot(snapshot)
    drawn = [(snapshot, report)]
    if args.compare:
        with counting(args.compare, "history events") as progress:
            other = read_snapshot(args.compare, progress)
        other_report = analyse_snapshot(other)
        drawn.append((other, other_report))
        verdict = compare_reports(report, other_report)
    else:
        verdict = build_memory_verdict(report)
    if args.html:
        _write_html(args.html, verdict, drawn)
    print(render_json(verdict) if args.json else render_text(verdict) + "\n" + _tables(verdict))
    if args.html and not args.json:
        print(f"\nHTML report: {args.html}")
    return exit_codes.PROBLEM_FOUND if verdict.diagnosed_problem else exit_codes.OK
