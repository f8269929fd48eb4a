"""Record the step monitor on one GPU: 2 ranks sharing it through NCCL, one case of slowness per job.

Run from the repository root on a machine with one GPU (no network needed):

    PYTHONPATH=src python tests/gpu/record_monitor_gpu.py "$OUT"             # every case, under 8 minutes
    PYTHONPATH=src python tests/gpu/record_monitor_gpu.py OUT --cases data even
    PYTHONPATH=src python tests/gpu/record_monitor_gpu.py OUT --cpu          # the same jobs, tiny, on gloo
    PYTHONPATH=src python tests/gpu/record_monitor_gpu.py "$OUT" --archive   # all in OUT/monitor_gpu.tar.gz

Each case is `torchtriage run --monitor --monitor-window 10 -- torchrun --nproc_per_node 2
tests/jobs/monitor_gpu_job.py` (both ranks on CUDA device 0, each its own NCCL_HOSTID). OUT/<case>/ gets
the monitor's files (steps-rank0.jsonl, steps-rank1.jsonl, stragglers.jsonl when a decision was made), the
job's output (job.log) and what was expected against what was decided (expected.json). A line per case
says whether the decisions were the expected ones; the exit code is 0 when every case ran (whatever was
decided: the recordings are what `tests/test_monitor_gpu.py` checks), 1 when a case failed to run, 4 when
there is no GPU (without --cpu). Copy OUT/<case>/ to tests/fixtures/monitor_gpu/<case>/ (with --archive:
`tar xzf monitor_gpu.tar.gz -C tests/fixtures/monitor_gpu`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "jobs" / "monitor_gpu_job.py"
sys.path.insert(0, str(JOB.parent))
from monitor_gpu_cases import EXPECTED  # noqa: E402 - the one table of cases, beside the job

CASES = tuple(EXPECTED)
TOTAL_SECONDS = 450  # the whole recording stays under 8 minutes
TINY = {"LAYERS": "2", "WIDTH": "64", "SEQ": "32", "BATCH": "4", "VOCAB": "256", "STEPS": "60"}


def fail(message: str, code: int) -> None:
    print(f"record_monitor_gpu: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def check_device(cpu: bool) -> str:
    try:
        import torch
    except ImportError as error:
        fail(f"torch cannot be imported ({error}); run with the environment that trains", 4)
    if cpu:
        return f"CPU, gloo, torch {torch.__version__}"
    if not torch.cuda.is_available():
        fail("no CUDA device is visible (torch.cuda.is_available() is False); use --cpu to check the jobs on CPU", 4)
    if not torch.distributed.is_nccl_available():
        fail("this torch has no NCCL; the GPU cases need it", 4)
    return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"


def job_environment(case: str, folder: Path, cpu: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    env.update({"MONITOR_CASE": case, "MONITOR_OUT": str(folder), "PYTHONUNBUFFERED": "1"})
    if cpu:
        env.update({"DEVICE": "cpu", **{k: v for k, v in TINY.items() if k not in os.environ}})
    else:
        env.setdefault("CUDA_DEVICE", "0")
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")  # one host: its loopback, whatever else it has
        env.setdefault("NCCL_IB_DISABLE", "1")
    return env


def record_case(case: str, out: Path, cpu: bool, seconds: float) -> bool:
    folder = Path(tempfile.mkdtemp(prefix=f"monitor-{case}-"))
    command = [sys.executable, "-m", "torchtriage", "run", "--monitor", "--monitor-window", "10", "--out", str(folder)]
    command += ["--", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(JOB)]
    target = out / case
    target.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    try:
        done = subprocess.run(
            command, env=job_environment(case, folder, cpu), capture_output=True, text=True, timeout=seconds, cwd=ROOT
        )
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as error:
        output = (error.stdout or b"").decode(errors="replace") + (error.stderr or b"").decode(errors="replace")
        code = f"timed out after {seconds:.0f} s"
    (target / "job.log").write_text(output)
    for name in ("steps-rank0.jsonl", "steps-rank1.jsonl", "stragglers.jsonl"):
        if (folder / "monitor" / name).is_file():
            shutil.copy(folder / "monitor" / name, target / name)
    decisions = _decisions(folder)
    shutil.rmtree(folder, ignore_errors=True)
    named = sorted({(d["kind"], d["rank"], d["reason"]) for d in decisions}, key=str)
    expected = EXPECTED[case]
    right = named == ([expected] if expected else [])  # the expected decision, and nothing else
    (target / "expected.json").write_text(json.dumps({"case": case, "expected": expected, "decided": named}) + "\n")
    windows = (
        len((target / "steps-rank0.jsonl").read_text().splitlines()) if (target / "steps-rank0.jsonl").is_file() else 0
    )
    status = "ran" if code == 0 else f"FAILED ({code})"
    verdict = "as expected" if right else f"expected {expected or 'nothing'}"
    print(
        f"{case:8s} {status}, {time.monotonic() - began:.0f} s, {windows} windows: decided {named or 'nothing'}"
        f" — {verdict}",
        flush=True,
    )
    if code != 0:
        print("\n".join("    " + line for line in output.splitlines()[-25:]), flush=True)
    return code == 0


def _decisions(folder: Path) -> list[dict]:
    path = folder / "monitor" / "stragglers.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="where each case's folder goes")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument(
        "--cpu", action="store_true", help="the jobs on CPU + gloo, tiny: checks them, records nothing useful"
    )
    parser.add_argument("--archive", action="store_true", help="pack every case's folder into OUT/monitor_gpu.tar.gz")
    parser.add_argument("--seconds", type=float, default=TOTAL_SECONDS, help="the whole recording's budget")
    args = parser.parse_args()
    print(f"recording on {check_device(args.cpu)}", flush=True)
    deadline = time.monotonic() + args.seconds
    ran = True
    for index, case in enumerate(args.cases):
        left = deadline - time.monotonic()
        share = left / (len(args.cases) - index)  # what is left, shared among the cases still to run
        if share < 30:
            print(f"{case:8s} not run: {left:.0f} s left of the {args.seconds:.0f} s budget", flush=True)
            ran = False
            continue
        ran = record_case(case, args.out, args.cpu, min(share * 1.5, left)) and ran
    if args.archive:
        with tarfile.open(args.out / "monitor_gpu.tar.gz", "w:gz") as archive:
            for case in args.cases:
                if (args.out / case).is_dir():
                    archive.add(args.out / case, arcname=case)
                    shutil.rmtree(args.out / case)
        print(f"every case's folder is in {args.out / 'monitor_gpu.tar.gz'}", flush=True)
    sys.exit(0 if ran else 1)


if __name__ == "__main__":
    main()
