"""Per-rank flight-recorder (FR) dumps in, compact typed records out.

PyTorch's flight recorder keeps a ring buffer of every c10d collective and p2p op per process and writes
it as one pickle per rank (`<TORCH_FR_DUMP_TEMP_FILE><rank>`, by default `~/.cache/torch/
comm_lib_trace_rank_<rank>`, formerly `nccl_trace_rank_<rank>`) or, through `_dump_fr_trace_json`, as JSON
(no stack frames; timestamps 0 instead of null; counters as strings). Format versions 2.x are read:

    {version: "2.10", pg_config: {pg_name: {name, desc, ranks: "[0, 1]"}},
     pg_status: {pg_id: {last_enqueued_collective, last_started_collective, last_completed_collective}},
     entries: [{record_id, pg_id, process_group: (name, desc), collective_seq_id, p2p_seq_id, is_p2p,
                profiling_name: "nccl:all_reduce" | "gloo:send 0->1", input_sizes, output_sizes,
                input_dtypes, output_dtypes, state, time_created_ns, timeout_ms, frames: [{name, filename,
                line}], ...}], rank?: int}

Only what a verdict needs is kept, column by column per (rank, process group) so that thousands of ranks
stay small: each op's comparison key (what every rank of the group must agree on), state, user call site
and its index in the file (for evidence). Strings are interned so identical values share one object.
Loading runs on every core: the unpickling dominates and each file is independent.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import os
import re
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import itemgetter, methodcaller, ne
from typing import Any, NamedTuple

from torchtriage.errors import InputError
from torchtriage.knowledge.frames import is_library_file, stack_knowledge
from torchtriage.model import Frame, SourceKind
from torchtriage.sources import limits
from torchtriage.sources.fields import TextMemo, as_int, as_text, describe
from torchtriage.sources.forked import usable_cores
from torchtriage.sources.fr_bytes import ByteTemplate, ByteTemplates
from torchtriage.sources.fr_checks import check_entries, check_frames, check_header, ranks_in_text
from torchtriage.sources.fr_template import Templates, flat
from torchtriage.sources.isolated import Stopped, can_isolate, map_isolated
from torchtriage.sources.limits import LimitExceeded, seconds_for_size
from torchtriage.sources.registry import discover, for_reader, not_read_here, rank_from_name
from torchtriage.sources.safe_pickle import PickleError, safe_loads
from torchtriage.sources.streams import read_whole

SUPPORTED_MAJOR = 2
_PICKLE_HEAD = re.compile(rb"\A\x80[\x02-\x05]")
# Ops that are p2p by name even when an old dump lacks `is_p2p`.
_P2P_OPS = ("send", "recv")
_ALL_TO_ALL = ("all_to_all", "alltoall")
# Ops whose root passes a list where the other ranks pass one tensor or none: their sizes and dtypes differ by
# rank legitimately, and which side the recorder files the list under differs too (a real NCCL scatter
# records the root's list as its output, an empty [0] of an unknown dtype elsewhere). Only the op is compared.
_ROOTED = ("gather", "scatter")


class Signature(NamedTuple):
    """What one op was, as far as its peers must agree: its name, sizes and dtypes (coalesced ops merged)."""

    op: str  # "all_reduce", "coalesced[all_reduce, all_reduce]", ...
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_dtypes: tuple[str, ...]

    @property
    def input_numel(self) -> int:
        return sum(math.prod(s) for s in self.input_sizes)

    @property
    def output_numel(self) -> int:
        return sum(math.prod(s) for s in self.output_sizes)


class P2POp(NamedTuple):
    index: int  # position in the dump's entries
    seq: int  # p2p_seq_id
    kind: str  # "send" | "recv"
    src: int  # group-local ranks, as the profiling name gives them
    dst: int
    sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    state: str
    site: Frame | None
    after: int = 0  # collective_seq_id: the group's last collective before it (NCCL records it on p2p entries)
    # The entry index of the `coalesced` marker that closes its batch (batch_isend_irecv), -1 if in none. NCCL
    # never marks a batch's own entries completed, only the marker: a batched op's state is the marker's.
    batch: int = -1


@dataclass
class Track:
    """One rank's collectives in one process group, in record order, one column per field."""

    seqs: list[int] = field(default_factory=list)  # collective_seq_id (a coalesced group is one op)
    keys: list[str] = field(default_factory=list)  # comparison key; equal keys = compatible ops
    states: list[str] = field(default_factory=list)  # scheduled | started | completed
    sites: list[Frame | None] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)  # position in the dump's entries (the first, if coalesced)
    # op_id of each: one counter per group over every op, p2p included. Where the backend records no p2p
    # (gloo), the ids a step skips are its sends and recvs.
    op_ids: list[int] = field(default_factory=list)
    # all_to_all ops compare no sizes (each rank sends its own split); their totals are checked across ranks.
    a2a_numel: dict[int, tuple[int, int]] = field(default_factory=dict)  # seq -> (input numel, output numel)
    # position -> the call every rank must make that issued the op (a checkpoint's save, a state-dict
    # consolidation: knowledge/frames.toml [[all_rank_calls]]), for the few ops issued inside one
    all_rank_calls: dict[int, str] = field(default_factory=dict)


@dataclass
class PGInfo:
    name: str
    desc: str
    ranks_digest: str | None  # a digest of the `ranks` string; RankDump.ranks_text maps it to the text


@dataclass
class RankDump:
    path: str
    rank: int
    rank_from: str  # "content" | "file name"
    version: str
    backend: str  # "nccl", "gloo", ... from the profiling names
    has_frames: bool
    entry_count: int
    first_record_id: int | None
    pg_config: dict[str, PGInfo]  # by pg name
    pg_ids: dict[str, str]  # pg name -> pg_id (the key of pg_status)
    pg_desc: dict[str, str]  # pg name -> desc, from the entries
    pg_status: dict[str, tuple[int, int, int]]  # pg_id -> (last enqueued, last started, last completed)
    tracks: dict[str, Track]  # by pg name
    p2p: dict[str, list[P2POp]]  # by pg name
    signatures: dict[str, Signature]  # comparison key -> the op it stands for
    timed_out: list[tuple[str, int]]  # (pg name, seq) of ops pending for longer than their timeout
    ranks_text: dict[str, str] = field(default_factory=dict)  # digest -> "[0, 1, ...]" (first sight per worker)
    # gloo records the world's ranks under a nameless placeholder, its default group's members before it had
    # a name: the digest of those ranks, which say which ranks the default group has when nothing else does.
    nameless_ranks: str | None = None

    def status(self, name: str) -> tuple[int, int, int] | None:
        """The `pg_status` counters of the group named `name` (pg_status is keyed by pg_id)."""
        return self.pg_status.get(self.pg_ids.get(name, name))


class DumpProblem(NamedTuple):
    path: str
    message: str


# --------------------------------------------------------------------------------------------------- discovery


