"""PyTorch's debug server as a collector: every rank's stack and flight recorder over HTTP, found through
the job's store, so one command reaches the ranks of every node.

torch >= 2.10 (`torch.distributed.debug.start_debug_server`, or `torchtriage run --debug-server`) runs a
worker HTTP server in every rank and registers its URL in the job's TCPStore (MASTER_ADDR:MASTER_PORT)
under `debug_server/rank<N>` (torch/distributed/debug/__init__.py and _store.py). The worker serves each
handler from a C++ thread of its own: one POST to `<url>/handler/<name>?<query>` per request
(torch/distributed/debug/_frontend.py, fetch_all). The handlers read here:

    pyspy_dump?nonblocking=1   py-spy's text dump of the rank, without pausing it (py-spy on its PATH)
    dump_traceback             faulthandler's dump of every thread (it takes the rank's GIL)
    fr_trace_json              the flight recorder of gloo and the other CPU backends, as JSON
    dump_nccl_trace_json       NCCL's flight recorder (CUDA builds; a 404 elsewhere)

A careful guest, and a wary one: the store and the ranks are other machines' processes, wedged, broken or
crafted. The store is read in a bounded child (`sources/isolated.py`): a plain connection first (TCPStore's
client retries a closed port until its timeout, printing C++ errors), then a handful of questions (whether
every rank's key is there, and their values in one request), all within `--timeout`; a world larger than
the policy's largest rank is refused. Then every rank is asked at once (`bounded_http.py`): one deadline,
`--timeout`, for every answer however its bytes trickle in, and one budget of bytes shared by every answer
(the policy's `answers`, each answer at most `bytes`), each streamed into its file. What comes back is the
files `diagnose DIR` reads, so the same engine gives the verdict. A rank that does not answer is named,
never dropped; an answer cut is said, with the limit that cut it.
"""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from torchtriage.collect.bounded_http import Outcome, Request, SharedBytes, fetch_all
from torchtriage.errors import EnvironmentProblem, InputError, TriageError, UsageError
from torchtriage.model import Assessment, Finding
from torchtriage.protocol import DEBUG_SERVER_FILE, FR_SUBDIR, make_private_folders
from torchtriage.protocol import DEBUG_SERVER_STORE_PREFIX as STORE_PREFIX
from torchtriage.protocol import DEBUG_SERVER_WORLD_KEY as WORLD_SIZE_KEY
from torchtriage.ranks import format_ranks
from torchtriage.sources import limits
from torchtriage.sources.isolated import Stopped
from torchtriage.sources.limits import LimitExceeded
from torchtriage.sources.registrations import write_registrations

# (handler, query, the file it becomes): the readers of `diagnose DIR` keep the richer stack of a rank
STACK_HANDLERS = (
    ("pyspy_dump", "nonblocking=1", "rank{rank:02d}.txt"),
    ("dump_traceback", "", "faulthandler-rank{rank}.txt"),
)
FR_HANDLERS = (("dump_nccl_trace_json", "", "nccl"), ("fr_trace_json", "", "cpu"))
_STACK_FILES = {handler: name for handler, _, name in STACK_HANDLERS}
# py-spy's stack first (it shows a rank held in C), faulthandler's last (it waits for the rank's GIL)
_ASKING_ORDER = (STACK_HANDLERS[0], *FR_HANDLERS, STACK_HANDLERS[1])
_NO_NCCL = ("dump_nccl_trace_json", 404)  # what a build without CUDA answers: nothing to say
FR_FILE = "debug_server_fr_rank_{rank}.json"
# Where a flight-recorder answer lands until one per rank is chosen: a dot name, which no reader takes.
_FR_ANSWER = ".{handler}-rank{rank}.json"
_MAX_URL = 2048  # a registered URL is "http://<host>:<port>"
# Keys per question to the store: the job's own store answers one request at a time, and its time per key grows
# with the request (65,536 keys at once: 2 s to check, 4 s to get; in requests of 1,024: 0.03 s and 0.09 s).
_KEYS_PER_REQUEST = 1024
_STORE_GRACE_S = 1.0  # beyond --timeout, for the store's reader to start and say why it stopped
# Whether a flight-recorder answer records any entry (NCCL's and the CPU backends' both answer on a CUDA build).
_HOLDS_ENTRIES = re.compile(rb'"entries"\s*:\s*\[\s*[^\]\s]')


