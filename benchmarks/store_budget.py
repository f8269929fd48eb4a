"""What hostile ranks cost `torchtriage diagnose --store`: its peak memory, time and the bytes it kept.

Usage: python benchmarks/store_budget.py [--cases flood2 stream10g flood16 billion trickle closed wide] [--repeat 3]

Each case serves debug-server workers on loopback from this process (tests/test_store_budget.py's
HostileWorkers, registered in a real TCPStore) and runs the command under /usr/bin/time, which gives its peak
resident memory (the largest of it and its children):

    flood2     2 ranks, every handler answering 300 MB without a length (2.4 GB offered), default limits
    stream10g  1 rank whose py-spy dump streams 10 GB without a length, default limits
    flood16    16 ranks, every handler answering 300 MB without a length (19 GB offered), default limits
    billion    a store whose world size key says 1,000,000,000 ranks
    trickle    2 ranks answering, 2 trickling one byte every 2 s, --timeout 3
    closed     a closed store port, --timeout 10
    wide       65,536 ranks registered, every URL a closed port (262,144 requests refused at once), --timeout 10

Printed per case: exit code, wall seconds and peak MB (median and spread of the runs), the bytes the servers
sent and those left in the capture folder. A command past 120 s is stopped (printed as such). Target: peak
memory independent of what the ranks send, every case ended within twice --timeout plus start-up.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_store_budget import WORLD_KEY, HostileWorkers  # noqa: E402  the hostile workers of the tests

LIMIT_S = 120
CASES = {
    "flood2": (["flood-open"] * 2, 300 << 20, ["--timeout", "60"]),
    "stream10g": (["normal", "flood-stack"], 10 << 30, ["--timeout", "60"]),
    "flood16": (["flood-open"] * 16, 300 << 20, ["--timeout", "60"]),
    "billion": (["normal", "normal"], 0, ["--timeout", "10"]),
    "trickle": (["normal", "normal", "trickle", "trickle-head"], 0, ["--timeout", "3"]),
    "closed": ([], 0, ["--timeout", "10"]),
    "wide": (["normal"], 0, ["--timeout", "10"]),
}
WIDE = 65_536


def run_once(case: str) -> dict:
    behaviours, flood, extra = CASES[case]
    workers = HostileWorkers(behaviours, flood_bytes=flood) if behaviours else None
    if case == "billion":
        workers.store.set(WORLD_KEY, "1000000000")
    if case == "wide":
        closed = f"http://127.0.0.1:{_closed_port()}"
        for rank in range(1, WIDE):
            workers.register(rank, closed)
    address = workers.address if workers else f"127.0.0.1:{_closed_port()}"
    out = Path(tempfile.mkdtemp(prefix="store-budget-"))
    command = ["/usr/bin/time", "-f", "%M", sys.executable, "-m", "torchtriage", "diagnose", "--store", address]
    command += ["--out", str(out), "--json", *extra]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=LIMIT_S)
        code, peak_kb = done.returncode, int(done.stderr.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        code, peak_kb = None, 0
    finally:
        wall = time.perf_counter() - start
        if workers:
            workers.close()
    kept = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    shutil.rmtree(out, ignore_errors=True)
    return {"code": code, "wall": wall, "peak_mb": peak_kb / 1024, "sent": workers.sent if workers else 0, "kept": kept}


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for case in args.cases:
        runs = [run_once(case) for _ in range(args.repeat)]
        codes = sorted({"stopped" if r["code"] is None else r["code"] for r in runs}, key=str)
        print(
            f"{case:10s} exit {codes}  wall s {_spread([r['wall'] for r in runs])}  "
            f"peak MB {_spread([r['peak_mb'] for r in runs])}  sent {max(r['sent'] for r in runs) / 2**20:,.0f} MB  "
            f"kept {max(r['kept'] for r in runs) / 2**20:,.1f} MB",
            flush=True,
        )


if __name__ == "__main__":
    main()
