"""The step monitor's files in a run folder: each rank's windows and the straggler decisions.

    DIR/monitor/steps-rank<R>.jsonl   one line per window (schema torchtriage.monitor/2, or /1 of older runs)
    DIR/monitor/stragglers.jsonl      one line per decision (torchtriage.straggler/2, or /1)

A line that is not one of these records (cut off by a crash, hand-edited) is skipped and counted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchtriage.protocol import MONITOR_SUBDIR

_STEPS_FILE = re.compile(r"^steps-rank(\d{1,7})\.jsonl$")
# The versions read: /2 times the forward from the batch's arrival and adds each phase's spread; /1's fields
# keep their own meaning and are shown as recorded.
_WINDOW_SCHEMAS = ("torchtriage.monitor/1", "torchtriage.monitor/2")
_DECISION_SCHEMAS = ("torchtriage.straggler/1", "torchtriage.straggler/2")
_MAX_LINES = 200_000  # per file: a week of 50-step windows at one step a second is 12,096


@dataclass
class MonitorRecords:
    windows: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # rank -> windows in order
    decisions: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _records(path: Path, schemas: tuple[str, ...], problems: list[str]) -> list[dict[str, Any]]:
    found, bad = [], 0
    try:
        with open(path, encoding="utf-8", errors="replace") as lines:
            for number, line in enumerate(lines):
                if number >= _MAX_LINES:
                    problems.append(f"{path}: more than {_MAX_LINES:,} lines; the rest is not read")
                    break
                try:
                    record = json.loads(line)
                except ValueError:
                    bad += 1
                    continue
                if isinstance(record, dict) and record.get("schema") in schemas:
                    found.append(record)
                else:
                    bad += 1
    except OSError as err:
        problems.append(f"{path}: {err.strerror or err}")
    if bad:
        problems.append(f"{path}: {bad} line(s) are not step-monitor records and were skipped")
    return found


def read_monitor(folder: str | Path) -> MonitorRecords | None:
    """The monitor's records under `folder` (the run folder, or its monitor folder); None when there are none."""
    base = Path(folder)
    if base.name != MONITOR_SUBDIR:
        base = base / MONITOR_SUBDIR
    if not base.is_dir():
        return None
    records = MonitorRecords()
    for path in sorted(base.iterdir()):
        match = _STEPS_FILE.match(path.name)
        if match and path.is_file():
            windows = _records(path, _WINDOW_SCHEMAS, records.problems)
            if windows:
                records.windows[int(match.group(1))] = sorted(windows, key=lambda w: w.get("last_step", 0))
    decisions = base / "stragglers.jsonl"
    if decisions.is_file():
        records.decisions = _records(decisions, _DECISION_SCHEMAS, records.problems)
    return records if records.windows or records.decisions else None
