"""What the runtime helpers wrote on 2xH200, read back by the offline verbs."""

import json

from conftest import FIXTURES, run_cli
from torchtriage import exit_codes

RUNTIME = FIXTURES / "h200x2_runtime"


def test_the_oom_snapshot_written_by_the_attribution_hook_names_the_request_and_the_site():
    done = run_cli("memory", "--json", RUNTIME / "memory" / "oom-oomcase-rank01.pickle")
    assert done.returncode == exit_codes.PROBLEM_FOUND, done.stderr.decode()
    verdict = json.loads(done.stdout)
    assert verdict["category"] == "oom"
    assert "8.00 GiB request" in verdict["summary"]
    assert "check_memory_profiler.py:125" in verdict["summary"]


def test_profile_steps_traces_from_nccl_ranks_are_read_with_their_collectives():
    done = run_cli("trace", "--json", RUNTIME / "profiler")
    facts = json.loads(done.stdout)["facts"]
    assert [r["rank"] for r in facts["ranks"]] == [0, 1]
    assert all(r["has_gpu"] for r in facts["ranks"])
    for rank in facts["ranks"]:
        for step in rank["steps"]:
            parts = step["compute"] + step["communication"] + step["memory"] + step["idle"]
            assert abs(parts - step["duration"]) < 1e-3 * step["duration"]
            assert step["communication"] > 0  # the NCCL all_reduce kernels are counted
    assert facts["collectives"], "the NCCL collectives were matched across the two ranks"
