"""JSON output: the verdict as one object (the versioned public interface, see model.SCHEMA), and the one
encoder every `--json` uses."""

from __future__ import annotations

import json
import math
from typing import Any

from torchtriage.model import Verdict
from torchtriage.report.safe_text import encodable


def _strict(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by null (strict JSON parsers reject the bare `NaN`), and every
    lone surrogate in a string or key written as its escape (a file name's byte 0xff as the text `\\xff`):
    JSON is Unicode text, and strict parsers reject a lone `\\udcff` too."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return encodable(value)
    if isinstance(value, dict):
        return {_strict(k): _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def json_text(value: Any) -> str:
    """Strict JSON (no NaN, no lone surrogate), indented; what it cannot encode is written as its string."""
    return json.dumps(_strict(value), indent=2, default=lambda other: encodable(str(other)), allow_nan=False)


def render_json(verdict: Verdict) -> str:
    return json_text(verdict.to_json())
