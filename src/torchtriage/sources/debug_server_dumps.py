"""The periodic dumps of PyTorch's debug server (`start_debug_server(dump_dir=...)`): one file per handler and
moment, `stacks_<YYYYmmdd_HHMMSS>.txt` (faulthandler's, per rank) or `pyspy_dump_<...>.txt` (py-spy's), each
every rank's stack in a section of its own (torch/distributed/debug/_debug_handlers.py, dump()):

    PARTIAL DATA: 7/8 workers responded          only when some did not, then one line per rank that failed
      Rank 3: <why>
    === Rank 0: http://host:port/handler/dump_traceback? ===
    <the rank's stack, or "Error: <status>">

Split here into one stack per rank, each read by the reader of its own form.
"""

from __future__ import annotations

import re

from torchtriage.sources.faulthandler import parse_faulthandler
from torchtriage.sources.pyspy import ProcessStack, parse_dump

SECTION = re.compile(r"^=== Rank (\d{1,9}): (.*) ===$", re.MULTILINE)
_FAILED = re.compile(r"^\s*Rank (\d{1,9}): (.*)$", re.MULTILINE)


def split_ranks(text: str) -> tuple[dict[int, str], dict[int, str]]:
    """rank -> its section's text, and rank -> why it gave none (an error, or the partial-data summary)."""
    sections: dict[int, str] = {}
    failed: dict[int, str] = {}
    marks = list(SECTION.finditer(text))
    if marks and text[: marks[0].start()].lstrip().startswith("PARTIAL DATA:"):
        failed |= {int(m.group(1)): m.group(2).strip()[:200] for m in _FAILED.finditer(text[: marks[0].start()])}
    ends = [following.start() for following in marks[1:]] + [len(text)]  # a file of no section: no ends at all
    for mark, end in zip(marks, ends[: len(marks)], strict=True):
        body = text[mark.end() : end].strip("\n")
        rank = int(mark.group(1))
        if body.startswith("Error: ") and "\n" not in body.strip():
            failed.setdefault(rank, body.strip())
        elif body.strip():
            sections[rank] = body + "\n"
    return sections, failed


def parse_debug_server_stacks(text: str, source: str) -> tuple[dict[int, ProcessStack], list[str]]:
    """Each rank's stack in a debug server's stacks dump, and a problem per rank that gave none."""
    sections, failed = split_ranks(text)
    stacks: dict[int, ProcessStack] = {}
    problems = [f"{source}: rank {rank} gave no stack in this dump ({why})" for rank, why in sorted(failed.items())]
    for rank, body in sections.items():
        where = f"{source} (rank {rank})"
        if body.lstrip().startswith("Process "):
            parsed = parse_dump(body, where)
            if parsed:
                stacks[rank] = parsed[0]
        else:
            stacks[rank] = parse_faulthandler(body, where)
    if not stacks and not problems:
        problems.append(f"{source}: a debug server's stacks dump that holds no rank's stack")
    return stacks, problems
