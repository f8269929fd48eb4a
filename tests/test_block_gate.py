"""The gate asked for many lines at once (knowledge.may_match `Gate.block`, sources.logs `LineFinder`): past a line
that holds a prefilter word, one call into C answers for a stretch of lines whether any could match a rule or a
marker, and halving finds the first that could. Skipping the others must change nothing a user sees.

Logs are generated, seeded: the lines of test_may_match's generator (every rule's examples, cut, under launchers'
and loggers' prefixes, coloured, with bytes outside ASCII), lines that hold an anchor in chatter and match nothing,
ordinary step lines, lines outside ASCII with and without a prefilter word, tracebacks and torchrun's report, in
random order and blocks small enough that lines straddle them. The truth is the scan without the block gate, every
line the prefilter finds asked on its own. And on the long tail's generated logs (tests/long_tail_logs.py), the
records read with and without it are the same.
"""

from __future__ import annotations

import io
import random

import pytest

from long_tail_logs import make, variants
from test_bounded_log_folder import plain
from test_may_match import _anchor_lines, _generated
from test_scanner import NVRM_MISMATCH
from torchtriage.analysis.pipeline import matcher_for
from torchtriage.model import SourceKind
from torchtriage.sources import logs
from torchtriage.sources.log_records import read_logs
from torchtriage.sources.logs import scan_lines
from torchtriage.sources.registry import discover

LOGS = 60

_OTHER_LINES = (
    "[rank{r}]:[titan] step {n:>6}  loss: 2.{n:03d}  grad_norm: 1.{n:04d}",
    "[rank{r}]: epoch 3 ████████▏ {n}% eta 3s — ok",
    "[rank{r}]: epoch 3 ████████▏ {n}% — timeout in config",
    "[rank{r}]: \x1b[32mINFO\x1b[0m saved checkpoint step {n}",
    "[{r}] NCCL INFO Channel 0{n} : 0[0] -> 1[1] via P2P/IPC",
    "[rank{r}]:Traceback (most recent call last):",
    '[rank{r}]:  File "/job/train.py", line {n}, in <module>',
    "[rank{r}]:    loss.backward()",
    "[rank{r}]:ValueError: a value no rule knows {n}",
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2026-11-30_04:32:11",
    "  host      : node-{r}",
    "  rank      : {r} (local_rank: {r})",
    "  exitcode  : -9 (pid: 4{n})",
    "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f>",
)


def _log(rng: random.Random, examples: list[str], anchor_lines: list[str]) -> bytes:
    lines = []
    for _ in range(rng.randint(20, 400)):
        kind = rng.random()
        if kind < 0.15:
            lines.append(_generated(rng, examples))
        elif kind < 0.6:
            lines.append(rng.choice(anchor_lines).replace("[rank3]", f"[rank{rng.randint(0, 7)}]"))
        else:
            lines.append(rng.choice(_OTHER_LINES).format(r=rng.randint(0, 7), n=rng.randint(0, 999)))
    ending = rng.choice(("\n", "\r\n", ""))
    return (ending or "\n").join(lines).encode("utf-8", errors="surrogateescape") + ending.encode()


@pytest.fixture(scope="module")
def generated() -> list[bytes]:
    matcher = matcher_for()
    examples = [line for rule in matcher.rules for example in rule.examples for line in example.splitlines() if line]
    rng = random.Random(20261206)
    return [_log(rng, examples, _anchor_lines(matcher)) for _ in range(LOGS)]


@pytest.mark.parametrize("block", [1 << 10, 8 << 10, logs.BLOCK_BYTES])
def test_the_scan_hands_on_exactly_the_lines_that_could_match(monkeypatch, generated, block):
    monkeypatch.setattr(logs, "BLOCK_BYTES", block)
    matcher = matcher_for()
    assert matcher.gate() is not None and matcher.gate().block is not None
    handed_on = skipped = 0
    for data in generated:
        asked_one_by_one = [
            (number, raw) for number, raw in scan_lines(io.BytesIO(data), matcher.prefilter) if matcher.could_match(raw)
        ]
        every = sum(1 for _ in scan_lines(io.BytesIO(data), matcher.prefilter))
        gated = list(scan_lines(io.BytesIO(data), matcher.prefilter, gate=matcher.gate))
        # A hard-wrapped log's rejoined messages are all handed on, and asked one by one by the reader.
        assert [(number, raw) for number, raw in gated if matcher.could_match(raw)] == asked_one_by_one
        handed_on, skipped = handed_on + len(gated), skipped + every - len(gated)
    # Not an empty check: most lines the prefilter finds are skipped, and many are handed on.
    assert skipped > handed_on > 500


def test_while_a_traceback_is_open_every_line_the_prefilter_finds_is_handed_on(generated):
    matcher = matcher_for()
    data = generated[0]
    every = list(scan_lines(io.BytesIO(data), matcher.prefilter))
    assert list(scan_lines(io.BytesIO(data), matcher.prefilter, gate=matcher.gate, every_hit=lambda: True)) == every


def _records(folder) -> dict:
    inputs = [i for i in discover([str(folder)], []) if i.kind == SourceKind.LOG]
    return plain(read_logs(inputs, matcher_for()), matcher_for())


def test_the_records_are_those_of_asking_every_line(monkeypatch, tmp_path, generated):
    texts = [text for seed in range(40) for text in variants(make(seed)).values()]
    texts += [data.decode("utf-8", errors="surrogateescape") for data in generated]
    for index, text in enumerate(texts):
        (tmp_path / f"job{index:03d}.log").write_text(text, encoding="utf-8", errors="surrogateescape")
    gated = _records(tmp_path)
    monkeypatch.setattr(matcher_for().gate(), "block", None)  # every line the prefilter finds asked on its own
    asked = _records(tmp_path)
    assert gated == asked
    # Not an empty check: events, tracebacks, torchrun's reports and ranks were read.
    assert len(gated["events"]) > 100 and len(gated["tracebacks"]) > 20 and gated["child_failures"]
    assert set(range(8)) <= gated["ranks_seen"]


def test_a_message_over_lines_under_one_tag_is_read_whole_among_anchor_lines(monkeypatch, tmp_path):
    """The kernel module's four NVRM lines (tests/test_scanner.py) amid chatter that holds anchors: its first line
    could match alone, so the scan hands it on and the message is rejoined as without the gate. (A message whose
    lines none could match alone, and which only its rejoined text matches, is left: no rule's message is printed
    so but the kernel's, whose rule matches its first line; rules' phrases cut at a line's end pass the gate.)"""
    matcher = matcher_for()
    chatter = [line.replace("[rank3]:", f"[   11.{i:06d}] ") for i, line in enumerate(_anchor_lines(matcher)[:300])]
    data = ("\n".join([*chatter, *NVRM_MISMATCH, *chatter]) + "\n").encode()
    gated = [(n, raw) for n, raw in scan_lines(io.BytesIO(data), matcher.prefilter, gate=matcher.gate)]
    whole = [(n, raw) for n, raw in gated if raw.startswith(NVRM_MISMATCH[0].encode())]
    assert [n for n, _ in whole] == [len(chatter) + 1]
    assert whole[0][1].decode().endswith("components have the same version.")
    (tmp_path / "kern.log").write_bytes(data)
    gated_records = _records(tmp_path)
    monkeypatch.setattr(matcher.gate(), "block", None)
    assert _records(tmp_path) == gated_records
    assert [e["rule"] for e in gated_records["events"]] == ["environment.driver_runtime_mismatch"]
