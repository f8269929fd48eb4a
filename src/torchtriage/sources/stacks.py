"""Every rank's stack from the files a job left: py-spy dumps (text or --json) and faulthandler dumps,
one file per rank, the rank from its name (`rank03.txt`, `faulthandler-rank3.txt`)."""

from __future__ import annotations

import os
import re

from torchtriage.errors import InputError
from torchtriage.model import SourceKind
from torchtriage.sources.debug_server_dumps import parse_debug_server_stacks
from torchtriage.sources.faulthandler import parse_faulthandler
from torchtriage.sources.pyspy import ProcessStack, read_rank_dump
from torchtriage.sources.registry import Input, discover, rank_from_name
from torchtriage.sources.streams import read_text

STACK_KINDS = (SourceKind.PYSPY, SourceKind.FAULTHANDLER, SourceKind.DEBUG_SERVER_STACKS)


def _preference(process: ProcessStack) -> tuple[bool, bool, bool, bool]:
    # py-spy knows each thread's state; native frames tell a lock from a sleep; full paths tell library
    # code from user code; locals tell which group a collective was given.
    known = any(t.state_known for t in process.threads)
    has_locals = any(f.locals for t in process.threads for f in t.frames)
    return known, process.has_native_frames, process.has_full_paths, has_locals


def _read_faulthandler(path: str) -> tuple[int, ProcessStack]:
    rank = rank_from_name(path)
    if rank is None:
        raise InputError(f"{path}: cannot tell which rank this dump is; name it faulthandler-rank<N>.txt")
    return rank, parse_faulthandler(read_text(path, "the dump"), path)


def load_rank_stacks(paths: list[str | os.PathLike], problems: list[str] | None = None) -> dict[int, ProcessStack]:
    """Rank -> its stack, from files and folders of stack dumps.

    When one rank has several dumps (text and JSON, plain and --native, py-spy and faulthandler), the
    richest is kept. With `problems`, a dump that cannot be read is listed there and the others are
    still used; without it, it raises.
    """
    seen: list[str] = []
    inputs = [i for i in discover([str(p) for p in paths], seen) if i.kind in STACK_KINDS]
    if not inputs:
        raise InputError(
            f"no py-spy dumps (rank<N>.txt or rank<N>.json) or faulthandler dumps in {', '.join(map(str, paths))}"
        )
    return load_stack_inputs(inputs, problems)


_MOMENT = re.compile(r"_\d{8}_\d{6}(?=\.txt$)")


def _newest_periodic(inputs: list[Input]) -> list[Input]:
    """Of a debug server's periodic dumps, only the newest of each handler in each folder: an older one is the
    job's past (a rank missing from the newest did not answer then; its stack of an hour ago says nothing)."""
    newest: dict[tuple[str, str], Input] = {}
    kept = []
    for item in inputs:
        if item.kind != SourceKind.DEBUG_SERVER_STACKS:
            kept.append(item)
            continue
        folder, name = os.path.split(item.path)
        key = (folder, _MOMENT.sub("", name))
        if key not in newest or os.path.basename(newest[key].path) < name:
            newest[key] = item
    return kept + list(newest.values())


def _read(item: Input, problems: list[str] | None) -> dict[int, ProcessStack]:
    if item.kind == SourceKind.DEBUG_SERVER_STACKS:
        stacks, missing = parse_debug_server_stacks(read_text(item.path, "the dump"), item.path)
        if problems is not None:
            problems.extend(missing)
        return stacks
    reader = _read_faulthandler if item.kind == SourceKind.FAULTHANDLER else read_rank_dump
    rank, process = reader(item.path)
    return {rank: process}


def load_stack_inputs(inputs: list[Input], problems: list[str] | None = None) -> dict[int, ProcessStack]:
    """`load_rank_stacks` of stack dumps already discovered (a folder of 16k ranks is not sniffed twice)."""
    chosen: dict[int, ProcessStack] = {}
    # A debug server's periodic dumps hold every rank, one file per moment: only the newest is read.
    ordered = sorted(_newest_periodic(inputs), key=lambda i: (i.kind == SourceKind.DEBUG_SERVER_STACKS, i.path))
    for item in ordered:
        try:
            found = _read(item, problems)
        except InputError as err:
            if problems is None:
                raise
            problems.append(str(err))
            continue
        for rank, process in found.items():
            if rank not in chosen or _preference(process) > _preference(chosen[rank]):
                chosen[rank] = process
    if not chosen:
        raise InputError("no stack dump could be read:\n  " + "\n  ".join(problems or []))
    return dict(sorted(chosen.items()))
