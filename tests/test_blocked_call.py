"""The hang watchdog names the C call a thread is blocked in from the frame itself, as py-spy --native would:
threads really blocked in a store's get, a socket's recv, time.sleep, a lock, a `with lock:` and a Work's wait,
read back through the one stack classifier."""

import socket
import sys
import threading
import time
from datetime import timedelta

import pytest

from torchtriage.analysis.stacks import classify_thread
from torchtriage.model import RankState
from torchtriage.runtime.blocked_call import blocked_call
from torchtriage.runtime.watchdog import format_stacks
from torchtriage.sources.pyspy import parse_dump

torch_distributed = pytest.importorskip("torch.distributed")


def _wait_in(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    time.sleep(0.3)  # into the C call
    return thread


def store_get(store):
    store.get("never/set")


def store_get_by_attribute(job, request):
    # The callee and its argument are both attributes: the instruction before the call loads the argument.
    job.store.get(request.key)


class _Holder:
    def __init__(self, **values):
        self.__dict__.update(values)


def socket_recv(sock):
    sock.recv(8)


def socket_recv_computed(sock, request):
    sock.recv(len(request.key) + 1)  # an argument that is itself a call


def sleeping():
    time.sleep(30)


def explicit_acquire(lock):
    lock.acquire()


def with_lock(lock):
    with lock:
        pass


@pytest.fixture
def store():
    """A client of a store of its own (a client blocked in get serves nothing else: the key is set by another)."""
    from torch.distributed import TCPStore

    master = TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    client = TCPStore("127.0.0.1", master.port, 1, False, timeout=timedelta(seconds=30))
    yield client
    master.set("never/set", "now")  # the blocked get returns before the server goes
    time.sleep(0.5)


def test_each_blocking_call_is_named_and_classified(store):
    mine, _theirs = socket.socketpair()
    other, _peer = socket.socketpair()
    held = threading.Lock()
    held.acquire()
    cases = {
        "store": (_wait_in(store_get, store), RankState.STORE, "c10d::TCPStore::get"),
        "store by attribute": (
            _wait_in(store_get_by_attribute, _Holder(store=store), _Holder(key="never/set")),
            RankState.STORE,
            "c10d::TCPStore::get",
        ),
        "socket": (_wait_in(socket_recv, mine), RankState.BLOCKED, "sock_recv"),
        "socket, computed size": (
            _wait_in(socket_recv_computed, other, _Holder(key="abc")),
            RankState.BLOCKED,
            "sock_recv",
        ),
        "sleep": (_wait_in(sleeping), RankState.SLEEPING, "time_sleep"),
        "acquire": (_wait_in(explicit_acquire, held), RankState.LOCK, "lock_PyThread_acquire_lock"),
        "with": (_wait_in(with_lock, held), RankState.LOCK, "lock_PyThread_acquire_lock"),
    }
    frames = sys._current_frames()
    for name, (thread, state, symbol) in cases.items():
        frame = frames[thread.ident]
        assert blocked_call(frame)[0] == symbol, name
        text = format_stacks({thread.ident: frame}, thread.ident, stalled=True)
        (process,) = parse_dump(text, "rank00.txt")
        assert classify_thread(process.threads[0])[0] == state, (name, text)
    held.release()


def test_a_frame_running_python_names_no_call():
    assert blocked_call(sys._getframe()) is None
