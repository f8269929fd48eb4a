"""The matcher's RE2 sets decide nothing the patterns would not: with them, without them (Python's engine has
none), and with sets that give up on every line, every line reaches the same rules, with the same facts, in the
same order. The lines: every rule's examples whole, cut at every word and behind other text, and lines of the
hostile-log generator built from the anchors and the patterns themselves."""

from __future__ import annotations

import random

import pytest

from hostile_logs import _anchors_line, _fragment, _near, material
from torchtriage.knowledge.matcher import AnchorSet, Matcher, PatternSet
from torchtriage.knowledge.rules import default_rules
from torchtriage.sources.lines import normalise


def _lines() -> list[str]:
    found = []
    for rule in default_rules():
        for example in rule.examples:
            text = normalise(example).text
            found += [text, f"note: {text} (again)", text + " " + text]
            found += [text[:i] for i in range(len(text)) if text[i] in " :,("]
    rng, m = random.Random(5), material()
    for _ in range(1500):
        found.append(_anchors_line(rng, m, rng.randint(1, 6)))
        found.append("".join(_fragment(rng, m) for _ in range(rng.randint(1, 3))))
        found.append(_near(rng, m)[1][:2000])
    return found


LINES = _lines()


def _results(matcher: Matcher) -> list:
    return [[(found.rule.id, found.facts) for found in matcher.match(text)] for text in LINES]


@pytest.fixture(scope="module")
def with_sets() -> list:
    matcher = Matcher(default_rules())
    results = _results(matcher)
    assert matcher._anchor_set is not None and any(matcher._pattern_sets.values()), "the sets were not used"
    return results


def test_without_sets_every_line_reaches_the_same_rules(with_sets, monkeypatch):
    monkeypatch.setattr(AnchorSet, "of", classmethod(lambda cls, anchors: None))
    monkeypatch.setattr(PatternSet, "of", classmethod(lambda cls, patterns: None))
    assert _results(Matcher(default_rules())) == with_sets
    assert sum(map(bool, with_sets)) > len(LINES) // 4  # many of them match something


def test_sets_that_give_up_on_every_line_change_nothing(with_sets, monkeypatch):
    """RE2 answers nothing where a set's automaton cannot fit its memory: the set's empty pattern, found in
    every text, tells that from a line that holds nothing, and the line is matched without the set."""
    import re2

    monkeypatch.setattr(re2.Set, "Match", lambda self, text: None)  # the wrapper's answer when RE2 gave up
    matcher = Matcher(default_rules())
    assert _results(matcher) == with_sets
    assert matcher._anchor_set is not None


def test_a_line_of_the_python_engine_gets_no_set():
    import re

    assert PatternSet.of((re.compile("abc"),)) is None


def test_without_re2_installed_the_examples_reach_the_same_rules(tmp_path):
    """A broken install without google-re2: Python's engine runs the patterns, no set exists, and the rules'
    examples (ASCII, where both engines agree on every class) reach the same rules with the same facts."""
    import json
    import subprocess
    import sys

    script = (
        "import sys, json; sys.modules['re2'] = None\n"
        "from torchtriage.knowledge.matcher import Matcher\n"
        "from torchtriage.knowledge.rules import default_rules\n"
        "from torchtriage.sources.lines import normalise\n"
        "m = Matcher(default_rules())\n"
        "lines = [normalise(e).text for r in default_rules() for e in r.examples if e.isascii()]\n"
        "print(json.dumps([[[f.rule.id, f.facts] for f in m.match(t)] for t in lines]))\n"
        "assert m._anchor_set is None and not any(m._pattern_sets.values())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    matcher = Matcher(default_rules())
    lines = [normalise(e).text for r in default_rules() for e in r.examples if e.isascii()]
    expected = [[[f.rule.id, f.facts] for f in matcher.match(t)] for t in lines]
    assert json.loads(done.stdout) == expected
