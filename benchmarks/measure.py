"""Running a command while sampling the resident memory of its whole process tree (for the benchmarks)."""

from __future__ import annotations

import os
import subprocess
import threading
import time


def tree_rss(pid: int) -> int:
    """Summed resident memory (bytes) of a process and all its descendants."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    stack.extend(int(c) for c in children.read().split())
        except (OSError, ValueError):
            continue
    return total


def run_measured(command: list[str], timeout: float, *, merge_stderr: bool = False) -> dict:
    """Wall time, peak tree memory (sampled every 10 ms), output and exit code of `command`."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        text=True,
    )
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(proc.pid))
            done.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        timed_out = True
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    return {"wall_s": wall, "peak_mb": peak[0] / 2**20, "out": out, "err": err or "", "rc": proc.returncode,
            "timed_out": timed_out}  # fmt: skip
