"""The fuzz suite: every reader, fed mutations of real artifacts, ends with a documented exit code.

For each kind of input a fixed number of mutations (fixed seeds, so a failure reproduces) of a genuine
file is written where the reader expects it, beside genuine peers where the verb compares ranks, and
the real command runs on it under a memory bound and a time bound. It must end with exit 0, 1 or 3 (2
only where a config file supplies the command's required settings), never a traceback or an "internal
error". Reproduce one case: `pytest tests/test_fuzz.py -k 'fr-pickle and 7'`.
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import FIXTURES, H200
from mutations import mutate_json, mutate_pickle, mutate_text
from parallel import jobs

MUTATIONS_PER_KIND = 30
MEMORY_BOUND = 3 << 30
TIME_BOUND_S = 90

FAULTHANDLER = b"""Fatal Python error: Segmentation fault

Thread 0x00007f3a2b7fe640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 622 in wait

Current thread 0x00007f3a4c8b9740 (most recent call first):
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "/job/train.py", line 88 in train_step
  File "/job/train.py", line 140 in <module>
"""
JSON_DUMPS = FIXTURES / "fr/size_json_4r"
CROSS = FIXTURES / "fr_cross_group/world_for_subgroup_c2_8r"
PIPELINE = FIXTURES / "fr_cross_group/skip_send_c1_4r"
LAYOUT_JSON = json.dumps({"world_size": 64, "gpus_per_node": 8, "parallelism": {"tp": 8, "pp": 2}}).encode()
LAYOUT_YAML = b"world_size: 64\ngpus_per_node: 8\ntensor_model_parallel_size: 8\npipeline_model_parallel_size: 2\n"


def _peer(source: Path, name: str):
    return (source, name)


# kind -> (genuine seed bytes, file name, mutator, command, genuine peers written beside it, accepted exit codes)
KINDS = {
    "log": ((H200 / "oom.log").read_bytes(), "rank0.log", mutate_text, ["triage"], [], {0, 1, 3}),
    "pyspy-text": (
        (FIXTURES / "stacks/skip/rank00.txt").read_bytes(), "rank00.txt", mutate_text, ["diagnose"],
        [_peer(FIXTURES / "stacks/skip/rank01.txt", "rank01.txt")], {0, 1, 3},
    ),
    "pyspy-json": (
        (FIXTURES / "stacks/skip/rank00.json").read_bytes(), "rank00.json", mutate_json, ["diagnose"],
        [_peer(FIXTURES / "stacks/skip/rank01.json", "rank01.json")], {0, 1, 3},
    ),
    "faulthandler": (FAULTHANDLER, "faulthandler-rank0.txt", mutate_text, ["diagnose"], [], {0, 1, 3}),
    "fr-pickle": (
        (H200 / "size/nccl_trace_rank_0").read_bytes(), "nccl_trace_rank_0", mutate_pickle, ["fr"],
        [_peer(H200 / "size/nccl_trace_rank_1", "nccl_trace_rank_1")], {0, 1, 3},
    ),
    # One rank of a hang across groups, its seven peers genuine: the wait-for graph and p2p counts on hostile
    # entries (states, op ids, groups).
    "fr-cross-group": (
        (CROSS / "fr/nccl_trace_rank_2").read_bytes(), "nccl_trace_rank_2", mutate_pickle, ["fr"],
        [_peer(CROSS / f"fr/nccl_trace_rank_{r}", f"nccl_trace_rank_{r}") for r in (0, 1, 3, 4, 5, 6, 7)], {0, 1, 3},
    ),
    # The watchdog's stacks, with the locals it writes (what c10d's wrapper was passed, recv's src).
    "watchdog-stacks": (
        (PIPELINE / "rank00.txt").read_bytes(), "rank00.txt", mutate_text, ["diagnose"],
        [_peer(PIPELINE / f"rank0{r}.txt", f"rank0{r}.txt") for r in (1, 2, 3)], {0, 1, 3},
    ),
    "fr-json": (
        (JSON_DUMPS / "fr_dump_json_rank_0").read_bytes(), "fr_dump_json_rank_0", mutate_json,
        ["fr"], [_peer(JSON_DUMPS / f"fr_dump_json_rank_{r}", f"fr_dump_json_rank_{r}") for r in (1, 2, 3)], {0, 1, 3},
    ),
    "trace": (
        (H200 / "trace/trace_rank0.json.gz").read_bytes(), "trace_rank0.json.gz", mutate_json, ["trace"],
        [_peer(H200 / "trace/trace_rank1.json.gz", "trace_rank1.json.gz")], {0, 1, 3},
    ),
    "snapshot": (
        (H200 / "oom_snapshot.pickle").read_bytes(), "snapshot.pickle", mutate_pickle, ["memory"], [], {0, 1, 3},
    ),
    "nvml": ((H200 / "nvml.json").read_bytes(), "nvml.json", mutate_json, ["nvlink", "--from"], [], {0, 1, 3}),
    "smi": ((H200 / "nvidia_smi.txt").read_bytes(), "nvidia_smi.txt", mutate_text, ["nvlink", "--from"], [], {0, 1, 3}),
    # a config that lost a required setting makes the command line incomplete: a usage error (2)
    "layout-json": (LAYOUT_JSON, "layout.json", mutate_json, ["check-layout", "--config"], [], {0, 1, 2, 3}),
    "layout-yaml": (LAYOUT_YAML, "layout.yaml", mutate_text, ["check-layout", "--config"], [], {0, 1, 2, 3}),
}  # fmt: skip


def _bounded() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BOUND, MEMORY_BOUND))


def _target(command: list[str], folder: Path, name: str, peers: list) -> list[str]:
    # Verbs that compare ranks read the folder (mutated file and its genuine peers); the others, the file.
    return [*command, str(folder if peers else folder / name)]


CASES = [(kind, n) for kind in KINDS for n in range(MUTATIONS_PER_KIND)]


def _run_case(case: tuple[str, int], root: Path) -> subprocess.CompletedProcess:
    kind, number = case
    seed, name, mutate, command, peers, _ = KINDS[kind]
    folder = root / f"{kind}-{number}"
    folder.mkdir()
    (folder / name).write_bytes(mutate(seed, random.Random(f"{kind}-{number}")))
    for source, peer_name in peers:
        shutil.copy(source, folder / peer_name)
    return subprocess.run(
        [sys.executable, "-m", "torchtriage", *_target(command, folder, name, peers)],
        capture_output=True,
        timeout=TIME_BOUND_S,
        preexec_fn=_bounded,
    )


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory) -> dict[tuple[str, int], subprocess.CompletedProcess]:
    """The selected cases' commands (all, or those `-k` kept), run on every core: each is its own bounded
    process, so threads only wait for them."""
    chosen = [
        (item.callspec.params["kind"], item.callspec.params["number"])
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    ]
    root = tmp_path_factory.mktemp("fuzz")
    with ThreadPoolExecutor(jobs()) as pool:
        return dict(zip(chosen, pool.map(lambda case: _run_case(case, root), chosen), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("kind, number", CASES, ids=lambda v: str(v))
def test_a_mutated_artifact_gets_a_documented_exit(kind, number, outcomes):
    done = outcomes[(kind, number)]
    err = done.stderr.decode(errors="replace")
    assert done.returncode in KINDS[kind][5], err[-2000:]
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    assert "\x1b" not in done.stdout.decode(errors="replace")  # nothing from the input reaches the terminal raw
