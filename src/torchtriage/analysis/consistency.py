"""Self-consistency: a verdict never quotes a line that shows another category's failure without saying so.

Two kinds of reading quote a line. A reading of absence ("the log shows no error and stops after its last
line: …", "a failure that no rule knows: …") says nothing about the line itself, so a line that shows a
failure's signature (`loss: nan`, `Killed`, `NCCL WARN`, `CUDA out of memory`) is the stronger reading:
it leads, at low confidence (words, not a known format), and the verdict keeps the weaker reading beside
it. A rule's reading names the failure its pattern matched; another category's signature elsewhere in the
same line is a second reading: the verdict keeps its category, says both, and is one level less sure.
The signatures are data (`knowledge/signatures.toml`).
"""

from __future__ import annotations

from torchtriage.analysis.stall import LOG_STOPS, UNRECOGNISED
from torchtriage.knowledge.rules import rule_by_id
from torchtriage.knowledge.signatures import Signature, signature_knowledge
from torchtriage.model import Assessment, Evidence, Finding

# The readings of absence: the line they quote is where a log stopped, not what failed.
_ABSENCE = (LOG_STOPS, UNRECOGNISED)
_LOWER = {"high": "medium", "medium": "low", "low": "low"}
_MAX_QUOTE = 200


def _outside_the_match(kind: str, text: str) -> str:
    """`text` without what the rule `kind` matched in it: the rule's own words are its reading."""
    rule = rule_by_id(kind)
    for pattern in rule.patterns if rule is not None else ():
        found = pattern.search(text)
        if found:
            return f"{text[: found.start()]} {text[found.end() :]}"
    return text


def _first_signature(text: str, category: str) -> tuple[Signature, str] | None:
    """The signature a line shows first, when it is another category's."""
    shown = signature_knowledge().signature_of(text)
    return shown if shown is not None and shown[0].category != category else None


def _another_signature(text: str, category: str) -> tuple[Signature, str] | None:
    """Any signature of another category a line shows."""
    return next((s for s in signature_knowledge().signatures_of(text) if s[0].category != category), None)


def consistent(assessment: Assessment) -> Assessment:
    """`assessment` whose quoted lines agree with its reading, or that says where they do not."""
    lead = assessment.lead
    if lead is None or not lead.evidence:
        return assessment
    if lead.kind in _ABSENCE:
        return _signature_leads(assessment, lead)
    for evidence in lead.evidence:
        shown = _another_signature(_outside_the_match(lead.kind, evidence.text), assessment.category or lead.category)
        if shown is not None:
            return _says_both(assessment, lead, evidence, *shown)
    return assessment


def _signature_leads(assessment: Assessment, lead: Finding) -> Assessment:
    """A reading of absence whose line shows a failure: the failure leads, the absence is kept beside it."""
    quoted = lead.evidence[0]
    shown = _first_signature(quoted.text, assessment.category or lead.category)
    if shown is None or rule_by_id(shown[0].rule) is None:
        return assessment
    signature, words = shown
    message = (
        f"The log ends on a line that shows {signature.what} ({words!r}) in a format no rule knows: "
        f"{quoted.text.strip()[:_MAX_QUOTE]}"
    )
    finding = Finding(
        signature.rule,
        list(lead.ranks),
        message,
        "symptom",
        signature.category,
        [Evidence(quoted.source, quoted.file, quoted.line, quoted.rank, quoted.text)],
        {"signature": words, "other_reading": lead.message},
    )
    assessment.findings.insert(0, finding)
    assessment.lead = finding
    assessment.facts["other_reading"] = lead.message
    assessment.summary = f"{message}; else: {assessment.summary}"
    assessment.category = signature.category
    assessment.confidence = "low"
    return assessment


def _says_both(assessment: Assessment, lead: Finding, evidence: Evidence, signature: Signature, words: str):
    """A rule's line that also shows another category's signature: both readings, one level less sure."""
    note = (
        f"the line quoted as evidence ({evidence.file}:{evidence.line}) also shows {signature.what} "
        f"({words!r}): read as {signature.category} it would say otherwise"
    )
    assessment.facts["other_reading"] = {"category": signature.category, "words": words, "line": evidence.line}
    assessment.problems.append(note[0].upper() + note[1:])
    assessment.confidence = _LOWER[assessment.confidence or "low"]
    return assessment
