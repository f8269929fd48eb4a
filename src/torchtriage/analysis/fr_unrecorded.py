"""What a flight recorder cannot show: where a rank blamed for waiting in no op may wait all the same.

A sink of the wait-for graph is blamed for waiting in no recorded op. Two recorders cannot always show that it
does not: gloo's own records collectives only (a rank may wait in a send or recv), and ProcessGroupNCCL
records an op only once its communicator exists (a rank may be blocked creating one). This module says where
such a rank may wait, whether the dumps show the job makes such ops, and when the two sides of that wait
cannot be told apart.
"""

from __future__ import annotations

from torchtriage.analysis import wait_for
from torchtriage.analysis.fr_model import group_key
from torchtriage.model import Finding
from torchtriage.ranks import format_ranks
from torchtriage.sources.fields import as_int
from torchtriage.sources.flight_recorder import RankDump


def may_wait_unrecorded(
    culprits: list[int], programs: dict[int, wait_for.Program], groups: dict, dumps: dict[int, RankDump]
) -> tuple[dict[int, list[str]], bool]:
    """The culprits blamed for waiting in no recorded op whose recorder cannot show that they do not, with
    where they may wait; and whether the dumps show the job makes such unrecorded calls at all.

    - gloo records collectives only: a rank whose recorded collectives all completed may wait in a send or
      recv (a pipeline's), for a peer no dump names. Its op ids show sends and recvs between collectives.
    - ProcessGroupNCCL creates a communicator at its first use unless the job initialised eagerly: a collective
      bumps its sequence number, then blocks creating the communicator (the store exchange of its unique id,
      then `ncclCommInitRank` with every member) and only then records its entry and lists the group in
      `pg_config`. A rank blocked there leaves no trace of the op: that can be the first collective of a group
      no rank has used yet (nothing shows the job has one), or the first send/recv to a peer it never met
      (the job's recorded sends and recvs show it makes them)."""
    lazy = not _created_eagerly(dumps)
    uses_p2p = any(dump.p2p for dump in dumps.values())
    shared_backend = job_backend(dumps)
    found: dict[int, list[str]] = {}
    shown = False
    for rank in culprits:
        dump, program = dumps.get(rank), programs.get(rank)
        if dump is None or (program is not None and program.waiting is not None):
            continue
        backend = dump.backend or shared_backend
        if backend == "gloo" and not uses_p2p and not wait_for.records_states(dump):
            # ProcessGroupGloo's own recorder (torch ≤ 2.13: no states, no sends or recvs); the hook-based
            # recorder of later versions records both, and then says what this rank waits in.
            found[rank] = ["a send or recv, which gloo does not record"]
            shown = shown or _gloo_unrecorded_ops(dumps)
            continue
        if not backend.startswith("nccl"):  # nccl, and the nccl2 / ncclx backends' names
            continue
        unrecorded = ["the first collective of a group it has not used before"] if lazy else []
        if uses_p2p and _peers_never_met(rank, dumps, groups):
            unrecorded.append("a first send/recv to a peer")
            shown = True
        if unrecorded:
            found[rank] = unrecorded
    return found, shown


def job_backend(dumps: dict[int, RankDump]) -> str:
    """The backend the dumps name, where they name one: a dump with no entry names none (a rank that issued no
    recorded op), and its rank runs the job's."""
    named = {dump.backend for dump in dumps.values() if dump.backend}
    return named.pop() if len(named) == 1 else ""


def cannot_tell(culprits: list[int], waiting_for_them: set[int], shown: bool, gloo: bool) -> bool:
    """Whether ranks "in no op" that may wait unrecorded cannot be told from the ranks waiting for them.

    Each may wait (creating a communicator, in a send or recv) for the very ranks that wait for it: the two
    sides then close a cycle through an op no dump shows, and either side may have departed. Where the ranks in
    no op are not fewer than their waiters, neither side is the likelier; on NCCL this needs the dumps to show
    the job makes such ops (a first send/recv to a peer). On gloo, where the dumps show the job makes sends and
    recvs they do not record, a single rank in no op is as likely the receiver of a send its peer skipped on
    the way into the collective as the rank that departed: on generated pipelines (benchmarks/sim_hangs.py)
    naming it is wrong more often than right."""
    if gloo:
        return shown or len(culprits) >= len(waiting_for_them)
    return shown and len(culprits) >= len(waiting_for_them)