# ------------------------------------------------------------------------------------------------------ parsing

# Per process: interned values; in a pool worker, the pg ranks strings already sent to the parent (by digest),
# since thousands of dumps repeat the same long "[0, 1, ..., 4095]".
_intern: dict[Any, Any] = {}
_site_of_frame: dict[int, Frame | None] = {}
_sent_ranks: set[str] | None = None


def _worker_init() -> None:
    global _sent_ranks
    _sent_ranks = set()
    gc.disable()


def _interned(value: Any) -> Any:
    return _intern.setdefault(value, value)


def _as_tuple_sizes(sizes: Any) -> tuple[tuple[int, ...], ...]:
    if not sizes:
        return ()
    return tuple(tuple(s) for s in sizes)


_library_file: dict[str, bool] = {}  # file name -> library code? (a job has a few hundred files, all dumps alike)
_LIBRARY_FILES_KEPT = 1 << 16  # a hostile dump with millions of names must not grow it without bound


def _judge_frame(frame: Any) -> Frame | None:
    """The frame as a call site when it is the user's code, else None (remembered by the frame's identity)."""
    site = None
    filename = str(frame.get("filename", "")) if isinstance(frame, dict) else ""
    if filename:
        library = _library_file.get(filename)
        if library is None:
            if len(_library_file) >= _LIBRARY_FILES_KEPT:
                _library_file.clear()
            library = _library_file[filename] = is_library_file(filename)
        if not library:
            site = _interned(Frame(filename, _int(frame.get("line"), 0), str(frame.get("name", "?"))))
        elif not _in_all_rank_call and _in_all_rank_call_file(filename):
            if stack_knowledge().all_rank_call(filename, str(frame.get("name", ""))):
                _in_all_rank_call.append(True)  # this dump has ops issued inside one: `_mark_all_rank_calls` finds them
    _site_of_frame[id(frame)] = site
    return site


_in_all_rank_call: list[bool] = []  # per dump: a frame judged was in a call every rank must make
_all_rank_call_file: dict[str, bool] = {}  # file name -> holds a call every rank must make? (few files do)


def _in_all_rank_call_file(filename: str) -> bool:
    known = _all_rank_call_file.get(filename)
    if known is None:
        if len(_all_rank_call_file) >= _LIBRARY_FILES_KEPT:
            _all_rank_call_file.clear()
        known = _all_rank_call_file[filename] = stack_knowledge().holds_all_rank_calls(filename)
    return known


def _all_rank_call(frames: Any) -> str | None:
    """The outermost call every rank must make among the library frames above the user's call site (frames
    come innermost first): the one the user called, not its helpers."""
    found = None
    knowledge = stack_knowledge()
    for frame in frames if type(frames) is list else ():
        if not isinstance(frame, dict):
            return found
        filename = str(frame.get("filename", ""))
        if not is_library_file(filename):
            return found
        found = knowledge.all_rank_call(filename, str(frame.get("name", ""))) or found
    return found


def _mark_all_rank_calls(ext: _Extract, frame_col: Any) -> None:
    """Where a frame of this dump was in a call every rank must make: the ops issued inside one, per track."""
    if not _in_all_rank_call:
        return
    calls: dict[int, str | None] = {}  # id(frames list) -> its call
    for track in ext.tracks.values():
        for i, index in enumerate(track.indices):
            frames = frame_col(index)
            key = id(frames)
            if key not in calls:
                calls[key] = _all_rank_call(frames)
            if calls[key] is not None:
                track.all_rank_calls[i] = calls[key]  # type: ignore[assignment]


_RECENT_FRAMES = 8  # distinct frame lists remembered: a training step calls its collectives from a few lines


def _shared_frames(column: list | tuple) -> list:
    """The frames column with equal frame lists made one object. Some dumps share the lists of entries called
    from one line, some repeat them (each entry's list rebuilt): made shared, each distinct list is checked
    and judged once, as the readers that go by identity expect. A list is compared with the few seen last."""
    recent: list = []
    shared = []
    for frames in column:
        if type(frames) is list and frames:
            for known in recent:
                try:
                    if known is frames or known == frames:
                        frames = known
                        break
                except RecursionError:  # a crafted, deeply nested value: compared no further
                    break
            else:
                recent.insert(0, frames)
                del recent[_RECENT_FRAMES:]
        shared.append(frames)
    return shared


def _user_site(frames: Any) -> Frame | None:
    """The innermost frame in user code (frames come innermost first)."""
    if not frames:
        return None
    for frame in frames:
        key = id(frame)
        site = _site_of_frame[key] if key in _site_of_frame else _judge_frame(frame)
        if site is not None:
            return site
    return None


def _sites_of(frame_col: list | tuple) -> list[Frame | None]:
    """Each entry's call site, judged once per distinct frame list (`_shared_frames` made equal lists one object)."""
    ids = list(map(id, frame_col))
    site_of = {key: _user_site(frames) for key, frames in dict(zip(ids, frame_col, strict=True)).items()}
    return list(map(site_of.__getitem__, ids))


def _split_name(profiling_name: str) -> tuple[str, str]:
    backend, _, name = profiling_name.partition(":")
    return (backend, name) if name else ("", backend)


def _compare_key(sig: Signature) -> str:
    op = sig.op
    if any(op.startswith(prefix) for prefix in _ALL_TO_ALL):
        return f"{op}|{sig.input_dtypes}|{sig.output_dtypes}"  # sizes differ per rank; totals are checked apart
    if op in _ROOTED:
        return op
    return f"{op}|{sig.input_sizes}|{sig.output_sizes}|{sig.input_dtypes}|{sig.output_dtypes}"


def _version_problem(version: Any) -> str | None:
    if version is None:
        return "it has no `version` key, so it is not a flight-recorder dump (or one too old to read)"
    text = as_text(version, limit=40)
    if not text:  # a container, bytes: never walked or formatted
        return f"its format version is {describe(version)}, not a version such as '2.10': not a flight-recorder dump"
    major = text.split(".", 1)[0]
    # ASCII digits only: '²'.isdigit() holds, and int() refuses it
    number = as_int(major, -1, 0) if major.isascii() and major.isdigit() else -1
    if number < 0:
        return f"its format version {text!r} is not a version this tool knows (it reads 2.x)"
    if number != SUPPORTED_MAJOR:
        return (
            f"its format version is {text}, and this torchtriage reads flight-recorder format 2.x "
            "(PyTorch 2.4 and later); upgrade torchtriage, or analyse it with the PyTorch that wrote it"
        )
    return None


def _int(value: Any, default: int = -1) -> int:
    return as_int(value, default)


# Per process: raw entry text -> comparison key, and comparison key -> the Signature it stands for.
_key_cache: dict[str, str] = {}
_signature_of: dict[str, Signature] = {}


