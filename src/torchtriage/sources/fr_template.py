"""Dumps that repeat one another, read once: the ranks of one SPMD job record the same program.

In a job of thousands of ranks, the dumps of the ranks that share a role (a data-parallel replica, a half of
the world) hold the same ops, in the same groups, with the same sequence numbers, sizes and states; only
time stamps, ids of threads and record ids differ. The reader keeps what it made of a dump's columns (the
fields of its entries that it checks and turns into records), and a later dump whose columns are equal to
them takes the records instead of checking and extracting everything again.

Equality is tested against columns that were already checked, so a crafted dump costs no more to compare
than the trusted one it is compared with: the comparison stops at the first difference, and it never goes
deeper or further than the trusted columns go. Before any comparison, a few flat values (the number of
entries, the last entry's name, state and sequence number, the first group's name) pick the one candidate.
"""

from __future__ import annotations

from typing import Any

_KEPT = 64  # candidates: a job has a handful of roles, and a dump that matches none costs one comparison
_FLAT = (str, int)


def flat(value: Any) -> Any:
    """The value when it is a plain string or integer (hashing anything else could walk a crafted structure)."""
    return value if type(value) in _FLAT else None


def _pick(columns: tuple) -> tuple | None:
    """The flat values that pick a candidate: (entries, last name, last state, last seq, first group)."""
    groups, names, seqs, states = columns[0], columns[2], columns[7], columns[8]
    if not names:
        return None
    first = groups[0]
    group = flat(first[0]) if type(first) is tuple and first else None
    return (len(names), flat(names[-1]), flat(states[-1]), flat(seqs[-1]), group)


class Templates:
    """What the reader made of the columns it checked, found again for equal columns."""

    def __init__(self) -> None:
        self._by_pick: dict[tuple, tuple[tuple, Any]] = {}

    def find(self, columns: tuple) -> Any | None:
        """The records made of columns equal to these, or None."""
        pick = _pick(columns)
        known = self._by_pick.get(pick) if pick is not None else None
        if known is None:
            return None
        trusted, made = known
        try:
            return made if trusted == columns else None  # the trusted side first: it bounds the walk
        except RecursionError:
            return None

    def keep(self, columns: tuple, made: Any) -> None:
        """Remember what these checked columns made (the latest for its pick)."""
        pick = _pick(columns)
        if pick is None:
            return
        if len(self._by_pick) >= _KEPT and pick not in self._by_pick:
            self._by_pick.clear()
        self._by_pick[pick] = (columns, made)

    def clear(self) -> None:
        self._by_pick.clear()
