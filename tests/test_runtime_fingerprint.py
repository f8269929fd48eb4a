"""check_collectives: fingerprint comparison (pure), patching, and real torchrun + gloo jobs (slow)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchtriage.runtime.fingerprint import check_collectives, describe_call, find_mismatches, format_mismatch

JOBS = Path(__file__).parent / "jobs"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def run_job(script: str, ranks: int, env: dict | None = None, timeout: float = 180) -> tuple[int, str, list[dict]]:
    """Run tests/jobs/<script> under torchrun; return its exit code, its log (stderr) and RESULT records."""
    done = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node", str(ranks), str(JOBS / script)],
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    decoder, records, start = json.JSONDecoder(), [], 0
    while (start := done.stdout.find("RESULT ", start)) != -1:
        record, end = decoder.raw_decode(done.stdout, start + len("RESULT "))
        records.append(record)
        start = end
    return done.returncode, done.stderr, records


def fingerprint(op, fields, cross=None, rank=0, site="train.py:10 in step"):
    return {"op": op, "group": "0", "seq": 3, "fields": fields, "cross": cross or {}, "site": site, "rank": rank}


def test_matching_fingerprints_have_no_problems():
    fps = [fingerprint("all_reduce", {"shape": [16], "dtype": "float32"}, rank=r) for r in range(4)]
    assert find_mismatches(fps, [0, 1, 2, 3]) == []


def test_size_mismatch_names_expected_and_actual_per_rank():
    fps = [fingerprint("all_reduce", {"shape": [17 if r == 2 else 16], "dtype": "float32"}, rank=r) for r in range(4)]
    problems = find_mismatches(fps, [0, 1, 2, 3])
    assert problems == ["shape: ranks 0-1, 3: (16,); rank 2: (17,)"]
    text = format_mismatch(fps, [0, 1, 2, 3], problems)
    assert "collective #3 on process group 0 (ranks 0-3) does not match" in text
    assert "    rank 2: all_reduce(shape=(17,), dtype=float32) at train.py:10 in step" in text


def test_op_mismatch_is_reported_before_fields():
    fps = [fingerprint("all_reduce", {"shape": [4]}), fingerprint("broadcast", {"shape": [4], "src": 0}, rank=1)]
    assert find_mismatches(fps, [0, 1]) == ["op: rank 0: all_reduce; rank 1: broadcast"]


def test_all_to_all_single_splits_must_pair_up():
    torch = pytest.importorskip("torch")
    calls = [
        {
            "input": torch.zeros(3, 2),
            "output": torch.zeros(3, 2),
            "input_split_sizes": [1, 2],
            "output_split_sizes": [1, 2],
        },
        {
            "input": torch.zeros(3, 2),
            "output": torch.zeros(4, 2),
            "input_split_sizes": [2, 1],
            "output_split_sizes": [3, 1],
        },
    ]
    fps = []
    for rank, args in enumerate(calls):
        fields, cross = describe_call("all_to_all_single", args, 2)
        fps.append(fingerprint("all_to_all_single", fields, cross, rank=rank))
    assert find_mismatches(fps, [0, 1]) == ["splits: rank 0 sends 2 to rank 1, which expects 3"]
    fps[1]["cross"]["output_splits"] = [2, 1]
    assert find_mismatches(fps, [0, 1]) == []


def test_all_gather_input_must_match_the_slot_peers_expect():
    torch = pytest.importorskip("torch")
    fps = []
    for rank, n in enumerate([4, 5]):
        fields, cross = describe_call("all_gather", {"tensor_list": [torch.zeros(4)] * 2, "tensor": torch.zeros(n)}, 2)
        fps.append(fingerprint("all_gather", fields, cross, rank=rank))
    assert find_mismatches(fps, [0, 1]) == ["input shape: rank 1 sends (5,) but every rank expects (4,) from it"]


def test_checking_patches_torch_and_restores_it():
    dist = pytest.importorskip("torch.distributed")
    original = dist.all_reduce, dist.distributed_c10d.barrier
    with check_collectives():
        with check_collectives(timeout=5):  # nests
            assert dist.all_reduce is not original[0]
            assert dist.all_reduce.__torchtriage_original__ is original[0]
        assert dist.distributed_c10d.barrier is not original[1]
    assert (dist.all_reduce, dist.distributed_c10d.barrier) == original


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, ranks, expected",
    [
        ("size", 3, ["shape: ranks 0, 2: (16,); rank 1: (17,)", "rank 1: all_reduce(shape=(17,)"]),
        ("env", 2, ["shape: rank 0: (16,); rank 1: (17,)", "runtime_fingerprint.py"]),
        ("op", 2, ["op: rank 0: all_reduce; rank 1: all_gather_into_tensor"]),
        ("groups", 2, ["deadlock", "rank 0: all_reduce #0 on process group 1", "on process group 2"]),
    ],
)
def test_mismatch_raises_on_every_rank_before_hanging(mode, ranks, expected):
    pytest.importorskip("torch")
    env = {"FP_MODE": mode, "DIST_NCCL_TIMEOUT_MINUTES": "0.5"}  # the PG timeout is only a safety net
    if mode == "env":
        env["TORCHTRIAGE_CHECK_COLLECTIVES"] = "1"
    code, log, records = run_job("runtime_fingerprint.py", ranks, env)
    # Had the collective been issued, the 30 s process-group timeout would have raised instead.
    assert sorted(r["rank"] for r in records) == list(range(ranks)), log[-3000:]
    assert {r.get("raised") for r in records} == {"CollectiveMismatchError"}
    messages = {r["message"] for r in records}
    assert len(messages) == 1  # the same error on every rank
    message = messages.pop()
    for text in expected:
        assert text in message
    assert all(r["seconds"] < 15 for r in records)  # well before the 30 s process-group timeout
    assert all(r["restored"] for r in records) or mode == "env"


@pytest.mark.slow
def test_matching_collectives_of_every_kind_pass():
    pytest.importorskip("torch")
    code, log, records = run_job("runtime_fingerprint.py", 3, {"FP_MODE": "ok", "DIST_NCCL_TIMEOUT_MINUTES": "0.5"})
    assert code == 0, log[-3000:]
    assert [r.get("passed") for r in sorted(records, key=lambda r: r["rank"])] == [True, True, True]
    assert all(r["restored"] for r in records)