def _signature(members: list[tuple[str, dict]]) -> Signature:
    """One op from the entries of one seq (several when coalesced; the `coalesced` marker itself adds nothing)."""
    names = [name for name, _ in members]
    ops = [(name, e) for name, e in members if name != "coalesced"] or members[:1]
    op = names[0] if len(members) == 1 else f"coalesced[{', '.join(name for name, _ in ops)}]"
    return Signature(
        _interned(op),
        tuple(s for _, e in ops for s in _as_tuple_sizes(e.get("input_sizes"))),
        tuple(s for _, e in ops for s in _as_tuple_sizes(e.get("output_sizes"))),
        tuple(str(d) for _, e in ops for d in (e.get("input_dtypes") or ())),
        tuple(str(d) for _, e in ops for d in (e.get("output_dtypes") or ())),
    )


def _register(sig: Signature) -> str:
    key = _interned(_compare_key(sig))
    _signature_of.setdefault(key, sig)
    return key


def _new_key(entry: dict, profiling_name: str) -> str:
    return _register(_signature([(_split_name(profiling_name)[1].split(" ", 1)[0], entry)]))


def _merge_coalesced(track: Track, entries: list, signatures: dict[str, Signature]) -> Track:
    """Runs of entries sharing a seq (a coalesced op) become one op."""
    merged = Track()
    i = 0
    while i < len(track.seqs):
        j = i
        while j + 1 < len(track.seqs) and track.seqs[j + 1] == track.seqs[i]:
            j += 1
        if j == i:
            key = track.keys[i]
            state = track.states[i]
        else:
            run = [entries[track.indices[k]] for k in range(i, j + 1)]
            members = [(_split_name(str(e.get("profiling_name", "")))[1].split(" ", 1)[0], e) for e in run]
            key = _register(_signature(members))
            signatures.setdefault(key, _signature_of[key])
            states = set(track.states[i : j + 1])
            state = "completed" if states == {"completed"} else min(states - {"completed"})
        merged.seqs.append(track.seqs[i])
        merged.keys.append(key)
        merged.states.append(state)
        merged.sites.append(next((s for s in track.sites[i : j + 1] if s), None))
        merged.indices.append(track.indices[i])
        i = j + 1
    return merged


def _add_p2p(p2p: dict[str, list[P2POp]], pg: str, index: int, entry: dict) -> None:
    name = _split_name(str(entry.get("profiling_name", "")))[1]
    op_name = name.split(" ", 1)[0]
    if op_name not in _P2P_OPS:
        return  # the `coalesced` marker of a batch of sends/recvs
    parsed = _parse_p2p(name)
    if parsed is None:
        return
    src, dst = parsed
    send = op_name == "send"
    p2p.setdefault(pg, []).append(
        P2POp(
            index,
            _int(entry.get("p2p_seq_id")),
            op_name,
            src,
            dst,
            _as_tuple_sizes(entry.get("input_sizes") if send else entry.get("output_sizes")),
            tuple(str(d) for d in ((entry.get("input_dtypes") if send else entry.get("output_dtypes")) or ())),
            _interned(str(entry.get("state", ""))),
            _user_site(entry.get("frames")),
            _int(entry.get("collective_seq_id"), 0),
        )
    )


def _rank_of(data: dict, rank_hint: int | None) -> tuple[int, str]:
    rank = data.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:
        return rank, "content"
    if rank_hint is None:
        raise ValueError(
            "its rank is unknown: the dump has no `rank` key and the file name carries no number "
            "(name it like nccl_trace_rank_<N>)"
        )
    if rank_hint > limits.active().rank:
        raise LimitExceeded(
            f"the rank in its file name, {rank_hint:,}, is past the largest rank accepted", "rank", rank_hint
        )
    return rank_hint, "file name"


_digests = TextMemo()


def _ranks_digest(text: str) -> str:
    """A short digest of a group's ranks text, each distinct text hashed once per process: every dump of a
    16,384-rank job repeats the world's 100 KB "[0, 1, ..., 16383]"."""
    digest = _digests.get(text)
    if digest is None:
        digest = _digests.put(text, hashlib.blake2b(text.encode(), digest_size=8).hexdigest())
    return digest


_A_RANK = re.compile(r"[^\[\] ]")  # found at once; `strip("[] ")` copied the world's 100 KB of ranks per dump


def _pg_config(data: dict) -> tuple[dict[str, PGInfo], dict[str, str], str | None]:
    """The groups a dump configures (by name), their ranks' text by digest, and gloo's nameless placeholder."""
    pg_config: dict[str, PGInfo] = {}
    ranks_text: dict[str, str] = {}
    nameless_ranks = None
    for key, info in (data.get("pg_config") or {}).items():
        if not isinstance(info, dict):
            continue
        name = str(info.get("name", key))
        text = info.get("ranks")
        digest = None
        if isinstance(text, (list, tuple)):
            text = str(list(text))
        if isinstance(text, str) and _A_RANK.search(text):
            digest = _ranks_digest(text)
            ranks_text[digest] = text
        if not name:
            nameless_ranks = digest  # gloo's placeholder: no group of its own, but the world's ranks
            continue
        pg_config[name] = PGInfo(name, str(info.get("desc", "")), digest)
    return pg_config, ranks_text, nameless_ranks


def _pg_status(data: dict) -> dict[str, tuple[int, int, int]]:
    return {
        str(pg_id): (
            _int(status.get("last_enqueued_collective")),
            _int(status.get("last_started_collective")),
            _int(status.get("last_completed_collective")),
        )
        for pg_id, status in (data.get("pg_status") or {}).items()
        if isinstance(status, dict)
    }


def _is_p2p_entry(entry) -> bool:
    flag = entry.get("is_p2p")
    return (
        bool(flag)
        if flag is not None
        else _split_name(str(entry.get("profiling_name", "")))[1].split(" ", 1)[0] in _P2P_OPS
    )


def _without_p2p_markers(track: Track, entries: list) -> Track:
    """The track less the `coalesced` markers that end a batch of sends and recvs: NCCL records the marker
    with `is_p2p` False and the collective sequence number of the collective before the batch, so read as a
    collective it would merge with that collective and tell its ranks apart from those that ran no batch."""
    keep = [
        i
        for i, index in enumerate(track.indices)
        if not (
            index > 0
            and _split_name(str(entries[index].get("profiling_name", "")))[1] == "coalesced"
            and _is_p2p_entry(entries[index - 1])
        )
    ]
    if len(keep) == len(track.indices):
        return track
    kept = Track()
    for name in ("seqs", "keys", "states", "sites", "indices"):
        setattr(kept, name, [getattr(track, name)[i] for i in keep])
    return kept


_OP_ID = methodcaller("get", "op_id")


