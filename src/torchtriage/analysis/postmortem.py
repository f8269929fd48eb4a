"""A fused verdict from what a job left behind: stack dumps, flight-recorder dumps and logs.

Given folders and files, each is sorted by what it holds — py-spy stacks (`rank<N>.txt|json` in
py-spy's format), flight-recorder dumps (pickle or JSON), or logs (everything else that is text) —
each kind is analysed by its own reader, and the verdicts are fused.
"""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from torchtriage.analysis.fusion import HANG_SOURCES, fuse
from torchtriage.errors import TriageError
from torchtriage.model import Assessment, Verdict
from torchtriage.sources.files import rank_from_path

# Files of our own making, and source files, notes and pictures, are not evidence.
_OWN_FILES = ("summary.json", "verdict.json", "verdict.txt", "REQUEST")
_NOT_LOGS = (".md", ".py", ".sh", ".svg", ".html", ".htm", ".png", ".jpg")
_TRACE_SUFFIXES = (".json", ".json.gz")
# What a profiler trace and a CUDA memory snapshot hold in their first bytes.
_TRACE_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"distributedInfo"', b'"deviceProperties"')
_SNAPSHOT_KEYS = (b"segments", b"device_traces")


@dataclass
class Artifacts:
    stacks: list[str] = field(default_factory=list)
    flight_recorder: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    # Not evidence of a hang, and never to be read as dumps or logs: `trace` and `memory` read them.
    traces: list[str] = field(default_factory=list)
    snapshots: list[str] = field(default_factory=list)


def _looks_like_stack_dump(path: str, head: bytes) -> bool:
    if rank_from_path(path) is None or not path.endswith((".txt", ".json")):
        return False
    stripped = head.lstrip()
    if stripped.startswith(b"["):
        return b'"thread_id"' in head or b'"frames"' in head or stripped.startswith(b"[]")
    return stripped.startswith(b"Process ")


def _head(path: str, size: int = 4096) -> bytes | None:
    """The first bytes of a file, un-gzipped; None when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(size)
        if head[:2] == b"\x1f\x8b":
            with gzip.open(path, "rb") as handle:
                head = handle.read(size)
    except (OSError, EOFError, zlib.error):
        return None
    return head


def _files(paths: list[str]) -> list[str]:
    found = []
    for path in paths:
        if os.path.isfile(path):
            found.append(path)
            continue
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found += [os.path.join(root, name) for name in sorted(names) if not name.startswith(".")]
    return found


def sort_artifacts(paths: list[str], skip: set[str] | None = None) -> Artifacts:
    """Which files are stacks, flight-recorder dumps, logs, profiler traces or memory snapshots."""
    from torchtriage.sources.flight_recorder import discover_dumps

    skip = {os.path.abspath(p) for p in skip or ()}
    found = Artifacts()
    heads: dict[str, bytes | None] = {}
    for file in _files(paths):
        name = os.path.basename(file)
        if os.path.abspath(file) in skip or name in _OWN_FILES or name.endswith(_NOT_LOGS):
            continue
        if name.startswith("faulthandler-"):
            continue
        head = heads[file] = _head(file)
        if head is None:
            continue
        if name.endswith(_TRACE_SUFFIXES) and any(key in head for key in _TRACE_KEYS):
            found.traces.append(file)
        elif head[:1] == b"\x80" and any(key in head[:256] for key in _SNAPSHOT_KEYS):
            found.snapshots.append(file)
    set_aside = {os.path.abspath(p) for p in found.traces + found.snapshots}
    fr_files, _ = discover_dumps(paths)
    found.flight_recorder = [p for p in fr_files if p in heads and os.path.abspath(p) not in set_aside]
    taken = set_aside | {os.path.abspath(p) for p in found.flight_recorder}
    for file, head in heads.items():
        if os.path.abspath(file) in taken:
            continue
        if head is not None and _looks_like_stack_dump(file, head):
            found.stacks.append(file)
        else:
            found.logs.append(file)  # triage reports an unreadable file
    return found


def _analyse(kind: str, run, problems: dict[str, str]) -> Assessment | None:
    try:
        return run()
    except TriageError as err:
        problems[kind] = str(err)
        return None


def diagnose_artifacts(found: Artifacts) -> Verdict:
    """The fused verdict of stacks, flight-recorder dumps and logs already sorted."""
    problems: dict[str, str] = {}
    assessments: list[Assessment | None] = []
    if found.stacks:

        def stacks() -> Assessment:
            from torchtriage.analysis.stacks import analyze_stacks, assess_stacks
            from torchtriage.sources.pyspy import load_rank_dumps

            return assess_stacks(analyze_stacks(load_rank_dumps(found.stacks)), files=found.stacks)

        assessments.append(_analyse("stacks", stacks, problems))
    if found.flight_recorder:

        def flight_recorder() -> Assessment:
            from torchtriage.analysis.flight_recorder import assess_dumps
            from torchtriage.sources.flight_recorder import load_dumps

            return assess_dumps(load_dumps(found.flight_recorder))

        assessments.append(_analyse("flight_recorder", flight_recorder, problems))
    if found.logs:

        def logs() -> Assessment:
            from torchtriage.analysis.pipeline import assess_paths

            return assess_paths(found.logs)

        assessments.append(_analyse("logs", logs, problems))
    reasons = {
        "stacks": "no py-spy dumps found",
        "flight_recorder": "no flight-recorder dumps found",
        "logs": "no logs found",
    }
    reasons.update(problems)
    verdict = fuse([a for a in assessments if a is not None], reasons, expected=HANG_SOURCES)
    verdict.problems.extend(f"{kind}: {message}" for kind, message in problems.items())
    if found.traces or found.snapshots:
        verdict.facts["not_read_here"] = {"profiler_traces": found.traces, "memory_snapshots": found.snapshots}
    return verdict


def diagnose_paths(paths: list[str], extra_logs: list[str] | None = None) -> Verdict:
    """The fused verdict of every artifact under `paths` (and of `extra_logs`)."""
    found = sort_artifacts(paths)
    found.logs += extra_logs or []
    return diagnose_artifacts(found)


def diagnose_folder(folder: str | os.PathLike) -> Verdict:
    return diagnose_paths([str(Path(folder))])
