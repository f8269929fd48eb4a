"""A gloo rank whose flight recorder torchtriage armed pauses at exit while gloo's workers exist (torch 2.13
aborts such a rank at interpreter exit otherwise: docs/runtime.md), and only then. Real gloo groups in a
child process; the exits themselves are tested on real torchrun jobs in test_run_harm.py."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

PROGRAM = textwrap.dedent(
    """
    import json, os, tempfile
    from torchtriage.runtime import gloo_exit

    before = gloo_exit.gloo_workers_running()
    if os.environ.get("GROUP") == "gloo":
        import torch.distributed as dist

        store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        # A rank exits after its work: a worker names itself when it starts, which a loaded machine may delay
        # past init_process_group's return; the collective runs on one, so it has.
        import torch

        dist.all_reduce(torch.ones(1))
    print(json.dumps({"workers_before": before, "settled": gloo_exit.settle()}))
    """
)


def _run(group: str, **env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR", "TORCH_NCCL"))}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        env={**base, "GROUP": group, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_armed_rank_with_gloo_workers_pauses_at_exit():
    assert _run("gloo", TORCH_FR_BUFFER_SIZE="20000") == {"workers_before": False, "settled": True}


def test_a_rank_without_the_flight_recorder_or_without_gloo_does_not():
    assert _run("gloo", TORCH_FR_BUFFER_SIZE="0")["settled"] is False
    assert _run("none", TORCH_FR_BUFFER_SIZE="20000")["settled"] is False
