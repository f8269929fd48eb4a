"""Where each rank ran: the identity records ranks write at start (`DIR/identity/rank<N>.json`).

A rank armed by `torchtriage run` records its rank, local rank, world size, host, pid and the launcher's attempt
number as it starts, and its GPU (index, UUID, PCI bus id) once its own program has put CUDA to use
(runtime/identity.py). The registry knows the record by its schema; here it becomes a `Machine`. A record comes
from another machine: every field is checked as it is read, and one that is not what it should be is left
unknown, never trusted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

from torchtriage.model import Machine
from torchtriage.protocol import IDENTITY_SCHEMA
from torchtriage.sources import limits
from torchtriage.sources.fields import as_int, as_text, strict_json
from torchtriage.sources.streams import read_whole

_NAME_CHARS = 255  # a host name (RFC 1035 limits it to 253), a UUID, a PCI bus id


@dataclass(frozen=True)
class RankIdentity:
    """One rank's record: where it ran, and when it started."""

    machine: Machine
    world_size: int | None
    started_at: str
    file: str


def _text(value: object) -> str | None:
    """A name (host, UUID, bus id): text of one line, else unknown."""
    if not isinstance(value, str) or not value or len(value) > _NAME_CHARS or not value.isprintable():
        return None
    return value


def _count(value: object, low: int, high: int) -> int | None:
    number = as_int(value, -1, low, high)
    return None if number == -1 else number


def read_identity(path: str) -> RankIdentity | str:
    """The record at `path`, or why it cannot be read (a sentence naming the file)."""
    try:
        data, _ = read_whole(path, "the identity record")
        record = strict_json(data)
    except (OSError, ValueError) as err:
        return f"{path}: an identity record that cannot be read ({getattr(err, 'strerror', None) or err})."
    if not isinstance(record, dict) or record.get("schema") != IDENTITY_SCHEMA:
        return f"{path}: not an identity record of this version ({IDENTITY_SCHEMA})."
    top = limits.active().rank
    rank = as_int(record.get("rank"), -1, 0, top)
    if rank < 0:
        return f"{path}: an identity record without a rank."
    gpu = record.get("gpu") if isinstance(record.get("gpu"), dict) else {}
    machine = Machine(
        rank=rank,
        host=_text(record.get("host")),
        pid=_count(record.get("pid"), 1, 1 << 32),
        gpu_index=_count(gpu.get("index"), 0, 1 << 16),
        gpu_uuid=_text(gpu.get("uuid")),
        gpu_pci_bus_id=_text(gpu.get("pci_bus_id")),
        local_rank=_count(record.get("local_rank"), 0, top),
        attempt=_count(record.get("attempt"), 0, 1 << 20),
        sources=("identity",),
    )
    world = _count(record.get("world_size"), 1, top + 1)
    return RankIdentity(machine, world, as_text(record.get("started_at"), limit=40), path)


def read_identity_once(path: str) -> RankIdentity | str:
    """`read_identity`, read once per analysis: the log triage (which ranks the job had) and the verdict's
    machines both need the records, and at 16,000 ranks a second read is 16,000 more files. The file's
    identity, modification time and size are part of the key, so a record rewritten since is read again."""
    try:
        st = os.stat(path)
    except OSError:
        return read_identity(path)  # says why it cannot be read
    return _read_keyed(path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, limits.active().rank)


@lru_cache(maxsize=1 << 15)
def _read_keyed(path: str, dev: int, ino: int, mtime_ns: int, size: int, top_rank: int) -> RankIdentity | str:
    return read_identity(path)


def read_identities(paths: list[str], problems: list[str]) -> dict[int, Machine]:
    """Rank -> where it ran, from the records at `paths`. Two records of one rank (folders of two attempts read
    together) keep the later attempt's; what cannot be read is added to `problems`."""
    found: dict[int, RankIdentity] = {}
    for path in paths:
        record = read_identity_once(path)
        if isinstance(record, str):
            problems.append(record)
            continue
        rank = record.machine.rank
        if rank not in found or _later(record, found[rank]):
            found[rank] = record
    return {rank: record.machine for rank, record in found.items()}


def _later(one: RankIdentity, other: RankIdentity) -> bool:
    return (one.machine.attempt or 0, one.started_at) > (other.machine.attempt or 0, other.started_at)


def ranks_of_the_job(paths: list[str]) -> set[int]:
    """The ranks a job had, from its identity records: every rank of the world size they agree on, and the ranks
    that wrote one. Records that cannot be read are reported where machines are attached."""
    records = [r for r in map(read_identity_once, paths) if not isinstance(r, str)]
    worlds = {r.world_size for r in records}
    ranks = {r.machine.rank for r in records}
    if len(worlds) == 1 and None not in worlds:
        ranks |= set(range(worlds.pop()))  # type: ignore[arg-type]
    return ranks
