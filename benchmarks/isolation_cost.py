"""What reading dumps in bounded children with the pre-scan costs: this tree's `fr` against another commit's.

Usage: python benchmarks/isolation_cost.py [--base REF] [--runs 5]

Writes three folders (one recorded dump; 1,024 ranks x 200 entries and 64 ranks x 2,000 entries in the real
format, from benchmarks/fr_speed.py), checks REF (default: the commit before sources/isolated.py) out into a
temporary worktree, then runs `python -m torchtriage fr DIR --json` from each tree in turn (A B A B ...) and
prints each one's median wall time and the ratio this/REF with its min and max over the pairs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fr_speed import PREFIX, make_dump  # benchmarks/fr_speed.py: run as scripts, this folder is on sys.path

ROOT = Path(__file__).resolve().parents[1]
ONE = ROOT / "tests/fixtures/fr_cross_group/subgroup_barrier_c1_4r/fr/nccl_trace_rank_0"


def _folders(where: Path) -> dict[str, Path]:
    found = {"one dump": where / "one"}
    found["one dump"].mkdir()
    (found["one dump"] / ONE.name).write_bytes(ONE.read_bytes())
    for world, entries in ((1024, 200), (64, 2000)):
        folder = found[f"{world} x {entries}"] = where / f"{world}x{entries}"
        folder.mkdir()
        ranks = "[" + ", ".join(map(str, range(world))) + "]"
        for rank in range(world):
            (folder / f"{PREFIX}{rank}").write_bytes(make_dump(rank, world, entries, 5, ranks))
    return found


def _timed(src: Path, folder: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torchtriage", "fr", str(folder), "--json"], env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)  # fmt: skip
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="be3b7dc93c")  # the commit before sources/isolated.py
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), args.base], check=True)
        try:
            for name, folder in _folders(Path(tmp)).items():
                _timed(ROOT / "src", folder), _timed(base / "src", folder)  # warm the caches
                pairs = [(_timed(ROOT / "src", folder), _timed(base / "src", folder)) for _ in range(args.runs)]
                ratios = [a / b for a, b in pairs]
                print(f"{name:>12}: this {statistics.median(a for a, _ in pairs):.3f} s, {args.base} "
                      f"{statistics.median(b for _, b in pairs):.3f} s, ratio {statistics.median(ratios):.2f} "
                      f"(min {min(ratios):.2f}, max {max(ratios):.2f})")  # fmt: skip
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
