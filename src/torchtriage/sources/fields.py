"""A field read from an artifact, checked where it is read: its type, its range, its length.

Readers take numbers and names out of data another machine wrote. A value of the wrong kind must never
reach code that formats, compares or walks it (a list where a name belongs may be nested a billion deep
through shared references; an integer may have a million digits): it is either refused with a message
naming the field, or read as "unknown". `describe` shows any value in a few words without walking it.
"""

from __future__ import annotations

import json
import math
from typing import Any

INT64 = 1 << 63
_MAX_DIGIT_TEXT = 20  # the digits of any 64-bit counter
_SHOWN = 40


class FieldError(ValueError):
    """A field of the wrong kind; the message names the field and shows the value cut short."""

    def __init__(self, field: str, value: Any, wanted: str) -> None:
        super().__init__(f"its field `{field}` is {describe(value)}, not {wanted}")


def describe(value: Any) -> str:
    """`value` in a few words, without walking into it or formatting a huge number."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > 64:
            return f"an integer of about {int(value.bit_length() * 0.30103):,} digits"
        return repr(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        shown = repr(value[:_SHOWN]) + ("…" if len(value) > _SHOWN else "")
        return f"the text {shown}" if len(value) <= _SHOWN else f"the text {shown} ({len(value):,} characters)"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"a {type(value).__name__} of {len(value):,} bytes"
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        kind = type(value).__name__
        return f"a {kind} of {len(value):,} item{'' if len(value) == 1 else 's'}"
    return f"a {type(value).__name__}"


def as_int(value: Any, default: int = -1, low: int = -INT64, high: int = INT64 - 1) -> int:
    """An integer in [low, high] from an int, an integral finite float or a short string of digits; else
    `default`. Booleans are not numbers here."""
    kind = type(value)
    if kind is int:
        number = value
    elif kind is float:
        if not math.isfinite(value) or value != int(value):
            return default
        number = int(value)
    elif kind is str and 0 < len(value) <= _MAX_DIGIT_TEXT:
        try:
            number = int(value)
        except ValueError:
            return default
    else:
        return default
    return number if low <= number <= high else default


def as_text(value: Any, default: str = "", limit: int = 4096) -> str:
    """A string field as text (cut to `limit` characters); a number or None as its short form; anything
    else (a container, bytes) as `default`."""
    kind = type(value)
    if kind is str:
        return value if len(value) <= limit else value[:limit] + "…"
    if kind is int:
        return str(value) if value.bit_length() <= 64 else default
    if kind is float or kind is bool:
        return repr(value)
    return default


def is_plain_int(value: Any) -> bool:
    return type(value) is int and -INT64 <= value < INT64


def _no_constants(name: str) -> Any:
    raise ValueError(f"it holds {name}, which JSON does not allow")


def json_reason(err: Exception) -> str:
    """Why Python's JSON parser refused a document, in plain words."""
    if isinstance(err, json.JSONDecodeError):
        return f"not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})"
    if isinstance(err, RecursionError):
        return "its JSON is nested too deep to be a genuine report"
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 text ({err.reason})"
    if "digits" in str(err):
        return "its JSON holds an integer of thousands of digits, which no genuine report has"
    return str(err)


def strict_json(text: str | bytes) -> Any:
    """Parse JSON, refusing what Python's parser would accept but JSON does not (NaN, Infinity), and
    turning what it cannot take (nesting thousands deep, integers of thousands of digits) into a
    ValueError with a plain reason."""
    try:
        return json.loads(text, parse_constant=_no_constants)
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(json_reason(err)) from None


class TextMemo:
    """Values computed from long texts, found again without hashing the text.

    Every dump of a 16,384-rank job carries the world's 100 KB "[0, 1, ..., 16383]", a new string each time:
    used as a dict key, it is hashed every time (25 µs), where comparing it with the one text already seen
    costs a memcmp (1.5 µs). So the key is its length and ends, and a hit is confirmed by equality."""

    _ENDS = 64

    def __init__(self, kept: int = 4096) -> None:
        self._known: dict[tuple[int, str, str], tuple[str, Any]] = {}
        self._kept = kept

    def _key(self, text: str) -> tuple[int, str, str]:
        return len(text), text[: self._ENDS], text[-self._ENDS :]

    def get(self, text: str) -> Any | None:
        known = self._known.get(self._key(text))
        return known[1] if known is not None and known[0] == text else None

    def put(self, text: str, value: Any) -> Any:
        if len(self._known) >= self._kept:
            self._known.clear()
        self._known[self._key(text)] = (text, value)  # a text with the same ends replaces the other
        return value
