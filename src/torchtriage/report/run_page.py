"""The page of `torchtriage report`: one self-contained HTML file of everything a run folder holds.

The headline is the fused verdict — the same one `diagnose` prints — then what each source says on its
own, which sources were found, and a section per source: every rank's stack, the flight-recorder grid,
the profiler traces' charts, the memory snapshots' timelines. Inline CSS and SVG, no script, nothing
fetched; every string from the artifacts is escaped.
"""

from __future__ import annotations

from typing import Any

from torchtriage.analysis.fusion import verdict_of
from torchtriage.analysis.postmortem import STACK_KINDS, RunAnalysis, RunInputs
from torchtriage.model import SourceKind, Verdict
from torchtriage.report.html import (
    actions_block,
    esc,
    findings_table,
    flight_recorder_section,
    memory_sections,
    monitor_section,
    render_report_html,
    stacks_section,
    trace_sections,
    verdict_block,
)

MAX_SNAPSHOTS_DRAWN = 8  # beyond this, a snapshot gets its summary line only (the page stays readable)
# (the report's name for a source, the kinds it reads, what a folder without it lacks)
_SOURCES = (
    ("py-spy stacks", STACK_KINDS, "no py-spy dumps found (nor faulthandler dumps)"),
    ("flight-recorder dumps", (SourceKind.FLIGHT_RECORDER,), "no flight-recorder dumps found"),
    ("logs", (SourceKind.LOG,), "no logs found"),
    ("profiler traces", (SourceKind.PROFILER_TRACE,), "no profiler trace (.json / .json.gz) found"),
    ("memory snapshots", (SourceKind.MEMORY_SNAPSHOT,), "no CUDA memory snapshot found"),
)
_ASSESSED_BY = {
    "py-spy stacks": "stacks",
    "flight-recorder dumps": "flight_recorder",
    "logs": "logs",
    "profiler traces": "profiler_trace",
    "memory snapshots": "memory_snapshot",
}


def _source_status(found: RunInputs, run: RunAnalysis) -> list[tuple[str, str, bool]]:
    assessed = {a.source: a for a in run.assessments}
    status = []
    for name, kinds, missing in _SOURCES:
        files = found.of(*kinds)
        assessment = assessed.get(_ASSESSED_BY[name])
        if assessment is not None:
            status.append((name, f"read ({len(assessment.files)} of {len(files)} files)", True))
        else:
            status.append((name, "none of the files could be read" if files else missing, False))
    return status


def _glance(run: RunAnalysis) -> list[tuple[str, Verdict]]:
    """What each source says on its own; each memory snapshot is a row of its own."""
    rows = [(a.source.replace("_", " "), verdict_of(a)) for a in run.assessments if a.source != "memory_snapshot"]
    rows += [(f"memory snapshot {a.facts.get('snapshot', '')}", verdict_of(a)) for a in run.snapshots]
    return rows


def _sections(run: RunAnalysis, series: dict[str, dict[int, Any]]) -> list[tuple[str, str]]:
    culprits = run.verdict.culprit_ranks
    sections: list[tuple[str, str]] = []
    if run.stacks:
        from torchtriage.analysis.stacks import positions

        sections.append(("Per-rank state and stack", stacks_section(positions(run.stacks), run.stacks, culprits)))
    if run.flight_recorder is not None and run.flight_recorder.dumps:
        title = "Flight recorder: the last collectives of each rank"
        sections.append((title, flight_recorder_section(run.flight_recorder, culprits)))
    if run.verdict.findings or run.verdict.actions:
        evidence = actions_block(run.verdict) + "<h3>Findings, with their evidence</h3>" + findings_table(run.verdict)
        sections.append(("What to do, and the evidence", evidence))
    trace = next((a for a in run.assessments if a.source == "profiler_trace"), None)
    if trace is not None and run.traces is not None:
        verdict = verdict_of(trace)
        timelines = {r.rank: r.timeline for r in run.traces.ranks}
        sections.append(
            (
                "Profiler traces: where the time goes",
                verdict_block(verdict) + "".join(trace_sections(verdict, timelines)),
            )
        )
    if run.snapshots:
        sections.append(("CUDA memory snapshots", _snapshot_sections(run, series)))
    return sections


def _snapshot_sections(run: RunAnalysis, series: dict[str, dict[int, Any]]) -> str:
    body = []
    for number, assessment in enumerate(run.snapshots):
        verdict = verdict_of(assessment)
        path = assessment.facts.get("snapshot", "")
        body.append(f"<h3><code>{esc(path)}</code></h3>")
        if number >= MAX_SNAPSHOTS_DRAWN or path not in series:
            body.append(f"<p>{esc(verdict.summary)}</p>")
            continue
        body.append(verdict_block(verdict))
        body += memory_sections(verdict, series[path], level=4)
    return "".join(body)


def run_page(folder: str, found: RunInputs, run: RunAnalysis, series: dict[str, dict[int, Any]], generated: str) -> str:
    """The whole page. `series`: snapshot path -> device -> its allocation timeline (report.html.memory_series)."""
    from torchtriage.sources.monitor_windows import read_monitor

    glance = _glance(run)
    sections = _sections(run, series)
    problems = list(run.verdict.problems)
    monitor = read_monitor(folder)
    if monitor is not None:
        sections.append(("Step monitor: step time by rank", monitor_section(monitor.windows, monitor.decisions)))
        problems += monitor.problems
    return render_report_html(folder, run.verdict, glance, _source_status(found, run), sections, problems, generated)
