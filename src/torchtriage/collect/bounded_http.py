"""Many HTTP requests at once, under one deadline and one byte budget, each answer streamed into a file.

`diagnose --store` asks every rank's debug server for a few answers at once. Those servers are processes of
other machines: a wedged one never answers, and a broken or hostile one may answer without end, gigabytes at
a time or one byte every few seconds. Socket timeouts bound the wait for each byte, not an answer; reading
an answer whole bounds nothing when every rank sends one. So one thread drives every request through
non-blocking sockets (a selector), and:

- **one deadline** ends every request at once: an answer still arriving then is given up, however its bytes
  trickle in (the headers too);
- **one budget** of bytes is shared by every answer: each is sure of an equal share and may borrow what the
  others leave, up to a bound of its own; an answer past it is cut and thrown away (what it read stays
  spent: the budget bounds what is read), and a length announced past it is refused before a byte is read;
- **bodies go straight to their files** in pieces of 64 KiB, so this process holds a piece and the headers
  of each request in flight (at most 8 KiB), never an answer.

Host names are resolved by a few daemon threads (`getaddrinfo` cannot be interrupted: one that hangs is
left behind, and the deadline holds for the requests to its host).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import queue
import re
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from torchtriage.protocol import open_private
from torchtriage.sources.limits import describe_size

__all__ = ["Request", "Outcome", "SharedBytes", "fetch_all"]

_PIECE = 1 << 16  # bytes read from a socket at a time, and written to the answer's file
_MAX_HEAD = 8 << 10  # a status line and its headers: PyTorch's worker sends about a hundred bytes
_MAX_CHUNK_LINE = 1 << 10  # a chunk's size line (chunked transfer encoding)
_MAX_IN_FLIGHT = 8192  # connections open at once; each holds a socket and a file
_RESOLVERS = 16
_STATUS = re.compile(rb"HTTP/1\.[01] ([1-5]\d\d)(?: |\r?$)")
_CONNECTING = (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN)


class Request(NamedTuple):  # a tuple: a fetch of a million ranks holds four million of them
    host: str
    port: int
    path: str  # with its query: "/handler/pyspy_dump?nonblocking=1"
    target: str  # the new file the body of a 200 answer goes to


@dataclass(slots=True)
class Outcome:
    status: int | None = None  # the HTTP status, once the headers came
    size: int = 0  # bytes of body received
    error: str = ""  # why the answer is missing, incomplete or cut; "" when it came whole
    cut: str | None = None  # the limit an answer too large passed ("bytes", "answers"); what came is thrown away

    @property
    def answered(self) -> bool:
        """The server answered in full, or more than it may: it is not wedged."""
        return self.status is not None and (not self.error or self.cut is not None)

    @property
    def kept(self) -> bool:
        """Its body is in its target file."""
        return self.status == 200 and not self.error


class SharedBytes:
    """`total` bytes for `answers` answers: each is sure of an equal share and may borrow what the others leave,
    up to `per_answer`. One server that answers without end takes its share and what is free, never the
    shares of the others."""

    def __init__(self, total: int, answers: int, per_answer: int) -> None:
        self.total, self.per_answer = total, per_answer
        self.share = min(per_answer, total // max(1, answers))
        self.pool = total - self.share * answers  # what no answer is sure of: lent first come, first served

    def take(self, held: int, more: int) -> str | None:
        """Let an answer that holds `held` bytes take `more`; else the limit it would pass."""
        if held + more > self.per_answer:
            return "bytes"
        borrowed = more - max(0, min(more, self.share - held))
        if borrowed > self.pool:
            return "answers"
        self.pool -= borrowed
        return None

    def settle(self, held: int) -> None:
        """An answer ended: what it did not use of its share is free for the others. What it took stays spent,
        kept or thrown away: the budget bounds what is read, not only what is kept."""
        self.pool += max(0, self.share - held)

    def why_cut(self, limit_name: str) -> str:
        if limit_name == "bytes":
            return f"larger than {describe_size(self.per_answer)}, what one answer may hold"
        return f"larger than its share of the {describe_size(self.total)} all the answers may hold together"


def fetch_all(requests: Sequence[Request], seconds: float, budget: SharedBytes) -> list[Outcome]:
    """POST every request at once (as many as this process may hold open); every one has ended `seconds` from
    now. One outcome per request, in order; the target of each answer that came whole holds its body."""
    outcomes = [Outcome() for _ in requests]
    if requests:
        _Fetch(requests, outcomes, budget).run(seconds)
    return outcomes


class _Fetch:
    """The requests of one fetch_all: waiting for their host's address, ready, or open (an `_Exchange`)."""

    def __init__(self, requests: Sequence[Request], outcomes: list[Outcome], budget: SharedBytes) -> None:
        self.requests, self.outcomes, self.budget = requests, outcomes, budget
        self.slots = _slots(len(requests))
        self.unresolved: dict[str, list[int]] = {}
        for index, request in enumerate(requests):
            self.unresolved.setdefault(request.host, []).append(index)
        self.ready: deque[int] = deque()
        self.active: dict[int, _Exchange] = {}
        self.selector = selectors.DefaultSelector()
        self.resolver = _Resolver(list(self.unresolved), self.selector)

    def run(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        try:
            while self.unresolved or self.ready or self.active:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._take_addresses()
                self._open_ready()
                for key, _ in self.selector.select(left):
                    if key.data is self.resolver:
                        self.resolver.drain()
                    elif key.data.step():
                        del self.active[key.data.index]
        finally:
            self._give_up(seconds)
            self.resolver.close()
            self.selector.close()

    def _take_addresses(self) -> None:
        for host, address in self.resolver.resolved():
            for index in self.unresolved.pop(host):
                if isinstance(address, str):
                    self.outcomes[index].error = address
                    self.budget.settle(0)
                else:
                    self.ready.append(index)

    def _open_ready(self) -> None:
        while self.ready and len(self.active) < self.slots:
            index = self.ready.popleft()
            request = self.requests[index]
            exchange = _Exchange(index, request, self.outcomes[index], self.budget, self.selector)
            if exchange.start(self.resolver.addresses[request.host]):
                self.active[index] = exchange

    def _give_up(self, seconds: float) -> None:
        """What the deadline (or an interruption) left unfinished is said so, and its files removed."""
        for exchange in self.active.values():
            exchange.give_up(seconds)
        for index in self.ready:
            self.outcomes[
                index
            ].error = f"not asked within {seconds:g} s: {self.slots} requests were open at once, the most here"
        for host, indices in self.unresolved.items():
            for index in indices:
                self.outcomes[index].error = f"its host name {host[:80]!r} did not resolve within {seconds:g} s"


class _Ended(Exception):
    """An exchange is over (its outcome says how)."""


class _Malformed(Exception):
    """The answer is not the HTTP it claims to be."""


class _Exchange:
    """One request on a non-blocking socket of its own: connect, send, read the status and headers, then stream
    the body into the target file. `step` goes on whenever the socket is ready."""

    def __init__(self, index: int, request: Request, outcome: Outcome, budget: SharedBytes, selector) -> None:
        self.index, self.request, self.outcome, self.budget, self.selector = index, request, outcome, budget, selector
        self.sock: socket.socket | None = None
        self.phase = "connect"  # connect, send, head, body
        host = f"[{request.host}]" if ":" in request.host else request.host  # an IPv6 address
        self.unsent = memoryview(
            f"POST {request.path} HTTP/1.1\r\nHost: {host}:{request.port}\r\n"
            "Content-Length: 0\r\nConnection: close\r\n\r\n".encode("ascii", "replace")
        )
        self.head = bytearray()
        self.length: int | None = None  # the body's announced length, reserved in the budget at once
        self.chunks: _Chunked | None = None
        self.held = 0  # bytes of the budget this answer holds
        self.fd: int | None = None

    def start(self, address: tuple[int, tuple]) -> bool:
        """Begin connecting; False when that failed at once (the outcome says why)."""
        family, sockaddr = address
        try:
            self.sock = socket.socket(family, socket.SOCK_STREAM)
            self.sock.setblocking(False)
            code = self.sock.connect_ex(_with_port(sockaddr, self.request.port))
            if code not in _CONNECTING:
                self._end(f"{os.strerror(code)} (its host may be down or its process gone)")
            self.selector.register(self.sock, selectors.EVENT_WRITE, self)
        except OSError as err:
            self._close(f"{_reason(err)} (cannot connect)")
            return False
        except _Ended:
            return False
        return True

    def step(self) -> bool:
        """Go on now that the socket is ready; True once the exchange is over."""
        try:
            if self.phase == "connect":
                self._connected()
            elif self.phase == "send":
                self._send()
            else:
                self._receive()
        except _Ended:
            return True
        except _Malformed as err:
            self._close(str(err))
            return True
        return False

    def give_up(self, seconds: float) -> None:
        """The deadline came first."""
        if self.phase == "connect":
            self._close(f"no connection within {seconds:g} s (its host may be unreachable)")
        elif self.phase in ("send", "head"):
            self._close(f"no answer within {seconds:g} s (its process may be wedged)")
        else:
            came = describe_size(self.outcome.size)
            self._close(f"its answer did not end within {seconds:g} s ({came} came): too slow, given up")

    # --- the steps

    def _connected(self) -> None:
        code = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            self._end(f"{os.strerror(code)} (its host may be down or its process gone)")
        self.phase = "send"
        self._send()

    def _send(self) -> None:
        try:
            self.unsent = self.unsent[self.sock.send(self.unsent) :]
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            self._end(f"{_reason(err)} (its process may be gone)")
        if not self.unsent:
            self.phase = "head"
            self.selector.modify(self.sock, selectors.EVENT_READ, self)

    def _receive(self) -> None:
        try:
            data = self.sock.recv(_PIECE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            self._end(f"{_reason(err)} (its process may be gone)")
        if not data:
            self._closed_by_server()
        elif self.phase == "head":
            self._read_head(data)
        else:
            self._read_body(data)

    def _read_head(self, data: bytes) -> None:
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > _MAX_HEAD:
                raise _Malformed(f"its status and headers run past {describe_size(_MAX_HEAD)}: not a debug server's")
            return
        status, length, chunked = _parse_head(bytes(self.head[:end]))
        rest = bytes(self.head[end + 4 :])
        self.head = bytearray()
        self.outcome.status = status
        if status != 200:
            self._end()  # a handler this build lacks (NCCL's on CPU), or py-spy missing on the rank's PATH
        if chunked:
            self.chunks = _Chunked()
        elif length is not None:
            self._take(length)  # refused before a byte of it is read when past the budget
            self.length = length
        self._open_target()
        self.phase = "body"
        if self.length == 0:
            self._end()
        if rest:
            self._read_body(rest)

    def _read_body(self, data: bytes) -> None:
        if self.length is not None:
            data = data[: self.length - self.outcome.size]  # past the announced length is not the answer
            self._write(data)
            if self.outcome.size == self.length:
                self._end()
            return
        self._take(len(data))  # a chunked body's framing counts too: it costs the same to receive
        if self.chunks is None:
            self._write(data)
            return
        pieces, ended = self.chunks.feed(data)
        for piece in pieces:
            self._write(piece)
        if ended:
            self._end()

    def _closed_by_server(self) -> None:
        if self.phase != "body":
            self._end("it closed the connection without an answer (its process may be ending)")
        if self.length is not None or self.chunks is not None:
            self._end(f"its answer was cut short: the connection closed after {describe_size(self.outcome.size)}")
        self._end()  # a body without a length ends with the connection

    # --- the budget and the file

    def _take(self, count: int) -> None:
        passed = self.budget.take(self.held, count)
        if passed is not None:
            self._end(self.budget.why_cut(passed), cut=passed)
        self.held += count

    def _open_target(self) -> None:
        try:
            self.fd = open_private(self.request.target)
        except OSError as err:
            self._end(f"cannot write {self.request.target}: {_reason(err)}")

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as err:
            self._end(f"cannot write {self.request.target}: {_reason(err)}")
        self.outcome.size += len(data)

    def _end(self, error: str = "", cut: str | None = None) -> None:
        self._close(error, cut)
        raise _Ended

    def _close(self, error: str = "", cut: str | None = None) -> None:
        """The outcome said, the socket closed, the file kept only when the answer came whole, the budget
        settled."""
        self.outcome.error, self.outcome.cut = error, cut
        if self.sock is not None:
            try:
                self.selector.unregister(self.sock)
            except (KeyError, ValueError):
                pass
            self.sock.close()
        if self.fd is not None:
            os.close(self.fd)
            if not self.outcome.kept:
                Path(self.request.target).unlink(missing_ok=True)
        self.budget.settle(self.held)


def _parse_head(head: bytes) -> tuple[int, int | None, bool]:
    """(status, the body's length when announced, whether the body is chunked)."""
    lines = head.split(b"\r\n")
    found = _STATUS.match(lines[0])
    if not found:
        raise _Malformed(f"it answered something other than HTTP: {lines[0][:40]!r}")
    lengths, chunked = set(), False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip()
        if name == b"content-length":
            if not value.isdigit() or len(value) > 18:
                raise _Malformed(f"its Content-Length is not a length: {value[:40]!r}")
            lengths.add(int(value))
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
    if len(lengths) > 1:
        raise _Malformed("it announced two different lengths")
    return int(found.group(1)), None if chunked or not lengths else lengths.pop(), chunked


class _Chunked:
    """A body sent with `Transfer-Encoding: chunked`, decoded as it comes: size lines, data, trailers."""

    def __init__(self) -> None:
        self.line = bytearray()
        self.state = "size"  # size, data, end of data (its CRLF), trailer
        self.left = 0  # bytes of the current chunk still to come

    def feed(self, data: bytes) -> tuple[list[bytes], bool]:
        """The body's pieces in `data`, and whether the body ended."""
        pieces, at = [], 0
        while at < len(data):
            if self.state == "data":
                piece = data[at : at + self.left]
                pieces.append(piece)
                at += len(piece)
                self.left -= len(piece)
                if not self.left:
                    self.state = "end of data"
                continue
            newline = data.find(b"\n", at)
            self.line += data[at : len(data) if newline < 0 else newline]
            if len(self.line) > _MAX_CHUNK_LINE:
                raise _Malformed("a line of its chunked answer runs past 1 KiB")
            if newline < 0:
                break
            at = newline + 1
            line = bytes(self.line).rstrip(b"\r")
            self.line.clear()
            if self._line(line):
                return pieces, True
        return pieces, False

    def _line(self, line: bytes) -> bool:
        """Take one line; True at the end of the body."""
        if self.state == "size":
            size = line.split(b";")[0].strip()
            if not size or len(size) > 16 or size.strip(b"0123456789abcdefABCDEF"):
                raise _Malformed(f"a chunk of its answer has no size: {line[:40]!r}")
            self.left = int(size, 16)
            self.state = "data" if self.left else "trailer"
        elif self.state == "end of data":
            if line:
                raise _Malformed("a chunk of its answer is longer than its size")
            self.state = "size"
        else:
            return not line  # trailers are skipped; an empty line ends the body
        return False


class _Resolver:
    """The address of every host: IP literals at once, names by a few daemon threads, each result announced on a
    socket the selector watches. A lookup that hangs is left behind; the deadline holds."""

    def __init__(self, hosts: list[str], selector) -> None:
        self.addresses: dict[str, tuple[int, tuple] | str] = {}
        self._fresh: list[str] = []
        self._lock = threading.Lock()
        self._wake, self._waker = socket.socketpair()
        self._wake.setblocking(False)
        self._waker.setblocking(False)
        selector.register(self._wake, selectors.EVENT_READ, self)
        names: queue.SimpleQueue[str] = queue.SimpleQueue()
        for host in hosts:
            literal = _literal(host)
            if literal is None:
                names.put(host)
            else:
                self._found(host, literal)
        for _ in range(min(_RESOLVERS, names.qsize())):
            threading.Thread(target=self._look_up, args=(names,), daemon=True, name="torchtriage-resolve").start()

    def resolved(self) -> list[tuple[str, tuple[int, tuple] | str]]:
        """The hosts resolved (or not) since the last call."""
        with self._lock:
            fresh, self._fresh = self._fresh, []
        return [(host, self.addresses[host]) for host in fresh]

    def drain(self) -> None:
        try:
            self._wake.recv(4096)
        except OSError:
            pass

    def close(self) -> None:
        self._wake.close()
        self._waker.close()

    def _look_up(self, names: queue.SimpleQueue) -> None:
        while True:
            try:
                host = names.get_nowait()
            except queue.Empty:
                return
            try:
                family, _, _, _, sockaddr = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0]
                self._found(host, (family, sockaddr))
            except (OSError, UnicodeError, ValueError, IndexError) as err:
                self._found(host, f"its host name {host[:80]!r} does not resolve ({_reason(err)})")

    def _found(self, host: str, address: tuple[int, tuple] | str) -> None:
        with self._lock:
            self.addresses[host] = address
            self._fresh.append(host)
        try:
            self._waker.send(b"\0")
        except OSError:
            pass  # a wake is pending already, or the fetch is over


def _literal(host: str) -> tuple[int, tuple] | None:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if address.version == 6:
        return socket.AF_INET6, (str(address), 0, 0, 0)
    return socket.AF_INET, (str(address), 0)


def _with_port(sockaddr: tuple, port: int) -> tuple:
    return (sockaddr[0], port, *sockaddr[2:])


def _slots(count: int) -> int:
    """How many requests may be open at once: all of them where the limit on open files allows (its soft limit
    is raised toward the hard one when lower), each holding a socket and a file."""
    wanted = 2 * min(count, _MAX_IN_FLIGHT) + 64
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            raised = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    except (ImportError, OSError, ValueError):
        soft = 1024
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 64
    return max(1, min(count, _MAX_IN_FLIGHT, (soft - open_now - 16) // 2))


def _reason(err: BaseException) -> str:
    return getattr(err, "strerror", None) or str(err) or type(err).__name__
