"""The fields of a flight-recorder dump, checked column by column before anything formats, compares or
walks them.

A dump is plain data, but it comes from another machine and may be corrupt or crafted: a name that is
a list nested a billion deep through shared references, a buffer where text belongs, sizes that repeat
one list a million times. Each check runs at C speed over a whole column (the entries' values of one
field), so a genuine dump of thousands of entries costs well under a millisecond. Wherever containers
hold containers, their slots are summed first: a genuine dump writes each slot with its own opcode, so
the total never exceeds the file's size; more means shared references built to expand.

Each failure raises FieldError (a ValueError) naming the entry and field; the dump is then refused as a
whole and its rank reported unread, rather than analysed on values that mean nothing.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Iterable, Mapping
from itertools import chain, compress, repeat
from operator import is_not, methodcaller
from typing import Any

from torchtriage.sources import limits
from torchtriage.sources.fields import INT64, FieldError, TextMemo, as_int, describe, is_plain_int
from torchtriage.sources.limits import LimitExceeded

_NONE = type(None)
_NUMBER = {int, float, str, _NONE}
_TEXT = {str, _NONE}
_SEQUENCE = {list, tuple}
_MAX_NAME = 4096  # a profiling name, a state, a dtype, a group's name: all short in genuine dumps
_MAX_GROUP_FIELDS = 4  # process_group is (name, description)


class Expands(FieldError):
    def __init__(self, field: str, slots: int, size: int) -> None:
        ValueError.__init__(
            self,
            f"its `{field}` values refer to the same containers over and over ({slots:,} slots from a file of "
            f"{size:,} bytes): a pickle built to expand when read, not a dump",
        )


def _present(column: list | tuple, allowed: set, field: str, wanted: str) -> tuple[list | tuple, set]:
    """The values of `column` that are not None, each of an `allowed` type (else FieldError naming the
    entry), and the set of their types."""
    kinds = set(map(type, column))
    if _NONE in kinds:
        column = list(compress(column, map(is_not, column, repeat(None))))
        kinds.discard(_NONE)
    if not kinds <= allowed:
        raw = list(column)
        index = next(i for i, value in enumerate(raw) if type(value) not in allowed and value is not None)
        raise FieldError(f"entries[{index}]{'.' if field else ''}{field}", raw[index], wanted)
    return column, kinds


def _inner(containers: Iterable, allowed: set, field: str, wanted: str) -> tuple[list, set]:
    """The items of `containers`, each of an `allowed` type, and their types."""
    items = list(chain.from_iterable(containers))
    kinds = set(map(type, items))
    if not kinds <= allowed:
        raise FieldError(field, next(v for v in items if type(v) not in allowed), wanted)
    return items, kinds


def _short(column: Iterable[str], field: str, limit: int = _MAX_NAME) -> None:
    longest = max(map(len, column), default=0)
    if longest > limit:
        raise FieldError(field, "x" * longest, f"text of at most {limit:,} characters")


def _slots(containers: list | tuple, field: str, size: int) -> None:
    total = sum(map(len, containers))
    if total > size:
        raise Expands(field, total, size)


def _ints_in_range(values: list | tuple, field: str) -> None:
    if values and (min(values) < -INT64 or max(values) >= INT64):
        raise FieldError(field, max(values, key=abs), "a 64-bit integer")


def _distinct(values: Iterable) -> list:
    """Each object once (by identity, not equality: comparing would walk them)."""
    values = list(values)
    return list(dict(zip(map(id, values), values, strict=True)).values())


def _check_text(column: tuple, field: str) -> None:
    values, _ = _present(column, {str}, field, "text")
    _short(values, field)


def _check_numbers(column: tuple, field: str) -> None:
    """Counters: ints, finite floats, or (as some JSON dumps write them) their digits as short text."""
    values, kinds = _present(column, _NUMBER - {_NONE}, field, "a number")
    if kinds == {int}:
        _ints_in_range(values, field)
        return
    if str in kinds:
        _short([v for v in values if type(v) is str], field, 20)
    floats = [v for v in values if type(v) is float]
    if not all(map(math.isfinite, floats)):
        raise FieldError(field, next(v for v in floats if not math.isfinite(v)), "a finite number")
    _ints_in_range([v for v in values if type(v) is int], field)


def _check_sizes(column: tuple, field: str, size: int) -> None:
    """A list per tensor of its dimensions: [[4096, 1024], [8]]."""
    values, _ = _present(column, _SEQUENCE, field, "a list of tensor sizes")
    _slots(values, field, size)
    tensors, _ = _inner(values, _SEQUENCE, field, "the sizes of a tensor (a list of integers)")
    _slots(tensors, field, size)
    try:  # an array of 64-bit integers takes each dimension at C speed, or says which kind it is not
        array("q", chain.from_iterable(tensors))
    except (TypeError, OverflowError):
        bad = next(d for d in chain.from_iterable(tensors) if not is_plain_int(d))
        raise FieldError(field, bad, "an integer dimension") from None


def _check_dtypes(column: tuple, field: str, size: int) -> None:
    values, _ = _present(column, _SEQUENCE, field, "a list of dtype names")
    _slots(values, field, size)
    names, _ = _inner(values, {str}, field, "a dtype name")
    _short(names, field, 256)


def _check_groups(column: tuple) -> None:
    values, _ = _present(column, _SEQUENCE, "process_group", "a (name, description) pair")
    if max(map(len, values), default=0) > _MAX_GROUP_FIELDS:
        raise FieldError("process_group", max(values, key=len), "a (name, description) pair")
    parts, kinds = _inner(values, {str, int}, "process_group", "a group's name")
    _short([p for p in parts if type(p) is str] if kinds != {str} else parts, "process_group")
    if int in kinds:
        _ints_in_range([p for p in parts if type(p) is int], "process_group")


def check_frames(column: tuple, size: int) -> None:
    """A list of frame dicts per entry; genuine dumps share frame lists and dicts between entries, so each
    distinct one is checked once."""
    values, _ = _present(column, _SEQUENCE, "frames", "a list of frames")
    lists = _distinct(values)  # the reader made equal lists one object: each is counted and checked once
    _slots(lists, "frames", size)
    frames = _distinct(chain.from_iterable(lists))
    if set(map(type, frames)) - {dict}:
        raise FieldError("frames", next(f for f in frames if type(f) is not dict), "a frame (a dict)")
    for field, allowed, wanted in _FRAME_FIELDS:
        column = list(map(methodcaller("get", field), frames))
        if set(map(type, column)) - allowed:
            raise FieldError(f"frames[].{field}", next(v for v in column if type(v) not in allowed), wanted)
        if field == "line":
            _ints_in_range([v for v in column if v is not None], "frames[].line")
        else:
            _short([v for v in column if v], f"frames[].{field}", 1 << 16)


_FRAME_FIELDS = (("filename", _TEXT, "text"), ("name", _TEXT, "text"), ("line", {int, _NONE}, "a line number"))
# The fields that are formatted, compared or walked (the others are read through `as_int` and friends).
_CHECKED = (
    "profiling_name",
    "state",
    "collective_seq_id",
    "process_group",
    "input_sizes",
    "output_sizes",
    "input_dtypes",
    "output_dtypes",
    "frames",
)


def check_entries(entries: Any, size: int, columns: Mapping[str, list | tuple] | None = None) -> None:
    """Raise FieldError unless every field the reader formats, compares or walks has the kind and size a
    genuine dump gives it.

    `size` is the dump's size in bytes once decompressed: no genuine dump holds more slots than that.
    `columns` (field -> the entries' values, as the reader fetched them) saves fetching them again."""
    if not isinstance(entries, list):
        raise FieldError("entries", entries, "a list")
    if not entries:
        return
    if columns is None:
        if set(map(type, entries)) != {dict}:
            index, bad = next((i, e) for i, e in enumerate(entries) if type(e) is not dict)
            raise FieldError(f"entries[{index}]", bad, "an entry (a dict)")
        columns = {field: list(map(methodcaller("get", field), entries)) for field in _CHECKED}
    for field in ("profiling_name", "state"):
        _check_text(columns[field], field)
    _check_numbers(columns["collective_seq_id"], "collective_seq_id")
    _check_groups(columns["process_group"])
    for field in ("input_sizes", "output_sizes"):
        _check_sizes(columns[field], field, size)
    for field in ("input_dtypes", "output_dtypes"):
        _check_dtypes(columns[field], field, size)
    check_frames(columns["frames"], size)


def check_header(data: dict, size: int, max_rank: int) -> None:
    """The dump's own fields: its rank, its groups' configuration and status counters."""
    rank = data.get("rank")
    if rank is not None and not (type(rank) is int and 0 <= rank <= max_rank):
        if type(rank) is int and rank > max_rank:
            raise LimitExceeded(f"its rank, {describe(rank)}, is past the largest rank accepted", "rank", rank)
        raise FieldError("rank", rank, "a rank (a non-negative integer)")
    config = data.get("pg_config")
    if config is not None:
        if not isinstance(config, dict):
            raise FieldError("pg_config", config, "a dict of process groups")
        for key, info in config.items():
            _check_group_config(str(key) if type(key) in (str, int) else "?", info, size, max_rank)
    status = data.get("pg_status")
    if status is not None:
        if not isinstance(status, dict):
            raise FieldError("pg_status", status, "a dict of process groups")
        for key, counters in status.items():
            if not isinstance(counters, dict):
                raise FieldError(f"pg_status[{key!r}]", counters, "a dict of counters")
            for name in ("last_enqueued_collective", "last_started_collective", "last_completed_collective"):
                value = counters.get(name)  # an int in pickles, its digits as text in JSON dumps
                if value is not None and as_int(value, None) is None:  # type: ignore[arg-type]
                    raise FieldError(f"pg_status[{str(key)[:40]!r}].{name}", value, "a 64-bit counter")


def _check_group_config(key: str, info: Any, size: int, max_rank: int) -> None:
    field = f"pg_config[{key[:40]!r}]"
    if not isinstance(info, dict):
        raise FieldError(field, info, "a group's configuration (a dict)")
    for name in ("name", "desc"):
        value = info.get(name)
        if value is not None and (type(value) not in (str, int) or (type(value) is str and len(value) > _MAX_NAME)):
            raise FieldError(f"{field}.{name}", value, "a short text")
    ranks = info.get("ranks")
    if ranks is None:
        return
    if type(ranks) is str:
        ranks_in_text(ranks, f"{field}.ranks", max_rank)
        return
    if type(ranks) not in _SEQUENCE or set(map(type, ranks)) - {int}:
        raise FieldError(f"{field}.ranks", ranks, "a list of ranks")
    if ranks and (min(ranks) < 0 or max(ranks) > max_rank):
        extreme = describe(max(ranks, key=abs))
        raise LimitExceeded(f"`{field}.ranks` holds {extreme}, past the largest rank accepted", "rank", max(ranks))


_RANKS_TEXT = re.compile(r"\s*[\[(]?\s*(?:\d{1,9}\s*(?:,\s*\d{1,9}\s*)*,?)?\s*[\])]?\s*")
_parsed_ranks = TextMemo()


def ranks_in_text(text: str, field: str = "ranks", max_rank: int | None = None) -> tuple[int, ...]:
    """'[0, 1, 2]' -> (0, 1, 2), as torch writes a group's members; each distinct text is parsed once.

    Raises FieldError for anything but a list of ranks, LimitExceeded for a rank past the limit."""
    parsed = _parsed_ranks.get(text)
    if parsed is None:
        if not _RANKS_TEXT.fullmatch(text):
            raise FieldError(field, text, "a list of ranks")
        parsed = tuple(int(part) for part in text.strip().strip("[]()").split(",") if part.strip())
        limit = limits.active().rank if max_rank is None else max_rank
        if parsed and max(parsed) > limit:
            raise LimitExceeded(
                f"`{field}` holds the rank {max(parsed):,}, past the largest rank accepted", "rank", max(parsed)
            )
        _parsed_ranks.put(text, parsed)
    return parsed
