"""Rule patterns compiled for linear time: RE2, whatever the line.

A log line comes from a job, and a crafted or merely unlucky line can make a backtracking engine take
exponential time on a pattern with nested or adjacent quantifiers (the optional `[\\w.-]+:` prefix before
an anchor cost seconds per 16 KB line). RE2 runs every pattern as an automaton: time linear in the
line, never more. The constructs only a backtracking engine can run (lookaround, back-references,
atomic groups, possessive quantifiers) are refused when the rules load, with the way to say the same
thing: a rule's `unless` patterns veto a match instead of a lookaround.

Without the `google-re2` package (a dependency; a broken install may lack it) Python's engine runs the
same patterns, which are then still free of the refused constructs.
"""

from __future__ import annotations

import re
from typing import Any

from torchtriage.knowledge.loader import KnowledgeError

_RE2_MEMORY = 8 << 20


def _parser():
    if hasattr(re, "_parser"):
        return re._parser
    import sre_parse  # pragma: no cover - Python 3.10

    return sre_parse  # pragma: no cover


_REFUSED = {
    "ASSERT": "a lookahead or lookbehind",
    "ASSERT_NOT": "a negative lookahead or lookbehind",
    "GROUPREF": "a back-reference",
    "GROUPREF_EXISTS": "a conditional group",
    "ATOMIC_GROUP": "an atomic group",
    "POSSESSIVE_REPEAT": "a possessive quantifier",
}


def _ops(node: Any, subpattern: type) -> list[str]:
    """Every opcode name in a parsed pattern, nested groups, branches and repeats included."""
    names: list[str] = []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, subpattern):
            for op, arg in item.data:
                names.append(str(op))
                stack.append(arg)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return names


def compile_linear(text: str, where: str):
    """`text` compiled by RE2 (Python's engine without it); a KnowledgeError says what cannot be linear."""
    parser = _parser()
    try:
        parsed = parser.parse(text)
    except re.error as err:
        raise KnowledgeError(f"{where}: pattern {text!r} does not compile: {err}") from None
    refused = {_REFUSED[name] for name in _ops(parsed, type(parsed)) if name in _REFUSED}
    if refused:
        raise KnowledgeError(
            f"{where}: pattern {text!r} uses {', '.join(sorted(refused))}, which only a backtracking engine "
            "can run (and a crafted line can make it run for minutes); match the text itself and veto what "
            "must not match with `unless` patterns"
        )
    try:
        import re2
    except ImportError:  # pragma: no cover - google-re2 is a dependency
        return re.compile(text)
    options = re2.Options()
    options.max_mem = _RE2_MEMORY
    try:
        return re2.compile(text, options)
    except re2.error as err:
        raise KnowledgeError(f"{where}: pattern {text!r} is not a pattern RE2 can run: {err}") from None


def is_linear(pattern: Any) -> bool:
    """Whether a compiled pattern runs in linear time (it is an RE2 pattern)."""
    return type(pattern).__module__.split(".")[0] == "re2"
