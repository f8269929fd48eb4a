"""`torchtriage report DIR --html FILE`: everything a run folder holds, in one HTML file for a bug report.

The folder is sorted once: profiler traces (Chrome JSON, `.json` / `.json.gz`) and CUDA memory
snapshots (pickles whose first key is `segments` / `device_traces`) go to their own readers; the rest
(py-spy stacks, flight-recorder dumps, logs) goes to the fused post-mortem verdict of `diagnose`.
Each source that is found gets a section; those that are not are listed as missing. The page is one
file: inline CSS and SVG, no script, nothing fetched; every string from the artifacts is escaped.

Exit codes: 0 written and nothing wrong found; 1 written and a problem diagnosed (the fused verdict, a
straggler in the traces, or an OOM / fragmentation in a snapshot); 2 usage; 3 nothing in DIR could be
read (no page is written then).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from torchtriage import exit_codes
from torchtriage.analysis.postmortem import Artifacts, diagnose_artifacts, sort_artifacts
from torchtriage.errors import InputError, TriageError, UsageError
from torchtriage.model import Verdict

_MAX_SNAPSHOTS_DRAWN = 8  # beyond this, a snapshot gets its summary line only (the page stays readable)


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", metavar="DIR", help="a run folder: logs, py-spy dumps, FR dumps, traces, snapshots")
    parser.add_argument("--html", metavar="FILE", required=True, help="where to write the self-contained HTML page")


def sort_folder(folder: str, skip: set[str] | None = None) -> Artifacts:
    """Stacks, FR dumps, logs, traces and snapshots, sorted as `diagnose` sorts them."""
    return sort_artifacts([folder], skip)


def fused_verdict(found: Artifacts) -> Verdict | None:
    """What `diagnose DIR` says of the stacks, FR dumps and logs; None when the folder has none."""
    if not (found.stacks or found.flight_recorder or found.logs):
        return None
    return diagnose_artifacts(found)


def _stacks_and_fr(found: Artifacts, culprits: list[int]) -> tuple[list[tuple[str, str]], list[str]]:
    from torchtriage.report.html import flight_recorder_section, stacks_section

    sections: list[tuple[str, str]] = []
    problems: list[str] = []
    if found.stacks:
        from torchtriage.analysis.stacks import positions
        from torchtriage.sources.pyspy import load_rank_dumps

        try:
            dumps = load_rank_dumps(found.stacks)
            sections.append(("Per-rank state and stack (py-spy)", stacks_section(positions(dumps), dumps, culprits)))
        except TriageError as err:
            problems.append(f"py-spy dumps: {err}")
    if found.flight_recorder:
        from torchtriage.sources.flight_recorder import load_dumps

        try:
            load = load_dumps(found.flight_recorder, jobs=1)
        except TriageError as err:
            problems.append(f"flight-recorder dumps: {err}")
        else:
            if load.dumps:
                title = "Flight recorder: the last collectives of each rank"
                sections.append((title, flight_recorder_section(load, culprits)))
    return sections, problems


def _traces(paths: list[str]) -> tuple[Verdict | None, str, list[str]]:
    from torchtriage.analysis.trace import analyse_traces, build_trace_verdict
    from torchtriage.report.html import trace_sections, verdict_block
    from torchtriage.sources.profiler_trace import TraceReadError, read_trace

    traces, problems = [], []
    for path in paths:
        try:
            traces.append(read_trace(path))
        except TraceReadError as err:
            problems.append(f"{path}: {err}")
    if not traces:
        return None, "", problems
    analysis = analyse_traces(traces)
    verdict = build_trace_verdict(analysis)
    body = verdict_block(verdict) + "".join(trace_sections(verdict, {r.rank: r.timeline for r in analysis.ranks}))
    return verdict, body, problems + analysis.problems


def _snapshots(paths: list[str]) -> tuple[list[Verdict], str, list[str]]:
    from torchtriage.analysis.memory import analyse_snapshot, build_memory_verdict, read_snapshot
    from torchtriage.report.html import esc, memory_sections, memory_series, verdict_block

    verdicts, body, problems = [], [], []
    for number, path in enumerate(paths):
        try:
            snapshot = read_snapshot(path)
        except TriageError as err:
            problems.append(str(err))
            continue
        report = analyse_snapshot(snapshot)
        verdict = build_memory_verdict(report)
        verdicts.append(verdict)
        problems += [f"{path}: {p}" for p in verdict.problems]
        body.append(f"<h3><code>{esc(path)}</code></h3>")
        if number >= _MAX_SNAPSHOTS_DRAWN:
            body.append(f"<p>{esc(verdict.summary)}</p>")
            continue
        body.append(verdict_block(verdict))
        series = {device.device: memory_series(snapshot, device) for device in report.devices}
        body += memory_sections(verdict, series, level=4)
        del snapshot, report
    return verdicts, "".join(body), problems


def build_report(folder: str, skip: set[str] | None = None) -> tuple[str, Verdict | None, bool]:
    """The page, its headline verdict, and whether any source diagnosed a problem.

    Raises InputError when nothing in the folder could be read.
    """
    from torchtriage.report.html import render_report_html

    found = sort_folder(folder, skip)
    verdict = fused_verdict(found)
    used = set(verdict.facts.get("sources_used", [])) if verdict else set()
    missing = verdict.facts.get("sources_missing", {}) if verdict else {}
    problems = list(verdict.problems) if verdict else []
    culprits = verdict.culprit_ranks if verdict else []
    sections, more = _stacks_and_fr(found, culprits)
    problems += more
    if verdict is not None and used and (verdict.findings or verdict.actions):
        from torchtriage.report.html import actions_block, findings_table

        evidence = actions_block(verdict) + "<h3>Findings, with their evidence</h3>" + findings_table(verdict)
        sections.append(("The verdict of the stacks, flight recorder and logs", evidence))

    trace_verdict, trace_body, trace_problems = _traces(found.traces) if found.traces else (None, "", [])
    problems += trace_problems
    if trace_body:
        sections.append(("Profiler traces: where the time goes", trace_body))
    memory_verdicts, memory_body, memory_problems = _snapshots(found.snapshots) if found.snapshots else ([], "", [])
    problems += memory_problems
    if memory_body:
        sections.append(("CUDA memory snapshots", memory_body))

    def status(name: str, key: str, files: list[str], reason: str) -> tuple[str, str, bool]:
        if key in used:
            return name, f"read ({len(files)} files)", True
        return name, str(missing.get(key) or reason), False

    def other(name: str, ok: bool, files: list[str], read: int, what: str) -> tuple[str, str, bool]:
        if ok:
            return name, f"read ({read} of {len(files)} files)", True
        return name, ("none of the files could be read" if files else f"no {what} found"), False

    sources = [
        status("py-spy stacks", "stacks", found.stacks, "no py-spy dumps found"),
        status("flight-recorder dumps", "flight_recorder", found.flight_recorder, "no flight-recorder dumps found"),
        status("logs", "logs", found.logs, "no logs found"),
        other(
            "profiler traces",
            trace_verdict is not None,
            found.traces,
            len(trace_verdict.facts["ranks"]) if trace_verdict else 0,
            "profiler trace (.json / .json.gz)",
        ),
        other("memory snapshots", bool(memory_verdicts), found.snapshots, len(memory_verdicts), "CUDA memory snapshot"),
    ]
    if not used and trace_verdict is None and not memory_verdicts:
        raise InputError(
            f"{folder}: nothing readable: no py-spy dump, flight-recorder dump, log, profiler trace or memory snapshot."
            + ("\n  " + "\n  ".join(problems) if problems else "")
        )
    verdicts: list[tuple[str, Verdict]] = []
    if verdict is not None and used:
        verdicts.append(("stacks, flight recorder and logs", verdict))
    if trace_verdict is not None:
        verdicts.append(("profiler traces", trace_verdict))
    verdicts += [(f"memory snapshot {v.facts.get('snapshot', '')}", v) for v in memory_verdicts]
    # The headline: the first source that diagnosed something (the fused post-mortem first), else the first.
    headline = next((v for _, v in verdicts if v.diagnosed_problem), verdicts[0][1] if verdicts else None)
    generated = f"generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by torchtriage report"
    page = render_report_html(folder, headline, verdicts, sources, sections, problems, generated)
    return page, headline, any(v.diagnosed_problem for _, v in verdicts)


def run(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.folder):
        raise UsageError(f"{args.folder}: not a folder; give the run folder (logs, dumps, traces, snapshots).")
    if os.path.isdir(args.html):
        raise UsageError(f"--html {args.html}: a folder; give a file name (e.g. report.html).")
    page, verdict, problem = build_report(args.folder, skip={args.html})
    try:
        Path(args.html).write_text(page, encoding="utf-8")
    except OSError as err:
        raise InputError(f"--html {args.html}: cannot write it ({err.strerror or err}).") from None
    if verdict is not None:
        from torchtriage.report.text import render_text

        print(render_text(verdict))
    print(f"HTML report: {args.html}")
    return exit_codes.PROBLEM_FOUND if problem else exit_codes.OK
