"""Fusing the verdicts of logs, flight recorder and stacks (pure)."""

from torchtriage.analysis.fusion import fuse
from torchtriage.model import Finding, Verdict


def verdict(category, culprits, *, role="primary", confidence="medium", summary="s", frame=None):
    facts = {"user_frame": frame} if frame else {}
    return Verdict(category, culprits, summary, confidence, [Finding("k", culprits, "m", role, category)], facts=facts)


def test_agreeing_sources_raise_confidence_and_name_what_was_missing():
    fused = fuse({"flight_recorder": verdict("hang", [3]), "stacks": verdict("hang", [3])})
    assert (fused.category, fused.culprit_ranks, fused.confidence) == ("hang", [3], "high")
    assert fused.findings[0].kind == "sources_agree"
    assert fused.facts["sources_used"] == ["flight_recorder", "stacks"]
    assert fused.facts["sources_missing"] == {"logs": "not given"}


def test_a_cause_in_the_logs_beats_the_hang_it_caused():
    logs = verdict("oom", [5], frame={"file": "train.py", "line": 88, "function": "forward", "rank": 5})
    fused = fuse({"logs": logs, "stacks": verdict("hang", [2]), "flight_recorder": verdict("hang", [2])})
    assert (fused.category, fused.culprit_ranks) == ("oom", [5])
    assert fused.facts["user_frame"]["line"] == 88
    assert any(f.kind == "sources_disagree" for f in fused.findings)
    assert fused.confidence == "low"  # two sources point elsewhere


def test_the_flight_recorder_names_the_culprit_when_stacks_cannot_and_a_timeout_stays_a_timeout():
    fused = fuse(
        {
            "logs": verdict("nccl_timeout", [], role="symptom"),
            "flight_recorder": verdict("hang", [0]),
            "stacks": verdict("hang", []),
        }
    )
    assert (fused.category, fused.culprit_ranks) == ("nccl_timeout", [0])


def test_nothing_readable():
    fused = fuse({}, {"logs": "no logs found"})
    assert fused.category == "unknown" and fused.culprit_ranks == []
