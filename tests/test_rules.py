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
