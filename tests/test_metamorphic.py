"""Transforms that must not change a verdict: the same log hard-wrapped by a terminal, behind another
launcher's rank prefix, with CRLF line ends, in colour, interleaved with another rank's lines, gzip'd.

Every rule's own examples (lines written from the format strings in its `source`) are the logs: each
transformed log must still reach the rule. Where the development corpus is beside the checkout, every
log of it is transformed too and must keep its category.
"""

import gzip
import io
import json
from pathlib import Path

import pytest

from conftest import triage_json
from torchtriage.analysis.pipeline import matcher_for, triage_text
from torchtriage.knowledge.prefilter import literal_trie_regex
from torchtriage.knowledge.rules import default_rules
from torchtriage.sources.lines import normalise
from torchtriage.sources.logs import scan_lines, wrap_width

RULES = [r for r in default_rules() if r.patterns]
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "dev_logs.jsonl"
WIDTHS = (80, 100, 120, 132)


def hard_wrap(text: str, width: int) -> str:
    """What a terminal or a browser does to a pasted log: every line cut into pieces of `width` columns."""
    out = []
    for line in text.split("\n"):
        out += [line[i : i + width] for i in range(0, len(line), width)] or [""]
    return "\n".join(out)


def three_ranks(example: str) -> str:
    return "\n".join(f"[rank{r}]:{example}" for r in range(3)) + "\n"


def rules_reached(text: str) -> set[str]:
    return {f.kind for f in triage_text(text).findings}


TRANSFORMS = {
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "ansi": lambda t: "\n".join(f"\x1b[1;31m{line}\x1b[0m" if line else line for line in t.split("\n")),
    "srun --label": lambda t: "\n".join(f"  4: {line}" if line else line for line in t.split("\n")),
    "mpirun --tag-output": lambda t: "\n".join(f"[1,4]<stderr>:{line}" if line else line for line in t.split("\n")),
    "interleaved": lambda t: "\n".join(
        f"{line}\n[rank9]:step {i} loss 2.{i:03d}" if line else line for i, line in enumerate(t.split("\n"))
    ),
}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_every_example_survives_a_hard_wrap(rule):
    for example in rule.examples:
        original = three_ranks(example)
        if rule.id not in rules_reached(original):
            continue  # an example that needs a context line of its own is checked elsewhere
        for width in WIDTHS:
            if len(f"[rank0]:{example}") <= width:
                continue
            assert rule.id in rules_reached(hard_wrap(original, width)), (width, example)


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_every_example_survives_prefixes_line_ends_and_colour(name):
    transform = TRANSFORMS[name]
    lost = []
    for rule in RULES:
        for example in rule.examples:
            original = three_ranks(example)
            if rule.id in rules_reached(original) and rule.id not in rules_reached(transform(original)):
                lost.append((rule.id, example))
    assert not lost, lost[:5]


def test_an_ordinary_log_is_never_rejoined():
    nccl = "node1:100:200 [0] NCCL INFO Channel {:02d}/32 :    0   1   2   3   4   5   6   7"
    records = "\n".join(nccl.format(i) for i in range(32)) + "\n"
    assert wrap_width(records.encode()) is None  # equal lengths, but every line starts a record
    ranks = "\n".join(
        f"[1,{r}]<stdout>:host:17{r}0:1771 [1] NCCL INFO comm 0x7f0a7 rank {r} nranks 8 - Init COMPLETE"
        for r in range(8)
    )
    assert wrap_width((ranks + "\n").encode()) is None
    padded = "\n".join(line.ljust(120) for line in ("step 1 loss 2.0", "step 2 loss 1.9", "(raylet) done")) + "\n"
    assert wrap_width(padded.encode()) is None  # a terminal capture pads short lines: nothing was cut


