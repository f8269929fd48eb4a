"""The prefilter of the log scan, compiled from the knowledge base: the literal anchors of every rule,
and the markers of what the analysis needs besides rules (tracebacks, torchrun's failure report).

One compiled search finds candidate positions in big blocks of bytes at C speed (`sources.logs.scan_lines`
reads with it); only the lines around them are decoded and matched. RE2 (`google-re2`) turns the
alternation into a DFA; without it, a trie-factored Python regex gives the same hits more slowly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Markers that are not rules but that the analysis needs to see: Python tracebacks, exception lines,
# and torchrun's "Root Cause (first observed failure)" report.
STRUCTURE_MARKERS = (
    "Traceback (most recent call last)",
    'File "',
    "Error",
    "Exception",
    "KeyboardInterrupt",  # a traceback's exception line that holds neither word above
    "Root Cause (first observed failure)",
    "Failures:",
    # the fields of torchrun's report (torch/distributed/elastic/multiprocessing/errors: `_format_failure`) that
    # start an entry, name its host, its rank and how it ended
    "  time      : ",
    "  host      : ",
    "(local_rank: ",
    "exitcode  :",
)
# Lines only torchrun's agent prints (its banner from run.py, its agent's and process manager's logging, by path
# or by logger name; a rank's own traceback through the `@record` decorator passes elastic/multiprocessing/errors,
# never these): in a file holding one, a launcher's task or process number (srun's "task 1", mpirun's "process
# rank 1") numbers a node's agent, not a rank (sources/log_records.py).
AGENT_MARKERS = (
    "torch/distributed/run.py:",
    "torch/distributed/elastic/agent/",
    "torch/distributed/elastic/multiprocessing/api.py:",
    "torch.distributed.elastic.agent.",
    "torch.distributed.elastic.multiprocessing.api:",
)
STRUCTURE_MARKERS += AGENT_MARKERS
# The agent's account of its rendezvous: which job ranks its node's local ranks are (sources/log_records.py).
STRUCTURE_MARKERS += ("group_world_size=", "local_ranks=[", "global_ranks=[")
# DeepSpeed's launcher's header of its node and its report of each process that exited 0
# (sources/deepspeed_launch.py).
STRUCTURE_MARKERS += ("num_local_procs=", "exits successfully")
# NCCL's set-up line of a communicator from 2.19 (its "Init COMPLETE" is a rule's): under torchrun's local-rank prefix
# it places that rank in the job (sources/log_records.py).
STRUCTURE_MARKERS += ("- Init START",)
# srun's reports of how its tasks ended and that it ends the step itself (sources/srun_tasks.py).
STRUCTURE_MARKERS += ("srun: error: ", "srun: Terminating ", "_step_signal: Terminating ")
# journalctl's separator between boots: the kernel's lines above it are an earlier boot's (sources/log_records.py).
STRUCTURE_MARKERS += ("-- Boot ", "-- Reboot --")
# Python's sentences between a chain's exceptions (Lib/traceback.py, TracebackException.format): the traceback after
# one was raised while handling the one before, in the same process (sources/log_records.py).
CHAIN_SENTENCES = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
STRUCTURE_MARKERS += CHAIN_SENTENCES


# How often a byte starts a regex attempt in a typical log, roughly: the prefilter starts each word at its
# rarest byte, because Python's regex engine skips quickly over positions whose byte cannot begin a
# match, and slowly over those that can. Lowercase letters follow English frequencies; unlisted bytes
# (most capitals, rare punctuation) count as rare.
_COMMON_BYTES = dict(
    zip(
        b" etaoinshrdlcumwfgypbvkjxqz0123456789.:/-_=,[]()",
        [150, 76, 54, 49, 45, 42, 40, 38, 36, 36, 26, 24, 17, 17, 14, 14, 13, 12, 12, 11, 9, 6, 5, 1, 1, 1, 1]
        + [30] * 10
        + [20, 12, 10, 10, 8, 8, 6, 6, 6, 5, 5],
        strict=True,
    )
)
_MIN_PREFILTER_WORD = 4
_RE2_MEMORY = 64 << 20


def prefilter_word(word: str) -> bytes:
    """The suffix of `word` that starts at its rarest byte, keeping at least two thirds of it.

    Any line containing `word` contains this suffix, so the prefilter loses nothing. Two costs are
    balanced: a common first byte makes the regex engine stop at many positions (cheap each), while a
    short suffix ("loss" out of "nan loss") makes ordinary lines pass the prefilter (costly each), so
    the suffix keeps most of the word.
    """
    data = word.encode("utf-8")
    keep = min(len(data), max(_MIN_PREFILTER_WORD, (2 * len(data) + 2) // 3))
    start = min(range(len(data) - keep + 1), key=lambda i: (_COMMON_BYTES.get(data[i], 2), i))
    return data[start:]


def compile_prefilter(words: Iterable[str]):
    """A compiled search for any of `words` in bytes, with `.search(buffer, pos, endpos)`.

    RE2 (the `google-re2` package) turns the alternation into a DFA and scans hundreds of MB/s
    whatever the number of words. Python's own engine tries the alternatives one by one wherever a
    word could start, so without RE2 the trie below keeps the scan correct, only slower.
    """
    unique = sorted(set(words))
    try:
        import re2
    except ImportError:
        return literal_trie_regex(unique)
    options = re2.Options()
    options.max_mem = _RE2_MEMORY  # room for the DFA of a few hundred words; it never falls back to NFA
    pattern = b"|".join(re.escape(word.encode("utf-8")) for word in unique) if unique else b"[^\\x00-\\xff]"
    return re2.compile(pattern, options)


def span_search(compiled):
    """`find(buffer, pos, end)`: the (start, stop) of `compiled`'s first hit in buffer[pos:end], or None.

    A hit of the prefilter costs its scan little but its call much: the `re2` package's `search` runs a
    generator and builds a match object in Python, half the cost of a line that holds a rule's anchor and
    matches nothing. The RE2 object's own call returns the span alone; any other engine goes through `search`."""
    try:
        import re2

        regexp, unanchored, nothing = compiled._regexp, re2._Anchor.UNANCHORED, re2._NULL_SPAN
        regexp.Match  # noqa: B018 - the call the fast path makes, checked once
    except (ImportError, AttributeError):

        def find(buffer: bytes, pos: int, end: int) -> tuple[int, int] | None:
            found = compiled.search(buffer, pos, end)
            return None if found is None else found.span()

        return find

    def find_in_re2(buffer: bytes, pos: int, end: int) -> tuple[int, int] | None:
        end = min(end, len(buffer))
        if pos >= end:  # RE2 itself logs an invalid range to stderr; an empty one holds no word
            return None
        span = regexp.Match(unanchored, buffer, max(pos, 0), end)[0]
        return None if span == nothing else span

    return find_in_re2


def literal_trie_regex(words: Iterable[str]) -> re.Pattern[bytes]:
    """One regex that finds any of `words`; factored as a trie so each position costs few branches."""
    trie: dict = {}
    for word in words:
        node = trie
        for byte in prefilter_word(word):
            node = node.setdefault(byte, {})
        node[None] = {}  # end of a word: a shorter word suffices, longer ones add nothing

    def build(node: dict) -> bytes:
        if None in node:
            return b""
        branches = [re.escape(bytes([byte])) + build(child) for byte, child in sorted(node.items())]
        return branches[0] if len(branches) == 1 else b"(?:" + b"|".join(branches) + b")"

    return re.compile(build(trie) if trie else rb"(?!)")


def longest_literal_regex(words: Iterable[str]) -> re.Pattern[str]:
    """A regex whose lookahead at each position reports the longest of `words` starting there.

    Factored as a trie: a flat alternation of hundreds of words costs hundreds of tries per position.
    """
    trie: dict = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}  # end of a word

    def build(node: dict) -> str:
        branches = [re.escape(char) + build(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        # Greedy: a longer word is tried before the shorter one that ends here.
        return f"(?:{body})?" if "" in node else body

    return re.compile(f"(?=({build(trie)}))" if trie else "(?!)")
