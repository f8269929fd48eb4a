"""A library's cascade: its own failure, then the generic CUDA error its broken context raises.

The logs are written from the format strings: each library failure is an example of a rule of DeepEP,
NVSHMEM or NCCL (the knowledge base's examples follow those libraries' printf and exception formats), each
generic error one of the forms CUDA errors reach a log in (c10's CUDA_CHECK, ProcessGroupNCCL's watchdog,
DeepEP's EPException around a CUDA call, NCCL's "Cuda failure", torch's AcceleratorError). A verdict must
name the library, never call the aftermath a GPU fault, and never be confident about a cascade; the same
must hold when the log is cut, hard-wrapped, behind a launcher's rank prefix or interleaved with another
rank's lines. The generic error alone, or before the library's failure, stays a GPU fault.
"""

from __future__ import annotations

import random

import pytest

from conftest import triage_json
from torchtriage.analysis.pipeline import matcher_for, triage_text
from torchtriage.knowledge.cascades import cascade_knowledge
from torchtriage.knowledge.rules import default_rules, rule_by_id
from torchtriage.knowledge.signatures import signature_knowledge

# The forms a generic CUDA error takes in a log, from the code that prints it.
GENERIC_ERRORS = {
    # c10/cuda/CUDAException.cpp (c10_cuda_check_implementation): "CUDA error: " + cudaGetErrorString(err)
    "c10": "RuntimeError: CUDA error: an illegal memory access was encountered",
    # ProcessGroupNCCL.cpp: "Process group watchdog thread terminated with exception: " + what()
    "watchdog": "[PG ID 2 PG GUID 9(EXPERT_PARALLEL_GROUP) Rank 3] Process group watchdog thread terminated with "
    "exception: CUDA error: unspecified launch failure",
    # DeepEP csrc/kernels/exception.cuh: "Failed: " + name + " error " + file + ":" + line + " '" + error + "'"
    "deepep_wrapper": "RuntimeError: Failed: CUDA error /opt/DeepEP/csrc/deep_ep.cpp:1022 'unspecified launch failure'",
    # nccl src/include/checks.h CUDACHECK: WARN("Cuda failure '%s'", cudaGetErrorString(err))
    "nccl_cuda_failure": "gpu12:4411:4590 [3] NCCL WARN Cuda failure 'an illegal memory access was encountered'",
    # torch >= 2.8 raises CUDA errors as torch.AcceleratorError
    "accelerator": "torch.AcceleratorError: CUDA error: unspecified launch failure",
}
LIBRARY_CATEGORIES = {c for lib in cascade_knowledge().libraries for c in lib.categories}
PREFIXES = {
    "torchrun": "[rank{r}]:",
    "accelerate": "[default{r}]:",
    "srun --label": "{r:>3}: ",
    "mpirun --tag-output": "[1,{r}]<stderr>:",
}


LEVELS = ("low", "medium", "high")


def _own_failures() -> list[tuple[str, str, str, str]]:
    """(rule id, category, line, confidence alone) of every example of a library's own failure that reads as
    that failure alone (an example that needs lines around it is checked by its rule's own tests)."""
    known = cascade_knowledge()
    found = []
    for rule in default_rules():
        library = known.library_reporting(rule)
        if library is None or rule.role == "collateral" or not rule.patterns:
            continue  # an aftermath itself (a peer's closed connection) explains nothing
        for example in rule.examples:
            if any(known.is_generic(m.rule, m.facts) for m in matcher_for().match(example)):
                continue  # NCCL's "unhandled cuda error": a CUDA error NCCL saw, a generic one itself
            verdict = triage_text(example)
            if verdict.category == rule.category and verdict.findings and verdict.findings[0].kind == rule.id:
                found.append((rule.id, rule.category, example, str(verdict.confidence)))
    return found


OWN_FAILURES = _own_failures()


def hard_wrap(text: str, width: int) -> str:
    out = []
    for line in text.split("\n"):
        out += [line[i : i + width] for i in range(0, len(line), width)] or [""]
    return "\n".join(out)


def prefixed(lines: list[str], prefix: str, rank: int = 3) -> list[str]:
    return [prefix.format(r=rank) + line for line in lines]


def interleaved(lines: list[str]) -> list[str]:
    out = []
    for i, line in enumerate(lines):
        out += [f"[rank9]:[titan] step {4100 + i}  loss: 2.{i:03d}  grad_norm: 0.81", line]
    return out


# Step lines as long as a real trainer's, so that a hard wrap cuts many lines at one width (the reader rejoins a
# log only where the wrap shows in many lines).
STEPS = [
    f"[titan] step {4100 + i}  loss: 2.{i:03d}  grad_norm: 0.81  memory: 61.20GiB(77.41%)  tps: 31,024  "
    f"tflops: 402.17  mfu: 40.66%  lr: 3.0e-4  data_wait: 0.012s  step_time: 1.873s  tokens_seen: {i}M"
    for i in range(12)
]


def cut_at_start(lines: list[str]) -> list[str]:
    """The paste begins inside an earlier traceback: what came before it is missing."""
    return ["    return forward_call(*args, **kwargs)", "           ^^^^^^^^^^^^^^^^^^^^^", *lines]


