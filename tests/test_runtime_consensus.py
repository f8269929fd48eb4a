"""assert_rank_uniform: encoding and report grouping (pure), and real torchrun + gloo jobs (slow)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchtriage.runtime.consensus import (
    RankReport,
    assert_rank_uniform,
    encode,
    format_divergence,
    format_ranks,
    group_by_value,
)

JOBS = Path(__file__).parent / "jobs"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def run_job(script: str, ranks: int, env: dict | None = None, timeout: float = 180) -> tuple[int, str, list[dict]]:
    """Run tests/jobs/<script> under torchrun; return its exit code, its log (stderr) and RESULT records."""
    done = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node", str(ranks), str(JOBS / script)],
        env={**os.environ, "PYTHONUNBUFFERED": "1", "DIST_NCCL_TIMEOUT_MINUTES": "0.5", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = done.stderr
    decoder, records, start = json.JSONDecoder(), [], 0
    while (start := done.stdout.find("RESULT ", start)) != -1:
        record, end = decoder.raw_decode(done.stdout, start + len("RESULT "))
        records.append(record)
        start = end
    return done.returncode, output, records


def test_format_ranks():
    assert format_ranks([7]) == "rank 7"
    assert format_ranks([3, 0, 1, 2]) == "ranks 0-3"
    assert format_ranks([0, 1, 2, 5, 7, 8]) == "ranks 0-2, 5, 7-8"


def test_group_by_value_keeps_first_rank_order():
    assert group_by_value(["a", "b", "a"], [4, 5, 6]) == [("a", [4, 6]), ("b", [5])]


def test_bf16_and_fp8_tensors_hash_by_bytes_without_numpy():
    torch = pytest.importorskip("torch")
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    assert encode(base).digest == encode(base.clone()).digest
    assert encode(base.t().contiguous().t()).digest == encode(base).digest  # layout does not matter
    changed = base.clone()
    changed[1, 1] += 1
    assert encode(changed).digest != encode(base).digest
    assert encode(base.reshape(4, 3)).digest != encode(base).digest  # same bytes, other shape
    assert encode(base.float()).digest != encode(base).digest  # same values, other dtype
    fp8 = torch.ones(4).to(torch.float8_e4m3fn)
    assert encode(fp8).summary.startswith("tensor (4,) float8_e4m3fn #")
    assert encode(torch.tensor(3.0)).digest != encode(torch.tensor(4.0)).digest  # zero-dim


def test_containers_and_objects_encode_stably():
    assert encode({"a": 1, "b": [1, 2]}).digest == encode({"b": [1, 2], "a": 1}).digest
    assert encode({"a": 1}).digest != encode({"a": 1.0}).digest
    assert encode([1, 2]).digest != encode((1, 2)).digest
    assert encode({3, 1, 2}).digest == encode({1, 2, 3}).digest

    class Config:  # default repr holds an address: compared by attributes instead
        def __init__(self, hidden):
            self.hidden = hidden

    assert encode(Config(8)).digest == encode(Config(8)).digest
    assert encode(Config(8)).digest != encode(Config(9)).digest
    cyclic = [1]
    cyclic.append(cyclic)
    assert encode(cyclic).digest == encode(cyclic).digest


def report(summary: str, digest: str, leaves=()) -> RankReport:
    return RankReport(digest=digest, summary=summary, leaves=list(leaves))


def test_report_groups_ranks_by_distinct_value():
    reports = [report("tensor (8, 4096) bfloat16 #aa", "aa")] * 7 + [report("tensor (8, 4095) bfloat16 #bb", "bb")]
    text = format_divergence("batch", reports, list(range(8)))
    assert text.splitlines()[:3] == [
        "assert_rank_uniform('batch'): 2 distinct values across ranks 0-7",
        "  ranks 0-6: tensor (8, 4096) bfloat16 #aa",
        "  rank 7: tensor (8, 4095) bfloat16 #bb",
    ]


def test_report_names_the_differing_entry_of_a_container():
    same = [("['lr']", "0.1", "d1"), ("['layers']", "32", "d2")]
    other = [("['lr']", "0.1", "d1"), ("['layers']", "33", "d3")]
    text = format_divergence("cfg", [report("dict", "x", same), report("dict", "y", other)], [4, 9])
    assert "differs at cfg['layers']:\n    rank 4: 32\n    rank 9: 33" in text
    assert "['lr']" not in text


def test_outside_a_process_group_it_is_a_no_op():
    assert assert_rank_uniform(object(), label="anything", strict=True) is True


@pytest.fixture(scope="module")
def consensus_job():
    pytest.importorskip("torch")
    code, output, records = run_job("runtime_consensus.py", ranks=4)
    assert code == 0, output[-4000:]
    assert len(records) == 4 * 10, output[-4000:]
    by_scenario: dict[str, dict[int, dict]] = {}
    for record in records:
        by_scenario.setdefault(record["scenario"], {})[record["rank"]] = record
    return output, by_scenario


@pytest.mark.slow
def test_uniform_bf16_values_pass_on_every_rank(consensus_job):
    _, results = consensus_job
    assert {r: v["ok"] for r, v in results["uniform_bf16"].items()} == {0: True, 1: True, 2: True, 3: True}


@pytest.mark.slow
def test_divergent_shape_warns_on_every_rank_grouped_and_training_continues(consensus_job):
    output, results = consensus_job
    assert all(not v["ok"] for v in results["shape"].values()) and len(results["shape"]) == 4
    report_text = (
        "assert_rank_uniform('shape'): 2 distinct values across ranks 0-3\n  ranks 0-2: tensor (8, 16) bfloat16 #"
    )
    assert output.count(report_text) == 4  # logged once per rank
    assert output.count("  rank 3: tensor (8, 15) bfloat16 #") == 4
    assert {v["total"] for v in results["continued"].values()} == {4.0}
    assert len(results["done"]) == 4


@pytest.mark.slow
def test_same_shape_different_fp8_bytes_is_found(consensus_job):
    output, results = consensus_job
    assert [results["bytes_fp8"][r]["ok"] for r in range(4)] == [False] * 4
    assert "  rank 1: tensor (4,) float8_e4m3fn #" in output


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["strict", "strict_one_rank", "strict_env"])
def test_strict_raises_the_same_error_on_every_rank(consensus_job, scenario):
    _, results = consensus_job
    raised = results[scenario]
    assert sorted(raised) == [0, 1, 2, 3]
    assert {v.get("raised") for v in raised.values()} == {"RankDivergenceError"}
    messages = {v["message"] for v in raised.values()}
    assert len(messages) == 1
    assert "rank 3:" in messages.pop()


@pytest.mark.slow
def test_nested_difference_is_located(consensus_job):
    output, results = consensus_job
    assert [results["nested"][r]["ok"] for r in range(4)] == [False] * 4
    assert output.count("differs at nested['cfg']['layers']:\n    ranks 0-1, 3: 32\n    rank 2: 33") == 4


@pytest.mark.slow
def test_subgroups_check_only_their_members(consensus_job):
    output, results = consensus_job
    assert {r: v["ok"] for r, v in results["subgroup"].items()} == {0: True, 1: True, 2: False, 3: False}
    assert (
        output.count("assert_rank_uniform('subgroup'): 2 distinct values across ranks 2-3\n  rank 2: tensor (3,)") == 2
    )
