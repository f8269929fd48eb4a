"""Every node of a SLURM job: the node-local capture run on each node as one extra job step, into a shared
folder, then the merged folder read as one job.

    srun --overlap --jobid JOBID --ntasks-per-node=1 --kill-on-bad-exit=0 <this python> -m torchtriage dump --out DIR

`--overlap` lets the step share the CPUs the training step holds (without it the step waits for free
resources: forever); one task per node; a node whose capture fails does not stop the others. Each node's
`dump` writes `DIR/<host>-<time>/` (its host in the name, so nodes never clash), and `diagnose DIR` reads
them together. The same Python (a shared venv or the job's container) must exist on the nodes.

Each node's capture runs in the step's environment, which carries the job's id (SLURM_JOB_ID): on a node shared
with other jobs it takes this job's ranks (collect/discovery.py). Where srun is not on PATH (a shell on one of the
job's nodes), the capture runs on this node alone in that same environment, and says that the other nodes were
not reached.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from torchtriage.collect.discovery import SLURM_PLACE_VARS
from torchtriage.errors import EnvironmentProblem, UsageError
from torchtriage.protocol import host_name, make_private_folders, open_to_others

_STEP_SLACK_S = 60.0  # past the per-rank timeouts, for srun to place the step and the nodes to start Python


def check_jobid(jobid: str) -> None:
    if not jobid.replace("_", "").isdigit():
        raise UsageError(f"--slurm {jobid}: give the job's id (squeue -u $USER), e.g. --slurm 123456")


def step_command(jobid: str, verb_args: list[str]) -> list[str]:
    check_jobid(jobid)
    srun = shutil.which("srun")
    if srun is None:
        raise EnvironmentProblem(
            "srun is not on PATH: run this where SLURM's commands are (a login node of the cluster, or inside "
            "the job's allocation)"
        )
    return [srun, "--overlap", "--jobid", jobid, "--ntasks-per-node=1", "--kill-on-bad-exit=0"] + [
        sys.executable,
        "-m",
        "torchtriage",
        *verb_args,
    ]


def step_environment(jobid: str, environ: dict[str, str]) -> dict[str, str]:
    """The environment a step of job `jobid` gives the capture on this node: the job's id (and none of another
    job's place), so that the node's capture takes that job's ranks, never another job's on the same node."""
    env = {name: value for name, value in environ.items() if name not in SLURM_PLACE_VARS}
    return {**env, "SLURM_JOB_ID": jobid}


def run_here(jobid: str, verb_args: list[str], timeout_s: float) -> list[str]:
    """Where srun is not on PATH (a shell on one of the job's nodes): `torchtriage <verb_args>` on this node alone,
    as a step of the job would run it. The problems, first that the other nodes were not reached."""
    check_jobid(jobid)
    problems = [
        f"srun is not on PATH: only this node ({host_name()}) was captured, its ranks of SLURM job {jobid}; run "
        "this where SLURM's commands are (a login node) to reach every node of the job"
    ]
    command = [sys.executable, "-m", "torchtriage", *verb_args]
    env = step_environment(jobid, dict(os.environ))
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return [*problems, f"the capture did not finish within {timeout_s:g} s; what landed is read"]
    if done.returncode != 0:
        tail = " | ".join(line for line in done.stderr.strip().splitlines()[-4:] if line.strip())
        problems.append(f"the capture on this node returned {done.returncode}: {tail}")
    return problems


def default_folder(jobid: str) -> Path:
    """In the working directory, which on a cluster is usually on a file system every node sees."""
    return Path(f"torchtriage-slurm-{jobid}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()


def run_step(jobid: str, verb_args: list[str], timeout_s: float) -> list[str]:
    """Run `torchtriage <verb_args>` on every node of the job; the problems it reported (never raises for a
    node that failed: what the others wrote is still read)."""
    command = step_command(jobid, verb_args)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s + _STEP_SLACK_S, check=False)
    except subprocess.TimeoutExpired:
        return [f"the srun step did not finish within {timeout_s + _STEP_SLACK_S:g} s; what landed is read"]
    except OSError as err:
        raise EnvironmentProblem(f"cannot run srun ({err.strerror or err})") from None
    if done.returncode == 0:
        return []
    tail = " | ".join(line for line in done.stderr.strip().splitlines()[-4:] if line.strip())
    return [f"srun returned {done.returncode} (a node's capture failed, or the job id is wrong): {tail}"]


def capture_every_node(jobid: str, out: Path | None, timeout_s: float, native: bool = False) -> tuple[Path, list[str]]:
    """`dump` on every node of the job into one folder; the folder, and the problems."""
    args = ["dump", "--timeout", f"{timeout_s:g}"] + (["--native"] if native else [])
    return on_every_node(jobid, args, out, timeout_s * 2)  # a rank gets two py-spy runs: text, then JSON


def on_every_node(jobid: str, verb_args: list[str], out: Path | None, step_s: float) -> tuple[Path, list[str]]:
    """`torchtriage <verb_args> --out FOLDER` (dump, record) on every node of the job; the folder, and the
    problems. Raises EnvironmentProblem when no node wrote anything there."""
    check_jobid(jobid)  # before any folder is made for it
    folder = out.resolve() if out is not None else default_folder(jobid)
    try:
        make_private_folders(folder)  # private when made here; each node's folder in it is private too
    except OSError as err:
        raise UsageError(f"--out {folder}: {err.strerror or err}; give a folder every node can write") from None
    args = [*verb_args, "--out", str(folder)]
    if shutil.which("srun") is None:
        problems = run_here(jobid, args, step_s + _STEP_SLACK_S)
    else:
        problems = run_step(jobid, args, step_s)
    exposed = open_to_others(folder)
    if exposed is not None:
        problems.append(
            f"{folder} is readable by other users ({exposed}): each node's capture in it is private (0700, files "
            "0600); keep copies of it private too (py-spy's locals may hold secrets)"
        )
    if not any(folder.iterdir()):
        reasons = "; ".join(problems) or "no node wrote anything"
        raise EnvironmentProblem(
            f"no node's capture landed in {folder} ({reasons}); is it on a file system the nodes share?"
        )
    return folder, problems
