"""Point-to-point ops in the flight recorder: the k-th send a->b must meet the k-th recv at b from a.

Pure: takes one group and the loaded dumps, returns the first unmatched op as a `Disagreement`.
"""

from __future__ import annotations

from collections import defaultdict

from torchtriage.analysis.fr_model import ABSENT, Disagreement, Group
from torchtriage.sources.flight_recorder import P2POp, RankDump


def p2p_disagreement(group: Group, dumps: dict[int, RankDump]) -> Disagreement | None:
    """The k-th send a->b must meet the k-th recv at b from a, with the same sizes and dtypes.

    Ring buffers drop their oldest records, so counting from each buffer's start would pair the wrong ops.
    NCCL records on every p2p entry the group's last collective before it: the ops are counted after each
    collective, in the span both buffers hold whole (after the oldest collective each still holds, or from
    the start where a buffer never wrapped). A member whose dump holds no p2p op of the group posted none."""
    local_to_global = list(group.members)
    posted: dict[tuple[int, int], dict[str, list[P2POp]]] = defaultdict(lambda: {"send": [], "recv": []})
    for rank in group.members:
        dump = dumps.get(rank)
        if dump is None:
            continue
        for op in dump.p2p.get(group.name, ()):
            try:
                src, dst = local_to_global[op.src], local_to_global[op.dst]
            except IndexError:
                continue
            if (op.kind == "send" and rank == src) or (op.kind == "recv" and rank == dst):
                posted[(src, dst)][op.kind].append(op)
    found: list[tuple[int, Disagreement]] = []
    for (src, dst), ops in sorted(posted.items()):
        if src not in dumps or dst not in dumps or src == dst:
            continue
        floor = _aligned_after(dumps[src], dumps[dst], group.name)
        if floor is None:
            continue  # a buffer wrapped and the group has no collective to count from: cannot be aligned
        sends = [op for op in ops["send"] if op.after > floor]
        recvs = [op for op in ops["recv"] if op.after > floor]
        disagreement = _first_unmatched(group, src, dst, sends, recvs)
        if disagreement is not None:
            found.append(_unless_held_by_the_poster(disagreement, dumps))
    return min(found, key=lambda item: item[0])[1] if found else None


def _unless_held_by_the_poster(found: tuple[int, Disagreement], dumps: dict[int, RankDump]) -> tuple[int, Disagreement]:
    """A rank that never posted the matching op stopped issuing only if nothing holds it: where its own pending
    send or recv of the group pairs with an op the poster posted but its device has not run (queued behind the
    poster's unmatched op), each waits for the other. A stage that skipped a recv and went on posts the next
    step's ops, so its peer's send pairs with a later recv and the peer never gets to post its own: counts
    alone cannot say which departed (the ranks' own order may)."""
    after, d = found
    if d.decided_by != "stopped issuing":
        return found
    missing, poster = d.culprits[0], d.sides["posted"][0]
    if not _held_by(d.group.name, dumps.get(missing), dumps.get(poster)):
        return found
    held = (
        f"; rank {missing} waits in a send or recv of its own, paired with an op rank {poster} posted and has not run"
    )
    sides = {"posted": [poster], "holds": [missing]}
    return after, Disagreement(d.group, d.seq, True, sides, None, [], "undecided", d.kind, d.note + held)


def _held_by(name: str, mine: RankDump | None, theirs: RankDump | None) -> bool:
    if mine is None or theirs is None:
        return False
    for op in mine.p2p.get(name, ()):
        if op.state not in ("scheduled", "started"):
            continue
        try:
            paired = counterpart(name, mine, theirs, op)
        except LookupError:
            continue
        if paired is not None and paired.state in ("scheduled", "started"):
            return True
    return False


def _whole_from(dump: RankDump, name: str) -> int | None:
    """The collective seq after which this rank's buffer holds every p2p op of group `name`: -1 when it never
    wrapped; else the oldest collective it still holds (the ops after the one before it may be cut)."""
    if not dump.first_record_id:
        return -1
    track = dump.tracks.get(name)
    if track is None or not track.seqs:
        return None
    return track.seqs[0]


def _aligned_after(one: RankDump, other: RankDump, name: str) -> int | None:
    """The collective seq after which both buffers hold every p2p op of group `name` (None: they cannot be
    aligned, a buffer wrapped past every collective of the group)."""
    mine, theirs = _whole_from(one, name), _whole_from(other, name)
    return None if mine is None or theirs is None else max(mine, theirs)


def counterpart(name: str, mine: RankDump, theirs: RankDump, op: P2POp) -> P2POp | None:
    """The op of `theirs` that `op`, posted by `mine` in group `name`, pairs with: the k-th send a->b after a
    collective meets the k-th recv at b from a after the same collective. None when `theirs` never posted
    it; LookupError when the two buffers cannot be aligned there."""
    floor = _aligned_after(mine, theirs, name)
    if floor is None or op.after <= floor:
        raise LookupError("the buffers do not both hold the ops around it")
    pair, other = (op.src, op.dst), "recv" if op.kind == "send" else "send"
    same = [o.index for o in mine.p2p.get(name, ()) if (o.kind, o.src, o.dst, o.after) == (op.kind, *pair, op.after)]
    matching = [o for o in theirs.p2p.get(name, ()) if (o.kind, o.src, o.dst, o.after) == (other, *pair, op.after)]
    k = same.index(op.index)
    return matching[k] if k < len(matching) else None


def _first_unmatched(
    group: Group, src: int, dst: int, sends: list[P2POp], recvs: list[P2POp]
) -> tuple[int, Disagreement] | None:
    """The first send a->b without its recv (or the reverse, or with other sizes): (its collective, how)."""
    by_after: dict[int, list[list[P2POp]]] = defaultdict(lambda: [[], []])
    for op in sends:
        by_after[op.after][0].append(op)
    for op in recvs:
        by_after[op.after][1].append(op)
    for after in sorted(by_after):
        out, into = by_after[after]
        for k in range(max(len(out), len(into))):
            if k < len(out) and k < len(into):
                send, recv = out[k], into[k]
                if (send.sizes, send.dtypes) != (recv.sizes, recv.dtypes):
                    return after, Disagreement(
                        group,
                        send.seq,
                        True,
                        {f"send {src}->{dst}": [src], f"recv {dst}<-{src}": [dst]},
                        None,
                        [],
                        "undecided",
                        "size_mismatch" if send.sizes != recv.sizes else "dtype_mismatch",
                        f"send #{k + 1} after collective {after} from rank {src} to rank {dst} carries "
                        f"{[list(s) for s in send.sizes]} {list(send.dtypes)}, the matching recv expects "
                        f"{[list(s) for s in recv.sizes]} {list(recv.dtypes)}",
                    )
                continue
            op, missing, verb = (out[k], dst, "recv") if k < len(out) else (into[k], src, "send")
            return after, Disagreement(
                group,
                op.seq,
                True,
                {"posted": [src if k < len(out) else dst], ABSENT: [missing]},
                "posted",
                [missing],
                "stopped issuing",
                "not_joined",
                f"rank {missing} never posted the {verb} matching {'send' if k < len(out) else 'recv'} #{k + 1} "
                f"after collective {after} from rank {src} to rank {dst}",
            )
    return None