def _add_op_ids(tracks: dict[str, Track], entries: list) -> None:
    """Each collective's op_id, fetched as one column (a counter that is not an int reads as -1)."""
    if not tracks:
        return
    column = list(map(_OP_ID, entries)) if set(map(type, entries)) == {dict} else [None] * len(entries)
    for track in tracks.values():
        ids = [column[i] for i in track.indices]
        track.op_ids = ids if set(map(type, ids)) <= {int} else [_int(i, -1) for i in ids]


def _close_batches(p2p: dict[str, list[P2POp]], entries: list) -> None:
    """Each op of a batch of sends and recvs takes its batch's marker and state. NCCL records a batch as its
    ops, which share one p2p_seq_id, then a `coalesced` entry (not p2p) with that id, which alone says
    whether the batch completed: the ops' own entries stay `scheduled`."""
    by_index = {op.index: op for ops in p2p.values() for op in ops}
    closing: dict[int, tuple[int, str]] = {}  # op index -> (marker index, marker state)
    for marker in sorted({index + 1 for index in by_index} - set(by_index)):
        if marker >= len(entries) or _is_p2p_entry(entries[marker]):
            continue
        entry = entries[marker]
        if _split_name(str(entry.get("profiling_name", "")))[1] != "coalesced":
            continue
        seq, state, at = _int(entry.get("p2p_seq_id")), _interned(str(entry.get("state", ""))), marker - 1
        while at in by_index and by_index[at].seq == seq:
            closing[at] = (marker, state)
            at -= 1
    if closing:
        for name, ops in p2p.items():
            p2p[name] = [
                op._replace(batch=closing[op.index][0], state=closing[op.index][1]) if op.index in closing else op
                for op in ops
            ]


def _finish_tracks(tracks: dict[str, Track], entries: list, signatures: dict[str, Signature]) -> None:
    """Drop empty tracks, merge coalesced ops, and note each all_to_all's own totals."""
    has_all_to_all = any(key.startswith(_ALL_TO_ALL) for key in signatures)
    for pg in list(tracks):
        track = tracks[pg]
        if not track.seqs:
            del tracks[pg]
            continue
        if len(set(track.seqs)) != len(track.seqs):
            track = _without_p2p_markers(track, entries)
            tracks[pg] = _merge_coalesced(track, entries, signatures)
            track = tracks[pg]
            if not track.seqs:
                del tracks[pg]
                continue
        if not has_all_to_all:
            continue
        for i, key in enumerate(track.keys):
            if key.startswith(_ALL_TO_ALL):  # the key leaves sizes out: take this rank's own from its entry
                own = _signature([("all_to_all", entries[track.indices[i]])])
                track.a2a_numel[track.seqs[i]] = (own.input_numel, own.output_numel)


def _past_their_timeout(ext: _Extract, entries: list) -> list[tuple[str, int]]:
    """Ops still pending after their timeout, measured against the latest moment this rank recorded anything."""
    timed_out = list(ext.timed_out)
    if ext.pending:
        latest_ns = ext.latest_ns
        if latest_ns is None:
            latest_ns = _latest_stamp(map(methodcaller("get", name), entries) for name in _STAMP_NAMES)
        for pg, seq, created, timeout_ms, _ in ext.pending:
            if created and timeout_ms > 0 and latest_ns - created > timeout_ms * 1_000_000:
                timed_out.append((pg, seq))
    return timed_out


class _Header(NamedTuple):
    """A dump's own top-level fields, read and checked."""

    rank: int
    rank_from: str
    version: str
    pg_config: dict[str, PGInfo]
    ranks_text: dict[str, str]
    nameless_ranks: str | None
    pg_status: dict[str, tuple[int, int, int]]


def _read_header(data: dict, size: int, rank_hint: int | None) -> _Header:
    """Raises ValueError with the reason."""
    if not isinstance(data, dict):
        raise ValueError(f"it holds a {type(data).__name__}, not the dict a flight-recorder dump is")
    problem = _version_problem(data.get("version"))
    if problem:
        raise ValueError(problem)
    check_header(data, size, limits.active().rank)
    rank, rank_from = _rank_of(data, rank_hint)
    pg_config, ranks_text, nameless_ranks = _pg_config(data)
    return _Header(rank, rank_from, str(data.get("version")), pg_config, ranks_text, nameless_ranks, _pg_status(data))


def parse_dump(path: str, data: dict, rank_hint: int | None, size: int, raw: bytes | None = None) -> RankDump:
    """Turn one rank's dump (already decoded from `size` bytes) into records. Raises ValueError with the reason.

    `raw`, the pickle's bytes, lets the dump become a byte template for the files of its role that follow."""
    header = _read_header(data, size, rank_hint)
    entries = data.get("entries") or []
    _site_of_frame.clear()  # keyed by id(): valid only while this dump's frames are alive
    _in_all_rank_call.clear()
    fetched = _fetch_columns(entries) if entries and type(entries) is list else None
    if fetched is not None and set(map(type, entries)) != {dict}:
        fetched = None
    compared = made = None
    if fetched is not None:
        frames_at = _COLUMN_NAMES.index("frames")
        compared = (*fetched[0][:frames_at], tuple(map(_OP_ID, entries)))
        made = _templates.find(compared)
        if made is not None and not made.same_group_ids(entries):
            made = None
        if made is None:
            fetched[0][frames_at] = _shared_frames(fetched[0][frames_at])
    if made is None:
        check_entries(entries, size, dict(zip(_COLUMN_NAMES, fetched[0], strict=True)) if fetched else None)
    if made is not None:  # equal to checked columns: only what each dump has of its own is read and checked
        ext = made.extract(entries, fetched, size)  # type: ignore[arg-type]
    else:
        ext = _extract(entries, fetched, compared)
    if fetched is not None:
        column = fetched[0][_COLUMN_NAMES.index("frames")]
        _mark_all_rank_calls(ext, column.__getitem__)
    else:
        _mark_all_rank_calls(ext, lambda index: entries[index].get("frames"))
    first_record_id = _int(entries[0].get("record_id"), 0) if entries else None
    dump = _rank_dump(path, header, ext, len(entries), first_record_id, _past_their_timeout(ext, entries))
    if raw is not None and _byte_roles.time_for_one(entries):
        _keep_bytes(raw, data, dump, ext)
    return dump


def _rank_dump(
    path: str, header: _Header, ext: _Extract, entry_count: int, first_record_id: int | None, timed_out: list
) -> RankDump:
    ranks_text = header.ranks_text
    if _sent_ranks is not None and ranks_text:  # in a loading child: each text is sent once
        ranks_text = {digest: text for digest, text in ranks_text.items() if digest not in _sent_ranks}
        _sent_ranks.update(ranks_text)
    return RankDump(
        path=path,
        rank=header.rank,
        rank_from=header.rank_from,
        version=header.version,
        backend=ext.backend,
        has_frames=ext.has_frames,
        entry_count=entry_count,
        first_record_id=first_record_id,
        pg_config=header.pg_config,
        pg_ids=ext.pg_ids,
        pg_desc=ext.pg_desc,
        pg_status=header.pg_status,
        tracks=ext.tracks,
        p2p=ext.p2p,
        signatures=ext.signatures,
        timed_out=timed_out,
        ranks_text=ranks_text,
        nameless_ranks=header.nameless_ranks,
    )


