"""The step monitor's files in a run folder: each rank's windows and the straggler decisions.

    DIR/monitor/steps-rank<R>.jsonl   one line per window (schema torchtriage.monitor/2, or /1 of older runs)
    DIR/monitor/stragglers.jsonl      one line per decision (torchtriage.straggler/2, or /1)

A line that is not one of these records (cut off by a crash, hand-edited) is skipped and counted, and so is a
record whose fields are not what the monitor writes: a window is a flat object of numbers (a step, a time, a
rate), a decision names a rank and a step by number and says why in text. The files come from the run folder, so
they are opened as every reader opens its files (regular files inside the folders given, within the byte budget).
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchtriage.protocol import MONITOR_SUBDIR
from torchtriage.sources.fields import INT64, is_plain_int, strict_json
from torchtriage.sources.streams import read_whole

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


def _number(value: Any) -> bool:
    """A time, a rate or a count as the monitor writes it: a finite number within 64 bits."""
    if type(value) is int:
        return -INT64 <= value < INT64
    return type(value) is float and math.isfinite(value) and abs(value) < INT64


def _step(value: Any) -> bool:
    return is_plain_int(value) and value >= 0


def _is_window(record: dict[str, Any]) -> bool:
    """Every field but the schema a number or null, and the window's last step a step number."""
    numbers = all(value is None or _number(value) for key, value in record.items() if key != "schema")
    return numbers and _step(record.get("last_step"))


def _is_decision(record: dict[str, Any]) -> bool:
    """The rank and the step named by number (or not at all), the sentence in text."""
    named = all(record.get(key) is None or _step(record.get(key)) for key in ("rank", "step"))
    return named and isinstance(record.get("line", ""), str)


def _lines(path: Path, problems: list[str]) -> list[bytes]:
    try:
        data, truncated = read_whole(str(path), "the step monitor's records")
    except (OSError, ValueError, zlib.error) as err:  # not a regular file in the folder, or past a limit
        problems.append(f"{path}: {getattr(err, 'strerror', None) or err}")
        return []
    lines = data.splitlines()
    if len(lines) > _MAX_LINES:
        problems.append(f"{path}: more than {_MAX_LINES:,} lines; the rest is not read")
    if truncated:
        problems.append(f"{path}: the gzip file is cut off before its end")
    return lines[:_MAX_LINES]


def _records(path: Path, schemas: tuple[str, ...], problems: list[str]) -> list[dict[str, Any]]:
    kept = _is_window if schemas == _WINDOW_SCHEMAS else _is_decision
    found, bad = [], 0
    for line in _lines(path, problems):
        try:
            record = strict_json(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(record, dict) and record.get("schema") in schemas and kept(record):
            found.append(record)
        else:
            bad += 1
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
        if match and not path.is_dir():  # a link, FIFO or device is refused by the reader, with its reason
            windows = _records(path, _WINDOW_SCHEMAS, records.problems)
            if windows:
                records.windows[int(match.group(1))] = sorted(windows, key=lambda w: w.get("last_step", 0))
    decisions = base / "stragglers.jsonl"
    if decisions.is_symlink() or decisions.exists():
        records.decisions = _records(decisions, _DECISION_SCHEMAS, records.problems)
    return records if records.windows or records.decisions else None
