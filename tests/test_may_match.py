"""The gate before the matcher (knowledge.may_match): a raw line it turns away can match no rule and holds
no marker the reader follows, so turning it away changes no verdict; and a line that holds an anchor but is
not its rule's message costs one call into C, not the peeling and matching of the full path.

Lines are generated from the knowledge base itself, seeded: every rule's examples, cut at word ends, wrapped
in the prefixes launchers and loggers really print (torchrun, mpirun, srun, glog, ISO dates, hosts, Ray),
coloured, with trailing white space and CRs, inside other text. For each, the full path (peel, then match)
is the truth: wherever it finds a rule or a marker, the gate must let the line through. Long runs:
`TORCHTRIAGE_GATE_LINES=200000 pytest tests/test_may_match.py`.
"""

from __future__ import annotations

import os
import random

import pytest

from torchtriage.analysis.pipeline import matcher_for, triage_text
from torchtriage.knowledge.may_match import relaxed
from torchtriage.knowledge.prefilter import STRUCTURE_MARKERS
from torchtriage.sources.lines import normalise
from torchtriage.sources.logs import MAX_LINE_CHARS

LINES = int(os.environ.get("TORCHTRIAGE_GATE_LINES", "6000"))

_PREFIXES = (
    "[rank{r}]:",
    "[default{r}]:",
    "[1,{r}]<stderr>:",
    "{r}: ",
    "Rank {r}: ",
    "node-{r:02d}: [rank{r}]:",
    "(RayTrainWorker pid=4{r}12, ip=10.0.0.{r}) ",
    "[E1130 02:54:48.068043558 ProcessGroupNCCL.cpp:689] ",
    "E1130 02:54:48.068043 1234 ProcessGroupNCCL.cpp:689] ",
    "[W socket.cpp:663] ",
    "2026-11-30 04:32:11,123 - ",
    "[2026-11-30T04:32:11Z] ",
    "\x1b[31m",
    "",
)
_SUFFIXES = ("", " ", "\r", "  \t", "\x1b[0m", " (see above)", "\x1c")


def _cut(example: str, rng: random.Random) -> str:
    """The example cut after a random word, as a truncated paste or a terminal's wrap leaves it."""
    ends = [i for i, c in enumerate(example) if c == " "]
    return example[: rng.choice(ends)] if ends and rng.random() < 0.3 else example


def _generated(rng: random.Random, examples: list[str]) -> str:
    line = _cut(rng.choice(examples), rng)
    for _ in range(rng.randint(0, 3)):
        line = rng.choice(_PREFIXES).format(r=rng.randint(0, 4095)) + line
    if rng.random() < 0.1:
        line = "text before it: " + line
    if rng.random() < 0.05:
        at = rng.randint(0, len(line))
        line = line[:at] + rng.choice(("é", "\u2028", "\x9b1m", "—")) + line[at:]
    return line + rng.choice(_SUFFIXES)


def _full_path_needs(matcher, raw: bytes) -> bool:
    text = normalise(raw[:MAX_LINE_CHARS].decode("utf-8", errors="replace")).text
    marked = any(marker in text for marker in STRUCTURE_MARKERS) or bool(matcher.superseded_rules(text))
    return marked or bool(matcher.match(text))


def test_the_gate_lets_through_every_generated_line_a_rule_or_marker_reads():
    matcher = matcher_for()
    examples = [line for rule in matcher.rules for example in rule.examples for line in example.splitlines() if line]
    rng = random.Random(20261205)
    needed = 0
    for _ in range(LINES):
        raw = _generated(rng, examples).encode("utf-8", errors="surrogateescape")
        if _full_path_needs(matcher, raw):
            needed += 1
            assert matcher.could_match(raw), raw
    assert needed > LINES // 2  # the sample is mostly lines the rules read: the check is not empty


def _anchor_lines(matcher) -> list[str]:
    """A line per anchor that holds it in other text and matches no rule: the chatty log's lines."""
    lines = [f"[rank3]:[titan] the text {anchor} zz 12" for rule in matcher.rules for anchor in rule.anchors]
    return [line for line in lines if not _full_path_needs(matcher, line.encode())]


def test_a_line_that_holds_an_anchor_but_matches_nothing_is_turned_away_in_c():
    matcher = matcher_for()
    lines = _anchor_lines(matcher)
    assert len(lines) > 200
    through = [line for line in lines if matcher.could_match(line.encode())]
    # The relaxed patterns let through only what they could not rule out from the raw line; nearly every such
    # line costs the one call.
    assert len(through) <= len(lines) // 20, through[:10]


def test_a_log_full_of_anchor_lines_costs_the_matcher_nothing_and_keeps_its_verdict():
    matcher = matcher_for()
    filler_lines = _anchor_lines(matcher) * 20
    filler = "\n".join(filler_lines)
    failure = (
        "[rank1]:[E1130 02:54:48.068043558 ProcessGroupNCCL.cpp:689] [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
        "600012 milliseconds before timing out."
    )
    before = matcher.counter.searches
    alone = triage_text(failure + "\n", "job.log")
    searches_alone = matcher.counter.searches - before
    chatty = triage_text(filler + "\n" + failure + "\n" + filler + "\n", "job.log")
    searches_chatty = matcher.counter.searches - before - searches_alone
    # Thousands of anchor lines, twice over, cost the matcher's searches of a tenth of them at most: the full path
    # searched every one (more than once each).
    assert searches_chatty - searches_alone <= 2 * len(filler_lines) // 10, (searches_chatty, searches_alone)
    assert chatty.category == alone.category == "nccl_timeout"
    assert chatty.confidence == alone.confidence


@pytest.mark.parametrize(
    "pattern, loosened",
    [
        (r"^Watchdog caught (?P<what>\w+)$", r"Watchdog caught (?P<what>\w+)(?:[\t\n\x0b\x0c\r\x1c-\x1f ]*$)"),
        (r"[^$]+ costs \$5", r"[^$]+ costs \$5"),  # a class's ^ and $, an escaped $: kept
        (r"[]^$] end\\$", r"[]^$] end\\(?:[\t\n\x0b\x0c\r\x1c-\x1f ]*$)"),  # "]" first in a class is literal
        (r"\Afoo\Z", r"foo(?:[\t\n\x0b\x0c\r\x1c-\x1f ]*$)"),
        (r"(?i)^nan loss", r"(?i)nan loss"),
    ],
)
def test_a_pattern_is_loosened_only_at_its_ends(pattern, loosened):
    assert relaxed(pattern) == loosened


def test_a_pattern_outside_ascii_is_left_to_its_anchors():
    assert relaxed("temperature \u2265 90") is None
