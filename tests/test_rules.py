"""The knowledge base: every rule loads, and every example line reaches its rule through the real
scanner (prefilter included) with the facts it promises."""

import io

import pytest

from torchtriage.knowledge.matcher import Matcher
from torchtriage.knowledge.rules import default_rules, required_literal
from torchtriage.model import CATEGORIES
from torchtriage.sources.log_records import LogRecords, read_logs
from torchtriage.sources.registry import log_input

RULES = default_rules()
MATCHER = Matcher(RULES)


def events_for(text: str):
    records = LogRecords()
    log = log_input("example.log")
    read_logs([log], MATCHER, records, opener=lambda _: io.BytesIO(text.encode()))
    return records.events


def test_the_knowledge_base_covers_every_failure_category():
    covered = {rule.category for rule in RULES}
    assert covered >= set(CATEGORIES) - {"straggler", "unknown", "ok"}
    assert len({rule.id for rule in RULES}) == len(RULES)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_rule_is_complete(rule):
    # A log rule shows the lines it matches; an analysis rule matches no line, it names its analysis.
    if rule.patterns:
        assert rule.examples, "every log rule shows the lines it matches"
    else:
        assert rule.found_by, "every analysis rule names the analysis that finds it"
    # What can be a verdict's cause routes to a fix; fusion's rules speak of the evidence, not the job.
    if rule.patterns or (rule.role == "primary" and not rule.id.startswith("fusion.")):
        assert rule.actions, "every rule routes to at least one action"
    assert rule.source and rule.cause


@pytest.mark.parametrize("rule", [r for r in RULES if r.patterns], ids=lambda r: r.id)
def test_every_example_reaches_its_rule_through_the_scanner(rule):
    for example in rule.examples:
        # An example is one line, as the launcher would print it behind a rank prefix.
        events = events_for(f"[rank3]:{example}\n")
        matched = [e for e in events if e.rule.id == rule.id]
        assert matched, f"{example!r} does not reach {rule.id}"
    if rule.example_facts:
        first = [e for e in events_for(rule.examples[0] + "\n") if e.rule.id == rule.id][0]
        for key, value in rule.example_facts.items():
            assert first.facts.get(key) == value, (key, first.facts)


def test_required_literal_is_what_every_match_contains():
    assert required_literal(r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<s>\d+)") == (
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum="
    )
    assert required_literal(r"(foo|bar)baz") == "baz"
    assert required_literal(r"(?i)loss: nan") is None


@pytest.mark.parametrize("rule", [r for r in RULES if MATCHER.phrases[r.id]], ids=lambda r: r.id)
def test_an_example_cut_right_after_its_phrase_still_reaches_its_rule(rule):
    for example in rule.examples:
        phrase = next((p for p in MATCHER.phrases[rule.id] if p in example), None)
        if phrase is None:
            continue
        cut = example[: example.index(phrase) + len(phrase)]
        assert any(e.rule.id == rule.id for e in events_for(f"[rank3]:{cut}\n")), cut


def test_a_cut_message_keeps_its_category_with_fewer_facts():
    cut = "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3738254, OpType=_ALL"
    (event,) = [e for e in events_for(cut + "\n") if e.rule.id == "nccl.watchdog_timeout"]
    assert "op" not in event.facts  # never a fact read from a cut field ("_ALL")


def test_a_phrase_other_rules_print_too_is_not_distinctive():
    (rule,) = [r for r in RULES if r.id == "deepep.nvshmem_library_mismatch"]
    assert ": cannot open shared object file" not in MATCHER.phrases[rule.id]
    line = "ImportError: libfoo.so.2: cannot open shared object file: No such file or directory"
    assert not [e for e in events_for(line + "\n") if e.rule.category == "deepep"]


def test_a_phrase_a_rule_tells_apart_by_its_unless_stays_distinctive():
    # The allocator's "out of memory. Tried to allocate" is in oom.impossible_size's message too, which
    # oom.cuda_allocator's `unless` vetoes: a cut allocator OOM still reaches its rule, an exabyte never does.
    assert "out of memory. Tried to allocate" in MATCHER.phrases["oom.cuda_allocator"]
    cut = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 3 has a tot"
    assert "oom.cuda_allocator" in {e.rule.id for e in events_for(f"[rank3]:{cut}\n")}
    exabyte = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate more than 1EB memory."
    assert {e.rule.id for e in events_for(f"[rank3]:{exabyte}\n")} == {"oom.impossible_size"}


