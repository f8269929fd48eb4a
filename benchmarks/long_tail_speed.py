"""What reading the long tail costs: the scan with a knowledge base against another, and the reading of
non-finite values (`analysis/nonfinite_values.py`) against the scan it follows.

Usage: python benchmarks/long_tail_speed.py [--size-mb 64] [--repeats 5] [--baseline-rules DIR] [--keep PATH]

1. The scan (prefilter, rules, records) of one log shaped like triage_speed.py's (step lines, NCCL INFO
   chatter, warnings), with the built-in rules and, given `--baseline-rules DIR` (the rules/*.toml of an
   earlier checkout, e.g. `git archive HEAD src/torchtriage/knowledge/rules | tar -x -C /tmp/base`), with
   those: the ratio says what the rules added since cost ordinary lines.
2. The reading of non-finite values after the scan, on three shapes: that log (a healthy tail), the same
   log ending in a thousand rows of NaN, and 2,000 small logs (every tail read).

Runs are interleaved (A, B, A, B, ...) on one core and reported as median with min-max spread, so a busy
machine widens the spread instead of biasing one side. Nothing here is asserted: read the ratios.
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from torchtriage.analysis.nonfinite_values import read_nonfinite_values
from torchtriage.knowledge.matcher import Matcher
from torchtriage.knowledge.rules import default_rules, load_rules
from torchtriage.sources.log_records import LogRecords, read_logs
from torchtriage.sources.registry import log_input

sys.path.insert(0, str(Path(__file__).resolve().parent))
from triage_speed import write_log  # noqa: E402  (the same synthetic job log)


def scan(path: Path, matcher: Matcher) -> tuple[float, LogRecords]:
    data = path.read_bytes()
    records = LogRecords()
    start = time.perf_counter()
    read_logs([log_input(str(path))], matcher, records, opener=lambda _: io.BytesIO(data))
    return time.perf_counter() - start, records


def scan_many(paths: list[Path], matcher: Matcher) -> tuple[float, LogRecords]:
    blobs = {str(p): p.read_bytes() for p in paths}
    records = LogRecords()
    start = time.perf_counter()
    read_logs([log_input(name) for name in blobs], matcher, records, opener=lambda i: io.BytesIO(blobs[i.display]))
    return time.perf_counter() - start, records


def reading(records: LogRecords) -> float:
    start = time.perf_counter()
    read_nonfinite_values(records)
    return time.perf_counter() - start


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f} s (min {min(values):.3f}, max {max(values):.3f})"


def ratio(a: list[float], b: list[float]) -> str:
    ratios = [x / y for x, y in zip(a, b, strict=True) if y > 0]
    return f"{statistics.median(ratios):.3f}x (min {min(ratios):.3f}, max {max(ratios):.3f})"


def compare_rules(log: Path, baseline_dir: Path, repeats: int) -> None:
    current, baseline = Matcher(default_rules()), Matcher(load_rules(baseline_dir))
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(scan(log, current)[0])
        theirs.append(scan(log, baseline)[0])
    size = log.stat().st_size / (1 << 20)
    print(f"scan, built-in rules ({len(default_rules())}): {spread(ours)}  {size / statistics.median(ours):.0f} MB/s")
    print(f"scan, baseline rules ({baseline_dir}): {spread(theirs)}  {size / statistics.median(theirs):.0f} MB/s")
    print(f"ratio built-in / baseline: {ratio(ours, theirs)}")


def nan_tail(log: Path, workdir: Path) -> Path:
    rng = random.Random(0)
    path = workdir / "nan_tail.log"
    rows = "\n".join(f"[rank{rng.randrange(64)}]:{i},nan,{rng.random():.4f},nan" for i in range(1000))
    path.write_bytes(log.read_bytes() + rows.encode() + b"\n")
    return path


def small_logs(workdir: Path, count: int) -> list[Path]:
    rng = random.Random(1)
    folder = workdir / "many"
    folder.mkdir(exist_ok=True)
    paths = []
    for index in range(count):
        lines = [f"step {i} loss: {2 + rng.random():.4f} lr: 3e-4 | NCCL INFO Channel 00/0 : 0 -> 1" for i in range(99)]
        if index % 50 == 0:
            lines.append(f"{index},nan,nan")
        path = folder / f"rank{index}.log"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def mechanism_overhead(log: Path, workdir: Path, repeats: int) -> None:
    matcher = Matcher(default_rules())
    shapes = {"healthy tail": [log], "a thousand NaN rows at the end": [nan_tail(log, workdir)]}
    shapes["2,000 small logs"] = small_logs(workdir, 2000)
    for name, paths in shapes.items():
        scans, reads = [], []
        for _ in range(repeats):
            took, records = scan_many(paths, matcher) if len(paths) > 1 else scan(paths[0], matcher)
            scans.append(took)
            reads.append(reading(records))
        print(f"{name}: scan {spread(scans)}; non-finite reading {spread(reads)}; reading / scan {ratio(reads, scans)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline-rules", type=Path, metavar="DIR", help="the rules/*.toml to compare with")
    parser.add_argument("--keep", type=Path, help="reuse or keep the generated log at this path")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="long-tail-speed-") as tmp:
        workdir = Path(tmp)
        log = args.keep or workdir / "job.log"
        if not log.exists() or log.stat().st_size < args.size_mb << 20:
            print(f"writing a {args.size_mb} MB log to {log} ...", flush=True)
            write_log(log, args.size_mb << 20, 64)
        if args.baseline_rules:
            compare_rules(log, args.baseline_rules, args.repeats)
        mechanism_overhead(log, workdir, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
