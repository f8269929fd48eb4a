"""A profiler trace of many steps costs work linear in its steps: each step's record is looked up, not searched
for in the list of steps, and each step's collectives are found by bisection. Held by counting the walks over
the lists (not by timing), on traces of thousands of steps written as files and read by the real reader."""

from __future__ import annotations

import json

import pytest

from torchtriage.analysis.trace import summarise_rank
from torchtriage.sources.profiler_trace import read_trace

STEP_US = 1000.0


class Walked(list):
    """A list that counts how often it is walked from its start."""

    def __init__(self, items) -> None:
        super().__init__(items)
        self.walks = 0

    def __iter__(self):
        self.walks += 1
        return super().__iter__()


def _event(cat: str, name: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def _comm(ts: float, ext: int) -> dict:
    return _event(
        "cpu_op", "record_param_comms", ts, 50, **{"External id": ext, "Collective name": "allreduce",
        "In msg nelems": 1024, "Out msg nelems": 1024, "dtype": "Float", "Process Group Name": "0",
        "Process Group Ranks": "[0, 1]", "Group size": 2},
    )  # fmt: skip


def write_trace(path, steps: int, gpu: bool, repeat_numbers: bool = False) -> None:
    """Every step: a `data` range of 100 µs, a collective 7 µs after the step starts, and on a GPU a compute
    kernel of 500 µs launched at the step's start. With `repeat_numbers`, a second profiling session numbers
    its steps from 0 again, as two `profile()` contexts in one trace do."""
    events = []
    for index in range(steps):
        start = index * STEP_US
        number = index % (steps // 2) if repeat_numbers else index
        events.append(_event("user_annotation", f"ProfilerStep#{number}", start, STEP_US - 1))
        events.append(_event("user_annotation", "data", start, 100))
        events.append(_comm(start + 7, index))
        if gpu:
            events.append(_event("cuda_runtime", "cudaLaunchKernel", start + 1, 1, correlation=index))
            kernel = _event("kernel", "sm90_gemm", start + 10, 500, correlation=index, **{"External id": index})
            events.append(kernel | {"pid": 0, "tid": 7})
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 2},
                                "traceEvents": events}))  # fmt: skip


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "cpu-only"])
def test_a_trace_of_thousands_of_steps_walks_its_steps_and_collectives_a_few_times(tmp_path, gpu):
    path = tmp_path / "rank0.trace.json"
    write_trace(path, 3000, gpu)
    trace = read_trace(str(path))
    trace.steps, trace.collectives = Walked(trace.steps), Walked(trace.collectives)
    summary = summarise_rank(trace)
    assert len(summary.steps) == 3000
    assert trace.steps.walks <= 10, f"the steps were walked {trace.steps.walks} times for 3000 steps"
    assert trace.collectives.walks <= 10, f"the collectives were walked {trace.collectives.walks} times"
    assert summary.first_collective_offset == 7
    assert summary.phases == {"data": 100}
    if gpu:
        assert {s.compute for s in summary.steps} == {500}
        assert {s.cpu_duration for s in summary.steps} == {STEP_US - 1}
    else:
        assert {s.collective_cpu for s in summary.steps} == {50}


def test_steps_numbered_twice_are_each_timed_from_the_first_of_their_number(tmp_path):
    path = tmp_path / "rank0.trace.json"
    write_trace(path, 400, gpu=True, repeat_numbers=True)
    summary = summarise_rank(read_trace(str(path)))
    # Each session's step N is reported; its CPU time is taken from the first step N, as it always was.
    assert [s.step for s in summary.steps] == list(range(200)) * 2
    assert {s.cpu_duration for s in summary.steps} == {STEP_US - 1}
    assert summary.first_collective_offset == 7