def test_two_lines_of_one_length_by_chance_are_no_wrap_where_a_record_follows_one():
    # NCCL gives up connecting, then c10's watchdog reports the CUDA error its abort left: two whole lines that
    # happen to have one length, the first followed by c10's header (a record), the second by a word. Read as a wrap,
    # the two records were one message, the CUDA error the lead (long-tail seed 23301).
    warn = (
        "node7:1967329:1967601 [0] misc/socket.cc:688 NCCL WARN socketStartConnect: connect to 10.62.191.50<61159> "
        "returned Connection timed out, exceeded error retry count after 35 attempts"
    )
    abort = (
        "[E0724 10:26:22.668550966 ProcessGroupNCCL.cpp:1541] [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group "
        "watchdog thread terminated with exception: CUDA error: unspecified launch failure"
    )
    tail = "CUDA kernel errors might be asynchronously reported at some other API call"
    original = "\n".join([warn, abort, tail])
    warn = warn.replace("returned", "returned" + " " * (len(abort) - len(warn)), 1)
    assert len(warn) == len(abort)
    text = "\n".join([warn, abort, tail])
    assert wrap_width((text + "\n").encode()) is None
    verdict = triage_text(text + "\n")
    assert str(verdict.category) == "nccl_transport", verdict.summary
    # The same lines cut by a terminal that pads each to its width: a padded line followed by a record was whole, as
    # every line of such a capture is, and says nothing against the wrap its other lines show.
    for width in (82, 86, 91, 95):
        padded = "\n".join(line.ljust(width) for line in hard_wrap(original, width).splitlines()) + "\n"
        assert wrap_width(padded.encode()) is not None, width


def test_whole_step_lines_that_reach_the_widest_length_by_chance_are_no_wrap():
    # Megatron's step lines a few characters apart, three of them at the log's widest; after two of them a
    # launcher's separator and mpirun's report of a kill. Read as a wrap, the report was the rest of a step line and
    # took its rank (long-tail seed 30068: a SIGKILL named on the step line's rank, at low).
    def step(rank, iteration, loss):
        return (
            f"[default{rank}]: [2026-05-22 15:29:38] iteration {iteration:>8}/  364756 | consumed samples: "
            f"{iteration * 512:>12} | elapsed time per iteration (ms): 4530.3 | lm loss: {loss} | loss scale: "
            "16384.0 | number of skipped iterations:   0 | number of nan iterations:   0 |"
        )

    rule = "-" * 74
    killed = "mpirun noticed that process rank 5 with PID 1226906 on node gpu-node-012 exited on signal 9 (Killed)."
    shorter = [step(5, 2000 + 100 * i, "6.47527E+00") for i in range(6)]
    widest = [step(1, n, "8.836214E+00") for n in (71, 121, 171)]
    assert {len(line) for line in widest} == {len(shorter[0]) + 1}
    text = "\n".join([*shorter, widest[0], widest[1], rule, widest[2], killed, rule]) + "\n"
    assert wrap_width(text.encode()) is None
    verdict = triage_text(text)
    assert (str(verdict.category), verdict.facts.get("local_ranks")) == ("host_oom", None), verdict.summary
    # the same lines cut by a terminal at a narrower width: pieces that end where the column fell, a wrap
    assert wrap_width(hard_wrap(text, 120).encode() + b"\n") is not None


def test_two_pieces_without_the_prefix_every_record_carries_are_a_wrap_wherever_the_column_fell():
    # pdsh's host and torchrun's prefix before every record; a terminal's wrap at 80 cut NCCL's WARN and its result
    # trail between two words (no word cut in two), and left the pieces without the prefix. Read as records, the
    # log "stopped" on "-> 2" (long-tail seed 24129: hang, low).
    head = "node29: [default0]:"
    steps = [f"{head}step {n} | loss 5.{n} | lr 2.1e-04 | 38762 tok/s" for n in range(433, 443)]
    warn = f"{head}node29:3314603:3315464 [0] transport/net_ib.cc:2057 NCCL WARN NET/IB : Unable to query port 1"
    trail = f"{head}node29:3314603:3315464 [0] NCCL INFO transport/net_ib.cc:784 -> 2"
    text = "\n".join([*steps, warn, trail]) + "\n"
    wrapped = hard_wrap(text, 80)
    assert "\n NET/IB : Unable" in wrapped and "\n-> 2" in wrapped
    assert wrap_width(wrapped.encode()) is not None
    verdict = triage_text(wrapped)
    assert str(verdict.category) == "nccl_transport", verdict.summary


