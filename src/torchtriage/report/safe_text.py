"""Strings from inputs, made safe for a terminal.

Whatever torchtriage prints for a person may hold text from the artifacts it read: a log line, a file
name, a function name, a process group's name. A terminal acts on control characters: ESC starts
sequences that set the title, clear the screen or (OSC 52, in some terminals) write the clipboard; a
carriage return or a newline inside a file name can forge a line of output; bidirectional overrides can
reorder what is shown. Every such character is shown instead as an escape (`\\x1b`, `\\n`, `\\u202e`).
Tab stays. JSON output needs none of this: its encoder escapes every control character.

A file name's bytes that are not UTF-8 (`rank\\xff.log`) reach Python as lone surrogates (`os.fsdecode`'s
surrogateescape: byte 0xff is U+DCFF), which no UTF-8 stream can encode: printed as they are, they end in
UnicodeEncodeError, or reach the terminal as raw bytes. One rule for every output, the terminal, JSON and
HTML: such a byte is written as its escape, `\\xff`; any other lone surrogate as `\\udXXX`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

# C0 controls but tab, DEL, C1 controls, the Unicode bidirectional embeddings, overrides and isolates, and
# lone surrogates.
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# U+DC80..U+DCFF: the bytes 0x80..0xff that were not UTF-8, as os.fsdecode (surrogateescape) holds them.
_ESCAPED_BYTES = range(0xDC80, 0xDD00)


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    if code in _ESCAPED_BYTES:
        return f"\\x{code - 0xDC00:02x}"
    return {10: "\\n", 13: "\\r"}.get(code) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def encodable(text: str) -> str:
    """`text` with each lone surrogate written as its escape (`\\xff` for a byte that was not UTF-8), and
    nothing else changed: what JSON and HTML hold of a name, so that any UTF-8 stream can write it."""
    return _SURROGATE.sub(_escape, text) if _SURROGATE.search(text) else text


def visible(text: str) -> str:
    """`text` with every control character shown as its escape."""
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def visible_lines(text: str) -> str:
    """Each line of `text` made visible; the newlines between them are layout and stay."""
    return "\n".join(visible(line) for line in text.split("\n"))


def visible_copy(value: Any) -> Any:
    """A copy of a verdict (or any dataclass, dict, list, tuple of them) with every string made visible."""
    if isinstance(value, str):
        return visible(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: visible_copy(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    if isinstance(value, dict):
        return {visible_copy(k): visible_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [visible_copy(v) for v in value]
    if isinstance(value, tuple):
        items = [visible_copy(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value
