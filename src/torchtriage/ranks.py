"""Naming sets of ranks the way people read them."""

from __future__ import annotations

from collections.abc import Iterable


def format_ranks(ranks: Iterable[int], *, none: str = "no rank identified", noun: str = "rank") -> str:
    """'rank 3', 'ranks 0-3, 7' (in any order, repeats ignored); `none` when there are none. `noun` names what the
    numbers count where they are not the job's ranks ('task 3', 'local ranks 1-2')."""
    ordered = sorted(set(ranks))
    if not ordered:
        return none
    spans, start = [], ordered[0]
    for prev, cur in zip(ordered, [*ordered[1:], None], strict=True):
        if cur is None or cur != prev + 1:
            spans.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    return (f"{noun} " if len(ordered) == 1 else f"{noun}s ") + ", ".join(spans)