def test_a_log_cut_inside_a_wrapped_record_is_read_as_wrapped_all_the_same():
    # NCCL's records (host:pid:tid [dev] before each) wrapped at 80, then cut mid-record at the start (a paste, a
    # `tail`): the first line is the rest of a record with its piece after it, neither starting as records do. They
    # are no records of the log's census; the two pieces of NCCL's WARN and its trail are a wrap (long-tail seed
    # 38668: its WARN, cut in two, was read as NCCL's result trail, nccl_transport at medium).
    head = "node38:1384069:1384880 [3] "
    lines = [
        f"{head}NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:172.16.65.134<0>",
        f"{head}NCCL INFO Using network IB",
        f"{head}NCCL INFO Channel 00/16 :    0   1   2   3   4   5   6   7",
        f"{head}misc/socket.cc:464 NCCL WARN Net : error encountered when getting address info : Name or service "
        "not known",
        f"{head}NCCL INFO misc/socket.cc:659 -> 3",
        f"{head}NCCL INFO bootstrap.cc:381 -> 3",
    ]
    wrapped = hard_wrap("\n".join(lines) + "\n", 80)
    cut = wrapped[wrapped.index("3] NCCL INFO NET/IB") :]
    assert wrap_width(cut.encode()) is not None
    verdict = triage_text(cut)
    assert str(verdict.category) == "rendezvous", verdict.summary


def test_the_rest_of_a_wrapped_line_that_looks_like_an_srun_label_of_another_width_is_no_label():
    # srun --label pads every task id of a step to the widest (" 78: " among 256 tasks). A terminal's wrap that cut
    # NCCL's "...ncclIbCreateQpMlx" / "5: mlx5dv_create_qp failed ..." left a "5: " of another width: the rest of
    # the line, not task 5's record (long-tail seed 20637: the queue pair's failure unread, a launch failure led).
    nccl = "ip-10-42-26-17:2864817:2865575 [6] "
    lines = [
        *(
            f" 78: {nccl}NCCL INFO Channel {c:02d}/24 :    0   1   2   3   4   5   6   7   8   9  10  11"
            for c in range(4)
        ),
        f" 78: {nccl}transport/net_ib.cc:2282 NCCL WARN NET/IB: ncclIbCreateQpMlx5: mlx5dv_create_qp failed to "
        "create QP: Cannot allocate memory",
        f" 78: {nccl}NCCL INFO transport/net_ib.cc:1738 -> 2",
    ]
    width = len(lines[4].split("Mlx")[0]) + 3
    wrapped = hard_wrap("\n".join(lines) + "\n", width)
    assert "\n5: mlx5dv_create_qp" in wrapped
    verdict = triage_text(wrapped)
    assert (str(verdict.category), verdict.culprit_ranks) == ("nccl_transport", [78]), verdict.summary
    assert "nccl.ib_qp_create_failed" in [f.kind for f in verdict.findings], verdict.summary


def test_a_wrapped_message_is_rejoined_across_blocks_and_numbered_by_its_first_line(monkeypatch):
    from torchtriage.sources import logs

    monkeypatch.setattr(logs, "BLOCK_BYTES", 200)  # after the first block, messages straddle blocks
    message = "x" * 50 + " Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE)"
    text = hard_wrap("\n".join(["a short line", message, message, "another one", message]), 60) + "\n"
    hits = list(scan_lines(io.BytesIO(text.encode()), literal_trie_regex(["collective operation timeout"])))
    assert [number for number, _ in hits] == [2, 5, 9]
    assert all(line.decode() == message for _, line in hits)


