"""`torchtriage trace PATH...`: per-rank profiler traces in; step breakdown, collective skew and the straggler out."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from torchtriage import exit_codes
from torchtriage.analysis.trace import analyse_traces, build_trace_verdict
from torchtriage.cli.progress import counting
from torchtriage.errors import InputError, UsageError
from torchtriage.model import Verdict
from torchtriage.report.json_report import render_json
from torchtriage.report.text import render_text
from torchtriage.sources.profiler_trace import TraceReadError, read_trace

_SUFFIXES = (".json", ".json.gz")


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="Chrome traces from torch.profiler (.json or .json.gz), one per rank, or folders of them",
    )
    parser.add_argument("--json", action="store_true", help="print the verdict and every number as one JSON object")
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page with the plots")


def expand(paths: list[str]) -> list[str]:
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(str(p) for p in Path(path).rglob("*") if p.is_file() and p.name.endswith(_SUFFIXES))
            if not found:
                raise InputError(f"{path}: no .json or .json.gz trace in this folder.")
            files += found
        elif os.path.exists(path):
            files.append(path)
        else:
            raise InputError(f"{path}: no such file or folder.")
    return files


def _tables(verdict: Verdict) -> str:
    ms = lambda us: f"{us / 1000:8.2f}"  # noqa: E731
    lines = ["", "per rank, mean step (ms)      step  compute     comm   memory     idle  overlapped-comm"]
    for rank in verdict.facts["ranks"]:
        m = rank["mean_step"]
        if not m:
            lines.append(f"  rank {rank['rank']:<4} no steps")
        elif rank["has_gpu"]:
            lines.append(
                f"  rank {rank['rank']:<4} ({len(rank['steps'])} steps)  {ms(m['duration'])} {ms(m['compute'])} "
                f"{ms(m['communication'])} {ms(m['memory'])} {ms(m['idle'])} {ms(m['overlapped_communication'])}"
            )
        else:
            lines.append(
                f"  rank {rank['rank']:<4} ({len(rank['steps'])} steps)  {ms(m['cpu_duration'])}  CPU only: "
                f"{ms(m['collective_cpu'])} in collective calls"
            )
    colls = verdict.facts["collectives"]
    if colls:
        lines += ["", f"collectives matched across ranks: {len(colls)} (slowest to agree first)"]
        lines.append("  key                         op            size      latency   busbw GB/s   skew      last")
        for c in sorted(colls, key=lambda c: -c["skew"])[:10]:
            size = f"{c['bytes'] / 2**20:.1f} MiB" if c["bytes"] else "?"
            bw = f"{c['busbw_gbps']:.1f}" if c["busbw_gbps"] is not None else "-"
            last = c["last_rank"] if c["last_rank"] is not None else "-"
            lines.append(
                f"  {c['key'][:27]:<27} {c['name'][:12]:<12} {size:>9} {c['latency'] / 1000:9.3f}ms {bw:>10} "
                f"{c['skew'] / 1000:8.3f}ms  {last}"
            )
    ranking = verdict.facts["straggler_ranking"]
    if ranking:
        lines += ["", "straggler ranking (others' wait per step caused by each rank)"]
        for row in ranking:
            lines.append(
                f"  rank {row['rank']:<4} last at {row['last_arrivals']}/{row['of_collectives']}  "
                f"{row['wait_caused_per_step_us'] / 1000:.2f} ms/step"
            )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.html and os.path.isdir(args.html):
        raise UsageError(f"--html {args.html}: a folder; give a file name (e.g. trace.html).")
    traces, problems = [], []
    for path in expand(args.paths):
        try:
            with counting(path) as progress:
                traces.append(read_trace(path, progress=progress))
        except TraceReadError as err:
            problems.append(f"{path}: {err}")
    if not traces:
        raise InputError("no trace could be read:\n  " + "\n  ".join(problems))
    analysis = analyse_traces(traces)
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
    print(render_json(verdict) if args.json else render_text(verdict) + "\n" + _tables(verdict))
    if args.html and not args.json:
        print(f"\nHTML report: {args.html}")
    if (problems or any(t.partial for t in traces)) and verdict.category != "straggler":
        return exit_codes.BAD_INPUT
    return exit_codes.PROBLEM_FOUND if verdict.diagnosed_problem else exit_codes.OK
