"""Fusing what logs, flight recorder and stacks say (pure)."""

from torchtriage.analysis.fusion import fuse
from torchtriage.model import Assessment, Finding


def verdict(category, culprits, *, role="primary", confidence="medium", summary="s", frame=None, source=""):
    facts = {"user_frame": frame} if frame else {}
    finding = Finding("k", culprits, "m", role, category, blames=bool(culprits))
    return Assessment(source, [finding], summary, category, culprits, confidence, facts, lead=finding)


def fuse_sources(by_source: dict, reasons=None):
    """The sources keyed by name, as the tests below read best."""
    assessments = []
    for name, assessment in by_source.items():
        assessment.source = name
        assessments.append(assessment)
    return fuse(assessments, reasons)


def test_agreeing_sources_raise_confidence_and_name_what_was_missing():
    fused = fuse_sources({"flight_recorder": verdict("hang", [3]), "stacks": verdict("hang", [3])})
    assert (fused.category, fused.culprit_ranks, fused.confidence) == ("hang", [3], "high")
    assert fused.findings[0].kind == "fusion.sources_agree"
    assert fused.facts["sources_used"] == ["flight_recorder", "stacks"]
    assert fused.facts["sources_missing"] == {"logs": "not given"}


def test_a_cause_in_the_logs_beats_the_hang_it_caused():
    logs = verdict("oom", [5], frame={"file": "train.py", "line": 88, "function": "forward", "rank": 5})
    fused = fuse_sources({"logs": logs, "stacks": verdict("hang", [2]), "flight_recorder": verdict("hang", [2])})
    assert (fused.category, fused.culprit_ranks) == ("oom", [5])
    assert fused.facts["user_frame"]["line"] == 88
    assert any(f.kind == "fusion.sources_disagree" for f in fused.findings)
    assert fused.confidence == "low"  # two sources point elsewhere


def test_the_flight_recorder_names_the_culprit_when_stacks_cannot_and_a_timeout_stays_a_timeout():
    fused = fuse_sources(
        {
            "logs": verdict("nccl_timeout", [], role="symptom"),
            "flight_recorder": verdict("hang", [0]),
            "stacks": verdict("hang", []),
        }
    )
    assert (fused.category, fused.culprit_ranks) == ("nccl_timeout", [0])


def test_nothing_readable():
    fused = fuse_sources({}, {"logs": "no logs found"})
    assert fused.category == "unknown" and fused.culprit_ranks == []
