"""Each rank's GPU in its identity record and in the verdict (1 GPU or more).

Run on a machine with a GPU, from the repository root:
    PYTHONPATH=src python3 tests/gpu/check_identity.py
Two ranks under `torchtriage run` (torchrun, gloo collectives) each hold memory on a GPU (local rank modulo the
GPUs seen); rank 1 stops. Checks that each rank's record names the GPU it holds memory on as nvidia-smi names it
(UUID and PCI bus id), that the record written at start had no GPU (CUDA is never initialised by torchtriage), and
that `diagnose` on the run folder names the culprit's GPU. Prints one PASS/FAIL line per check; exits 1 on a FAIL.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
failed = []


def check(name, ok, detail=""):
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}", flush=True)
    if not ok:
        failed.append(name)


def smi() -> list[dict]:
    query = ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"]
    rows = subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip().splitlines()
    return [
        dict(zip(("index", "uuid", "pci_bus_id"), (c.strip() for c in row.split(",")), strict=True)) for row in rows
    ]


out = Path(tempfile.mkdtemp()) / "run"
env = {**os.environ, "FAULT": "rank:1", "FAULT_ON_GPU": "1", "PYTHONUNBUFFERED": "1"}
env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
command = [sys.executable, "-m", "torchtriage", "run", "--out", str(out), "--stall-seconds", "3", "--"]
command += [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
command += [str(ROOT / "tests" / "jobs" / "faulty_machine.py")]
job = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
start_records = {}
try:
    deadline = time.monotonic() + 240
    while not (out / "hang" / "verdict.json").exists() and time.monotonic() < deadline:
        for rank in (0, 1):
            path = out / "identity" / f"rank{rank}.json"
            if rank not in start_records and path.exists():
                start_records[rank] = json.loads(path.read_text())
        time.sleep(0.2)
    time.sleep(6)  # the GPU watcher looks every few seconds
finally:
    os.killpg(job.pid, signal.SIGTERM)
    output = job.communicate(timeout=60)[0].decode(errors="replace")
check("verdict_written", (out / "hang" / "verdict.json").exists(), output[-2000:] if failed else "")
check("no_gpu_at_start", all(r.get("gpu") is None for r in start_records.values()), str(start_records))
cards = smi()
for rank in (0, 1):
    record = json.loads((out / "identity" / f"rank{rank}.json").read_text())
    gpu = record.get("gpu") or {}
    card = cards[rank % len(cards)]
    check(f"rank{rank}_gpu_uuid", gpu.get("uuid") == card["uuid"], f"{gpu} vs {card}")
    check(f"rank{rank}_gpu_bus_id", gpu.get("pci_bus_id") == card["pci_bus_id"], f"{gpu} vs {card}")
diagnose = [sys.executable, "-m", "torchtriage", "diagnose", str(out)]
verdict = json.loads(subprocess.run([*diagnose, "--json"], env=env, capture_output=True).stdout)
machine = (verdict.get("culprit_machines") or [{}])[0]
check("verdict_names_the_culprits_gpu", machine.get("gpu_uuid") == cards[1 % len(cards)]["uuid"], str(machine))
text = subprocess.run(diagnose, env=env, capture_output=True).stdout
print(text.decode(errors="replace").split("summary")[0], flush=True)
sys.exit(1 if failed else 0)
