"""The one loader of the knowledge base's TOML files: log rules, analysis rules, stack knowledge,
kernel classes and parallel layouts.

Every table is checked against the keys its reader declares: a misspelt key (`pattern` for
`patterns`) is an error naming the file and the table, never a silently ignored line, because a
knowledge base that quietly drops part of a rule drops a failure mode.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

KNOWLEDGE_DIR = Path(__file__).resolve().parent


class KnowledgeError(ValueError):
    """A knowledge file is malformed; the message names the file, the table and what is wrong."""


# Value kinds a declared key may take.
STRING = "a string"
INTEGER = "an integer"
NUMBER = "a number"
BOOLEAN = "true or false"
STRINGS = "a list of strings"
TABLE = "a table"
TABLES = "a list of tables"
STRING_TABLE = "a table of strings"

_CHECKS = {
    STRING: lambda v: isinstance(v, str),
    INTEGER: lambda v: isinstance(v, int) and not isinstance(v, bool),
    NUMBER: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    BOOLEAN: lambda v: isinstance(v, bool),
    STRINGS: lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    TABLE: lambda v: isinstance(v, dict),
    TABLES: lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
    STRING_TABLE: lambda v: isinstance(v, dict) and all(isinstance(x, (str, int, float)) for x in v.values()),
}


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file's content; a file that cannot be read, is not UTF-8 or not TOML is a KnowledgeError."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise KnowledgeError(f"{path}: cannot be read ({err.strerror or err})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise KnowledgeError(f"{path}: not UTF-8 text (byte {err.start}); knowledge files are UTF-8 TOML") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise KnowledgeError(f"{path.name}: not valid TOML: {err}") from None
    except RecursionError:
        raise KnowledgeError(f"{path.name}: nested too deeply to be a knowledge file") from None


def check_table(
    raw: Any, where: str, required: Mapping[str, str], optional: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """`raw` if it is a table with every required key, no unknown key, and each value of its kind."""
    if not isinstance(raw, dict):
        raise KnowledgeError(f"{where}: expected a table, found {type(raw).__name__}")
    optional = optional or {}
    unknown = sorted(set(raw) - set(required) - set(optional))
    if unknown:
        known = ", ".join(sorted(set(required) | set(optional)))
        raise KnowledgeError(
            f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} (known: {known})"
        )
    for key in required:
        if key not in raw or raw[key] in ("", [], {}):
            raise KnowledgeError(f"{where}: missing `{key}`")
    for key, value in raw.items():
        kind = required.get(key) or optional[key]
        if not _CHECKS[kind](value):
            raise KnowledgeError(f"{where}: `{key}` must be {kind}, not {value!r:.60}")
    return raw
