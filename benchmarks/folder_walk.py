"""What a folder of many tiny files costs: this tree's walk, `triage DIR` and `diagnose DIR` against another commit's.

Usage: python benchmarks/folder_walk.py [--base REF] [--files 200000] [--runs 3] [--keep DIR]

Writes one folder of FILES small files (a third empty, the rest a line or two of a log, a py-spy stack or a
JSON record, under names of every shape, three levels deep, one rank's log holding a CUDA OOM), checks REF
(default: the commit before the folder walk used scandir) out into a temporary worktree, then runs
`python -m torchtriage VERB DIR --json` from each tree in turn (A B A B ...) and prints each one's median wall
time and the ratio this/REF with its min and max over the pairs; `discover` is the walk and the sniffing alone
(the source registry), without reading what it found. With --keep DIR the folder is written there (and kept)
instead, for profiling.
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

ROOT = Path(__file__).resolve().parents[1]
OOM = (
    "[rank7]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 7 has a total "
    "capacity of 79.10 GiB of which 1.12 GiB is free.\n"
)
CONTENTS = (
    b"",
    b"step 12 loss 2.31\n",
    b"",
    b'{"step": 3, "loss": 1.5}\n',
    b"INFO: NCCL version 2.21.5+cuda12.4\nstep 1 loss 3.0\n",
    b"",
    b'Process 7: python train.py\nPython v3.12.3\n\nThread 0x1 (idle): "MainThread"\n    main (train.py:3)\n',
)
NAMES = ("rank{n}.log", "worker-{n}.out", "notes_{n}.txt", "shard{n}.idx", "event.{n}.json", "attempt_{n}", "x{n}")


def make_tree(where: Path, files: int) -> None:
    """`files` small files under `where`, 20 x 20 folders, the names and contents of every shape."""
    folders = [where / f"node{a:02d}" / f"part{b:02d}" for a in range(20) for b in range(20)]
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    for n in range(files):
        name = NAMES[n % len(NAMES)].format(n=n)
        (folders[n % len(folders)] / name).write_bytes(CONTENTS[n % len(CONTENTS)])
    (folders[0] / "rank7.log").write_text(OOM)


# The walk and the sniffing alone (the source registry's discover), without reading the logs found.
DISCOVER = "import sys; from torchtriage.sources.registry import discover; discover([sys.argv[1]], [])"


def _timed(src: Path, verb: str, folder: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    command = ["-c", DISCOVER] if verb == "discover" else ["-m", "torchtriage", verb, "--json"]
    start = time.perf_counter()
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    subprocess.run([sys.executable, *command, str(folder)], env=env, check=False, **quiet)
    return time.perf_counter() - start


def _compare(base: Path, base_name: str, folder: Path, runs: int) -> None:
    for verb in ("discover", "triage", "diagnose"):
        _timed(ROOT / "src", verb, folder)  # warm the page cache and the dentries
        pairs = [(_timed(ROOT / "src", verb, folder), _timed(base / "src", verb, folder)) for _ in range(runs)]
        ratios = [a / b for a, b in pairs]
        print(f"{verb:>8}: this {statistics.median(a for a, _ in pairs):.2f} s, {base_name} "
              f"{statistics.median(b for _, b in pairs):.2f} s, ratio {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f})", flush=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="3ac590f")  # the commit before the walk used scandir
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", metavar="DIR", help="write the folder to DIR, keep it, and compare nothing")
    args = parser.parse_args()
    if args.keep:
        make_tree(Path(args.keep), args.files)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), args.base], check=True)
        try:
            folder = Path(tmp) / "files"
            make_tree(folder, args.files)
            print(f"{args.files:,} files under {folder.name}/", flush=True)
            _compare(base, args.base, folder, args.runs)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