# ------------------------------------------------------------------------------------------- byte templates


class _ByteRoles:
    """When to make a byte template (fr_bytes): a role's dumps, told apart by their length and last op, are
    read in full until this many have been; then one of them is walked. The walk costs about as much as the
    pre-scan of one dump (pickle_scan: both go opcode by opcode), which every dump read in full pays, so a
    role that never repeats costs at most twice the ordinary path. A role may take a few templates (a job's
    two halves written apart, a stamp a byte longer on some ranks), then no more."""

    EVERY = 2
    MOST = 4
    KEPT = 4096

    def __init__(self) -> None:
        self._read: dict[tuple, int] = {}

    def time_for_one(self, entries: Any) -> bool:
        if type(entries) is not list or not entries or type(entries[-1]) is not dict:
            return False
        last = entries[-1]
        role = (len(entries), *(flat(last.get(k)) for k in ("profiling_name", "state", "collective_seq_id")))
        if len(self._read) >= self.KEPT and role not in self._read:
            self._read.clear()
        read = self._read[role] = self._read.get(role, 0) + 1
        return read % self.EVERY == 0 and read <= self.EVERY * self.MOST

    def clear(self) -> None:
        self._read.clear()


_byte_roles = _ByteRoles()
_byte_templates = ByteTemplates()


def _keep_bytes(raw: bytes, data: dict, dump: RankDump, ext: _Extract) -> None:
    """Keep this checked dump as a byte template of its role, if its bytes allow one."""
    try:
        template = ByteTemplate(raw, data, [index for *_, index in ext.pending], (dump, ext), limits.active())
    except ValueError:
        return
    _byte_templates.add(template)


def _repeated(path: str, raw: bytes, rank_hint: int | None) -> RankDump | None:
    """The records of a file whose entries repeat a byte template's (fr_bytes): its own header, the template's
    records with its groups' names and its own time stamps; None otherwise (the ordinary path then reads it)."""
    found = _byte_templates.find(raw, limits.active())
    if found is None:
        return None
    template, repeat = found
    dump, ext = template.records
    try:
        header = _read_header(repeat.header, len(raw), rank_hint)
    except ValueError:
        return None  # the ordinary path says what is wrong with it
    names = {group: _interned(name) for group, name in repeat.names.items()}
    pending = [
        (names[pg], seq, created or 0, timeout, at)
        for (pg, seq, _, timeout, at), created in zip(ext.pending, repeat.created, strict=True)
    ]
    timed_out = [(names[pg], seq) for pg, seq in ext.timed_out]
    if any(name != group for group, name in names.items()) or repeat.descs:
        ids = {group: name if template.groups[group].id_is_name else ext.pg_ids[group] for group, name in names.items()}
        ext = ext._replace(
            tracks={names[group]: track for group, track in ext.tracks.items()},
            p2p={names[group]: ops for group, ops in ext.p2p.items()},
            pg_ids={names[group]: pg_id for group, pg_id in ids.items()},
            pg_desc={names[group]: repeat.descs.get(group, desc) for group, desc in ext.pg_desc.items()},
        )
    ext = ext._replace(timed_out=timed_out, pending=pending, latest_ns=repeat.latest_ns)
    return _rank_dump(path, header, ext, dump.entry_count, dump.first_record_id, _past_their_timeout(ext, []))


def _extract(entries: list, fetched: tuple[list, list | None] | None, compared: tuple | None) -> _Extract:
    """The records of checked entries; kept as a template when later dumps may repeat them (see fr_template)."""
    try:
        ext = _extract_columns(entries, fetched)
    except (TypeError, ValueError, AttributeError, IndexError, KeyError):
        ext = None  # an odd layout: the per-entry path says what is wrong with it, as it always did
    if ext is None:
        ext = _extract_per_entry(entries)
        compared = None
    # Every compared column was checked above but the op ids, which are taken as a template only when plain ints.
    plain = compared is not None and not ext.p2p and _Made.plain(ext) and set(map(type, compared[-1])) <= {int}
    _finish_tracks(ext.tracks, entries, ext.signatures)
    _add_op_ids(ext.tracks, entries)
    if ext.p2p:
        _close_batches(ext.p2p, entries)
    made = _Made.of(ext, tuple(fetched[0][_COLUMN_NAMES.index("frames")])) if plain else None  # type: ignore[index]
    if made is not None:
        _templates.keep(compared, made)  # type: ignore[arg-type]
    return ext


class _Made(NamedTuple):
    """What a dump's checked columns made, for the dumps that repeat them: everything but what each dump holds
    of its own (call sites, the times of pending ops, the id of its first record)."""

    ext: _Extract
    pending_at: tuple[tuple[str, int, int], ...]  # (pg, seq, entry index) of each pending op
    group_ids: tuple[tuple[int, str, str], ...]  # (entry index, pg, pg_id): where each group's pg_id was read
    frames: tuple  # the checked frames column: a dump with equal frames has the same call sites

    @staticmethod
    def plain(ext: _Extract) -> bool:
        """Collectives only, none coalesced and no all_to_all: records made from the compared columns alone."""
        return not any(key.startswith(_ALL_TO_ALL) for key in ext.signatures) and all(
            len(set(track.seqs)) == len(track.seqs) for track in ext.tracks.values()
        )

    @classmethod
    def of(cls, ext: _Extract, frames: tuple) -> _Made:
        pending = tuple((pg, seq, index) for pg, seq, _, _, index in ext.pending)
        groups = tuple((track.indices[0], pg, ext.pg_ids[pg]) for pg, track in ext.tracks.items() if track.indices)
        return cls(ext, pending, groups, frames)

    def same_group_ids(self, entries: list) -> bool:
        return all(str(entries[index].get("pg_id", pg)) == pg_id for index, pg, pg_id in self.group_ids)

    def extract(self, entries: list, fetched: tuple[list, list | None], size: int) -> _Extract:
        """This dump's records: the template's, with the times of its pending ops and its call sites (the
        template's when the frames are equal; read and checked like any dump's when not)."""
        ext = self.ext
        frames_at = _COLUMN_NAMES.index("frames")
        has_frames, sites_of = ext.has_frames, {pg: track.sites for pg, track in ext.tracks.items()}
        same_frames = self.frames == tuple(fetched[0][frames_at])  # the checked side first: it bounds the walk
        if not same_frames:
            frame_col = fetched[0][frames_at] = _shared_frames(fetched[0][frames_at])
            check_frames(frame_col, size)
            has_frames = any(frame_col)
            sites = _sites_of(frame_col) if has_frames else [None] * len(frame_col)
            sites_of = {pg: [sites[i] for i in track.indices] for pg, track in ext.tracks.items()}
        tracks = {
            pg: Track(
                track.seqs, track.keys, track.states, sites_of[pg], track.indices, track.op_ids,
                all_rank_calls=dict(track.all_rank_calls) if same_frames else {},
            )
            for pg, track in ext.tracks.items()
        }  # fmt: skip
        pending = [
            (pg, seq, entries[index].get("time_created_ns") or 0, _int(entries[index].get("timeout_ms"), 0), index)
            for pg, seq, index in self.pending_at
        ]
        stamps = fetched[1]
        latest_ns = _latest_stamp(stamps) if pending and stamps is not None else None
        return ext._replace(tracks=tracks, pending=pending, has_frames=has_frames, latest_ns=latest_ns)


