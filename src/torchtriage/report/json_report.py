"""The verdict as one JSON object: the versioned public interface (see model.SCHEMA)."""

from __future__ import annotations

import json

from torchtriage.model import Verdict


def render_json(verdict: Verdict) -> str:
    return json.dumps(verdict.to_json(), indent=2, sort_keys=False, default=str)