def test_a_wrapped_gzip_log_on_stdin_is_rejoined(tmp_path):
    watchdog = (
        "[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, "
        "NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600043 milliseconds before timing out."
    )
    text = hard_wrap("\n".join(watchdog.format(r=r) for r in range(3)), 100) + "\n"
    code, verdict = triage_json("-", stdin=gzip.compress(text.encode()))
    assert verdict["category"] == "nccl_timeout" and verdict["facts"]["seq"] == "812"


def _corpus():
    if not CORPUS.is_file():
        return []
    return [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS.is_file(), reason="the development corpus is not beside the checkout")
@pytest.mark.parametrize("name", [*TRANSFORMS, *(f"wrap {w}" for w in WIDTHS)])
def test_every_corpus_log_keeps_its_category_when_transformed(name):
    width = int(name.split()[1]) if name.startswith("wrap") else 0
    transform = TRANSFORMS.get(name) or (lambda t: hard_wrap(t, width))
    changed = []
    for row in _corpus():
        before = triage_text(row["excerpt"]).category
        after = triage_text(transform(row["excerpt"])).category
        if after != before:
            changed.append((row["id"], before, after))
    # A message cut by the wrap where no other line of the log reaches the width cannot be told from an
    # ordinary line, and a line interleaved into a message the original already wrapped cuts it apart:
    # a few such logs change (measured: up to 6 of 153 for a wrap, 1 otherwise); more is a regression.
    allowed = 0.04 if name.startswith("wrap") else 0.01
    assert len(changed) <= allowed * len(_corpus()), changed


def _lines_the_prefilter_drops(lines, matcher):
    dropped = []
    for line in lines:
        text = normalise(line).text
        if matcher.match(text) and matcher.prefilter.search(line.encode("utf-8", "replace")) is None:
            dropped.append(line)
    return dropped


def test_the_prefilter_never_drops_a_line_a_rule_matches_in_the_examples():
    matcher = matcher_for()
    lines = [
        f"{prefix}{example}" for rule in RULES for example in rule.examples for prefix in ("", "[rank3]:", "  4: ")
    ]
    assert not _lines_the_prefilter_drops(lines, matcher)


@pytest.mark.skipif(not CORPUS.is_file(), reason="the development corpus is not beside the checkout")
def test_the_prefilter_never_drops_a_line_a_rule_matches_in_the_corpus():
    matcher = matcher_for()
    lines = [line for row in _corpus() for line in row["excerpt"].splitlines()]
    assert not _lines_the_prefilter_drops(lines, matcher)


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS.is_file(), reason="the development corpus is not beside the checkout")
def test_a_corpus_log_whose_first_third_is_cut_keeps_its_category_or_says_it_starts_mid_message():
    unexplained = []
    for row in _corpus():
        lines = row["excerpt"].split("\n")
        before, after = triage_text(row["excerpt"]), triage_text("\n".join(lines[len(lines) // 3 :]))
        if after.category != before.category and not after.facts.get("cut_at_start"):
            unexplained.append((row["id"], before.category, after.category))
    # A cut on a line that reads as the start of a record cannot be told from a whole log: measured 10 of
    # 153 change without the verdict saying the log is cut; more is a regression.
    assert len(unexplained) <= 0.07 * len(_corpus()), unexplained


def test_a_log_that_starts_mid_message_says_so_whatever_its_verdict(tmp_path):
    path = tmp_path / "rank3.log"
    path.write_text(
        "   from /opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79 GiB\n"
    )
    code, verdict = triage_json(path)
    assert verdict["category"] == "oom" and verdict["facts"]["cut_at_start"] is True
    assert any("starts mid-message" in p for p in verdict["problems"])
