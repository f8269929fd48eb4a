"""The triage flow as library calls: sources -> records -> verdict (the CLI only renders it)."""

from __future__ import annotations

import io
from pathlib import Path

from torchtriage.analysis.fusion import verdict_of
from torchtriage.analysis.machines import attach_machines
from torchtriage.analysis.nonfinite_values import read_nonfinite_values
from torchtriage.analysis.triage import assess_logs
from torchtriage.errors import InputError
from torchtriage.knowledge.matcher import Matcher
from torchtriage.knowledge.rules import RuleError, default_rules, with_extra_rules
from torchtriage.model import Assessment, SourceKind, Verdict
from torchtriage.sources.identity import ranks_of_the_job
from torchtriage.sources.log_records import LogRecords, read_logs
from torchtriage.sources.registry import Input, discover, log_input, not_read_here

_default_matcher: Matcher | None = None


def matcher_for(extra_rules_dir: str | None = None) -> Matcher:
    """The built-in knowledge base, plus the rules in `extra_rules_dir` when given."""
    global _default_matcher
    if not extra_rules_dir:
        if _default_matcher is None:
            _default_matcher = Matcher(default_rules())
        return _default_matcher
    try:
        return Matcher(with_extra_rules(Path(extra_rules_dir)))
    except RuleError as err:
        raise InputError(f"--rules-dir: the rules do not load: {err}") from None


def assess_inputs(inputs: list[Input], matcher: Matcher | None = None, problems: list[str] | None = None) -> Assessment:
    """What the logs among `inputs` say, knowing the job's ranks from its identity records among them. Raises
    InputError when no log could be read."""
    problems = list(problems or []) + not_read_here(inputs, (SourceKind.LOG,))
    records = read_logs([i for i in inputs if i.kind == SourceKind.LOG], matcher or matcher_for())
    records.problems[:0] = problems
    records.ranks_known = ranks_of_the_job([i.path for i in inputs if i.kind == SourceKind.IDENTITY])
    if not records.files_read:
        reasons = "\n  ".join(records.problems) or "no input"
        raise InputError(f"no log could be read:\n  {reasons}")
    return assess_logs(read_nonfinite_values(records))


def assess_paths(paths: list[str], matcher: Matcher | None = None) -> Assessment:
    """What the logs at `paths` (files, folders, `-`) say. Raises InputError when no log could be read."""
    problems: list[str] = []
    inputs = discover(paths, problems)
    return assess_inputs(inputs, matcher, problems)


def triage_paths(paths: list[str], extra_rules_dir: str | None = None) -> Verdict:
    """Triage log files, folders and `-` (stdin). Raises InputError when nothing could be read."""
    matcher = matcher_for(extra_rules_dir)
    problems: list[str] = []
    inputs = discover(paths, problems)
    verdict = verdict_of(assess_inputs(inputs, matcher, problems), rules=matcher.rules_by_id)
    return attach_machines(verdict, inputs)


def triage_text(text: str | bytes, name: str = "<text>") -> Verdict:
    """Triage a log held in memory (tests, notebooks, the evaluation script)."""
    data = text.encode("utf-8", errors="replace") if isinstance(text, str) else text
    records = LogRecords()
    read_logs([log_input(name)], matcher_for(), records, opener=lambda _: io.BytesIO(data))
    return attach_machines(verdict_of(assess_logs(read_nonfinite_values(records))), [])
