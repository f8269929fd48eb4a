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


def printed_number(src: Path, program: str, *args: str) -> float:
    """The number `python -c program args` prints, run with `src` first on its path (this tree's or REF's)."""
    import os
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(src), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, "-c", program, *args], env=env, capture_output=True, text=True, check=True)
    return float(done.stdout)