_templates = Templates()


class _Extract(NamedTuple):
    tracks: dict[str, Track]
    p2p: dict[str, list[P2POp]]
    signatures: dict[str, Signature]
    pg_ids: dict[str, str]
    pg_desc: dict[str, str]
    timed_out: list[tuple[str, int]]
    pending: list[tuple[str, int, int, int, int]]  # (pg, seq, created, timeout_ms, entry index)
    backend: str
    has_frames: bool
    latest_ns: int | None = None  # the latest time stamp of any entry, if already known


def _extract_per_entry(entries: list) -> _Extract:
    """Entry by entry: any layout (missing keys, p2p, several groups); `_extract_columns` is the fast path."""
    tracks: dict[str, Track] = {}
    p2p: dict[str, list[P2POp]] = {}
    signatures: dict[str, Signature] = {}
    pg_ids: dict[str, str] = {}
    pg_desc: dict[str, str] = {}
    timed_out: list[tuple[str, int]] = []
    backend = ""
    has_frames = False
    pending: list[tuple[str, int, int, int, int]] = []  # (pg, seq, created, timeout_ms, entry index)
    key_cache = _key_cache
    last_pg: Any = None
    last_fields: tuple | None = None
    last_key = ""
    track = Track()
    # The hot loop: thousands of files x hundreds of entries. One formatted string per entry finds its
    # comparison key in a cache; everything else is a dict lookup.
    for index, entry in enumerate(entries):
        group = entry.get("process_group") or ("", "")
        pg = group[0]
        if pg != last_pg:
            pg = _interned(str(pg))
            if pg not in pg_desc:
                pg_desc[pg] = str(group[1]) if len(group) > 1 else ""
                pg_ids[pg] = str(entry.get("pg_id", pg))
                tracks[pg] = Track()
            last_pg, track = pg, tracks[pg]
        profiling_name = entry.get("profiling_name", "")
        is_p2p = entry.get("is_p2p")
        if is_p2p or (is_p2p is None and _split_name(str(profiling_name))[1].split(" ", 1)[0] in _P2P_OPS):
            _add_p2p(p2p, pg, index, entry)
            continue
        fields = (
            profiling_name,
            entry.get("input_sizes"),
            entry.get("output_sizes"),
            entry.get("input_dtypes"),
            entry.get("output_dtypes"),
        )
        # Most ops repeat the one before; comparing the small lists is far cheaper than formatting them.
        if fields == last_fields:
            key = last_key
        else:
            raw = f"{fields}"
            key = key_cache.get(raw)
            if key is None:
                key = key_cache[raw] = _new_key(entry, str(profiling_name))
            if key not in signatures:
                signatures[key] = _signature_of[key]
                if not backend:
                    backend = _split_name(str(profiling_name))[0]
            last_fields, last_key = fields, key
        seq = entry.get("collective_seq_id")
        state = entry.get("state", "")
        frames = entry.get("frames")
        site = _user_site(frames) if frames else None
        has_frames = has_frames or bool(frames)
        track.seqs.append(seq if type(seq) is int else _int(seq))
        track.keys.append(key)
        track.states.append(state)
        track.sites.append(site)
        track.indices.append(index)
        if state != "completed":
            if str(state).startswith("timed"):
                timed_out.append((pg, track.seqs[-1]))
            else:
                created, timeout_ms = entry.get("time_created_ns") or 0, _int(entry.get("timeout_ms"), 0)
                pending.append((pg, track.seqs[-1], created, timeout_ms, index))
    return _Extract(tracks, p2p, signatures, pg_ids, pg_desc, timed_out, pending, backend, has_frames)


_STAMP_NAMES = ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns")
# The fields of an entry that a collective's record needs, fetched in one C call per entry.
_COLUMN_NAMES = (
    "process_group",
    "is_p2p",
    "profiling_name",
    "input_sizes",
    "output_sizes",
    "input_dtypes",
    "output_dtypes",
    "collective_seq_id",
    "state",
    "frames",
)
_COLUMNS = itemgetter(*_COLUMN_NAMES)
_COLUMNS_AND_STAMPS = itemgetter(*_COLUMN_NAMES, *_STAMP_NAMES)


def _runs(column: list | tuple) -> list[tuple[int, int]]:
    """The runs of equal consecutive values, as (start, end); a run's values share one key or call site."""
    if not column:
        return []
    starts = [0, *compress(range(1, len(column)), map(ne, column[1:], column))]
    return list(zip(starts, [*starts[1:], len(column)], strict=True))


def _fetch_columns(entries: list) -> tuple[list, list | None] | None:
    """The fields every entry has, column by column (and its time stamps when all entries have them)."""
    try:
        try:
            columns = list(zip(*map(_COLUMNS_AND_STAMPS, entries), strict=True))
            return columns[: len(_COLUMN_NAMES)], columns[len(_COLUMN_NAMES) :]
        except KeyError:  # an older dump without some time stamp: they are read one by one if needed
            return list(zip(*map(_COLUMNS, entries), strict=True)), None
    except (KeyError, TypeError):
        return None


