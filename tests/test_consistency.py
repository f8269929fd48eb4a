"""Self-consistency and calibration: a verdict never quotes a line that shows another failure without saying
so, and it is `high` only where the deciding line is a cause in itself.

The lines are written from the formats of the programs that print them (a CSV logger's row, a terminal's
"Killed" glued to a progress bar, mpirun's and DeepSpeed's reports of a killed rank, NCCL's socket lines).
"""

from __future__ import annotations

import pytest

from torchtriage.analysis.consistency import consistent
from torchtriage.analysis.pipeline import triage_text
from torchtriage.analysis.stall import LOG_STOPS
from torchtriage.knowledge.cascades import load_cascade_knowledge
from torchtriage.knowledge.loader import KNOWLEDGE_DIR, KnowledgeError
from torchtriage.knowledge.signatures import load_signature_knowledge, signature_knowledge
from torchtriage.model import Assessment, Evidence, Finding

STEPS = "\n".join(f"step {i} | loss {2.5 - i / 100:.3f} | lr 3.0e-04 | 0.91 s/it" for i in range(1, 40))


def stopped_at(line: str) -> Assessment:
    """What the lowest layer says of a log that stops at `line`: no error, only where it stopped."""
    finding = Finding(
        LOG_STOPS,
        [],
        f"The log shows no error and stops after its last line: {line}",
        "symptom",
        "hang",
        [Evidence("log", "job.log", 40, None, line)],
        {"last_line": line},
    )
    return Assessment("logs", [finding], finding.message, category="hang", confidence="low", lead=finding)


def read_as(kind: str, category: str, line: str, confidence: str = "high") -> Assessment:
    """A rule's reading of `line`, as triage makes it."""
    finding = Finding(kind, [3], "a rule's reading", "primary", category, [Evidence("log", "job.log", 7, 3, line)])
    return Assessment("logs", [finding], "a rule's reading", category=category, confidence=confidence, lead=finding)


@pytest.mark.parametrize(
    ("line", "category"),
    [
        ("212,nan,nan,0.0013", "nan_inf"),  # a CSV logger's row
        ("77010 nan", "nan_inf"),
        ("tensor([[-inf, 0.5000, 1.2500]], device='cuda:0')", "nan_inf"),
        ("grad_norm is not finite: nan", "nan_inf"),
        ("Epoch 1:  45%|████▌     | 450/1000 [10:02<12:17,  1.34s/it]Killed", "host_oom"),
        ("mpirun noticed that process rank 3 with PID 0 on node n07 exited on signal 9 (Killed).", "host_oom"),
        ("[launch.py:319:sigkill_handler] Killing subprocess 4242 exits with return code = -9", "host_oom"),
        ("gpu3:771:802 [3] NCCL WARN Cuda failure 'out of memory'", "oom"),
        ("gpu3:771:802 [3] NCCL INFO NET/Socket : connect returned No route to host, retrying", "nccl_transport"),
    ],
)
def test_a_log_that_stops_on_a_line_showing_a_failure_is_read_as_that_failure(line, category):
    said = consistent(stopped_at(line))
    assert (said.category, said.confidence) == (category, "low")
    assert said.lead.kind != LOG_STOPS and said.lead.evidence[0].text == line
    kinds = [f.kind for f in said.findings]
    assert LOG_STOPS in kinds and "else: The log shows no error and stops" in said.summary  # both readings


@pytest.mark.parametrize(
    "line",
    [
        "max_grad_norm: inf, warmup: 2000",  # a setting that is infinite on purpose
        "clip_value=inf patience = inf",
        "epoch 0 | best_val_loss: inf | saving to /ckpt",
        "loading dataset nanodet-coco from /data/nanodet",
        "[INFO] step 31 | infer time 0.21 s",
        "skipped 0 non-NaN batches",
        "step 40 | loss 2.101 | lr 3.0e-04",
    ],
)
def test_a_line_that_only_looks_like_a_signature_stays_where_the_log_stops(line):
    assert signature_knowledge().signature_of(line) is None
    assert consistent(stopped_at(line)).category == "hang"


def test_a_rules_line_that_also_shows_another_failure_says_both_and_is_less_sure():
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. (step 881, loss nan)"
    said = consistent(read_as("oom.cuda_allocator", "oom", line))
    assert (said.category, said.confidence) == ("oom", "medium")
    assert said.facts["other_reading"]["category"] == "nan_inf"
    assert any("also shows a NaN or Inf value" in p for p in said.problems)


def test_a_rules_own_words_are_not_another_reading():
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity"
    said = consistent(read_as("oom.cuda_allocator", "oom", line))
    assert (said.category, said.confidence, said.problems) == ("oom", "high", [])


@pytest.mark.parametrize(
    ("last", "category"),
    [
        ("eval | epoch 3 | ppl inf | bleu 0.00", "nan_inf"),
        ("step 40 | loss nan | lr 3.0e-04 | 0.91 s/it", "nan_inf"),
        ("  0%|          | 0/1000 [00:00<?, ?it/s]Killed", "host_oom"),
        ("worker 3: exited on signal 9 (Killed)", "host_oom"),
    ],
)
def test_a_whole_log_that_stops_on_a_failure_is_never_called_a_stall(last, category):
    verdict = triage_text(f"{STEPS}\n{last}\n")
    assert verdict.category == category, verdict.summary
    assert verdict.confidence != "high"
    assert not any(f.kind == LOG_STOPS and f.role != "collateral" for f in verdict.findings[:1]), verdict.summary


def test_absence_of_evidence_is_never_high():
    verdict = triage_text(f"{STEPS}\n")
    assert (verdict.category, verdict.confidence) == ("hang", "low")


def test_one_cause_in_itself_is_high():
    verdict = triage_text(
        f"{STEPS}\n[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 has a total "
        "capacity of 79.19 GiB of which 1.02 GiB is free.\n"
    )
    assert (verdict.category, verdict.confidence, verdict.culprit_ranks) == ("oom", "high", [2])


@pytest.mark.parametrize(
    ("file", "change", "says"),
    [
        ("signatures.toml", ('category = "nan_inf"', 'category = "nans"'), "unknown category 'nans'"),
        ("signatures.toml", ("patterns = [\n  # A value", "pattern = [\n  # A value"), "unknown key pattern"),
        ("cascades.toml", ('categories = ["deepep"]', 'categories = ["deep_ep"]'), "unknown category 'deep_ep'"),
        ("cascades.toml", ('rules = ["oom.math_library_alloc"]', ""), "give `categories` or `rules`"),
        ("cascades.toml", ("'(?i)misaligned address'", "'(?<=CUDA)misaligned'"), "lookahead or lookbehind"),
    ],
)
def test_a_malformed_knowledge_file_is_refused_naming_the_table(tmp_path, file, change, says):
    text = (KNOWLEDGE_DIR / file).read_text()
    assert change[0] in text
    (tmp_path / file).write_text(text.replace(change[0], change[1], 1))
    load = load_signature_knowledge if file == "signatures.toml" else load_cascade_knowledge
    with pytest.raises(KnowledgeError) as refused:
        load(tmp_path / file)
    assert file in str(refused.value) and says in str(refused.value)
