"""`torchtriage history DIR...`: the attempts of a job, and whether its failures follow a machine or the program.

Each DIR is a run folder of `torchtriage run` (its attempts: DIR itself, then DIR/.attempt-1 ...; the launcher's
restarts and requeues), or the folder of an earlier job, read as one attempt. Each attempt's folder gets the
verdict `diagnose` would give it, with its culprit's machine; analysis/history.py compares them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from torchtriage import exit_codes
from torchtriage.analysis.history import AttemptResult, judge
from torchtriage.cli.common import add_json, add_paths, check_paths, emit
from torchtriage.errors import InputError, TriageError, UsageError
from torchtriage.protocol import recorded_attempts


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    add_paths(
        parser,
        "run folders of `torchtriage run` (every attempt in each is read), or folders of earlier jobs (one attempt "
        "each), in the order they ran",
    )
    add_json(parser, "each attempt's verdict and what the attempts say together")


def attempts_of(paths: list[str]) -> list[tuple[int, Path, str]]:
    """(attempt, folder, name) of every attempt under `paths`, in the order given, each path's by number."""
    found = []
    for path in paths:
        folder = Path(path)
        if not folder.is_dir():
            raise UsageError(f"{path}: not a folder; give run folders (torchtriage run --out DIR) or a job's folder.")
        attempts = recorded_attempts(folder) or {0: folder}
        for number, where in attempts.items():
            name = f"attempt {number}" if len(paths) == 1 else f"attempt {number} of {path}"
            found.append((number, where, name))
    return found


def verdict_of(number: int, folder: Path, name: str) -> AttemptResult:
    """The attempt with the verdict of its folder, or with why it has none."""
    from torchtriage.analysis.postmortem import analyse_run, gather

    try:
        verdict = analyse_run(gather([str(folder)])).verdict
    except TriageError as err:
        first = str(err).splitlines()[0].rstrip(":")
        return AttemptResult(number, str(folder), None, note=f"no verdict: {first}", label=name)
    return AttemptResult(number, str(folder), verdict, label=name)


def run(args: argparse.Namespace) -> int:
    from torchtriage.report.history import history_json, render_history_text
    from torchtriage.report.json_report import json_text

    check_paths(args.paths)
    attempts = [verdict_of(*attempt) for attempt in attempts_of(list(args.paths))]
    if all(a.verdict is None for a in attempts):
        notes = "\n  ".join(f"{a.name} ({a.folder}): {a.note}" for a in attempts)
        raise InputError(
            "no attempt left anything to judge; give the folder `torchtriage run --out DIR` wrote, or folders of a "
            f"job's logs and dumps:\n  {notes}"
        )
    judgement = judge(attempts)
    emit(json_text(history_json(judgement)) if args.json else render_history_text(judgement))
    return exit_codes.PROBLEM_FOUND if any(a.failed for a in attempts) else exit_codes.OK
