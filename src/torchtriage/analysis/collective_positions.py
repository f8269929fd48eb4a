"""Which collective each rank was in when it failed, read from its Python traceback.

A hang is almost always a collective mismatch: the ranks that time out wait in one collective, and
the culprit is elsewhere — in another collective (a barrier against an all_reduce), or in none. When
the job dies, every rank's traceback shows the c10d function it was in and the user line that called
it; comparing them names the culprit even when its own error is only "connection closed by peer".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from torchtriage.analysis.log_records import Frame, PyTraceback

# The c10d front-end module whose public functions are the collectives.
_C10D_MODULES = ("distributed_c10d.py",)
# Wrappers that sit between the user and the collective; never the collective itself.
_WRAPPERS = {"wrapper", "_wrapper", "inner", "wrapped", "_fn"}


@dataclass(frozen=True)
class RankPosition:
    rank: int
    collective: str | None  # e.g. "all_reduce", "barrier"; None when not inside a collective
    call_site: Frame | None  # the innermost user frame


def collective_of(traceback: PyTraceback) -> str | None:
    """The outermost c10d function on the stack: the collective the user called."""
    for frame in traceback.frames:
        if frame.path.endswith(_C10D_MODULES) and frame.function not in _WRAPPERS:
            return frame.function
    return None


def positions(tracebacks: list[PyTraceback], user_frame) -> dict[int, RankPosition]:
    """Each rank's position from its last traceback (`user_frame` picks the innermost user frame)."""
    latest: dict[int, PyTraceback] = {}
    for tb in tracebacks:
        if tb.rank is not None and tb.frames:
            latest[tb.rank] = tb
    return {rank: RankPosition(rank, collective_of(tb), user_frame(tb)) for rank, tb in latest.items()}


def odd_ones_out(found: dict[int, RankPosition], waiting_ranks: set[int]) -> tuple[list[int], str | None]:
    """Ranks not in the collective the others wait in, and that collective.

    The ranks that timed out define where the job waits; without them, the strict majority does.
    Returns ([], None) when the stacks do not single anyone out.
    """
    if len(found) < 2:
        return [], None
    waiting = [found[r].collective for r in waiting_ranks if r in found and found[r].collective]
    if waiting:
        expected = Counter(waiting).most_common(1)[0][0]
    else:
        counts = Counter(p.collective for p in found.values()).most_common()
        if counts[0][0] is None or (len(counts) > 1 and counts[0][1] == counts[1][1]):
            return [], None
        expected = counts[0][0]
    culprits = sorted(rank for rank, p in found.items() if p.collective != expected)
    if not culprits or len(culprits) == len(found):
        return [], None
    return culprits, expected
