"""Whether a raw log line could match any rule at all: one call into C before a line is decoded and peeled.

The prefilter finds lines that hold a rule's anchor; most such lines in a chatty log are not the rule's
message ("timeout" in a config dump, "nan" in a metric name), and peeling and matching each one from Python
cost dozens of times an ordinary line. This gate is one RE2 automaton of every rule's patterns, relaxed so
that it finds, in the raw bytes, a superset of what the rules find in the peeled text:

- peeling removes a prefix and trailing white space, so `^` and `\\A` match anywhere and `$`, `\\Z` and `\\z`
  after any trailing white space;
- a rule's distinctive phrases (whole, or a head the line ends with: a message cut short) and the markers
  the reader follows besides rules (tracebacks, torchrun's report, lines that withdraw a rule) are literals;
- what peeling changes inside a line is routed to the full path, never judged here: terminal escapes, any
  byte outside ASCII (decoding and Unicode case folding), an NCCL header of the releases that printed no
  `NCCL` tag (it is put back).

The automaton reads bytes as Latin-1, so a byte is a character and ASCII classes mean what RE2's mean in the
rules' own compilation (RE2's `\\w`, `\\d`, `\\s` are ASCII in both). A pattern that holds a character outside
ASCII is replaced by its rule's anchors, which every match of the rule holds. Without RE2, or where the
automaton would not build, every line takes the full path.

The same alternatives also answer for many lines at once (`Gate.block`): whether any line of a stretch could
match, in one call into C, so that a stretch of anchor lines costs what the ordinary lines around it cost. There,
`$` ends every line and no class takes a newline (RE2's `never_nl`), so the answer is that of each line alone;
the routed constructs count only on a line that also holds one of the prefilter's words (alone they would stop
at every non-ASCII line of a log).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# What peeling changes inside a line: such lines are always read in full.
_ROUTED = (
    r"[\x1b\x80-\xff]",  # escapes (ECMA-48, and the C1 CSI 0x9b among the bytes outside ASCII)
    r"\[\d{1,4}\] (?:[\w/.-]{1,200}:\d{1,7} )?(?:WARN|INFO) ",  # NCCL's untagged header (sources.lines)
)
# White space str.rstrip() removes, in ASCII: the end of a peeled line is before it.
_TRAILING = r"[\t\n\x0b\x0c\r\x1c-\x1f ]*"
_GATE_MEMORY = 64 << 20


def relaxed(pattern: str) -> str | None:
    """`pattern` with its anchors to the start and end of the text loosened for the raw line, or None where it
    holds a character outside ASCII. Escapes and character classes are copied as they are."""
    if not pattern.isascii():
        return None
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            escape = pattern[i : i + 2]
            i += 2
            if not in_class and escape == "\\A":
                continue
            out.append(f"(?:{_TRAILING}$)" if not in_class and escape in ("\\Z", "\\z") else escape)
            continue
        if in_class:
            in_class = char != "]" or out[-1] in ("[", "[^")  # "[]" and "[^]" hold a literal bracket
            out.append(char)
        elif char == "[":
            in_class = True
            out.append("[^" if pattern[i + 1 : i + 2] == "^" else "[")
            i += 1 if out[-1] == "[^" else 0
        elif char == "^":
            pass
        elif char == "$":
            out.append(f"(?:{_TRAILING}$)")
        else:
            out.append(char)
        i += 1
    return "".join(out)


def block_alternatives(alternatives: list[str], words: Iterable[str]) -> list[str]:
    """The gate's `alternatives` for a search over many lines: each routed construct only beside one of `words`
    (the prefilter's) on the same line. A word outside ASCII is written as its UTF-8 bytes, read as Latin-1."""
    held = "|".join(re.escape(word.encode("utf-8").decode("latin-1")) for word in sorted(set(words)))
    routed = [
        f"(?:{construct})[^\\n]*(?:{held})|(?:{held})[^\\n]*(?:{construct})" if held else construct
        for construct in _ROUTED
    ]
    return [*(a for a in alternatives if a not in _ROUTED), *routed]


def gate_alternatives(
    patterns_by_rule: Iterable[tuple[Iterable[str], Iterable[str]]],
    phrases: Iterable[tuple[str, Iterable[str]]],
    literals: Iterable[str],
) -> list[str]:
    """Every alternative of the gate: each rule's relaxed patterns (its anchors where one cannot be relaxed),
    its phrases whole or as the head a line ends with, the literals, and the routed constructs."""
    alternatives = list(_ROUTED)
    for patterns, anchors in patterns_by_rule:
        loosened = [relaxed(p) for p in patterns]
        if all(p is not None for p in loosened):
            alternatives.extend(f"(?:{p})" for p in loosened)  # type: ignore[misc]
        else:
            alternatives.extend(re.escape(a) for a in anchors if a.isascii())
    for phrase, heads in phrases:
        alternatives.extend(re.escape(text) for text in (phrase,) if text.isascii())
        ascii_heads = [re.escape(head) for head in heads if head.isascii()]
        if ascii_heads:
            alternatives.append(f"(?:{'|'.join(ascii_heads)}){_TRAILING}$")
    alternatives.extend(re.escape(text) for text in literals if text.isascii())
    return alternatives


class Gate:
    """`could_match(raw)`: False only where no rule can match the line and no marker the reader follows is
    in it; `block.could_match(lines)`: the same for every line of `lines` (whole lines, a bytes-like view).

    An RE2 set of one pattern: a set answers which patterns match from the automaton alone, where a search
    also asks where (a search of this automaton costs twenty times as much per line). The set holds one more
    pattern, the empty one, found in every text, so that a set that gave up (one state of its automaton would
    not fit its memory) sends the line down the full path instead of dropping it."""

    def __init__(self, compiled, always: int, block: Gate | None = None):
        self._compiled = compiled
        self._always = always
        self.block = block  # the gate for many lines at once, or None: each line is asked on its own

    @classmethod
    def of(cls, alternatives: list[str], words: Iterable[str]) -> Gate | None:
        """The gate of `alternatives`, with its gate for many lines (`words`: the prefilter's)."""
        try:
            import re2
        except ImportError:  # pragma: no cover - google-re2 is a dependency
            return None
        line = _compiled_set(re2, "|".join(alternatives), never_nl=False)
        if line is None:  # a pattern RE2 ran alone but not relaxed: every line takes the full path
            return None
        block = _compiled_set(re2, "(?m)" + "|".join(block_alternatives(alternatives, words)), never_nl=True)
        return cls(*line, None if block is None else cls(*block))

    def could_match(self, raw) -> bool:
        found = self._compiled.Match(raw)
        return len(found) != 1 or self._always not in found


def _compiled_set(re2, pattern: str, never_nl: bool):
    """(an RE2 set of `pattern` and the empty pattern, read as Latin-1 with no captures, the empty one's index),
    or None where RE2 will not build it."""
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1
    options.max_mem = _GATE_MEMORY
    options.never_capture = True
    options.never_nl = never_nl
    options.log_errors = False
    compiled = re2.Set.SearchSet(options)
    try:
        compiled.Add(pattern.encode("latin-1"))
        always = compiled.Add(b"")
        compiled.Compile()
    except (re2.error, UnicodeEncodeError):
        return None
    return compiled, always