def no_surer(confidence, alone: str) -> bool:
    """A cascade is said no more surely than the library's failure alone: a symptom (a timeout) at medium."""
    return LEVELS.index(str(confidence)) <= LEVELS.index(alone)


def assert_the_library_is_the_verdict(text: str, category: str, alone: str, why) -> None:
    verdict = triage_text(text)
    assert verdict.category == category, (why, verdict.category, verdict.summary)
    assert no_surer(verdict.confidence, alone), (why, verdict.confidence, verdict.summary)
    assert the_generic_error_is_aftermath(verdict), (why, [(f.kind, f.role) for f in verdict.findings])


def the_generic_error_is_aftermath(verdict) -> bool:
    """Every finding of a generic CUDA error is collateral (a cascade, or a rule's own `collateral_of`)."""
    generic = [f for f in verdict.findings if f.kind in cascade_knowledge().generic_rules and f.category == "gpu_fault"]
    return bool(generic) and all(f.role == "collateral" for f in generic)


def test_the_examples_cover_every_library():
    categories = {category for _, category, _, _ in OWN_FAILURES}
    assert {"deepep", "nccl_transport", "nccl_timeout"} <= categories
    assert sum(rule.startswith("deepep.nvshmem") for rule, _, _, _ in OWN_FAILURES) >= 3
    # Most of them are timeouts and peers' errors: symptoms, which a cascade must never make confident.
    assert sum(alone == "medium" for _, _, _, alone in OWN_FAILURES) >= len(OWN_FAILURES) // 2


@pytest.mark.parametrize("form", list(GENERIC_ERRORS))
def test_a_generic_error_after_a_librarys_own_failure_is_its_aftermath(form):
    wrong = []
    for rule_id, category, example, alone in OWN_FAILURES:
        text = "\n".join(["[testing] Running with BF16, with top-k ...", example, GENERIC_ERRORS[form]]) + "\n"
        verdict = triage_text(text)
        if (
            verdict.category != category
            or not no_surer(verdict.confidence, alone)
            or not the_generic_error_is_aftermath(verdict)
        ):
            wrong.append((rule_id, verdict.category, verdict.confidence, verdict.summary[:100]))
    assert not wrong, wrong[:5]


TRANSFORMS = {
    "cut": cut_at_start,
    "wrapped at 80": lambda lines: hard_wrap("\n".join(lines), 80).split("\n"),
    "wrapped at 120": lambda lines: hard_wrap("\n".join(lines), 120).split("\n"),
    "interleaved with another rank": interleaved,
    **{name: (lambda lines, p=prefix: prefixed(lines, p)) for name, prefix in PREFIXES.items()},
}


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_a_cascade_keeps_its_verdict_cut_wrapped_prefixed_or_interleaved(name):
    rng = random.Random(f"cascade {name}")  # seeded: one generic form per example, the same on every run
    for rule_id, category, example, alone in OWN_FAILURES:
        form = rng.choice(list(GENERIC_ERRORS))
        lines = TRANSFORMS[name]([*STEPS, example, "Traceback (most recent call last):", GENERIC_ERRORS[form]])
        assert_the_library_is_the_verdict("\n".join(lines) + "\n", category, alone, (rule_id, form, name))


def test_a_generic_error_raised_in_deepeps_frames_is_deepeps_whatever_the_order_of_the_streams():
    # The kernel's printf reaches stdout when the host synchronises: it may land after the traceback on stderr.
    lines = [
        "[rank5]: Traceback (most recent call last):",
        '[rank5]:   File "/job/moe/layer.py", line 211, in forward',
        "[rank5]:     recv_x, handle = self.buffer.dispatch(x, topk_idx=topk_idx)",
        '[rank5]:   File "/usr/local/lib/python3.12/dist-packages/deep_ep/buffer.py", line 366, in dispatch',
        "[rank5]:     return self.runtime.intranode_dispatch(x, None, topk_idx)",
        "[rank5]: RuntimeError: CUDA error: an illegal memory access was encountered",
        "[rank5]: DeepEP timeout for dispatch receivers, rank 5, responsible_channel = 11, tokens remained: 96",
    ]
    verdict = triage_text("\n".join(lines) + "\n")
    assert (verdict.category, verdict.confidence) == ("deepep", "medium"), verdict.summary
    assert verdict.facts["aftermath"][0]["how"] == "inside"
    assert "aftermath" in verdict.summary


def test_the_launch_failure_a_deepep_kernels_trap_leaves_is_deepeps_on_that_rank_in_either_order():
    timeout = "[rank5]: DeepEP timeout for combine senders, rank 5, responsible_channel = 9"
    error = [
        "[rank5]: Traceback (most recent call last):",
        '[rank5]:   File "/job/train.py", line 301, in train_step',
        "[rank5]:     torch.cuda.synchronize()",
        "[rank5]: RuntimeError: CUDA error: unspecified launch failure",
    ]
    for lines in ([timeout, *error], [*error, timeout]):
        verdict = triage_text("\n".join(lines) + "\n")
        assert (verdict.category, verdict.confidence) == ("deepep", "medium"), verdict.summary
    # Another rank's launch failure, printed first, is not this rank's trap.
    other = [line.replace("[rank5]", "[rank2]") for line in error]
    verdict = triage_text("\n".join([*other, timeout]) + "\n")
    assert (verdict.category, verdict.confidence) == ("gpu_fault", "medium"), verdict.summary


