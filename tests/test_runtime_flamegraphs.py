"""record_flamegraphs: this rank samples itself with py-spy, in the background, and gets its flame graphs."""

import subprocess
import sys
from pathlib import Path

import pytest

PY_SPY = Path(sys.executable).parent / "py-spy"


@pytest.mark.slow
@pytest.mark.skipif(not PY_SPY.exists(), reason="py-spy is not installed next to this Python")
def test_a_rank_records_its_own_flame_graphs_while_it_works(tmp_path):
    program = (
        "import time\n"
        "from torchtriage.runtime.profiler import record_flamegraphs\n"
        f"recording = record_flamegraphs({str(tmp_path)!r}, duration=2, rate=50, ranks='all')\n"
        "def busy_step():\n"
        "    deadline = time.monotonic() + 6\n"
        "    while time.monotonic() < deadline:\n"
        "        sum(i * i for i in range(1000))\n"
        "busy_step()\n"
        "print(recording.wait())\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    svgs = list(tmp_path.rglob("*.svg"))
    speedscope = list(tmp_path.rglob("*speedscope*"))
    assert svgs and speedscope, sorted(p.name for p in tmp_path.rglob("*"))
    assert "busy_step" in svgs[0].read_text()