def test_a_path_in_a_pattern_is_not_a_phrase():
    (rule,) = [r for r in RULES if r.id == "hang.stack_in_collective"]
    assert rule.phrases == ()  # a frame line's path locates a stack; it does not name a failure
    frame = '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 25, in barrier'
    assert not [e for e in events_for(frame + "\n") if e.rule.id == rule.id]


def test_a_line_cut_inside_a_phrase_at_a_words_end_still_reaches_its_rule():
    cut = "[Rank 12] Watchdog caught collective operation timeout:"
    assert [e for e in events_for(cut + "\n") if e.rule.id == "nccl.watchdog_timeout"]
    assert not [e for e in events_for("[Rank 12] Watchdog caught coll\n") if e.rule.id == "nccl.watchdog_timeout"]


# Lines cut short after the part that already says what failed, written from the programs' formats:
# every fact after it is optional, so each still reaches its rule, with fewer facts.
CUT_AFTER_THE_DISTINCTIVE_PART = [
    ("RuntimeError: NCCL Error 2: unhan", "nccl.legacy_error_code"),  # torch/csrc/cuda/nccl.cpp; nccl.h codes
    ("OSError: [Errno 98] Addr", "rendezvous.python_port_in_use"),  # EADDRINUSE
    ("OSError: [Errno 12] Cann", "host_oom.errno_enomem"),  # ENOMEM
    ("Signal 11 (SIGSEGV) recei", "logs.fatal_signal"),  # elastic ProcessFailure
    ("[gpu3:812 :0:812] Caught signal 7 (Bus er", "environment.sigbus"),  # ucs/debug/debug.c
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:799] connect [10.1.2.3]:4", "gloo.connect_failed"),
    (
        "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:575] Read error [10.0.0.2]:5",
        "gloo.peer_connection_closed",
    ),
    ("Stalled ops: HorovodAllreduce_grad_dense_0 [miss", "hang.horovod_stall"),
    ("Exception: Current loss scale already at minimum - can", "nan_inf.loss_scale_exhausted"),
    ("NOTE: gradient overflow detected, ignoring gra", "nan_inf.loss_scale_overflow"),  # fairseq fp16_optimizer.py
    ("IndexError: index 50257 is out of bounds fo", "usage.index_out_of_range"),
    ("RuntimeError: CUDA error: no kernel image is available for execution on th", "environment.gpu_arch_unsupported"),
    ("RuntimeError: CUDA error: an illegal instruction was enc", "gpu_fault.illegal_instruction"),
    ("[Rank 2] Some NCCL operations have failed or timed out. Due to the asyn", "nccl.ops_failed_teardown"),
]


@pytest.mark.parametrize(
    ("line", "rule_id"), CUT_AFTER_THE_DISTINCTIVE_PART, ids=[r for _, r in CUT_AFTER_THE_DISTINCTIVE_PART]
)
def test_a_line_cut_after_its_distinctive_part_reaches_its_rule(line, rule_id):
    assert rule_id in {e.rule.id for e in events_for(f"[rank3]:{line}\n")}


def test_an_all_to_all_whose_splits_disagree_blames_the_rank_gloo_refused_not_its_peer(tmp_path):
    from conftest import triage_json

    log = tmp_path / "job.log"
    log.write_text(
        "[rank1]: RuntimeError: [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/alltoallv.cc:138] "
        "inLengthPerRank[myRank] == outLengthPerRank[myRank]. \n"
        "[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
        "closed by peer [127.0.0.1]:47818. This is typically caused by a remote worker crashing.\n"
    )
    code, verdict = triage_json(log)
    assert verdict["culprit_ranks"] == [1]
    assert verdict["findings"][0]["kind"] == "gloo.all_to_all_splits_mismatch"
