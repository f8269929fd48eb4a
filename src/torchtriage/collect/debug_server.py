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

A careful guest: the store is asked a handful of questions (whether every rank's key is there, and their
values in one request), each rank gets its few requests at once with a bounded timeout, and what comes back
is written as the files `diagnose DIR` reads, so the same engine gives the verdict. A rank that does not
answer is named, never dropped.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from torchtriage.errors import EnvironmentProblem, UsageError
from torchtriage.model import Assessment, Finding
from torchtriage.protocol import DEBUG_SERVER_FILE, FR_SUBDIR
from torchtriage.protocol import DEBUG_SERVER_STORE_PREFIX as STORE_PREFIX
from torchtriage.protocol import DEBUG_SERVER_WORLD_KEY as WORLD_SIZE_KEY
from torchtriage.ranks import format_ranks

# (handler, query, the file it becomes): the readers of `diagnose DIR` keep the richer stack of a rank
STACK_HANDLERS = (
    ("pyspy_dump", "nonblocking=1", "rank{rank:02d}.txt"),
    ("dump_traceback", "", "faulthandler-rank{rank}.txt"),
)
FR_HANDLERS = (("dump_nccl_trace_json", "", "nccl"), ("fr_trace_json", "", "cpu"))
FR_FILE = "debug_server_fr_rank_{rank}.json"
_MAX_BODY = 256 << 20  # a flight-recorder buffer of 20,000 entries is tens of MB
_MAX_THREADS = 256  # requests in flight at once: the workers answer from threads of their own


@dataclass
class Answer:
    rank: int
    handler: str
    status: int | None  # the HTTP status; None when the worker did not answer
    body: bytes = b""
    error: str = ""


@dataclass
class Collected:
    folder: Path
    world_size: int
    answered: list[int] = field(default_factory=list)
    unregistered: list[int] = field(default_factory=list)  # no URL in the store
    not_answering: dict[int, str] = field(default_factory=dict)  # rank -> why
    problems: list[str] = field(default_factory=list)


