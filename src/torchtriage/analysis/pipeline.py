"""The triage flow as library calls: sources -> records -> verdict (the CLI only renders it)."""

from __future__ import annotations

import io
from pathlib import Path

from torchtriage.analysis.log_records import LogRecords, read_logs
from torchtriage.analysis.triage import build_verdict
from torchtriage.errors import InputError, UsageError
from torchtriage.knowledge.matcher import Matcher
from torchtriage.knowledge.rules import RuleError, default_rules, load_rules
from torchtriage.model import Verdict
from torchtriage.sources.files import Artifact, discover

_default_matcher: Matcher | None = None


def matcher_for(extra_rules_dir: str | None = None) -> Matcher:
    """The built-in knowledge base, plus the rules in `extra_rules_dir` when given."""
    global _default_matcher
    if not extra_rules_dir:
        if _default_matcher is None:
            _default_matcher = Matcher(default_rules())
        return _default_matcher
    try:
        extra = load_rules(Path(extra_rules_dir))
    except RuleError as err:
        raise UsageError(f"the rules in {extra_rules_dir} do not load: {err}") from None
    known = {rule.id for rule in default_rules()}
    return Matcher(list(default_rules()) + [rule for rule in extra if rule.id not in known])


def triage_paths(paths: list[str], extra_rules_dir: str | None = None) -> Verdict:
    """Triage log files, folders and `-` (stdin). Raises InputError when nothing could be read."""
    problems: list[str] = []
    artifacts = discover(paths, problems)
    records = read_logs(artifacts, matcher_for(extra_rules_dir))
    records.problems[:0] = problems
    if not records.files_read:
        reasons = "\n  ".join(records.problems) or "no input"
        raise InputError(f"nothing could be read:\n  {reasons}")
    return build_verdict(records)


def triage_text(text: str | bytes, name: str = "<text>") -> Verdict:
    """Triage a log held in memory (tests, notebooks, the evaluation script)."""
    data = text.encode("utf-8", errors="replace") if isinstance(text, str) else text
    records = LogRecords()
    read_logs([Artifact(name, None)], matcher_for(), records, opener=lambda _: io.BytesIO(data))
    return build_verdict(records)
