"""Where a framework decides whose failure it was, the verdict follows its decision, and names no machine the
decision clears. Logs written from the programs' format strings (each test says which)."""

from conftest import triage_json

# Megatron-LM megatron/core/rerun_state_machine.py, validate_result(): the second rerun runs on another GPU, from
# a checkpoint; log_failure() prints f"Rank {rank}, node {node}, device {device}: {message}!" of *that* GPU.
SECOND_RERUN = [
    "WARNING:megatron.core.rerun_state_machine:Result validation enabled",
    "WARNING:megatron.core.rerun_state_machine:Second rerun: unexpected result is not reproducible on a different "
    "GPU, therefore was likely incorrect (2.0625 != nan)",
    "ERROR:megatron.core.rerun_state_machine:Rank 2, node dgx-b11, device 2, iteration #1200: Possible persistent "
    "error!!",
    "WARNING:megatron.core.rerun_state_machine:Exiting now. A checkpoint at the last iteration already exists if "
    "further examination is needed",
]


def write(tmp_path, lines):
    path = tmp_path / "job.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_megatrons_persistent_error_names_no_rank_on_the_healthy_gpu_that_found_it(tmp_path):
    # The GPU that printed the line computed the right value; the faulty one ran rank 2 before the restart.
    for prefix in ("", "[rank2]: "):
        code, verdict = triage_json(write(tmp_path, [prefix + line for line in SECOND_RERUN]))
        assert (verdict["category"], verdict["culprit_ranks"]) == ("gpu_fault", []), verdict["summary"]
        assert "dgx-b11" not in str(verdict.get("facts", {}).get("culprit_machines"))
        assert verdict["actions"][0]["title"] == "Take the GPU rank 2 ran on before the restart out of service"
