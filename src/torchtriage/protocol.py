"""The run folder and the names shared by `torchtriage run`, the ranks' hang watchdog and live `diagnose`.

`torchtriage run --out DIR` tells every rank where DIR is through the environment; the ranks write
into it and `diagnose` asks them, through a file in it, for a fresh dump. Both sides read the names
here, so neither imports the other.

    DIR/fr/nccl_trace_rank_<N>     the flight recorder's dumps on a timeout (TORCH_FR_DUMP_TEMP_FILE)
    DIR/hang/rank<NN>.txt          each rank's stack when the watchdog fired (py-spy's text form)
    DIR/hang/fr/nccl_trace_rank_<N>   each rank's flight-recorder buffer at that moment
    DIR/hang/verdict.json, .txt    the fused verdict the first rank to notice wrote
    DIR/hang/REQUEST               created by `diagnose` to ask every armed rank for a fresh dump
    DIR/debug_server.json          with --debug-server: the job's store address, for `diagnose --store`
    DIR/nonfinite.jsonl            NonFiniteGuard(locate=True): where each skipped step's NaN was born
    DIR/monitor/steps-rank<R>.jsonl   with --monitor: one line per window of each rank's step timings
    DIR/monitor/stragglers.jsonl   with --monitor: the straggler decisions (rank 0)
"""

from __future__ import annotations

import os
from pathlib import Path

RUN_DIR_ENV = "TORCHTRIAGE_RUN_DIR"
STALL_SECONDS_ENV = "TORCHTRIAGE_STALL_SECONDS"
HANG_SUBDIR = "hang"
FR_SUBDIR = "fr"
FR_PREFIX = "nccl_trace_rank_"
REQUEST_FILE = "REQUEST"
VERDICT_STEM = "verdict"
DEBUG_SERVER_ENV = "TORCHTRIAGE_DEBUG_SERVER"
DEBUG_SERVER_FILE = "debug_server.json"
MONITOR_WINDOW_ENV = "TORCHTRIAGE_MONITOR_WINDOW"  # set by `run --monitor`: the step monitor's window
MONITOR_SUBDIR = "monitor"
# PyTorch's debug server registers each rank's worker URL in the job's store under this prefix
# (torch/distributed/debug/_store.py); `run --debug-server` adds the world size under the second key.
DEBUG_SERVER_STORE_PREFIX = "debug_server/"
DEBUG_SERVER_WORLD_KEY = "torchtriage/debug_server/world_size"
# Keys the watchdogs of one job share in its c10d store.
WATCHDOG_STORE_PREFIX = "torchtriage/watchdog/"


def hang_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / HANG_SUBDIR


def write_whole(path: Path, text: str) -> None:
    """Write `text` under another name in the same folder, then rename it: whoever reads the run folder
    while a rank writes (another rank, `diagnose`, a user's script) sees the file whole or not at all. The
    other name starts with a dot, which every reader skips."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    os.replace(partial, path)
