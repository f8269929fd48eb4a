"""A one-line progress count on stderr while a long file is read (only on a terminal: logs stay clean)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def counting(path: str, unit: str = "events") -> Iterator[Callable[[int], None] | None]:
    """Yields a callback printing `reading NAME: N events` in place, or None when stderr is not a terminal."""
    if not sys.stderr.isatty():
        yield None
        return

    from torchtriage.report.safe_text import visible

    name = visible(os.path.basename(path))

    def report(count: int) -> None:
        print(f"\rreading {name}: {count:,} {unit}", end="", file=sys.stderr, flush=True)

    try:
        yield report
    finally:
        print("\r\x1b[K", end="", file=sys.stderr, flush=True)
