"""Memory helpers on CPU: pass-through without CUDA, rank selection, OOM attribution lines.

The snapshot-writing path needs CUDA: tests/gpu/check_memory_profiler.py exercises it on a GPU machine.
"""

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from torchtriage.runtime import memory  # noqa: E402

OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 16.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
    "11.29 GiB is free."
)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the pass-through without CUDA")
def test_history_passes_through_without_cuda(tmp_path):
    with memory.cuda_memory_history(tmp_path, ranks="all") as path:
        x = torch.ones(4) * 2
    assert path is None and x.sum().item() == 8 and list(tmp_path.iterdir()) == []
    assert memory.log_cuda_memory("after step") == {}
    assert memory.check_memory_margin() is False


def test_history_passes_exceptions_through(tmp_path):
    with pytest.raises(KeyError):
        with memory.cuda_memory_history(tmp_path):
            raise KeyError("from the training loop")


@pytest.mark.parametrize(
    ("spec", "expected"), [("0", {0}), ("0,8", {0, 8}), (3, {3}), ("", {0}), (None, {0}), ("ALL", None)]
)
def test_parse_ranks(spec, expected):
    assert memory.parse_ranks(spec) == expected


def test_parse_ranks_refuses_garbage():
    with pytest.raises(ValueError, match="expected 'all'"):
        memory.parse_ranks("first")


def test_rank_tag_pads_for_the_world():
    assert memory.rank_tag(3, 8) == "rank03"
    assert memory.rank_tag(7, 128) == "rank007"
    assert memory.rank_tag(0, 1) == "rank00"


def run_python(code: str, **env):
    import os

    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_uncaught_oom_is_attributed_to_this_rank():
    done = run_python(
        f"""
        import torch, torchtriage
        torchtriage.install_oom_attribution()
        raise torch.OutOfMemoryError({OOM_MESSAGE!r})
        """,
        RANK="3",
        WORLD_SIZE="4",
    )
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if "PRIMARY FAILURE" in line]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        "torchtriage: rank 3 is the PRIMARY FAILURE: torch.OutOfMemoryError: CUDA out of memory."
    )
    assert "collateral" in lines[0]
    assert "Traceback" in done.stderr and done.stderr.rstrip().endswith(OOM_MESSAGE)  # the original still shows


def test_other_exceptions_are_not_attributed():
    done = run_python(
        """
        import torchtriage
        torchtriage.install_oom_attribution()
        raise ValueError("not memory")
        """
    )
    assert done.returncode == 1 and "PRIMARY FAILURE" not in done.stderr and "ValueError" in done.stderr


def test_an_impossible_size_is_not_attributed_as_this_ranks_oom(caplog):
    # No GPU ran out: the size was garbage (an object collective that paired with a peer's other collective),
    # and the rank where it arrived is not the primary failure.
    with caplog.at_level("ERROR", logger="torchtriage.memory"):
        with pytest.raises(torch.OutOfMemoryError):
            with memory.oom_attribution():
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate more than 1EB memory.")
    assert "PRIMARY FAILURE" not in caplog.text


def test_oom_attribution_context_reports_once_and_reraises(caplog):
    with caplog.at_level("ERROR", logger="torchtriage.memory"):
        with pytest.raises(torch.OutOfMemoryError):
            with memory.oom_attribution():
                with memory.oom_attribution():  # nested (step inside epoch): still one line
                    raise torch.OutOfMemoryError(OOM_MESSAGE)
    assert caplog.text.count("is the PRIMARY FAILURE") == 1
