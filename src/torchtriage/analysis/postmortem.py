"""A fused verdict from what a job left behind: stack dumps, flight-recorder dumps and logs.

Given folders and files, each is sorted by what it holds — py-spy stacks (`rank<N>.txt|json` in
py-spy's format), flight-recorder dumps (pickle or JSON), or logs (everything else that is text) —
each kind is analysed by its own reader, and the verdicts are fused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from torchtriage.analysis.fusion import fuse
from torchtriage.errors import TriageError
from torchtriage.model import Verdict
from torchtriage.sources.files import rank_from_path

# Files of our own making, and source files and notes, are not evidence.
_OWN_FILES = ("summary.json", "verdict.json", "verdict.txt", "REQUEST")
_NOT_LOGS = (".md", ".py", ".sh", ".svg")
_STACK_HEAD = (b"Process ", b"[")


@dataclass
class Artifacts:
    stacks: list[str] = field(default_factory=list)
    flight_recorder: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)


def _looks_like_stack_dump(path: str, head: bytes) -> bool:
    if rank_from_path(path) is None or not path.endswith((".txt", ".json")):
        return False
    stripped = head.lstrip()
    if stripped.startswith(b"["):
        return b'"thread_id"' in head or b'"frames"' in head or stripped.startswith(b"[]")
    return stripped.startswith(b"Process ")


def sort_artifacts(paths: list[str]) -> Artifacts:
    """Which files are stacks, which flight-recorder dumps, which logs."""
    from torchtriage.sources.flight_recorder import discover_dumps

    fr_files, _ = discover_dumps(paths)
    fr_files = [p for p in fr_files if os.path.basename(p) not in _OWN_FILES]
    fr_set = {os.path.abspath(p) for p in fr_files}
    found = Artifacts(flight_recorder=fr_files)
    for path in paths:
        walk = (
            [path]
            if os.path.isfile(path)
            else [os.path.join(root, name) for root, _, names in os.walk(path) for name in sorted(names)]
        )
        for file in walk:
            name = os.path.basename(file)
            if (
                os.path.abspath(file) in fr_set
                or name in _OWN_FILES
                or name.endswith(_NOT_LOGS)
                or name.startswith((".", "faulthandler-"))
            ):
                continue
            try:
                with open(file, "rb") as handle:
                    head = handle.read(512)
            except OSError:
                found.logs.append(file)  # triage reports the unreadable file
                continue
            (found.stacks if _looks_like_stack_dump(file, head) else found.logs).append(file)
    return found


def _analyse(kind: str, run, problems: dict[str, str]) -> Verdict | None:
    try:
        return run()
    except TriageError as err:
        problems[kind] = str(err)
        return None


def diagnose_paths(paths: list[str], extra_logs: list[str] | None = None) -> Verdict:
    """The fused verdict of every artifact under `paths` (and of `extra_logs`)."""
    found = sort_artifacts(paths)
    found.logs += extra_logs or []
    problems: dict[str, str] = {}
    by_source: dict[str, Verdict | None] = {}
    if found.stacks:

        def stacks() -> Verdict:
            from torchtriage.analysis.stacks import analyze_stacks, stacks_verdict
            from torchtriage.sources.pyspy import load_rank_dumps

            return stacks_verdict(analyze_stacks(load_rank_dumps(found.stacks)))

        by_source["stacks"] = _analyse("stacks", stacks, problems)
    if found.flight_recorder:

        def flight_recorder() -> Verdict:
            from torchtriage.analysis.flight_recorder import build_verdict
            from torchtriage.sources.flight_recorder import load_dumps

            return build_verdict(load_dumps(found.flight_recorder))

        by_source["flight_recorder"] = _analyse("flight_recorder", flight_recorder, problems)
    if found.logs:

        def logs() -> Verdict:
            from torchtriage.analysis.pipeline import triage_paths

            return triage_paths(found.logs)

        by_source["logs"] = _analyse("logs", logs, problems)
    reasons = {
        "stacks": "no py-spy dumps found",
        "flight_recorder": "no flight-recorder dumps found",
        "logs": "no logs found",
    }
    reasons.update(problems)
    verdict = fuse(by_source, reasons)
    verdict.problems.extend(f"{kind}: {message}" for kind, message in problems.items())
    return verdict


def diagnose_folder(folder: str | os.PathLike) -> Verdict:
    return diagnose_paths([str(Path(folder))])
