"""Throughput of `torchtriage triage` on a large multi-rank log, against grep over the same signatures.

Usage: python benchmarks/triage_speed.py [--size-mb 1024] [--ranks 64] [--keep PATH]

Writes a synthetic log shaped like a real multi-rank job's (per-rank prefixes, step lines, NCCL INFO
chatter, warnings, a Python traceback, and the failure itself near the end), then times one
single-process `torchtriage triage --json` over it (so MB/s is per core) and `grep -c -F -f` with the
knowledge base's literal anchors, the fastest thing a user could do by hand. Prints both rates and
the ratio. Target: >= 200 MB/s per core.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchtriage.knowledge.rules import default_rules

TARGET_MB_S = 200  # one core, a 1 GB log

LINE_KINDS = [
    (60, "[rank{r}]:[titan] step {i:>6}  loss: {loss:.4f}  grad_norm: 1.{i:04d}  tps: 31,{i:03d}  mfu: 41.2%"),
    (25, "node{n}:{pid}:{tid} [{lr}] NCCL INFO Channel {c:02d}/0 : {r} -> {nr} via P2P/IPC/read"),
    (8, "[rank{r}]:[W1130 04:{m:02d}:{s:02d}.123456789 ProcessGroupNCCL.cpp:4713] Warning: an unused env var"),
    (5, "[rank{r}]:  tokens/sec {i}  memory 61.{c:02d}GiB (77.4%)  data_wait 0.0{c:02d}s"),
    (2, "[rank{r}]:[2026-11-30 04:{m:02d}:{s:02d}] INFO checkpoint step {i} saved to /ckpt/step-{i}"),
]
FAILURE = """[rank5]:[E1130 05:12:00.068043558 ProcessGroupNCCL.cpp:689] [Rank 5] Watchdog caught collective \
operation timeout: WorkNCCL(SeqNum=91822, OpType=ALLREDUCE, NumelIn=4096, NumelOut=4096, Timeout(ms)=600000) \
ran for 600055 milliseconds before timing out.
[rank7]:Traceback (most recent call last):
[rank7]:  File "/workspace/train.py", line 88, in <module>
[rank7]:    loss = model(batch)
[rank7]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 7 has a total capacity \
of 79.19 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.16 GiB memory in use. \
Of the allocated memory 70.11 GiB is allocated by PyTorch, and 6.32 GiB is reserved by PyTorch but unallocated.
"""


def write_log(path: Path, size_bytes: int, ranks: int) -> None:
    rng = random.Random(0)
    weights = [w for w, _ in LINE_KINDS]
    formats = [f for _, f in LINE_KINDS]
    written, i = 0, 0
    with open(path, "w", encoding="utf-8") as out:
        while written < size_bytes:
            chunk = []
            for _ in range(10_000):
                r = rng.randrange(ranks)
                fmt = rng.choices(formats, weights)[0]
                chunk.append(
                    fmt.format(
                        r=r,
                        n=r // 8,
                        pid=1000 + r,
                        tid=2000 + r,
                        lr=r % 8,
                        c=i % 32,
                        nr=(r + 1) % ranks,
                        i=i,
                        loss=2.0 + (i % 1000) / 1000,
                        m=(i // 60) % 60,
                        s=i % 60,
                    )
                )
                i += 1
            text = "\n".join(chunk) + "\n"
            out.write(text)
            written += len(text)
        out.write(FAILURE)


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    return time.perf_counter() - start, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--keep", type=Path, help="reuse or keep the generated log at this path")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="triage-speed-"))
    log = args.keep or workdir / "job.log"
    if not log.exists() or log.stat().st_size < args.size_mb << 20:
        print(f"writing a {args.size_mb} MB log of {args.ranks} ranks to {log} ...", flush=True)
        write_log(log, args.size_mb << 20, args.ranks)
    size_mb = log.stat().st_size / (1 << 20)

    ours_s, done = timed([sys.executable, "-m", "torchtriage", "triage", "--json", str(log)])
    verdict = json.loads(done.stdout)
    print(
        f"torchtriage triage: {ours_s:6.2f} s  {size_mb / ours_s:7.1f} MB/s (one core)  "
        f"verdict: {verdict['category']}, culprit ranks {verdict['culprit_ranks']}"
    )

    if shutil.which("grep"):
        anchors = workdir / "anchors.txt"
        anchors.write_text("\n".join(a for rule in default_rules() for a in rule.anchors) + "\n")
        env = dict(os.environ, LC_ALL="C")
        start = time.perf_counter()
        grep = subprocess.run(
            ["grep", "-c", "-F", "-f", str(anchors), str(log)], capture_output=True, text=True, env=env
        )
        grep_s = time.perf_counter() - start
        print(
            f"grep -F (anchors only, no verdict): {grep_s:6.2f} s  {size_mb / grep_s:7.1f} MB/s  "
            f"({grep.stdout.strip()} matching lines)"
        )
        print(f"ratio torchtriage/grep time: {ours_s / grep_s:.2f}x")
    print(f"target: >= {TARGET_MB_S} MB/s per core -> {'MET' if size_mb / ours_s >= TARGET_MB_S else 'NOT MET'}")
    if not args.keep:
        shutil.rmtree(workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