def _groups_of(entries: list, groups: tuple, single: bool) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Each entry's group name, and the groups' descriptions and ids, in order of first sight."""
    pg_names = [str(groups[0][0])] if single else list(map(str, map(itemgetter(0), groups)))
    pg_desc: dict[str, str] = {}
    pg_ids: dict[str, str] = {}
    for raw in dict.fromkeys(pg_names):
        first = 0 if single else pg_names.index(raw)
        group = groups[first]
        pg = _interned(raw)
        pg_desc[pg] = str(group[1]) if len(group) > 1 else ""
        pg_ids[pg] = str(entries[first].get("pg_id", pg))
    return pg_names, pg_desc, pg_ids


def _keys_by_run(entries: list, coll, fields: list) -> tuple[list[str], dict[str, Signature], str]:
    """Comparison keys, one per run of equal (name, sizes, dtypes); the signatures met; the backend."""
    signatures: dict[str, Signature] = {}
    backend = ""
    keys: list[str] = []
    key_cache = _key_cache
    recent: list[tuple[tuple, str]] = []  # a step alternates between a few ops: compared, not formatted
    for a, b in _runs(fields):
        this = fields[a]
        key = next((known_key for known, known_key in recent if known == this), None)
        if key is None:
            raw = f"{this}"
            key = key_cache.get(raw)
            if key is None:
                key = key_cache[raw] = _new_key(entries[coll[a]], str(this[0]))
            recent.insert(0, (this, key))
            del recent[_RECENT_FRAMES:]
        if key not in signatures:
            signatures[key] = _signature_of[key]
            if not backend:
                backend = _split_name(str(fields[a][0]))[0]
        keys += repeat(key, b - a)
    return keys, signatures, backend


def _tracks_of(pg_names: list[str], single: bool, coll, seqs, keys, states, sites) -> dict[str, Track]:
    if single:
        return {_interned(pg_names[0]): Track(seqs, keys, states, sites, list(coll))} if len(coll) else {}
    positions: dict[str, list[int]] = {}
    for p, index in enumerate(coll):
        positions.setdefault(pg_names[index], []).append(p)
    return {
        _interned(raw): Track(
            [seqs[p] for p in pos], [keys[p] for p in pos], [states[p] for p in pos], [sites[p] for p in pos],
            [coll[p] for p in pos],
        )
        for raw, pos in positions.items()
    }  # fmt: skip


def _extract_columns(entries: list, fetched: tuple[list, list | None] | None) -> _Extract | None:
    """The fast path of `_extract_per_entry`, with the same result, column by column.

    Every field is fetched at C speed, and the work per entry (a comparison key, a call site) is done once per
    run of consecutive entries with equal fields: a training step repeats the same ops from the same lines,
    and the dump shares their frame objects. None when the layout needs the per-entry path (a missing key,
    an entry that is not a dict, an entry without a process group).
    """
    n = len(entries)
    if fetched is None:
        return None
    columns, stamps = fetched
    groups, flags, names, in_sizes, out_sizes, in_dtypes, out_dtypes, seq_col, state_col, frame_col = columns
    if not all(groups):
        return None
    single = groups.count(groups[0]) == n
    pg_names, pg_desc, pg_ids = _groups_of(entries, groups, single)
    p2p: dict[str, list[P2POp]] = {}
    coll: list[int] | range = range(n)  # the collective entries
    if any(flags) or None in flags:
        is_p2p = [
            bool(flag) or (flag is None and _split_name(str(name))[1].split(" ", 1)[0] in _P2P_OPS)
            for flag, name in zip(flags, names, strict=True)
        ]
        coll = [i for i in range(n) if not is_p2p[i]]
        for i in compress(range(n), is_p2p):
            _add_p2p(p2p, _interned(pg_names[0 if single else i]), i, entries[i])
        names, in_sizes, out_sizes, in_dtypes, out_dtypes, seq_col, state_col, frame_col = (
            [column[i] for i in coll]
            for column in (names, in_sizes, out_sizes, in_dtypes, out_dtypes, seq_col, state_col, frame_col)
        )
    fields = list(zip(names, in_sizes, out_sizes, in_dtypes, out_dtypes, strict=True))
    keys, signatures, backend = _keys_by_run(entries, coll, fields)
    has_frames = any(frame_col)
    sites = _sites_of(frame_col) if has_frames else [None] * len(coll)
    seqs = list(seq_col)
    if set(map(type, seqs)) != {int}:
        seqs = [seq if type(seq) is int else _int(seq) for seq in seqs]
    states = list(state_col)
    timed_out: list[tuple[str, int]] = []
    pending: list[tuple[str, int, int, int, int]] = []
    for p in compress(range(len(coll)), map(ne, states, repeat("completed"))):
        pg, entry = _interned(pg_names[0 if single else coll[p]]), entries[coll[p]]
        if str(states[p]).startswith("timed"):
            timed_out.append((pg, seqs[p]))
        else:
            created, timeout_ms = entry.get("time_created_ns") or 0, _int(entry.get("timeout_ms"), 0)
            pending.append((pg, seqs[p], created, timeout_ms, coll[p]))
    tracks = {pg: Track() for pg in pg_desc} | _tracks_of(pg_names, single, coll, seqs, keys, states, sites)
    latest_ns = _latest_stamp(stamps) if pending and stamps is not None else None
    return _Extract(tracks, p2p, signatures, pg_ids, pg_desc, timed_out, pending, backend, has_frames, latest_ns)


def _latest_stamp(columns: Iterable[Iterable[Any]]) -> int:
    """The latest integer time stamp in these columns of stamps (0 if none)."""
    latest = 0
    for column in columns:
        stamps = list(filter(None, column))
        try:  # genuine stamps are all ints: one pass
            newest = max(stamps, default=0)
        except TypeError:
            newest = None
        if type(newest) is not int:  # text or floats among them: only the integers count
            newest = max((stamp for stamp in stamps if isinstance(stamp, int)), default=0)
        latest = max(latest, newest)
    return latest


def _parse_p2p(name: str) -> tuple[int, int] | None:
    """'send 0->1' -> (0, 1); 'recv 1<-0' -> (0, 1): (src, dst) as group-local ranks."""
    _, _, peers = name.partition(" ")
    try:
        if "->" in peers:
            src, dst = peers.split("->")
            return int(src), int(dst)
        if "<-" in peers:
            dst, src = peers.split("<-")
            return int(src), int(dst)
    except ValueError:
        return None
    return None


def decode(raw: bytes) -> dict:
    """Bytes of a dump file (un-gzipped) -> its dict (pickle or JSON). Raises ValueError."""
    if not raw:
        raise ValueError("the file is empty (did the rank die while dumping?)")
    if raw.lstrip()[:1] == b"{":
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as err:
            raise ValueError(f"the JSON is malformed or truncated ({err})") from None
    if not _PICKLE_HEAD.match(raw):
        raise ValueError("neither a pickle nor JSON: not a flight-recorder dump")
    try:
        return safe_loads(raw)
    except PickleError as err:
        raise ValueError(str(err)) from None


def load_one(path: str) -> RankDump | DumpProblem:
    """Read one file; every failure becomes a DumpProblem naming the file and the reason."""
    try:
        raw, truncated = read_whole(path, "the dump")
    except OSError as err:
        hint = " (check its permissions)" if isinstance(err, PermissionError) else ""
        return DumpProblem(path, f"cannot be read: {err.strerror or err}{hint}")
    except zlib.error as err:
        return DumpProblem(path, f"a gzip file that cannot be decompressed ({err})")
    except ValueError as err:  # past a limit
        return DumpProblem(path, str(err))
    if truncated:
        return DumpProblem(path, "the gzip file is cut off before its end (truncated while being written or copied?)")
    rank_hint = rank_from_name(path, SourceKind.FLIGHT_RECORDER)
    try:
        if _PICKLE_HEAD.match(raw):
            repeated = _repeated(path, raw, rank_hint)
            if repeated is not None:
                return repeated
            return parse_dump(path, decode(raw), rank_hint, len(raw), raw)
        return parse_dump(path, decode(raw), rank_hint, len(raw))
    except ValueError as err:
        return DumpProblem(path, str(err))
    except (TypeError, AttributeError, KeyError, IndexError) as err:
        return DumpProblem(
            path, f"its content does not have the flight-recorder layout ({type(err).__name__}: {err}); is it a dump?"
        )


@dataclass
class LoadResult:
    dumps: list[RankDump]
    problems: list[DumpProblem]
    ranks_text: dict[str, str]  # digest -> ranks text, from every dump
    # The ranks other sources know the job had (its ranks' identity records, a live capture's world size): a rank
    # whose dump was lost is still a member of the world, where no dump lists the world's ranks (gloo's).
    known_ranks: frozenset[int] = frozenset()

    def ranks_of(self, digest: str | None) -> tuple[int, ...] | None:
        if digest is None or digest not in self.ranks_text:
            return None
        return ranks_in_text(self.ranks_text[digest])

    def require_dumps(self) -> LoadResult:
        """Itself, or InputError naming why each file failed where no dump could be read: an all-clear must
        never come from dumps nobody read."""
        if not self.dumps:
            reasons = "\n  ".join(f"{p.path}: {p.message}" for p in self.problems) or "no input"
            raise InputError(f"no flight-recorder dump could be read:\n  {reasons}")
        return self


# Below this many files a worker pool costs more than it saves.
_POOL_THRESHOLD = 48


def load_dumps(
    paths: list[str], jobs: int | None = None, meanwhile: Callable[[], object] | None = None, isolate: bool = True
) -> LoadResult:
    """Discover (through the source registry) and load every dump under `paths`.

    A file named directly that is not a dump is a problem that says what it is; in folders, other
    files are left to the verbs that read them.
    """
    found: list[str] = []
    inputs = discover(paths, found)
    files = for_reader(inputs, SourceKind.FLIGHT_RECORDER, found)
    if not files:
        found += [f"{p}: holds no flight-recorder dump (pickle or JSON)" for p in paths if os.path.isdir(p)]
        found += not_read_here([i for i in inputs if not i.named], (SourceKind.FLIGHT_RECORDER,))
    result = load_dump_files(files, jobs, meanwhile, isolate)
    result.problems[:0] = [DumpProblem(*_split_problem(p)) for p in found]
    return result


def _split_problem(problem: str) -> tuple[str, str]:
    path, _, message = problem.partition(": ")
    return path, message.rstrip(".")


def load_dump_files(
    files: list[str], jobs: int | None = None, meanwhile: Callable[[], object] | None = None, isolate: bool = True
) -> LoadResult:
    """Load these dump files on `jobs` bounded children (default: every core; sources/isolated.py): a file
    that kills, exhausts or stalls its reader is a problem of its own and the others are still read.

    `meanwhile` (say, importing the analysis) runs in this process while the children load. `isolate=False`
    reads in this process instead: for files this process wrote itself, and for tests of the parsing.
    """
    problems: list[DumpProblem] = []
    jobs = jobs or usable_cores()
    results: list[RankDump | DumpProblem]
    # The records are acyclic; the cyclic collector would only rescan them again and again as they pile up.
    collecting = gc.isenabled()
    gc.disable()
    try:
        # Without fork (Windows), many files still go to a pool; a few are read here.
        pooled = not can_isolate() and jobs > 1 and len(files) >= _POOL_THRESHOLD
        if not isolate:
            if meanwhile is not None:
                meanwhile()
            results = [load_one(f) for f in files]
        else:
            results = (_load_in_pool if pooled else _load_isolated)(files, jobs, meanwhile)
    finally:
        if collecting:
            # The records stay alive for the whole analysis: frozen, the collections it triggers do not walk
            # their millions of objects again and again (a second at 16,384 ranks). Freed as usual when dropped.
            gc.freeze()
            gc.enable()
    dumps: list[RankDump] = []
    ranks_text: dict[str, str] = {}
    for result in results:
        if isinstance(result, DumpProblem):
            problems.append(result)
        else:
            ranks_text.update(result.ranks_text)
            result.ranks_text = {}
            dumps.append(result)
    _share_sites(dumps)
    return LoadResult(_dedupe_ranks(dumps, problems), problems, ranks_text)


def _share_sites(dumps: list[RankDump]) -> None:
    """Make equal call sites one object across dumps. Each loading process shares its own; across them,
    copies: made one, the analysis compares thousands of ranks' sites by identity instead of by value."""
    shared: dict[Frame, Frame] = {}
    for dump in dumps:
        for track in dump.tracks.values():
            sites = track.sites
            distinct = dict(zip(map(id, sites), sites, strict=True))  # a track's sites are a few objects
            if len(distinct) == 1 and None in distinct.values():
                continue
            canonical = {key: site if site is None else shared.setdefault(site, site) for key, site in distinct.items()}
            track.sites = list(map(canonical.__getitem__, map(id, sites)))  # `sites` keeps the ids valid


