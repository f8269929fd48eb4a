"""A rule's line that ends a Python traceback is that failure only where the traceback was raised by code the
rule is about (`raised_in`): `OSError: [Errno 98] Address already in use` from torch's launcher or the job's
own port logic is a rendezvous port in use; from a metrics server's or a debugger's own socket it is not."""

import pytest

from torchtriage.analysis.pipeline import triage_text
from torchtriage.knowledge.rules import rule_by_id

SITE = "/opt/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"


def traceback(*files: str) -> str:
    """rank 0's traceback through `files` (outermost first), ending in the standard library's bind."""
    frames = [f'[rank0]:   File "{file}", line {10 + i}, in f{i}' for i, file in enumerate(files)]
    frames += [f'[rank0]:   File "{STDLIB}/socketserver.py", line 472, in server_bind']
    return (
        "\n".join(
            [
                "[rank0]: Traceback (most recent call last):",
                *frames,
                "[rank0]: OSError: [Errno 98] Address already in use",
            ]
        )
        + "\n"
    )


@pytest.mark.parametrize(
    "files, rendezvous",
    [
        (("/srv/job/train.py", f"{SITE}/prometheus_client/exposition.py"), False),
        (("/srv/job/train.py", f"{SITE}/debugpy/server/api.py", f"{SITE}/debugpy/adapter/servers.py"), False),
        (("/srv/job/train.py", f"{SITE}/torch/distributed/elastic/agent/server/api.py"), True),
        (("/srv/job/train.py", f"{SITE}/deepspeed/launcher/launch.py"), True),
        (("/srv/job/train.py", "/srv/job/ports.py"), True),  # the job's own port logic: its MASTER_PORT
        ((), True),  # no frame but the standard library's: nothing says whose socket, the rule stands
    ],
)
def test_errno_98_is_a_rendezvous_port_only_when_raised_by_the_launcher_or_the_job(files, rendezvous):
    verdict = triage_text(traceback(*files))
    assert (verdict.category == "rendezvous") == rendezvous, verdict.summary
    assert verdict.culprit_ranks == [0]


def test_a_bare_line_without_its_traceback_keeps_the_rule():
    assert triage_text("[rank0]: OSError: [Errno 98] Address already in use\n").category == "rendezvous"


def test_raised_elsewhere_reads_the_innermost_frame_outside_the_standard_library():
    rule = rule_by_id("rendezvous.python_port_in_use")
    assert rule.raised_elsewhere([f"{STDLIB}/socket.py", f"{SITE}/wandb/sdk/server.py", "/srv/job/train.py"])
    assert not rule.raised_elsewhere([f"{STDLIB}/socket.py", f"{SITE}/torch/distributed/run.py"])
    assert not rule.raised_elsewhere([f"{STDLIB}/socket.py", "/srv/job/train.py", f"{SITE}/wandb/x.py"])
