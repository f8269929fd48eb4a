"""What gives a failure's category away in any line, read from `signatures.toml`: the words a verdict may not
quote as its evidence, for another category, without saying so (`analysis.consistency`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from torchtriage.knowledge.linear_regex import compile_linear
from torchtriage.knowledge.loader import KNOWLEDGE_DIR, STRING, STRINGS, TABLES, KnowledgeError, check_table, read_toml
from torchtriage.model import CATEGORIES

SIGNATURES_FILE = KNOWLEDGE_DIR / "signatures.toml"
_EDGES = " ,;:=([{|'\")]}"  # the delimiters a token's pattern takes with it


@dataclass(frozen=True)
class Signature:
    category: str
    what: str  # the failure the words show, for a person ("a NaN or Inf value")
    rule: str  # the rule whose cause and actions a line showing it is routed to
    patterns: tuple[Any, ...]
    unless: tuple[Any, ...] = ()

    def shown_by(self, text: str) -> tuple[int, int] | None:
        """Where in `text` the words that show this signature are, or None. Text an `unless` pattern finds (a
        setting that names the value) is blanked out first."""
        for veto in self.unless:
            text = veto.sub(lambda found: " " * len(found.group(0)), text)
        for pattern in self.patterns:
            found = pattern.search(text)
            if found:
                return found.span()
        return None


@dataclass(frozen=True)
class SignatureKnowledge:
    signatures: tuple[Signature, ...]

    def signature_of(self, text: str) -> tuple[Signature, str] | None:
        """The first signature `text` shows, and the words that show it."""
        return next(iter(self.signatures_of(text)), None)

    def signatures_of(self, text: str) -> list[tuple[Signature, str]]:
        """Every signature `text` shows, in the file's order, each with its words. Words one signature took
        are not another's: "Cuda failure 'out of memory'" is a GPU's out-of-memory error, not a host's too."""
        shown = []
        for signature in self.signatures:
            span = signature.shown_by(text)
            if span is not None:
                start, end = span
                shown.append((signature, text[start:end].strip(_EDGES)))
                text = f"{text[:start]}{' ' * (end - start)}{text[end:]}"
        return shown


def _signature(raw: dict, where: str) -> Signature:
    table = check_table(
        raw, where, {"category": STRING, "what": STRING, "rule": STRING, "patterns": STRINGS}, {"unless": STRINGS}
    )
    if table["category"] not in CATEGORIES:
        raise KnowledgeError(f"{where}: unknown category {table['category']!r}")
    return Signature(
        table["category"],
        table["what"],
        table["rule"],
        tuple(compile_linear(p, where) for p in table["patterns"]),
        tuple(compile_linear(p, where) for p in table.get("unless", [])),
    )


@lru_cache(maxsize=1)
def signature_knowledge() -> SignatureKnowledge:
    return load_signature_knowledge()


def load_signature_knowledge(path: Path = SIGNATURES_FILE) -> SignatureKnowledge:
    """The signatures of `path`; a KnowledgeError names the table that is wrong."""
    raw = check_table(read_toml(path), path.name, {"signature": TABLES})
    signatures = [_signature(item, f"{path.name} [[signature]] #{n + 1}") for n, item in enumerate(raw["signature"])]
    return SignatureKnowledge(tuple(signatures))
