"""The step monitor on a GPU, replayed: the windows recorded by `tests/gpu/record_monitor_gpu.py` (2 ranks
sharing one H100/H200 through NCCL, a GPT-style model under `torchtriage run --monitor --monitor-window 10`,
one case of slowness each, `tests/jobs/monitor_gpu_cases.py`) through the decision, as every rank ran it.

Each case's folder holds what the job wrote: steps-rank0.jsonl and steps-rank1.jsonl (every window's
numbers, exactly those the ranks exchanged) and stragglers.jsonl (what the job decided while it ran).
"""

import json
import sys
from pathlib import Path

import pytest

from torchtriage.runtime import step_phases
from torchtriage.runtime import straggler as S

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "monitor_gpu"
sys.path.insert(0, str(ROOT / "tests" / "jobs"))
from monitor_gpu_cases import EXPECTED  # noqa: E402

# The recordings share one GPU between both ranks. There, rank 1's extra forward (`compute`) runs on the device
# rank 0 uses too and delays rank 0's kernels as much as its own: rank 0's device forward is the longer one in
# the recording, so no rank's own time stands out. Naming nobody is right on one shared GPU (naming rank 0
# would be wrong); the case shows its straggler with a GPU per rank.
ON_ONE_SHARED_GPU = {"compute": None}


def expected_on_one_gpu(case: str):
    return ON_ONE_SHARED_GPU.get(case, EXPECTED[case])


def recording(case: str) -> Path:
    folder = FIXTURES / case
    if not (folder / "steps-rank0.jsonl").is_file():
        pytest.skip(
            f"no GPU recording of {case!r} in {folder}: record it on a machine with one GPU "
            f"(`PYTHONPATH=src python tests/gpu/record_monitor_gpu.py OUT`) and copy OUT/{case}/ there"
        )
    return folder


def windows(folder: Path) -> list[tuple[int, int, dict[int, dict]]]:
    """The windows every rank wrote, in order: (first step, last step, rank -> the decision's input)."""
    by_rank = {}
    for path in sorted(folder.glob("steps-rank*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        assert all(r["schema"] == "torchtriage.monitor/2" for r in records), f"{path}: record it again"
        by_rank[int(path.stem.removeprefix("steps-rank"))] = {(r["first_step"], r["last_step"]): r for r in records}
    spans = sorted(set.intersection(*(set(spans) for spans in by_rank.values())))
    return [(a, b, {rank: step_phases.decision_input(by_rank[rank][(a, b)]) for rank in by_rank}) for a, b in spans]


def said(decisions) -> set[tuple]:
    return {(d["kind"], d["rank"], d["reason"]) for d in decisions}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_a_gpu_recording_replays_into_its_expected_decision(case):
    recorded = windows(recording(case))
    assert len(recorded) >= 6, "too few windows to decide: the monitor judges from the fourth"
    assert all(stats[1]["gpu"] is not None for _, _, stats in recorded[1:]), "the device's forward was not timed"
    decider = S.Decider()
    decisions = [d for first, last, stats in recorded for d in decider.window(first, last, stats)]
    expected = expected_on_one_gpu(case)
    assert said(decisions) == ({expected} if expected else set()), [d["line"] for d in decisions]


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_what_the_gpu_job_decided_while_it_ran_names_no_other_rank(case):
    folder = recording(case)
    path = folder / "stragglers.jsonl"
    live = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    expected = expected_on_one_gpu(case)
    assert said(live) <= ({expected} if expected else set()), [d["line"] for d in live]


def test_on_one_shared_gpu_the_extra_forward_lengthens_the_peers_device_forward_too():
    """Why `compute` names nobody on one GPU: the slow rank's device forward is not the longer one."""
    folder = recording("compute")
    medians = {}
    for rank in (0, 1):
        lines = (folder / f"steps-rank{rank}.jsonl").read_text().splitlines()
        values = sorted(json.loads(line)["gpu_forward_ms"] for line in lines[3:] if line.strip())
        medians[rank] = values[len(values) // 2]
    assert medians[0] >= medians[1], medians