def _gloo_unrecorded_ops(dumps: dict[int, RankDump]) -> bool:
    """Whether the gloo dumps show ops they did not record: op ids skipped between a group's collectives or
    before its first (its sends and recvs), or a group with no recorded collective (each rank numbers the
    groups it is a member of from 0, in creation order: a number missing among those it recorded is a group of
    sends and recvs only, or one it never used)."""
    for dump in dumps.values():
        if any(any(wait_for.unrecorded_between(dump, name)) for name in dump.tracks):
            return True
        if any(_unrecorded_before_first(track) for track in dump.tracks.values()):
            return True
        # A group's id is a number: not a name, nor '²' (a digit to isdigit(), which int() refuses), nor thousands
        # of digits (which int() refuses too).
        ids = {as_int(pg_id, -1, 0) for pg_id in dump.pg_ids.values() if pg_id.isascii() and pg_id.isdigit()} - {-1}
        if ids and len(ids) < max(ids) + 1:
            return True
    return False


def _unrecorded_before_first(track) -> bool:
    """gloo numbers every op of a group, sends and recvs too (`op_id`), and its collectives apart
    (`collective_seq_id`): a group's first recorded collective whose op id runs ahead of its seq came after
    ops it did not record (a pipeline's sends and recvs before its first collective)."""
    if not track.op_ids or not track.seqs or min(track.op_ids) < 0:
        return False
    return track.op_ids[0] > track.seqs[0]


def _created_eagerly(dumps: dict[int, RankDump]) -> bool:
    """Whether the job created its communicators eagerly (`init_process_group(device_id=...)`): a dump then
    lists in `pg_config` a group it never issued an op in. Lazily, a group is listed once its first op created
    the communicator, and no dump shows which groups are still to come."""
    for dump in dumps.values():
        for name in dump.pg_config:
            track, status = dump.tracks.get(name), dump.status(name)
            if (track is None or not track.seqs) and not dump.p2p.get(name) and (status is None or status[0] < 0):
                return True
    return False


def _peers_never_met(rank: int, dumps: dict[int, RankDump], groups: dict) -> bool:
    """Whether a member of one of the rank's groups has exchanged no recorded send or recv with it, by either
    one's dump: a first send/recv to that peer would create their pair's communicator, unrecorded until it
    exists (and once it exists, both sides record their ops)."""
    members = _members(dumps[rank], groups)
    if members is None:
        return True  # a group whose members are not known: any peer may be new
    strangers = members - _partners(dumps[rank], groups) - {rank}
    return any(peer not in dumps or rank not in _partners(dumps[peer], groups) for peer in strangers)


def _members(dump: RankDump, groups: dict) -> set[int] | None:
    members: set[int] = set()
    for name in {*dump.tracks, *dump.p2p, *dump.pg_config}:
        group = groups.get(group_key(dump, name))
        if group is None:
            return None
        members |= set(group.members)
    return members


def _partners(dump: RankDump, groups: dict) -> set[int]:
    """The global ranks this rank's recorded sends and recvs went to or came from."""
    met = set()
    for name, records in dump.p2p.items():
        group = groups.get(group_key(dump, name))
        if group is None:
            continue
        for record in records:
            for local in (record.src, record.dst):
                if 0 <= local < len(group.members):
                    met.add(group.members[local])
    return met


def unrecorded_finding(unrecorded: dict[int, list[str]], dumps: dict[int, RankDump]) -> Finding:
    ranks = sorted(unrecorded)
    where = "; or ".join(unrecorded[ranks[0]][:4])
    if (dumps[ranks[0]].backend or job_backend(dumps)) == "gloo":
        return Finding(
            "fr.unrecorded_p2p",
            ranks,
            f"gloo records collectives only: {format_ranks(ranks)} may wait in a send or recv rather than in no "
            "op at all — its stack tells",
            "symptom",
            "hang",
        )
    return Finding(
        "fr.unrecorded_init",
        ranks,
        f"NCCL records an op only once its communicator exists: {format_ranks(ranks)} may be blocked creating one "
        f"({where}) rather than in no op at all — its stack tells (with eager init, "
        "`init_process_group(device_id=...)`, no op waits to create one)",
        "symptom",
        "hang",
    )
