"""Seeded generator samples read on every core the machine gives: one pool of children, results in the order
of the seeds, so a sample's outcome is the same whatever the number of cores.

The generators' fixtures are CPU work (a simulated job diagnosed, a hostile file read by the real reader in its
own bounded child); run one after another they leave all cores but one idle. The children are spawned, not
forked: the test process may hold threads (a forked child inherits their locks held, and may wait forever).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

T = TypeVar("T")
MOST_JOBS = 4  # a generator's sample is short: more children than this cost more to start than they save


def jobs() -> int:
    return max(1, min(MOST_JOBS, len(os.sched_getaffinity(0))))


def map_seeds(function: Callable[[int], T], seeds: Iterable[int]) -> list[T]:
    """`function` of each seed, in the seeds' order. `function` must be a module-level function of a module the
    children can import by name (they get the test process's sys.path)."""
    seeds = list(seeds)
    workers = min(jobs(), len(seeds))
    if workers <= 1:
        return [function(seed) for seed in seeds]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        return list(pool.map(function, seeds, chunksize=max(1, len(seeds) // (workers * 8))))
