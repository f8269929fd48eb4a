"""What the hang watchdogs cost the job's own store: the latency of the job's `set`/`get` beside them.

Usage: python benchmarks/store_load.py [--clients 1024 4096] [--seconds 6] [--poll-seconds 5] [--modes ...]

Starts a real TCPStore server (the job's store, as torchrun's agent hosts it) in a process of its own, and
CLIENTS watchdog clients in worker processes (threads, one TCPStore connection each), behaving as:

    none     no watchdog
    poll     what each rank's watchdog did before: `check([dump_request])` every POLL seconds (random phase)
    wait     what it does now: one `wait([wake key])` held on a connection of its own

Meanwhile the job's own client times `set` then `get` of its key, back to back, for SECONDS; printed: the
median and 99th percentile latency, and the requests the watchdogs sent per second. Then, with the waits held,
the wake key is set (a stalled rank's request: every listener returns and announces with one `add`) and the
job's latency is measured through that burst. Target: no measurable change idle (`wait` against `none`).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import threading
import time
from datetime import timedelta

WAKE = "torchtriage/watchdog//0/wake"
REQUEST = "torchtriage/watchdog/dump_request"


def serve(port_out, stop) -> None:
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=600))
    port_out.put(store.port)
    stop.wait()
    time.sleep(2)  # the watchdog processes leave first
    os._exit(0)


def watchdogs(port: int, count: int, mode: str, poll_s: float, ready, stop, sent) -> None:
    """`count` watchdog clients in this process, each on its own connection."""
    from torch.distributed import TCPStore

    def one() -> None:
        client = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=600))
        with ready.get_lock():
            ready.value += 1
        if mode == "poll":
            time.sleep(random.random() * poll_s)
            while not stop.is_set():
                client.check([REQUEST])
                with sent.get_lock():
                    sent.value += 1
                stop.wait(poll_s)
        elif mode == "wait":
            try:
                client.wait([WAKE], timedelta(days=30))
                client.add("torchtriage/watchdog/dumped", 1)  # the announcement after its dump
            except Exception:  # noqa: BLE001 - the server stops at the end of the run
                pass
            stop.wait()

    threads = [threading.Thread(target=one, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    stop.wait()
    os._exit(0)  # threads still blocked in a wait: leave without running their clients' destructors


def job_latency(port: int, seconds: float) -> list[float]:
    from torch.distributed import TCPStore

    client = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=60))
    samples = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        client.set("job/key", "value")
        client.get("job/key")
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


def measure(clients: int, mode: str, seconds: float, poll_s: float, wake: bool = False) -> str:
    context = multiprocessing.get_context("spawn")
    port_out, stop = context.Queue(), context.Event()
    server = context.Process(target=serve, args=(port_out, stop), daemon=True)
    server.start()
    port = port_out.get(timeout=60)
    ready, sent = context.Value("i", 0), context.Value("l", 0)
    workers = []
    if mode != "none":
        per = -(-clients // 4)
        for start in range(0, clients, per):
            count = min(per, clients - start)
            worker = context.Process(target=watchdogs, args=(port, count, mode, poll_s, ready, stop, sent), daemon=True)
            worker.start()
            workers.append(worker)
        deadline = time.monotonic() + 1800  # a client's connection takes up to 0.2 s on a small machine
        while ready.value < clients and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(min(poll_s, 2.0))
    try:
        if wake:
            from torch.distributed import TCPStore

            waker = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
            timer = threading.Timer(0.5, lambda: waker.set(WAKE, "0"))
            timer.start()
        sent_before, started = sent.value, time.monotonic()
        samples = job_latency(port, seconds)
        rate = (sent.value - sent_before) / (time.monotonic() - started)
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
        server.join(timeout=10)
        if server.is_alive():
            server.kill()
    p50 = statistics.median(samples)
    p99 = statistics.quantiles(samples, n=100)[98]
    label = f"{mode}{' + wake' if wake else ''}"
    latency = f"set+get p50 {p50:7.0f} us  p99 {p99:7.0f} us"
    return f"  {clients:>5} clients  {label:<12} {latency}   watchdog requests {rate:7.0f}/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--poll-seconds", type=float, default=5.0)
    parser.add_argument("--modes", nargs="+", default=["none", "poll", "wait", "wake"])
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; the job's client times set+get back to back for {args.seconds:g} s")
    for clients in args.clients:
        for mode in args.modes:
            wake = mode == "wake"
            print(measure(clients, "wait" if wake else mode, args.seconds, args.poll_seconds, wake), flush=True)


if __name__ == "__main__":
    main()
