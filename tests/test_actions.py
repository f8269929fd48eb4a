"""Every action a verdict carries comes from the knowledge base, filled from the finding's facts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from torchtriage import exit_codes
from torchtriage.cli import main
from torchtriage.knowledge.actions import ActionTemplate, fill, render, route
from torchtriage.knowledge.rules import default_rules, rule_by_id
from torchtriage.model import Finding

SRC = Path(__file__).parent.parent / "src" / "torchtriage"
FIXTURES = Path(__file__).parent / "fixtures"
H200 = FIXTURES / "h200x2"

# A real run of every verb over the recorded fixtures: (argv, what it is).
RUNS = [
    ["triage", str(H200 / "skip" / "run.log")],
    ["triage", str(H200 / "op" / "run.log")],
    ["triage", str(H200 / "oom.log")],
    ["triage", str(FIXTURES / "logs" / "raise_in_rank" / "run.log")],
    ["triage", str(FIXTURES / "logs" / "gloo_skip_4ranks" / "run.log")],
    ["fr", str(FIXTURES / "fr" / "size_json_4r")],
    ["fr", str(FIXTURES / "fr" / "op_2r")],
    ["diagnose", str(H200 / "skip")],
    ["diagnose", str(FIXTURES / "h200x2_live" / "barrier")],
    ["diagnose", str(FIXTURES / "stacks" / "barrier")],
    ["trace", str(FIXTURES / "traces" / "gloo_cpu")],
    ["memory", str(H200 / "oom_snapshot.pickle")],
]


def test_no_action_is_written_in_analysis_code():
    offenders = [
        f"{path.relative_to(SRC)}:{number}"
        for path in sorted((SRC / "analysis").glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bAction\(", line)
    ]
    assert offenders == []


@pytest.mark.parametrize("argv", RUNS, ids=lambda argv: f"{argv[0]}-{Path(argv[1]).parent.name}-{Path(argv[1]).name}")
def test_every_finding_has_a_rule_and_every_action_is_filled(argv, capsys):
    main([*argv, "--json"])
    verdict = json.loads(capsys.readouterr().out)
    for finding in verdict["findings"]:
        assert rule_by_id(finding["kind"]) is not None, f"{finding['kind']} is in no rule: `explain` cannot say it"
    for action in verdict["actions"]:
        assert rule_by_id(action["rule"]) is not None, action["rule"]
        text = " ".join([action["title"], action["detail"], action["command"] or "", *action["env"].values()])
        assert "{" not in text and "[[" not in text and "<culprits>" not in text, text


def test_the_first_action_for_a_rank_with_nothing_in_flight_speaks_of_that_rank(capsys):
    main(["triage", str(H200 / "skip" / "run.log"), "--json"])
    verdict = json.loads(capsys.readouterr().out)
    first = verdict["actions"][0]
    assert first["rule"] == "logs.idle_rank" and first["title"] == "Look at what rank 1 does instead"
    assert "had no collective in flight" in first["detail"]
    assert not any("different idle" in a["detail"] for a in verdict["actions"])


def test_an_even_split_names_both_candidates_and_never_calls_one_innocent(capsys):
    code = main(["triage", str(H200 / "op" / "run.log")])
    out = capsys.readouterr().out
    assert code == exit_codes.PROBLEM_FOUND
    assert "culprit   undecided between ranks 0-1" in out
    assert "seq 4 of default_pg (pg 0)" in out and "of ?" not in out
    assert "not the culprit" not in out
    assert "torchtriage fr" in out  # the call-site history decides: the verdict says where to look next


def test_explain_shows_an_analysis_rule_with_its_facts_as_placeholders(capsys):
    assert main(["explain", "fr.not_joined"]) == exit_codes.OK
    out = capsys.readouterr().out
    assert "found by:" in out and "Find what <culprits> did after its last recorded collective (<site>)" in out


def test_rules_lists_every_failure_mode_an_analyzer_names(capsys):
    main(["rules", "--json"])
    ids = {rule["id"] for rule in json.loads(capsys.readouterr().out)}
    for kind in ("logs.idle_rank", "fr.not_joined", "stacks.not_in_collective", "memory.fragmentation"):
        assert kind in ids
    assert {r.id for r in default_rules()} == ids


def test_templates_fill_facts_drop_optional_parts_and_never_guess():
    assert fill("Look at {who}[[ at {site}]]", {"who": "rank 3", "site": "t.py:9"}) == "Look at rank 3 at t.py:9"
    assert fill("Look at {who}[[ at {site}]]", {"who": "rank 3"}) == "Look at rank 3"
    assert fill("Look at {who}[[ at {site}]]", {"who": "rank 3", "site": ""}) == "Look at rank 3"
    assert fill("Fix {site}", {"who": "rank 3"}) is None
    assert fill("rank {rank}", {"rank": 0}) == "rank 0"  # rank 0 is a fact, not a missing one
    only_when = ActionTemplate("Speed up rank {rank}", when="slow_data")
    assert render("r", only_when, {"rank": 1, "slow_data": False}) is None
    assert render("r", only_when, {"rank": 1, "slow_data": True}).title == "Speed up rank 1"


def test_a_culprit_is_only_named_by_a_finding_that_blames_it():
    rules = {"logs.idle_rank": rule_by_id("logs.idle_rank")}
    reported = Finding("logs.idle_rank", [0, 1], "m", "symptom", "hang")
    assert route([reported], rules) == []
    blamed = Finding("logs.idle_rank", [1], "m", "primary", "hang", blames=True)
    assert route([blamed], rules)[0].title == "Look at what rank 1 does instead"
