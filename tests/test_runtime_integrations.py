"""The Lightning example for real (torchrun + gloo), and both framework examples without their library."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TORCHRUN = Path(sys.executable).parent / "torchrun"


@pytest.mark.slow
def test_guard_in_lightning_optimizer_step_under_torchrun(tmp_path):
    # examples/lightning_module.py: DDP over gloo, 2 ranks x 4 steps x 2 epochs; rank 1's gradient is
    # poisoned at optimizer step 5; the guard in `optimizer_step` must skip it on both ranks.
    pytest.importorskip("lightning")
    done = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(EXAMPLES / "lightning_module.py")],
        env={**os.environ, "INJECT_NAN_STEP": "5", "MAX_EPOCHS": "2"},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    summaries = re.findall(r"rank (\d): ([^\n]*?), weights checksum (-?\d+\.\d{6})", done.stdout)
    assert sorted(rank for rank, _, _ in summaries) == ["0", "1"], output[-4000:]
    for _, summary, _ in summaries:
        # Lightning still counts the skipped step as an optimizer step: global_step is 8, 7 were applied.
        assert summary == "global_step 8, 7 applied, nonfinite_steps_skipped=1, skipped steps [5]"
    assert len({checksum for _, _, checksum in summaries}) == 1  # the replicas did not fork
    assert "at step 5: the update is skipped on every rank" in output
    assert "non-finite gradients on rank(s) [1]" in output


@pytest.mark.parametrize(
    ("example", "library"), [("hf_trainer.py", "transformers"), ("lightning_module.py", "lightning")]
)
def test_example_without_its_library_says_so_and_exits_0(example, library):
    code = (
        f"import sys, runpy; sys.modules[{library!r}] = None; "
        f"runpy.run_path({str(EXAMPLES / example)!r}, run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("skipping: this example needs") and library in done.stdout
