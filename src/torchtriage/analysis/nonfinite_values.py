"""Non-finite values that a log shows without a keyword.

No rule can name these from one line's wording: a CSV row `212,nan,nan,0.5` or a step line `77010 nan`
carries no word at all, `vpred_mean: nan` names no loss, a dynamic loss scale that halves report after
report is a series, and a tensor printed where the log stops says `-inf` and nothing else. This reads the
ends of the logs (the tails the scan keeps) and adds, for each such line, the record a rule's match
would have made: an event of an analysis rule of `nan_inf.toml`, which the triage engine weighs with the
others (its role, its priority, its place in the log).

Healthy numbers stay healthy: the letters inside a word (`nanoseconds`, `info`, `infer`) are no value, a
column named `nan_count` holds a count, a bound or a best-so-far set to inf (`max_norm=inf`,
`best_loss: inf`) is configuration, `-inf` in a printed attention mask is how masks look (it counts only
where the log stops on it), and a loss scale that halves and then grows again is fp16 calibration.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

from torchtriage.knowledge.linear_regex import compile_linear
from torchtriage.knowledge.rules import Rule, default_rules
from torchtriage.knowledge.stall import stall_knowledge
from torchtriage.sources.lines import strip_ansi
from torchtriage.sources.log_records import LogEvent, LogRecords, LogTail
from torchtriage.sources.logs import WRAP_MIN_WIDTH

NONFINITE_VALUE = "nan_inf.nonfinite_value"
LOSS_SCALE_COLLAPSE = "nan_inf.loss_scale_collapse"
NONFINITE_AT_STOP = "nan_inf.nonfinite_at_stop"
_RULE_IDS = (NONFINITE_VALUE, LOSS_SCALE_COLLAPSE, NONFINITE_AT_STOP)

_WHERE = "analysis/nonfinite_values.py"
# A tail worth reading holds a NaN/Inf token or a loss scale somewhere: searched in its whole text first, so
# the logs that hold neither (most) cost one search. `inf` followed by a letter (INFO, inference) is no token.
_WORTH_READING = compile_linear(r"(?i)(?:^|[^a-z])(?:nan|inf)(?:[^a-z_]|inity|$)|loss[ _-]?scale", _WHERE)
# A NaN/Inf token in a line: not the letters inside a word (nanoseconds, INFO, inference, finance).
_TOKEN = compile_linear(r"(?i)(?:^|[^a-z])(?:nan|inf)(?:[^a-z_]|inity|$)", _WHERE)
# `key: value` where the value is NaN/Inf: a metric dict ({'loss': nan}), a step line (grad_norm=nan), JSON
# ("grad_norm": NaN), a check's message (grad_norm is not finite: nan).
_KEY_VALUE = compile_linear(
    r"""(?i)(?P<key>[a-z_][\w./-]{0,80})['"]?\s{0,4}[:=]\s{0,4}['"]?(?P<value>[-+]?(?:nan|inf(?:inity)?))(?:[^\w.-]|\.(?:\D|$)|$)""",
    _WHERE,
)
# A smoothed metric and its running average, `key: 0.3922 (nan)` (the MetricLogger of torchvision's
# references and the models built on them: "{median:.4f} ({global_avg:.4f})"): the average went non-finite.
_RUNNING_AVERAGE = compile_linear(
    r"""(?i)(?P<key>[a-z_][\w./-]{0,80})['"]?\s{0,4}[:=]\s{0,4}[-+]?[\d.]+(?:e[-+]?\d+)?\s{0,4}\(\s{0,4}(?P<value>[-+]?(?:nan|inf))\s{0,4}\)""",
    _WHERE,
)
# The dynamic loss scale as fp16 trainers report it: fairseq (`loss_scale=64`, "setting loss scale to: 32.0"),
# apex/DLLogger (`loss_scale : 4096.0`), MetricLogger (`loss_scale: 8192.0000 (8646.0600)`), Megatron
# (`loss scale: 1.0 |`), DeepSpeed ("Attempted loss scale: 4096, reducing to 2048"). `\b` keeps out
# min_loss_scale, initial_loss_scale and loss_scale_window; the loss *scaler*'s index is no scale.
_LOSS_SCALE = compile_linear(
    r"""(?i)\bloss[ _-]?scale['"]?\s{0,4}(?:[:=]|\bto:?|\bis)?\s{0,4}['"]?(?P<value>\d+(?:\.\d+)?(?:e[-+]?\d+)?)\b""",
    _WHERE,
)
_KEY_PARTS = compile_linear(r"[^a-z0-9]+", _WHERE)
# The launchers' rank prefixes (sources/lines.py peels them): enough to keep each rank's series of loss scales
# apart without peeling every line.
_RANK_PREFIX = compile_linear(
    r"\s{0,5}(?:\[[A-Za-z_]{0,20}\d{1,6}\]:|\[\d+,\d{1,6}\]<std(?:out|err)>:|\d{1,6}: )", _WHERE
)
# The cells of a row of numbers, and what a cell may be. Every pattern of this module runs on RE2 (linear in
# the line, whatever the line: a log comes from the job).
_CELL = compile_linear(r"[,\s|;]+", _WHERE)
_NUMBER = compile_linear(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?%?", _WHERE)
_NONFINITE = compile_linear(r"(?i)[-+]?(?:nan|inf(?:inity)?)", _WHERE)
# What a printed tensor carries around its values: `tensor(` before, `device=`/`dtype=`/`grad_fn=` after.
_TENSOR_OPEN = compile_linear(r"^\s*tensor\(", _WHERE)
_TENSOR_FIELDS = compile_linear(r",?\s*(?:device|dtype|grad_fn|requires_grad|size)=", _WHERE)

# The parts of a key (split at `_`, `/`, `.`, `-`) that make it a bound, a setting or a best-so-far: inf (or
# nan) there is configuration, not a failure. Short words name a part exactly, longer ones begin it.
_SETTING_PARTS = ("min", "max", "eps", "tol", "nan", "inf", "prev", "init", "best", "worst")
_SETTING_PREFIXES = ("lowest", "highest", "limit", "bound", "thresh", "clip", "timeout", "patience", "initial",
                     "default", "posinf", "neginf", "previous")  # fmt: skip
# Keys whose value is a metric of the step: only these make an Inf a failure (an ETA or a ratio may be inf).
_METRIC_WORDS = (
    "loss", "norm", "grad", "ppl", "perplex", "reward", "kl", "entropy", "logit", "nll", "score", "acc",
    "value", "vpred", "return", "adv", "mse", "mae", "error", "metric", "objective", "output",
)  # fmt: skip

_FIRST_LINES = 4  # the lines of a tail that become events: the first ones, where the values went non-finite
_HALVING = 1.5  # a report whose scale is at least this much below the one before halved it (or more)
_MIN_HALVINGS = 4  # halvings report after report, to the end of the log: no calibration does that
_TENSOR_ROWS = 64  # how far back a printed tensor that ends the log is read


@dataclass(frozen=True)
class _Line:
    number: int
    text: str
    rank: int | None
    severity: str | None
    local: bool = False  # the rank is a local rank ("[default3]:") that nothing places in the job


@dataclass(frozen=True)
class _Reading:
    """What one line says of non-finite values: `strong` when it is a failure wherever it stands, else only
    where the log stops on it; `key` is the metric that holds the value, when one does."""

    strong: bool
    value: str
    key: str | None = None


def read_nonfinite_values(records: LogRecords) -> LogRecords:
    """Add to `records` the events of the non-finite values their tails show, in their place in the log."""
    rules = {rule.id: rule for rule in default_rules() if rule.id in _RULE_IDS}
    if len(rules) < len(_RULE_IDS):
        return records  # a knowledge base without these rules (a trimmed install) names none of them
    taken = {(e.file, e.line) for e in records.events if e.rule.category == "nan_inf"}
    added = [e for tail in records.tails for e in _events_of(tail, rules, taken)]
    if added:
        _merge(records, added)
    return records


def _events_of(tail: LogTail, rules: dict[str, Rule], taken: set[tuple[str, int]]) -> list[LogEvent]:
    if tail.last_own_record is not None:
        return []  # torchtriage's own records (nonfinite.jsonl) are read by their rules
    raw = None
    if tail.wrapping is not None:  # a hard-wrapped log's rows rejoined, as the scan reads its messages
        raw = tail.numbered_lines()
        text = "\n".join(line for _, line in raw)
    else:
        text = tail.data.decode("utf-8", errors="replace")
    if not _WORTH_READING.search(text):
        return []  # no token, no loss scale: the usual tail costs this one search
    raw = raw or tail.numbered_lines()
    events = [
        _event(rules[NONFINITE_VALUE], tail.file, line, {"value": reading.value} | _metric(reading))
        for line, reading in _first_strong_readings(tail, raw, taken)
    ]
    collapse = _loss_scale_collapse([text for _, text in raw])
    if collapse is not None:
        index, facts = collapse
        line = _line(tail, index)
        if (tail.file, line.number) not in taken:
            events.append(_event(rules[LOSS_SCALE_COLLAPSE], tail.file, line, facts))
    last_lines = (_line(tail, index) for index in range(len(raw) - 1, max(-1, len(raw) - 1 - _TENSOR_ROWS), -1))
    stop = _stops_on_a_tensor(last_lines)
    if stop is not None and not any(e.line == stop[0].number for e in events):
        line, facts = stop
        if (tail.file, line.number) not in taken:
            events.append(_event(rules[NONFINITE_AT_STOP], tail.file, line, facts))
    return events


def _first_strong_readings(
    tail: LogTail, raw: list[tuple[int, str]], taken: set[tuple[str, int]]
) -> list[tuple[_Line, _Reading]]:
    """The first lines of a tail whose values are non-finite wherever they stand (a line a rule of the same
    family already read is left to it). Only the lines holding a token are read, and only until enough are
    found: a tail of a thousand NaN rows costs a few."""
    found = []
    for index, (_, item) in enumerate(raw):
        if not _TOKEN.search(strip_ansi(item)):
            continue
        line = _line(tail, index)
        reading = reading_of(line.text)
        if reading is not None and reading.strong and (tail.file, line.number) not in taken:
            found.append((line, reading))
            if len(found) >= _FIRST_LINES:
                break
    return found


def _metric(reading: _Reading) -> dict[str, str]:
    return {"metric": reading.key} if reading.key else {}


def _line(tail: LogTail, index: int) -> _Line:
    """Line `index` of a tail's numbered lines, normalised as the scan normalises a line (once per tail, the host
    prefixes its lines show peeled off every one)."""
    number, text, rank, severity = tail.lines_with_severity()[index]
    return _Line(number, text, rank, severity, tail.rank_is_local(number))


def _event(rule: Rule, file: str, line: _Line, facts: dict[str, str]) -> LogEvent:
    event = LogEvent(rule, facts, line.rank, None, file, line.number, line.text.strip(), 0, line.severity)
    event.rank_from = "local" if line.local else None
    return event


def _merge(records: LogRecords, added: list[LogEvent]) -> None:
    """Put the new events in reading order (file by file, line by line) and number them again: the engine
    orders failures that nothing else orders by their place in the log."""
    file_order = {name: index for index, name in enumerate(records.files_read)}
    new = {id(e) for e in added}
    merged = sorted(
        records.events + added, key=lambda e: (file_order.get(e.file, len(file_order)), e.line, id(e) in new)
    )
    for order, event in enumerate(merged):
        event.order = order
    records.events[:] = merged


def reading_of(text: str) -> _Reading | None:
    """What one normalised line says of non-finite values, or None when it shows none."""
    if not _TOKEN.search(text):
        return None
    return _key_value_reading(text) or _row_reading(text)


def _key_value_reading(text: str) -> _Reading | None:
    for pattern in (_KEY_VALUE, _RUNNING_AVERAGE):
        for found in pattern.finditer(text):
            key, value = found.group("key"), found.group("value")
            if _is_setting(key):
                continue
            if "nan" in value.lower() or _is_metric(key):
                return _Reading(True, value, key)
    return None


def _is_setting(key: str) -> bool:
    parts = _KEY_PARTS.split(key.lower())
    return any(part in _SETTING_PARTS or part.startswith(_SETTING_PREFIXES) for part in parts)


def _is_metric(key: str) -> bool:
    lowered = key.lower()
    return any(word in lowered for word in _METRIC_WORDS)


def _row_reading(text: str) -> _Reading | None:
    """A line of numbers (a CSV row, a step line, a table row, a printed tensor's row) holding NaN or Inf.

    In a row of a printed tensor or list an Inf alone is weak: attention masks hold -inf by design."""
    bracketed = "[" in text or _TENSOR_OPEN.match(text) is not None
    opened = _TENSOR_OPEN.match(text)
    body = text[opened.end() :] if opened else text
    fields = _TENSOR_FIELDS.search(body)
    body = body[: fields.start()] if fields else body
    body = body.translate(_BRACKETS).strip()
    cells = [cell for cell in _CELL.split(body) if cell and cell != "..."]
    if not cells:
        return None
    nonfinite = [cell for cell in cells if _NONFINITE.fullmatch(cell)]
    if not nonfinite or any(not _NONFINITE.fullmatch(cell) and not _NUMBER.fullmatch(cell) for cell in cells):
        return None
    has_nan = any("nan" in cell.lower() for cell in nonfinite)
    # One number alone on its line, or an Inf in a printed tensor: seen only where the log stops.
    strong = len(cells) >= 2 and (has_nan or not bracketed)
    return _Reading(strong, nonfinite[0])


_BRACKETS = str.maketrans({c: " " for c in "[](){}"})


def _loss_scale_collapse(raw: list[str]) -> tuple[int, dict[str, str]] | None:
    """The last report of a dynamic loss scale that halved report after report to the end of the log, on any
    rank: every step overflows, so the gradients are non-finite at any scale. A run that starts the log and
    stays at or above 1 may be the scaler calibrating from its initial scale; it is not counted. Read from
    the raw lines (the value needs no peeling); each launcher's rank prefix keeps its rank's series apart."""
    series: dict[str, list[tuple[int, float]]] = {}
    for index, item in enumerate(raw):
        if "scale" not in item.lower():
            continue
        item = strip_ansi(item)  # a colouring logger's codes before some lines would start a series of their own
        found = _LOSS_SCALE.search(item)
        if found is None:
            continue
        try:
            value = float(found.group("value"))
        except (OverflowError, ValueError):
            continue
        if math.isfinite(value) and value > 0:
            prefix = _RANK_PREFIX.match(item)
            series.setdefault(prefix.group(0) if prefix else "", []).append((index, value))
    for reports in series.values():
        start = len(reports) - 1
        while start > 0 and reports[start - 1][1] >= _HALVING * reports[start][1]:
            start -= 1
        halvings = len(reports) - 1 - start
        first, last = reports[start][1], reports[-1][1]
        if halvings >= _MIN_HALVINGS and (start > 0 or last < 1):
            facts = {"loss_scale": f"{last:g}", "loss_scale_from": f"{first:g}", "halvings": str(halvings)}
            return reports[-1][0], facts
    return None


def _stops_on_a_tensor(last_lines: Iterator[_Line]) -> tuple[_Line, dict[str, str]] | None:
    """The line a log stops on (its last that is not noise, as the stall layer reads it), when it is, or
    closes, a printed tensor or a lone value holding NaN or Inf. `last_lines` come last first, normalised
    only as far as they are read: the answer is usually known after one or two. The tensor's rows are those
    of the rank that printed the stop: where ranks share a stream, other writers' lines fall between them."""
    known = stall_knowledge()
    stop, piece = None, None
    for line in last_lines:
        if stop is None:
            if known.is_noise(line.text):
                continue
            stop = line
        elif stop.rank is not None and line.rank != stop.rank:
            # Another writer's line in a stream of ranks: another rank's, or its launcher's (unprefixed where the
            # ranks' lines carry a prefix), flushed between this rank's rows.
            continue
        text = line.text
        if piece is not None:
            # The stop was no row: the end of this one, cut off by a terminal's wrap? Only if the two make the
            # row that closes a tensor (its fields, its parenthesis) and this one is as long as a wrap leaves.
            text, piece = text + piece, None
            if len(line.text) < WRAP_MIN_WIDTH or not _closes_a_tensor(text):
                return None
            # The row's first piece carries its writer's prefix; the piece a terminal cut off does not.
            stop = replace(stop, rank=line.rank, local=line.local) if stop.rank is None else stop
        reading = reading_of(text)
        if reading is not None:
            return stop, {"value": reading.value, "row": text.strip()[:300]}
        if line is stop and not _inside_a_tensor(text):
            piece = text
            continue
        if not _inside_a_tensor(text) or _TENSOR_OPEN.match(text):
            return None  # not a tensor's row, or its first row: no non-finite value before the stop
    return None


def _closes_a_tensor(text: str) -> bool:
    return _TENSOR_FIELDS.search(text) is not None and text.rstrip().endswith(")")


def _inside_a_tensor(text: str) -> bool:
    """A row of a printed tensor: numbers between brackets, or the fields that close it."""
    stripped = text.strip()
    return stripped.startswith(("[", "tensor(", "device=", "dtype=")) or stripped.endswith(("],", "])", "]]"))