@dataclass
class Collected:
    folder: Path
    world_size: int
    answered: list[int] = field(default_factory=list)
    unregistered: list[int] = field(default_factory=list)  # no URL in the store
    not_answering: dict[int, str] = field(default_factory=dict)  # rank -> why
    problems: list[str] = field(default_factory=list)
    kept: int = 0  # answers written as files `diagnose DIR` reads


def parse_address(text: str) -> tuple[str, int]:
    """'HOST:PORT' (MASTER_ADDR:MASTER_PORT; [v6]:PORT) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not (port.isascii() and port.isdigit() and len(port) < 6) or not 0 < int(port) < 65536:
        raise UsageError(f"--store {text}: give the job's store as HOST:PORT (its MASTER_ADDR:MASTER_PORT)")
    return host, int(port)


# --- the store, read in a bounded child ------------------------------------------------------------------


@dataclass
class StoreView:
    world_size: int
    inferred: bool  # the world size is one past the last rank registered
    urls: list[str | None]  # by rank; None where no URL is registered


class _StoreTrouble(NamedTuple):
    """Why the store could not be read: `unreachable` (the environment) or what it holds is wrong (the input)."""

    message: str
    unreachable: bool


class _Refused(Exception):
    def __init__(self, trouble: _StoreTrouble) -> None:
        self.trouble = trouble


def read_store(host: str, port: int, world_size: int | None, timeout_s: float) -> StoreView:
    """Every rank's registered URL, read within `timeout_s` by a child that this process kills at the deadline
    (TCPStore's client waits forever on a server that accepts and never answers) and whose C++ errors go
    nowhere. Raises the error the user reads."""
    try:
        import torch.distributed  # noqa: F401 - here, so that the child's deadline is the store's, not the import's
    except ImportError:
        raise EnvironmentProblem(
            "reading the job's store needs torch (the TCPStore client): run this where the job's Python is, "
            "or install torch"
        ) from None
    from torchtriage.sources.isolated import call_isolated

    largest = limits.active().rank + 1
    if world_size is not None and world_size > largest:
        raise UsageError(f"--world-size {world_size} is more than {largest:,} ranks: {_raise_rank_hint(world_size)}")
    # call_isolated allows the policy's seconds plus `extra_seconds`: the store gets the --timeout and the grace.
    extra = timeout_s + _STORE_GRACE_S - limits.active().seconds
    reached = [_NOT_CONNECTED]  # how far the child got, for the message if its deadline stops it

    def read(tick) -> StoreView | _StoreTrouble:
        return _store_view(host, port, world_size, timeout_s, largest, tick)

    found = call_isolated(read, progress=reached.append, extra_seconds=extra)
    where = f"the job's store at {host}:{port}"
    if isinstance(found, StoreView):
        return found
    if isinstance(found, _StoreTrouble) and found.unreachable:
        raise EnvironmentProblem(
            f"cannot reach {where} ({found.message}); give its MASTER_ADDR:MASTER_PORT "
            f"(`torchtriage run --debug-server` writes it to DIR/{DEBUG_SERVER_FILE})"
        )
    if isinstance(found, _StoreTrouble):
        raise InputError(f"{where}: {found.message}")
    raise _stopped_reading(where, found, timeout_s, reached[-1])


# How far the store's reader got: the message for a deadline says where it waited.
_NOT_CONNECTED, _CONNECTED, _A_STORE = 0, 1, 2


def _stopped_reading(where: str, found: Stopped, timeout_s: float, reached: int) -> TriageError:
    """The error to raise for a reader of the store that its deadline or its memory stopped."""
    if found.limit_name == "seconds" and reached == _NOT_CONNECTED:
        return EnvironmentProblem(
            f"no connection to {where} within {timeout_s:g} s: is the host up, and does its name resolve here?"
        )
    if found.limit_name == "seconds" and reached == _CONNECTED:
        return EnvironmentProblem(
            f"{where} took the connection but did not answer within {timeout_s:g} s: is it the job's "
            "MASTER_ADDR:MASTER_PORT (a TCPStore), and is the job's agent alive? (a longer --timeout waits more)"
        )
    if found.limit_name == "seconds":
        return EnvironmentProblem(
            f"{where} did not say which ranks registered a debug server within {timeout_s:g} s: a longer "
            "--timeout waits more, and --world-size N asks about fewer ranks"
        )
    hint = f"; if the store is genuine, raise the limit: --limit {found.limit_name}=..." if found.limit_name else ""
    return InputError(f"{where}: reading it stopped ({found.reason}){hint}")


def _raise_rank_hint(world_size: int) -> str:
    return f"if the job is that large, raise the largest rank read with --limit rank={world_size - 1}"


def _store_view(host: str, port: int, world_size: int | None, timeout_s: float, largest: int, tick):
    """In the child: the StoreView, or the _StoreTrouble that stopped it; `tick` says how far it got."""
    deadline = time.monotonic() + timeout_s
    try:
        # A plain connection first: TCPStore's client retries a refused one until its timeout.
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as err:
        return _StoreTrouble(_reason(err), unreachable=True)
    tick(_CONNECTED)
    from datetime import timedelta

    from torch.distributed import TCPStore

    try:
        left = timedelta(seconds=max(0.001, deadline - time.monotonic()))
        store = TCPStore(host, port, is_master=False, timeout=left, wait_for_workers=False)
        tick(_A_STORE)
        inferred = False
        if world_size is None:
            world_size, inferred = _registered_world(store, largest)
        return StoreView(world_size, inferred, worker_urls(store, world_size) if world_size else [])
    except _Refused as refused:
        return refused.trouble
    except (RuntimeError, ValueError, OSError) as err:  # torch's DistError family is RuntimeError
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return _StoreTrouble(first[:300], unreachable=True)


def _present(store, keys: list[str]) -> list[bool]:
    """Which keys the store holds, in few requests: a chunk at once, and halves of a chunk that is not whole."""
    return [
        here
        for at in range(0, len(keys), _KEYS_PER_REQUEST)
        for here in _halving(store, keys[at : at + _KEYS_PER_REQUEST])
    ]


def _halving(store, keys: list[str]) -> list[bool]:
    if not keys:
        return []
    if store.check(keys):
        return [True] * len(keys)
    if len(keys) == 1:
        return [False]
    half = len(keys) // 2
    return _halving(store, keys[:half]) + _halving(store, keys[half:])


def _registered_world(store, largest: int) -> tuple[int, bool]:
    """The world size: as `run --debug-server` wrote it, else one past the last rank registered (galloping,
    then halving), at most `largest`. The second value says whether it was inferred."""
    claimed = _claimed_world(store)
    if claimed is not None and claimed > largest:
        message = (
            f"it says the job has {claimed:,} ranks (its key {WORLD_SIZE_KEY}), more than the {largest:,} this "
            f"reads: give the job's real --world-size N, or {_raise_rank_hint(claimed)}"
        )
        raise _Refused(_StoreTrouble(message, unreachable=False))
    if claimed:
        return claimed, False
    if not store.check([f"{STORE_PREFIX}rank0"]):
        return 0, True
    low, high = 0, 1  # low is registered; find a high that is not (or the largest world, past which none is)
    while high < largest and store.check([f"{STORE_PREFIX}rank{high}"]):
        low, high = high, min(high * 2, largest)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if store.check([f"{STORE_PREFIX}rank{middle}"]) else (low, middle)
    return low + 1, True


def _claimed_world(store) -> int | None:
    """The world size `run --debug-server` wrote in the store, when it is a number."""
    if not store.check([WORLD_SIZE_KEY]):
        return None
    text = store.get(WORLD_SIZE_KEY)[:32].decode(errors="replace")
    return int(text) if text.isascii() and text.isdigit() else None


def worker_urls(store, world_size: int) -> list[str | None]:
    keys = [f"{STORE_PREFIX}rank{r}" for r in range(world_size)]
    present = _present(store, keys)
    found = [k for k, here in zip(keys, present, strict=True) if here]
    chunks = (store.multi_get(found[at : at + _KEYS_PER_REQUEST]) for at in range(0, len(found), _KEYS_PER_REQUEST))
    values = (value for chunk in chunks for value in chunk)
    return [_url_text(next(values)) if here else None for here in present]


def _url_text(value: bytes) -> str:
    if len(value) > _MAX_URL:
        return f"<a value of {len(value):,} bytes>"  # not a URL: said as such, never carried whole
    return value.decode(errors="replace")


# --- every rank, at once ---------------------------------------------------------------------------------


def _endpoint(url: str) -> tuple[str, int] | str:
    """(host, port) of a registered URL, or why it is not one this reads."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme != "http" or not parts.hostname:
        return f"its registered URL is not http://HOST:PORT: {url[:80]!r}"
    return parts.hostname, port or 80


def _requests(folder: Path, urls: dict[int, str]) -> tuple[list[tuple[int, str]], list[Request], dict[int, str]]:
    """What to ask, as (rank, handler), and how; and the ranks whose URL cannot be asked, with why. Every rank's
    first handler comes before any rank's second (where not all can be open at once)."""
    endpoints = {rank: _endpoint(url) for rank, url in urls.items()}
    malformed = {rank: why for rank, why in endpoints.items() if isinstance(why, str)}
    asked, requests = [], []
    for handler, query, _ in _ASKING_ORDER:
        path = f"/handler/{handler}" + (f"?{query}" if query else "")
        for rank, endpoint in endpoints.items():
            if rank in malformed:
                continue
            if handler in _STACK_FILES:
                target = folder / _STACK_FILES[handler].format(rank=rank)
            else:
                target = folder / FR_SUBDIR / _FR_ANSWER.format(handler=handler, rank=rank)
            asked.append((rank, handler))
            requests.append(Request(*endpoint, path, str(target)))
    return asked, requests, malformed


def _holds_entries(path: Path) -> bool:
    """Whether a flight-recorder answer records any entry, read in pieces (it may be hundreds of MB)."""
    tail = b""
    with open(path, "rb") as file:
        while piece := file.read(1 << 20):
            if _HOLDS_ENTRIES.search(tail + piece):
                return True
            tail = piece[-64:]
    return False


def _choose_flight_recorders(folder: Path, kept: dict[int, list[str]]) -> None:
    """One flight recorder per rank: NCCL's where it records entries (a CUDA job), else the CPU backends'
    (gloo); the other answer is removed."""
    for rank, handlers in kept.items():
        paths = {h: folder / FR_SUBDIR / _FR_ANSWER.format(handler=h, rank=rank) for h in handlers}
        nccl, cpu = (paths.get(h) for h, _, _ in FR_HANDLERS)
        chosen = nccl if nccl is not None and (cpu is None or _holds_entries(nccl)) else cpu
        chosen.rename(folder / FR_SUBDIR / FR_FILE.format(rank=rank))
        for path in paths.values():
            if path != chosen:
                path.unlink(missing_ok=True)


def file_answers(
    folder: Path, asked: list[tuple[int, str]], outcomes: list[Outcome], budget: SharedBytes
) -> tuple[list[int], dict[int, str], list[str], int]:
    """The answers as `diagnose DIR` reads them; the ranks that answered, why the others did not, what was cut
    (one line per handler and limit), and how many files were kept."""
    answered: set[int] = set()
    why: dict[int, str] = {}
    cut: dict[tuple[str, str], list[int]] = {}
    refused: dict[tuple[str, int], list[int]] = {}
    flight_recorders: dict[int, list[str]] = {}
    kept = 0
    for (rank, handler), outcome in zip(asked, outcomes, strict=True):
        if outcome.answered:
            answered.add(rank)
        else:
            why.setdefault(rank, outcome.error)
        if outcome.cut is not None:
            cut.setdefault((handler, outcome.cut), []).append(rank)
        elif outcome.answered and outcome.status != 200 and (handler, outcome.status) != _NO_NCCL:
            refused.setdefault((handler, outcome.status), []).append(rank)
        if outcome.kept and handler in _STACK_FILES:
            kept += 1
        elif outcome.kept:
            flight_recorders.setdefault(rank, []).append(handler)
    _choose_flight_recorders(folder, flight_recorders)
    kept += len(flight_recorders)
    problems = _cut_and_refused(cut, refused, budget)
    return sorted(answered), {r: reason for r, reason in why.items() if r not in answered}, problems, kept


def _cut_and_refused(
    cut: dict[tuple[str, str], list[int]], refused: dict[tuple[str, int], list[int]], budget: SharedBytes
) -> list[str]:
    """One line per handler and limit that cut its answers (with the flag that raises it), and per handler and
    HTTP status that was not an answer."""
    lines = [
        str(LimitExceeded(f"the {handler} answer of {format_ranks(ranks)} was {budget.why_cut(limit)}", limit))
        for (handler, limit), ranks in sorted(cut.items())
    ]
    return lines + [
        f"{format_ranks(ranks)} answered {handler} with HTTP {status}"
        + (" (is py-spy on the ranks' PATH?)" if handler == "pyspy_dump" else "")
        for (handler, status), ranks in sorted(refused.items())
    ]


def collect(address: str, folder: Path, world_size: int | None = None, timeout_s: float = 5.0) -> Collected:
    """Read the workers' URLs from the job's store at `address` and fetch every rank's state into `folder`:
    the store within `timeout_s`, then every rank within `timeout_s`."""
    host, port = parse_address(address)
    view = read_store(host, port, world_size, timeout_s)
    if view.world_size == 0:
        raise EnvironmentProblem(
            f"no debug server registered in the store at {host}:{port} (no key {STORE_PREFIX}rank0): start the job "
            "with `torchtriage run --debug-server`, or call torch.distributed.debug.start_debug_server() in every "
            "rank after init_process_group"
        )
    make_private_folders(folder / FR_SUBDIR)
    registered = {rank: url for rank, url in enumerate(view.urls) if url is not None}
    asked, requests, malformed = _requests(folder, registered)
    policy = limits.active()
    budget = SharedBytes(policy.answers, len(requests), policy.bytes)
    answered, not_answering, cut, kept = file_answers(folder, asked, fetch_all(requests, timeout_s, budget), budget)
    if kept:  # where each rank runs, as it registered itself: beside what the ranks said, never alone
        write_registrations(folder, f"{host}:{port}", registered)
    not_answering |= malformed
    unregistered = [rank for rank, url in enumerate(view.urls) if url is None]
    result = Collected(folder, view.world_size, answered, unregistered, not_answering, cut, kept)
    if view.inferred:
        result.problems.append(
            f"the world size ({view.world_size}) was inferred from the ranks registered in the store; give "
            "--world-size if the last ranks never registered"
        )
    if result.unregistered:
        result.problems.append(
            f"{format_ranks(result.unregistered)} registered no debug server in the store (it never started there: "
            "the rank may have died or hung before, or runs without it)"
        )
    for rank, reason in sorted(not_answering.items()):
        result.problems.append(f"rank {rank} did not answer at {registered[rank][:80]}: {reason}")
    return result


def _reason(err: BaseException) -> str:
    return getattr(err, "strerror", None) or str(err) or type(err).__name__


def assess_answers(collected: Collected) -> Assessment | None:
    """The ranks that registered but did not answer, as evidence: the likely culprits when the others wait
    (with low confidence: what they do is not seen)."""
    if not collected.not_answering:
        return None
    ranks = sorted(collected.not_answering)
    first = ranks[0]
    message = (
        f"{format_ranks(ranks)} did not answer ({collected.not_answering[first]}"
        + (f"; and {len(ranks) - 1} more" if len(ranks) > 1 else "")
        + f"), {len(collected.answered)} of {collected.world_size} ranks did"
    )
    finding = Finding("debug_server.not_answering", ranks, message, "symptom", "hang", blames=True)
    return Assessment(
        source="debug_server",
        findings=[finding],
        summary=message,
        category="hang",
        culprits=ranks,
        confidence="low",
        facts={"not_answering": format_ranks(ranks)},
        lead=finding,
        blaming=finding,
    )
