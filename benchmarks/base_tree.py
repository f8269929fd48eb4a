"""Another commit's source tree beside this one, for the benchmarks that run both side by side."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def base_src(ref: str, tmp: Path, given: Path | None = None) -> Iterator[Path]:
    """REF's src folder: `given`, or a temporary git worktree of REF under `tmp`, removed afterwards."""
    if given is not None:
        yield given
        return
    base = tmp / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), ref], check=True)
    try:
        yield base / "src"
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
