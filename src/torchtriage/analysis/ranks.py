"""Naming sets of ranks the way people read them."""

from __future__ import annotations


def format_ranks(ranks: list[int]) -> str:
    """'rank 3', 'ranks 0-3, 7'; `ranks` sorted."""
    if not ranks:
        return "no rank identified"
    spans, start = [], ranks[0]
    for prev, cur in zip(ranks, ranks[1:] + [None], strict=True):
        if cur is None or cur != prev + 1:
            spans.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(spans)
