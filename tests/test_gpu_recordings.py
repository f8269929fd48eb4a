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


NONFINITE = FIXTURES / "h200x1" / "nonfinite"


def test_the_locator_checks_recorded_on_cuda_all_passed_and_name_the_origin():
    recorded = json.loads((NONFINITE / "check_nonfinite.json").read_text())
    assert recorded["device"] == "NVIDIA H200" and recorded["checks"]
    failed = [name for name, check in recorded["checks"].items() if not check["ok"]]
    assert failed == []
    assert "aten._to_copy in the forward of head" in recorded["checks"]["cuda_fp16_autocast_overflow"]["detail"]
    assert "replayed eagerly" in recorded["checks"]["cuda_inductor_compiled_replayed_eagerly"]["detail"]
    for report in recorded["attention"][:-1]:  # every SDPA backend runs on the H200 at these shapes
        assert {e["backend"] for e in report["backends"] if e["available"]} == {"math", "flash", "efficient", "cudnn"}


def test_the_guards_cuda_log_lines_are_read_by_triage():
    done = run_cli("triage", "--json", NONFINITE / "check_nonfinite.log")
    verdict = json.loads(done.stdout)
    assert verdict["category"] == "nan_inf" and verdict["culprit_ranks"] == [0]
    kinds = [f["kind"] for f in verdict["findings"]]
    assert kinds[0] == "nan_inf.origin_data" and "nan_inf.origin_loss_scale" in kinds
    assert any("layers.2.act" in a["detail"] for a in verdict["actions"])


def test_anomaly_mode_names_the_loss_where_the_locator_names_the_planted_layer():
    for size in (256, 1024, 2048):
        recorded = json.loads((NONFINITE / f"overhead_d{size}.json").read_text())["origin"]
        assert "LogSoftmaxBackward0" in recorded["detect_anomaly"]
        assert recorded["locate_nonfinite"]["module"] == recorded["planted"] == "layers.7.mlp.0"


def test_the_monitor_on_cuda_timed_the_device_and_the_launch_apart():
    windows = [
        json.loads(line) for line in (FIXTURES / "h200x1" / "monitor" / "steps-rank0.jsonl").read_text().splitlines()
    ]
    assert [(w["first_step"], w["last_step"]) for w in windows] == [(1, 10), (11, 20), (21, 30)]
    last = windows[-1]
    assert last["gpu_forward_ms"] > last["forward_ms"] > 0  # the CPU launches while the device computes
    assert last["gpu_step_ms"] > last["gpu_forward_ms"]
    assert 0 < last["mfu"] < 1 and last["peak_allocated_gib"] > 1
