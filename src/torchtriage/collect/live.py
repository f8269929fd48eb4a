"""Live diagnosis of a running job: capture every rank's stack, ask armed ranks for their flight
recorder, and fuse what came back (with any dumps and logs the user adds)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from torchtriage.analysis.postmortem import diagnose_paths
from torchtriage.collect.capture import capture_stacks
from torchtriage.collect.discovery import parse_environ
from torchtriage.model import Assessment, Verdict
from torchtriage.protocol import (
    FIRST_ATTEMPT_ENV,
    FR_SUBDIR,
    IDENTITY_SUBDIR,
    RESTART_COUNT_ENV,
    RUN_DIR_ENV,
    attempt_dir,
    attempt_number,
    hang_dir,
    request_folder,
    withdraw_request,
    write_request,
)

# How long to wait for ranks started by `torchtriage run` to answer a dump request: their watchdogs
# poll every few seconds.
ARMED_WAIT_S = 15.0
_ARMED_ENV = (RUN_DIR_ENV, FIRST_ATTEMPT_ENV, RESTART_COUNT_ENV)


def armed_run_dir(pids: list[int]) -> Path | None:
    """The run folder of the attempt a job started with `torchtriage run` is in, read from a rank's environment
    (the environment it started with: the attempt's folder is the run folder's, by the attempt's number)."""
    for pid in pids:
        try:
            env = parse_environ(Path(f"/proc/{pid}/environ").read_bytes(), keys=_ARMED_ENV)
        except OSError:
            continue
        if env.get(RUN_DIR_ENV):
            return attempt_dir(env[RUN_DIR_ENV], attempt_number(env))
    return None


def request_fresh_dumps(folder: Path, ranks: int, wait_s: float = ARMED_WAIT_S) -> Path | None:
    """Ask armed ranks' watchdogs for their flight-recorder buffers; the folder they land in, if any.

    The request holds a token of its own: each watchdog serves it once, into a folder of its own, and stays
    armed (a later stall or request is served again); the request file is withdrawn once answered."""
    token = f"{time.time_ns():x}-{os.getpid()}"
    write_request(folder, token)
    fr = request_folder(folder, token) / FR_SUBDIR
    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline:
            if fr.is_dir() and len(list(fr.iterdir())) >= ranks:
                break
            time.sleep(0.5)
    finally:
        withdraw_request(folder, token)
    return fr if fr.is_dir() and any(fr.iterdir()) else None


def _verdict_of_capture(
    folder: Path,
    problems: list[str],
    extra_paths: list[str] | None,
    logs: list[str] | None,
    *,
    more_paths: Sequence[str] = (),
    collected: Sequence[Assessment] = (),
) -> Verdict:
    """The fused verdict of what a live capture wrote into `folder` (and the user's own paths and logs), with
    the capture's own problems and what its collector said by itself."""
    verdict = diagnose_paths([str(folder), *(extra_paths or []), *more_paths], extra_logs=logs, collected=collected)
    verdict.facts["capture_folder"] = str(folder)
    verdict.problems.extend(problems)
    return verdict


def diagnose_live(
    pids: list[int] | None = None,
    out: Path | None = None,
    *,
    native: bool = False,
    timeout_s: float = 10.0,
    extra_paths: list[str] | None = None,
    logs: list[str] | None = None,
) -> Verdict:
    capture = capture_stacks(pids, out, native=native, timeout_s=timeout_s)
    captured = [p.target.pid for p in capture.processes]
    armed = armed_run_dir(captured)
    answering = [p for p in capture.processes if "state" not in p.details]  # a stopped rank answers nothing
    fresh = request_fresh_dumps(hang_dir(armed), len(answering)) if armed is not None else None
    # Each error names its rank and pid; the warnings say what a user must know (a rank left stopped, a capture
    # folder other users can read).
    problems = [p.error or "failed" for p in capture.failures] + capture.warnings
    more = [str(fresh)] if fresh is not None else []
    if armed is not None and (armed / IDENTITY_SUBDIR).is_dir():
        more.append(str(armed / IDENTITY_SUBDIR))  # the ranks' own records: their GPUs beside the hosts and pids
    return _verdict_of_capture(capture.folder, problems, extra_paths, logs, more_paths=more)


def diagnose_from_store(
    address: str,
    out: Path | None = None,
    *,
    world_size: int | None = None,
    timeout_s: float = 10.0,
    extra_paths: list[str] | None = None,
    logs: list[str] | None = None,
) -> Verdict:
    """Every rank's state from its PyTorch debug server, found in the job's store, fused into one verdict."""
    import socket

    from torchtriage.collect.capture import default_out_dir, make_folder
    from torchtriage.collect.debug_server import assess_answers, collect

    folder = make_folder(out or default_out_dir(), f"store-{socket.gethostname()}")
    collected = collect(address, folder, world_size, timeout_s)
    if not collected.kept:
        from torchtriage.errors import EnvironmentProblem, InputError

        reasons = "\n  ".join(collected.problems) or "no rank answered"
        if not collected.answered:
            raise EnvironmentProblem(f"no rank's debug server answered:\n  {reasons}")
        raise InputError(f"no rank's answer could be read:\n  {reasons}")  # every one cut or refused
    answers = [a for a in (assess_answers(collected),) if a is not None]
    verdict = _verdict_of_capture(folder, collected.problems, extra_paths, logs, collected=answers)
    verdict.facts["debug_server"] = verdict.facts.get("debug_server", {}) | {
        "store": address,
        "world_size": collected.world_size,
        "answered": len(collected.answered),
        "not_answering": {str(rank): why for rank, why in sorted(collected.not_answering.items())[:64]},
        "unregistered": collected.unregistered[:64],
    }
    return verdict


def diagnose_slurm(
    jobid: str,
    out: Path | None = None,
    *,
    native: bool = False,
    timeout_s: float = 10.0,
    extra_paths: list[str] | None = None,
    logs: list[str] | None = None,
) -> Verdict:
    """Every node of a SLURM job captured by one extra job step into one folder, fused into one verdict."""
    from torchtriage.collect.slurm import capture_every_node

    folder, problems = capture_every_node(jobid, out, timeout_s, native)
    verdict = _verdict_of_capture(folder, problems, extra_paths, logs)
    verdict.facts["slurm_job"] = jobid
    return verdict


def diagnose_pods(
    selector: str,
    out: Path | None = None,
    *,
    namespace: str | None = None,
    container: str | None = None,
    timeout_s: float = 10.0,
    extra_paths: list[str] | None = None,
    logs: list[str] | None = None,
) -> Verdict:
    """Every running pod of a Kubernetes job captured with `kubectl exec`, merged, fused into one verdict."""
    import time as clock

    from torchtriage.collect.capture import default_out_dir
    from torchtriage.collect.kubernetes import capture_every_pod

    folder = out or default_out_dir() / f"pods-{clock.strftime('%Y%m%d-%H%M%S')}"
    folder, problems = capture_every_pod(selector, namespace, container, folder, timeout_s)
    return _verdict_of_capture(folder, problems, extra_paths, logs)