def _dedupe_ranks(dumps: list[RankDump], problems: list[DumpProblem]) -> list[RankDump]:
    by_rank: dict[int, RankDump] = {}
    for dump in dumps:
        seen = by_rank.get(dump.rank)
        if seen is None:
            by_rank[dump.rank] = dump
        else:
            problems.append(
                DumpProblem(
                    dump.path,
                    f"a second dump of rank {dump.rank} (the first is {seen.path}); only the first is used — "
                    "point at one job's dumps at a time",
                )
            )
    return [by_rank[r] for r in sorted(by_rank)]


def _load_in_pool(
    files: list[str], jobs: int, meanwhile: Callable[[], object] | None = None
) -> list[RankDump | DumpProblem]:
    import multiprocessing

    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    context = multiprocessing.get_context(method)
    chunk = max(1, len(files) // (jobs * 8))
    with context.Pool(jobs, initializer=_worker_init) as pool:
        loading = pool.imap(load_one, files, chunksize=chunk)
        if meanwhile is not None:
            meanwhile()
        return list(loading)


def _load_isolated(
    files: list[str], jobs: int, meanwhile: Callable[[], object] | None = None
) -> list[RankDump | DumpProblem]:
    """Load in bounded children (`isolated.map_isolated`); each child sends the ranks text of a group once."""
    global _sent_ranks
    sent_before, _sent_ranks = _sent_ranks, set()
    try:
        found = map_isolated(load_one, files, jobs, meanwhile, child_init=_worker_init, seconds_for=_seconds_for)
    finally:
        _sent_ranks = sent_before
    return [
        DumpProblem(path, r.message()) if isinstance(r, Stopped) else r for path, r in zip(files, found, strict=True)
    ]


def _seconds_for(path: str) -> float:
    try:
        return seconds_for_size(os.path.getsize(path))
    except OSError:
        return 0.0
