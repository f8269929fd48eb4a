"""PyTorch's debug-server worker in a rank, started by `torchtriage run --debug-server` once the default
process group exists, so `torchtriage diagnose --store HOST:PORT` reaches every rank of every node.

What `torch.distributed.debug.start_debug_server` does for each rank (torch >= 2.10): a C++ worker HTTP
server on an ephemeral port, its URL registered in the job's store at MASTER_ADDR:MASTER_PORT as
`debug_server/rank<N>`. Its web front end on rank 0 (a process of its own, with Jinja2 and aiohttp) is
not started: the verdict comes from `diagnose --store`. A user who starts the debug server as well gets a
second worker whose URL replaces this one; both answer alike.

Rank 0 also records the world size in the store and the store's address in the run folder
(`debug_server.json`), which is what a user outside the job needs to reach it.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from torchtriage.protocol import DEBUG_SERVER_FILE, DEBUG_SERVER_WORLD_KEY, write_whole


def unavailable() -> str | None:
    """Why this torch cannot run the debug server's worker, or None when it can."""
    try:
        from torch._C._distributed_c10d import _WorkerServer  # noqa: F401
        from torch.distributed.debug._store import tcpstore_client  # noqa: F401
    except ImportError:
        import torch

        return f"torch {torch.__version__} has no debug server (torch.distributed.debug needs torch >= 2.10)"
    return None


def start_worker(run_dir: str | os.PathLike | None) -> object:
    """Start this rank's worker server and register it; returns the server (keep it alive)."""
    from torch._C._distributed_c10d import _WorkerServer
    from torch.distributed.debug._store import tcpstore_client

    store = tcpstore_client()  # as torch's own: a client of MASTER_ADDR:MASTER_PORT, prefixed debug_server/
    server = _WorkerServer("::", 0)
    rank = int(os.environ["RANK"])
    store.set(f"rank{rank}", f"http://{socket.gethostname()}:{server.port}")
    if rank == 0:
        world = os.environ.get("WORLD_SIZE", "")
        address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        raw = tcpstore_client(prefix="")
        if world.isdigit():
            raw.set(DEBUG_SERVER_WORLD_KEY, world)
        if run_dir:
            record = {"store": address, "world_size": int(world) if world.isdigit() else None}
            write_whole(Path(run_dir) / DEBUG_SERVER_FILE, json.dumps(record) + "\n")
    return server
