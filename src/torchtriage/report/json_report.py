"""JSON output: the verdict as one object (the versioned public interface, see model.SCHEMA), and the one
encoder every `--json` uses."""

from __future__ import annotations

import json
import math
from typing import Any

from torchtriage.model import Verdict


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by null: strict JSON parsers reject the bare `NaN`."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def json_text(value: Any) -> str:
    """Strict JSON (no NaN), indented; what it cannot encode is written as its string."""
    return json.dumps(_finite(value), indent=2, default=str, allow_nan=False)


def render_json(verdict: Verdict) -> str:
    return json_text(verdict.to_json())