def test_the_library_that_failed_first_by_time_stamps_explains_another_files_generic_error(tmp_path):
    (tmp_path / "rank0.log").write_text(
        "[rank0]:[E1130 04:10:02.000000000 ProcessGroupNCCL.cpp:689] [PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog "
        "caught collective operation timeout: WorkNCCL(SeqNum=77, OpType=ALLTOALL_BASE, NumelIn=4096, NumelOut=4096, "
        "Timeout(ms)=600000) ran for 600017 milliseconds before timing out.\n"
    )
    (tmp_path / "rank1.log").write_text(
        "[rank1]:[E1130 04:10:09.000000000 ProcessGroupNCCL.cpp:1682] [PG ID 0 PG GUID 0(default_pg) Rank 1] Process "
        "group watchdog thread terminated with exception: CUDA error: unspecified launch failure\n"
    )
    code, verdict = triage_json(tmp_path)
    assert (verdict["category"], verdict["confidence"]) == ("nccl_timeout", "medium"), verdict["summary"]
    roles = {f["kind"]: f["role"] for f in verdict["findings"]}
    assert roles["gpu_fault.launch_failure"] == "collateral"


@pytest.mark.parametrize("form", ["c10", "watchdog", "accelerator"])
def test_a_generic_error_alone_is_a_gpu_fault_said_with_confidence(form):
    verdict = triage_text(f"step 412 loss 1.93\n{GENERIC_ERRORS[form]}\n")
    assert (verdict.category, verdict.confidence) == ("gpu_fault", "high"), verdict.summary


@pytest.mark.parametrize("name", ["none", *TRANSFORMS])
def test_a_generic_error_before_a_peers_library_failure_stays_a_gpu_fault_but_not_a_confident_one(name):
    # Rank 3 faulted first; rank 0's DeepEP kernel timed out waiting for it a hundred seconds later.
    lines = [
        f"[rank3]: {GENERIC_ERRORS['c10']}",
        "[rank0]: DeepEP timeout for dispatch receivers, rank 0, responsible_channel = 2, tokens remained: 40",
    ]
    lines = TRANSFORMS.get(name, lambda x: x)(lines)
    verdict = triage_text("\n".join(lines) + "\n")
    assert verdict.category == "gpu_fault" and verdict.confidence == "medium", (name, verdict.summary)
    assert any("DeepEP" in doubt for doubt in verdict.facts["doubts"])


def test_a_library_line_no_rule_knows_still_keeps_a_generic_error_below_high():
    # A future DeepEP release's wording: no rule reads it, but the library names itself and says it failed.
    text = "DeepEP v3 elastic combine: peer rank 6 failed to arrive\n" + GENERIC_ERRORS["c10"] + "\n"
    verdict = triage_text(text)
    assert verdict.confidence != "high", verdict.summary


def test_two_causes_of_different_categories_without_an_order_are_not_said_with_confidence(tmp_path):
    (tmp_path / "rank1.log").write_text(
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity "
        "of 79.19 GiB of which 1.02 GiB is free.\n"
    )
    (tmp_path / "rank6.log").write_text(
        "[rank6]: /pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:93: operator(): block: [211,0,0], thread: "
        '[64,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.\n'
    )
    code, verdict = triage_json(tmp_path)
    assert verdict["confidence"] == "medium", verdict["summary"]
    assert any("not high" in p for p in verdict["problems"])


def test_a_cause_that_says_why_leads_a_generic_error_of_its_category(tmp_path):
    (tmp_path / "rank2.log").write_text(
        "[rank2]:[E1130 04:10:02.000000000 ProcessGroupNCCL.cpp:1682] [PG ID 0 PG GUID 0(default_pg) Rank 2] Process "
        "group watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered\n"
    )
    (tmp_path / "kern.log").write_text(
        "2026-11-30T04:10:07 NVRM: Xid (PCI:0000:41:00): 48, An uncorrectable double bit error (DBE) has been detected "
        "on GPU in the framebuffer at partition 5, subpartition 0.\n"
    )
    code, verdict = triage_json(tmp_path)
    assert verdict["category"] == "gpu_fault", verdict["summary"]
    assert verdict["findings"][0]["kind"] == "gpu_fault.xid_hardware", verdict["summary"]


def test_every_generic_rule_and_signature_rule_exists():
    known = cascade_knowledge()
    assert all(rule_by_id(rule) is not None for rule in known.generic_rules)
    for library in known.libraries:
        assert all(rule_by_id(rule) is not None for rule in library.rules | library.not_failures), library.name
    assert all(rule_by_id(s.rule) is not None for s in signature_knowledge().signatures)
