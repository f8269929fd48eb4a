"""`torchtriage memory SNAPSHOT`: what holds GPU memory, the OOM, fragmentation, and what to change."""

from __future__ import annotations

import argparse

from torchtriage import exit_codes
from torchtriage.analysis.memory import (
    analyse_snapshot,
    build_memory_verdict,
    compare_reports,
    format_bytes,
)
from torchtriage.model import Verdict
from torchtriage.report.json_report import render_json
from torchtriage.report.text import render_text
from torchtriage.sources.memory_snapshot import load_snapshot


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


def run(args: argparse.Namespace) -> int:
    report = analyse_snapshot(load_snapshot(args.snapshot))
    if args.compare:
        verdict = compare_reports(report, analyse_snapshot(load_snapshot(args.compare)))
    else:
        verdict = build_memory_verdict(report)
    print(render_json(verdict) if args.json else render_text(verdict) + "\n" + _tables(verdict))
    return exit_codes.PROBLEM_FOUND if verdict.diagnosed_problem else exit_codes.OK