def parse_address(text: str) -> tuple[str, int]:
    """'HOST:PORT' (MASTER_ADDR:MASTER_PORT; [v6]:PORT) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--store {text}: give the job's store as HOST:PORT (its MASTER_ADDR:MASTER_PORT)")
    return host, int(port)


def _open_store(host: str, port: int, timeout_s: float):
    try:
        from datetime import timedelta

        from torch.distributed import TCPStore
    except ImportError:
        raise EnvironmentProblem(
            "reading the job's store needs torch (the TCPStore client): run this where the job's Python is, "
            "or install torch"
        ) from None
    try:
        return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
    except (RuntimeError, ValueError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise EnvironmentProblem(
            f"cannot reach the job's store at {host}:{port} ({first}); give its MASTER_ADDR:MASTER_PORT "
            f"(`torchtriage run --debug-server` writes it to DIR/{DEBUG_SERVER_FILE})"
        ) from None


def _present(store, keys: list[str]) -> list[bool]:
    """Which keys the store holds, in few requests: all at once, and halves of a set that is not whole."""
    if not keys:
        return []
    if store.check(keys):
        return [True] * len(keys)
    if len(keys) == 1:
        return [False]
    half = len(keys) // 2
    return _present(store, keys[:half]) + _present(store, keys[half:])


def _registered_world(store) -> tuple[int, bool]:
    """The world size: as `run --debug-server` wrote it, else one past the last rank registered (galloping,
    then halving). The second value says whether it was inferred."""
    if store.check([WORLD_SIZE_KEY]):
        text = store.get(WORLD_SIZE_KEY).decode(errors="replace")
        if text.isdigit() and int(text) > 0:
            return int(text), False
    if not store.check([f"{STORE_PREFIX}rank0"]):
        return 0, True
    low, high = 0, 1  # low is registered; find a high that is not
    while store.check([f"{STORE_PREFIX}rank{high}"]):
        low, high = high, high * 2
        if high > 1 << 24:
            break
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if store.check([f"{STORE_PREFIX}rank{middle}"]) else (low, middle)
    return low + 1, True


def worker_urls(store, world_size: int) -> dict[int, str | None]:
    keys = [f"{STORE_PREFIX}rank{r}" for r in range(world_size)]
    present = _present(store, keys)
    found = [k for k, here in zip(keys, present, strict=True) if here]
    values = iter(store.multi_get(found) if found else [])
    return {r: next(values).decode(errors="replace") if here else None for r, here in enumerate(present)}


def _post(rank: int, url: str, handler: str, query: str, timeout_s: float) -> Answer:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return Answer(rank, handler, None, error=f"its registered URL is not http: {url[:80]!r}")
    path = f"/handler/{handler}" + (f"?{query}" if query else "")
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout_s)
    try:
        connection.request("POST", path)
        response = connection.getresponse()
        body = response.read(_MAX_BODY + 1)
        if len(body) > _MAX_BODY:
            return Answer(rank, handler, None, error=f"{handler} answered more than {_MAX_BODY >> 20} MB")
        return Answer(rank, handler, response.status, body)
    except TimeoutError:
        return Answer(rank, handler, None, error=f"no answer within {timeout_s:g} s (its process may be wedged)")
    except (OSError, http.client.HTTPException) as err:
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
        return Answer(rank, handler, None, error=f"{reason} (its host may be down or its process gone)")
    finally:
        connection.close()


def fetch(urls: dict[int, str], timeout_s: float) -> list[Answer]:
    """Every handler of every rank, at once; each request bounded by `timeout_s`."""
    requests = [
        (rank, url, handler, query)
        for rank, url in urls.items()
        for handler, query, _ in (*STACK_HANDLERS, *FR_HANDLERS)
    ]
    if not requests:
        return []
    with ThreadPoolExecutor(min(_MAX_THREADS, len(requests))) as pool:
        return list(pool.map(lambda r: _post(*r, timeout_s), requests))


def _fr_dump(body: bytes) -> dict | None:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def write_answers(folder: Path, answers: list[Answer]) -> tuple[list[int], dict[int, str]]:
    """The answers as the files `diagnose DIR` reads; the ranks that answered, and why the others did not."""
    (folder / FR_SUBDIR).mkdir(parents=True, exist_ok=True)
    names = {handler: name for handler, _, name in STACK_HANDLERS}
    answered: set[int] = set()
    why: dict[int, str] = {}
    fr: dict[int, dict[str, dict]] = {}
    for answer in answers:
        if answer.status is None:
            why.setdefault(answer.rank, answer.error)
            continue
        answered.add(answer.rank)
        if answer.status != 200:
            continue  # a handler this build lacks (NCCL's on CPU), or py-spy missing on the rank's PATH
        if answer.handler in names:
            (folder / names[answer.handler].format(rank=answer.rank)).write_bytes(answer.body)
        else:
            dump = _fr_dump(answer.body)
            if dump is not None:
                fr.setdefault(answer.rank, {})[answer.handler] = dump
    for rank, dumps in fr.items():
        # NCCL's buffer when it holds entries (a CUDA job), else the CPU backends' (gloo)
        chosen = next((d for h, _, _ in FR_HANDLERS if (d := dumps.get(h)) and d.get("entries")), None)
        chosen = chosen or next(iter(dumps.values()))
        (folder / FR_SUBDIR / FR_FILE.format(rank=rank)).write_text(json.dumps(chosen))
    return sorted(answered), {rank: reason for rank, reason in why.items() if rank not in answered}


def collect(address: str, folder: Path, world_size: int | None = None, timeout_s: float = 5.0) -> Collected:
    """Read the workers' URLs from the job's store at `address` and fetch every rank's state into `folder`."""
    host, port = parse_address(address)
    store = _open_store(host, port, timeout_s)
    inferred = False
    if world_size is None:
        world_size, inferred = _registered_world(store)
    if world_size == 0:
        raise EnvironmentProblem(
            f"no debug server registered in the store at {host}:{port} (no key {STORE_PREFIX}rank0): start the job "
            "with `torchtriage run --debug-server`, or call torch.distributed.debug.start_debug_server() in every "
            "rank after init_process_group"
        )
    urls = worker_urls(store, world_size)
    del store  # the store's client is closed: diagnosis holds no connection to it while it fetches
    folder.mkdir(parents=True, exist_ok=True)
    registered = {rank: url for rank, url in urls.items() if url is not None}
    answered, not_answering = write_answers(folder, fetch(registered, timeout_s))
    result = Collected(folder, world_size, answered, sorted(r for r, u in urls.items() if u is None), not_answering)
    if inferred:
        result.problems.append(
            f"the world size ({world_size}) was inferred from the ranks registered in the store; give --world-size "
            "if the last ranks never registered"
        )
    if result.unregistered:
        result.problems.append(
            f"{format_ranks(result.unregistered)} registered no debug server in the store (it never started there: "
            "the rank may have died or hung before, or runs without it)"
        )
    for rank, reason in sorted(not_answering.items()):
        result.problems.append(f"rank {rank} did not answer at {urls[rank]}: {reason}")
    return result


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
