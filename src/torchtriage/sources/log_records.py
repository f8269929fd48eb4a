"""From log artifacts to typed records: rule events, Python tracebacks, torchrun's failure report.

Nothing here judges: the triage engine (analysis/triage.py) reasons over these records. The reader
keeps small per-file state for the two multi-line structures that matter (a traceback, an entry of
torchrun's report) and attributes every record to a rank: the launcher's line prefix first, then the
file name, then the message.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from functools import partial

from torchtriage.knowledge.matcher import Matcher
from torchtriage.knowledge.prefilter import AGENT_MARKERS, CHAIN_SENTENCES
from torchtriage.knowledge.rules import Rule
from torchtriage.model import Frame
from torchtriage.sources import limits
from torchtriage.sources.deepspeed_launch import DeepSpeedLaunch
from torchtriage.sources.fields import as_int
from torchtriage.sources.forked import can_fork, map_forked, usable_cores
from torchtriage.sources.limits import LimitExceeded
from torchtriage.sources.lines import Normalised, normalise
from torchtriage.sources.log_head import starts_mid_message
from torchtriage.sources.logs import MAX_LINE_CHARS, Tail, Wrapping, rejoined, scan_lines
from torchtriage.sources.registry import STDIN, Input, open_input
from torchtriage.sources.srun_tasks import SrunTasks


@dataclass
class LogEvent:
    """One line that matched one rule."""

    rule: Rule
    facts: dict[str, str]
    rank: int | None
    time: float | None
    file: str
    line: int
    text: str
    order: int  # position in reading order across all inputs
    severity: str | None = None  # glog's I/W/E/F (or the logger's level) where the line carries one
    aftermath: bool = False  # after a line of its file that says what it is the aftermath of (`aftermath_after`)
    host: str | None = None  # the host a launcher put before the line (pdsh's "node-07: "): the machine that printed it
    # Where the rank is a number taken for the job's rank on no more than an assumption: "task" (srun's task, a
    # node's where srun started torchrun), "local" (a rank within its node, where nothing placed the node: torchrun
    # --tee's prefix, DeepEP's NVLink rank; the verdict says it and names no job rank).
    rank_from: str | None = None


@dataclass
class PyTraceback:
    rank: int | None
    file: str
    line: int  # where the traceback starts
    frames: list[Frame] = field(default_factory=list)  # outermost first, as Python prints them
    exception: str | None = None  # the exception's qualified type name
    message: str = ""
    exception_line: int | None = None
    time: float | None = None
    # Printed by sys.unraisablehook ("Exception ignored in: <function ...__del__>"): a destructor or an
    # atexit handler failed, after the fact; it ended nothing.
    ignored: bool = False
    rank_from: str | None = None  # "local": `rank` is a rank within its node that nothing placed (as LogEvent's)
    chained: bool = False  # raised while handling the one before it: Python's chain sentence came between them


@dataclass
class ChildFailure:
    """One entry of torchrun's `Failures:` / `Root Cause (first observed failure):` report."""

    root_cause: bool
    file: str
    line: int
    rank: int | None = None
    local_rank: int | None = None
    exit_code: int | None = None
    pid: int | None = None
    host: str | None = None
    time: float | None = None
    traceback: str = ""


def text_lines(data: bytes) -> list[str]:
    """The lines of a tail's bytes as the scanner numbers them: ended by a newline only (the scanner has made a
    lone CR one), never by the form feeds, separators and U+2028 that `str.splitlines` also breaks at."""
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


@dataclass(frozen=True)
class LocalPlacing:
    """What a file's local-rank prefixes ("[default3]:", torchrun --tee) name once the file is read (_LocalRanks):
    the job's rank an agent's account, torchrun's report or NCCL's world communicator gives each (`mapping`; a
    local rank none of them places is a local rank only), or, where none does, the local rank itself: the job's on
    one node, a local rank only (`local_only`) where nothing says there was one node."""

    mapping: dict[int, int] | None  # None: a local rank is the job's rank of the same number
    local_only: bool = False

    def job_rank(self, local: int) -> tuple[int, bool]:
        """The rank a local one is, and whether that is the local rank only (nothing placed it)."""
        if self.mapping is None:
            return local, self.local_only
        placed = self.mapping.get(local)
        return (local, True) if placed is None else (placed, False)


# A file whose prefixes nothing placed: its local ranks are numbers within some node.
_UNPLACED = LocalPlacing(None, local_only=True)


@dataclass
class LogTail:
    """The last lines of one log, raw: where a log that shows no error stops is the evidence of a stall."""

    file: str
    rank: int | None  # the rank the file's name implies
    first_line: int
    data: bytes
    wrapping: Wrapping | None = None  # how the log was hard-wrapped, if it was
    # The log is all here and begins inside a message (sources/log_head.py): what came before, perhaps the first
    # failure, is not in it. Read where the log is read (on every core for a folder of thousands).
    cut_at_start: bool = False
    # The host prefixes the log's lines showed (pdsh's "node-07: "): peeled off its tail's lines as off the rest.
    hosts: frozenset[str] = frozenset()
    # How the file's local-rank prefixes name ranks (None: nothing placed them, see _UNPLACED).
    local_placing: LocalPlacing | None = None
    _normalised: list | None = field(default=None, repr=False, compare=False)
    _local_lines: set[int] = field(default_factory=set, repr=False, compare=False)

    @property
    def last_own_record(self) -> bytes | None:
        """Its last line, when that is a record of torchtriage's own (nonfinite.jsonl or stragglers.jsonl, read
        as a log): where such a file ends says nothing of where a job stopped."""
        last = self.data.rstrip().rpartition(b"\n")[2]
        return last if _OWN_RECORD.match(last) else None

    def numbered_lines(self) -> list[tuple[int, str]]:
        """(line number, text) of every line, as the scan reads them: where the log was hard-wrapped, a message
        cut into pieces is one line, numbered by its first piece."""
        if self.wrapping is None:
            return list(enumerate(text_lines(self.data), self.first_line))
        lines = self.data.split(b"\n")
        if self.data.endswith(b"\n"):
            lines.pop()
        return [
            (self.first_line + index, message.decode("utf-8", errors="replace"))
            for index, message in rejoined(lines, self.wrapping)
        ]

    def lines(self) -> list[tuple[int, str, int | None]]:
        """(line number, normalised text, rank) of every line of the tail."""
        return [(number, text, rank) for number, text, rank, _ in self.lines_with_severity()]

    def lines_with_severity(self) -> list[tuple[int, str, int | None, str | None]]:
        """(line number, normalised text, rank, glog's severity or the logger's level) of every line.

        Normalised once: the stall layer, the census and the account of an unknown failure all read them."""
        if self._normalised is not None:
            return self._normalised
        hosts = set(self.hosts)
        read = []
        for number, raw in self.numbered_lines():
            line = normalise(raw[:MAX_LINE_CHARS], hosts)
            if line.host is not None and len(hosts) < _MAX_HOSTS:
                hosts.add(line.host)
            read.append((number, raw, line))
        if len(hosts) > len(self.hosts):
            # A host the tail's own lines showed first (pdsh's prefix before a traceback line): the lines before
            # that one carry it too.
            self.hosts = frozenset(hosts)
            read = [(n, raw, _with_host(raw, line, hosts)) for n, raw, line in read]
        out = []
        placing = self.local_placing or _UNPLACED
        for number, _, line in read:
            rank = line.rank if line.rank is not None else self.rank
            if line.rank_is_local and line.rank is not None:
                rank, local_only = placing.job_rank(line.rank)
                if local_only:
                    self._local_lines.add(number)
            out.append((number, line.text, rank, line.severity or _level(line.text)))
        self._normalised = out
        return out

    def rank_is_local(self, number: int) -> bool:
        """Whether line `number`'s rank is a rank within a node that nothing read places in the job."""
        self.lines_with_severity()
        return number in self._local_lines


def _with_host(raw: str, line: Normalised, hosts: set[str]) -> Normalised:
    """`line` normalised again where it starts with one of `hosts` it did not peel (the host became known later)."""
    if line.host is not None or raw[:80].partition(": ")[0] not in hosts:
        return line
    return normalise(raw[:MAX_LINE_CHARS], hosts)


# The bytes of tails kept across every log of one triage, and per log.
_TAIL_TOTAL = 32 << 20
_TAIL_PER_FILE = (16 << 10, 256 << 10)


def _tail_bytes(files: int) -> int:
    low, high = _TAIL_PER_FILE
    return max(low, min(high, _TAIL_TOTAL // max(files, 1)))


@dataclass
class LogRecords:
    events: list[LogEvent] = field(default_factory=list)
    tracebacks: list[PyTraceback] = field(default_factory=list)
    child_failures: list[ChildFailure] = field(default_factory=list)
    ranks_seen: set[int] = field(default_factory=set)
    # Of `ranks_seen`, by the level of the lines that counted them: a rank among `ranks_informing` alone printed only
    # chatter at INFO level (NCCL's set-up, a framework's [INFO]), which reports no failure (analysis:
    # failing_ranks); a rank among `ranks_reporting` printed a line of another level, or of none said.
    ranks_informing: set[int] = field(default_factory=set)
    ranks_reporting: set[int] = field(default_factory=set)
    files_read: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    tails: list[LogTail] = field(default_factory=list)
    # The ranks the job had, known from outside its logs (the identity records `torchtriage run` leaves): a rank
    # among them that left no line is silent even when it was the highest.
    ranks_known: set[int] = field(default_factory=set)
    # Per file, where DeepSpeed's launcher had logged every process it spawned as exiting 0: (line, text).
    launches_finished: dict[str, tuple[int, str]] = field(default_factory=dict)
    # Per file, the line of journalctl's last boot separator: the kernel's lines above it are an earlier boot's.
    boots: dict[str, int] = field(default_factory=dict)
    # The ranks srun said it ended itself once a task had failed (sources/srun_tasks.py): running then, so none of
    # them left first.
    ended_by_launcher: set[int] = field(default_factory=set)


# The start of a record of torchtriage's own, read as a log line (sources/registry.py: _READ_AS_LOGS).
_OWN_RECORD = re.compile(rb'\s*\{\s*"schema"\s*:\s*"torchtriage\.')
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>.+))?$')
_EXCEPTION = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure|Failed|Fault|Timeout))"
    r"(?::\s?(?P<message>.*))?$"
)
# journalctl's separator between boots ("-- Boot 7f3a...5a6b --"; "-- Reboot --" before systemd 250): the prefilter
# passes it (knowledge/prefilter.py).
# A bound on the host prefixes one file's lines teach (pdsh merges a node's lines per host: a job's node count).
_MAX_HOSTS = 4096
_BOOT_SEPARATOR = re.compile(r"^\s*-- (?:Boot [0-9a-f]{32}|Reboot) --\s*$")
_REPORT_FIELD = re.compile(r"^\s{2}(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<value>.*)$")
_REPORT_RANK = re.compile(r"(?P<rank>\d+) \(local_rank: (?P<local_rank>\d+)\)")
_REPORT_EXIT = re.compile(r"(?P<code>-?\d+)(?: \(pid: (?P<pid>\d+)\))?")
_REPORT_TIME = re.compile(r"(?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d)_(?P<hms>\d\d:\d\d:\d\d)")


# Python logging's default format ("INFO:torch.distributed...:"), the bracketed levels of DeepSpeed,
# transformers and loguru ("[INFO]", "| INFO |") and NCCL's "host:pid:tid [dev] NCCL INFO ..." (NCCL
# reports at INFO what it probes and does without: "NCCL INFO dlvsym failed on ...").
_LEVEL = re.compile(r"^(?:\[?(INFO|DEBUG)\]?[:\s]|.{0,40}?[\[|] ?(INFO|DEBUG) ?[\]|]|.{0,120}?\bNCCL INFO\b)")


def _level(text: str) -> str | None:
    """'I' for a line its logger printed at INFO or DEBUG level, else None."""
    return "I" if _LEVEL.match(text) else None


def _count(records: LogRecords, rank: int, informing: set[bool]) -> None:
    """Count `rank` among the ranks the logs show, by the levels of its lines (`informing`: True for INFO)."""
    records.ranks_seen.add(rank)
    if True in informing:
        records.ranks_informing.add(rank)
    if False in informing:
        records.ranks_reporting.add(rank)


def _report_time(value: str) -> float | None:
    match = _REPORT_TIME.search(value)
    if not match:
        return None
    hours, minutes, seconds = (int(x) for x in match.group("hms").split(":"))
    day_index = int(match.group("month")) * 31 + int(match.group("day"))
    return ((day_index * 24 + hours) * 60 + minutes) * 60 + seconds


def _in_printers_numbering(named: int | None, facts: dict, rank_fact: str | None, printer: int | None) -> int | None:
    """A rank a line names, as a rank of the job: a line that numbers itself (`rank`, a library's own numbering:
    DeepEP's NVLink rank) numbers the rank it names the same way, so where its printer's own rank (`printer`, from
    its prefix) differs, the named rank moves by as much (the NVLink peers of one node are consecutive ranks)."""
    own = _rank_of(facts.get("rank")) if rank_fact not in (None, "rank") else None
    if named is None or own is None or printer is None or own == printer:
        return named
    moved = printer - own + named
    return moved if moved >= 0 else None


def _rank_of(fact: str | None) -> int | None:
    """The rank a line's fact names: digits, up to the largest rank read (a line's \\d+ can be thousands of
    digits long, more than Python converts to a number)."""
    if fact is None or not (fact.isascii() and fact.isdigit()):
        return None
    return as_int(fact, None, 0, limits.active().rank)  # type: ignore[arg-type]


class _FileReader:
    """Per-file state while its hit lines stream by."""

    def __init__(self, artifact: Input, matcher: Matcher, records: LogRecords):
        self.artifact = artifact
        self.matcher = matcher
        self.records = records
        self.open_tracebacks: dict[int | None, PyTraceback] = {}
        self.report_mode: bool | None = None  # None outside torchrun's report, else "is root cause"
        self.report_entry: ChildFailure | None = None
        self.superseded_before: dict[str, int] = {}  # rule id -> last line that withdraws it
        self.aftermath_from: dict[str, int] = {}  # rule id -> first line after which its lines are aftermath
        self.ignored_at: dict[int | None, int] = {}  # rank -> the line of its last "Exception ignored in"
        self.chained_at: dict[int | None, int] = {}  # rank -> the line of its last chain sentence
        self.first_event = len(records.events)
        self.agents_seen = False  # a line only torchrun's agent prints
        self.task_events: list[LogEvent] = []  # events whose rank is a launcher's task number (settled at close)
        self.local = _LocalRanks()  # ranks read from a role's "[default3]:" prefix: a node's (settled at close)
        self.launch = DeepSpeedLaunch()  # DeepSpeed's launcher's processes and which exited 0
        self.srun = SrunTasks()  # the tasks srun ended itself once one had failed
        self.named = _NamedRank(artifact.rank)  # the rank the file's name implies (settled at close)
        self.last_boot = 0  # the line of journalctl's last boot separator
        self.hosts: set[str] = set()  # the host prefixes its lines showed (pdsh's "node-07: "), peeled from then on

    def reads_every_hit(self) -> bool:
        """Whether every line that holds a prefilter word is wanted, not only those that could match: a traceback
        or torchrun's report is open, and any line may end it."""
        return bool(self.open_tracebacks) or self.report_mode is not None

    def feed(self, line_no: int, raw: bytes) -> None:
        # A line that holds an anchor but can match no rule or marker says nothing of a failure: its rank is not
        # counted among those the logs show (`ranks_seen`), whether or not the scan handed it on. Such lines are
        # mostly skipped in C (`LineFinder`); the census must not depend on which of them were.
        counted = self.matcher.could_match(raw)
        if not counted and not self.reads_every_hit():
            return
        decoded = raw[:MAX_LINE_CHARS].decode("utf-8", errors="replace")
        if not self.agents_seen and any(marker in decoded for marker in AGENT_MARKERS):
            self.agents_seen = True  # in the raw line: glog's header, which names the file, is peeled off below
        line = normalise(decoded, self.hosts)
        if line.host is not None and len(self.hosts) < _MAX_HOSTS:
            self.hosts.add(line.host)
        rank, by_name = self.named.of(line)
        text = line.text
        if self.local.read_agent_line(text):
            return
        if line.rank_is_local and rank is not None:
            self.local.read_comm_line(rank, text)
        if _NCCL_INIT_START in text:
            return  # the prefilter passes NCCL's set-up line for read_comm_line alone: it reports no failure
        self.launch.read(line_no, text)
        self.srun.read(text)
        if _BOOT_SEPARATOR.match(text):
            self.last_boot = line_no
        in_report = self._track_report(text, line_no)
        if in_report and self.report_entry is not None and (rank is None or by_name):
            rank, by_name = self.report_entry.rank, False  # the report's entry names its rank; the file's name does not
        time = line.time
        if time is None and in_report and self.report_entry is not None:
            time = self.report_entry.time
        opened = self.open_tracebacks.get(rank)
        ended = self._track_traceback(text, rank, line_no, time)
        if by_name and self.open_tracebacks.get(rank) not in (None, opened):
            self.named.tracebacks.append(self.open_tracebacks[rank])
        if self.matcher.superseding:
            for rule_id in self.matcher.superseded_rules(text):
                self.superseded_before[rule_id] = line_no
        if self.matcher.aftermath_markers:
            for rule_id in self.matcher.rules_in_aftermath(text):
                self.aftermath_from.setdefault(rule_id, line_no)
        level = line.severity or _level(text)
        found_all = list(self.matcher.match(text))
        # A line in a node's own numbering (DeepEP's NVLink ranks) that no prefix places: each rank it gives, the
        # printer's own (`rank = 3`) as the peer's, is a local rank of some node, whichever rule read it.
        node_numbered = rank is None and any(found.rule.local_numbering for found in found_all)
        for found in found_all:
            if ended is not None and found.rule.raised_elsewhere([f.file for f in reversed(ended.frames)]):
                continue  # the traceback this line ends was raised by a library the rule is not about
            event_rank, facts = rank, found.facts
            named = _rank_of(facts.get(found.rule.rank_fact)) if found.rule.rank_fact else None
            # Under a local prefix, a line in its node's numbering (DeepEP's NVLink ranks) names a rank of that node;
            # another line names ranks in its own numbering (DeepEP's buffer rank 47 under "[default7]:").
            in_node = line.rank_is_local and found.rule.local_numbering and named is not None
            if not line.rank_is_local:
                named = _in_printers_numbering(named, facts, found.rule.rank_fact, rank)
            if named is not None:
                event_rank = named  # the line is about another rank than the one printing it
            else:
                if found.rule.rank_fact in facts:  # a rank no numbering places: the line names nobody
                    facts = {k: v for k, v in facts.items() if k != found.rule.rank_fact}
                if event_rank is None:
                    event_rank = _rank_of(facts.get("rank"))
            by_task = event_rank is None and "task" in facts
            named_file = by_name and event_rank == rank
            local_only = node_numbered and event_rank is not None and not by_task
            if by_task:
                event_rank = _rank_of(facts["task"])
            elif event_rank is not None and not named_file and not (line.rank_is_local and event_rank == line.rank):
                if not (in_node or local_only):
                    self.records.ranks_seen.add(event_rank)
            event = LogEvent(
                rule=found.rule,
                facts=facts,
                rank=event_rank,
                rank_from="local" if local_only else None,
                time=time,
                file=self.artifact.display,
                line=line_no,
                text=text.strip(),
                order=len(self.records.events),
                severity=level,
                aftermath=line_no > self.aftermath_from.get(found.rule.id, line_no),
                host=line.host,
            )
            self.records.events.append(event)
            if by_task:
                self.task_events.append(event)
            elif named_file:
                self.named.events.append(event)
            elif line.rank_is_local and (event_rank == line.rank or in_node):
                self.local.events.append(event)
        if rank is not None and counted:
            if by_name:
                self.named.seen.add(level == "I")
            elif line.rank_is_local:
                self.local.seen.setdefault(rank, set()).add(level == "I")
            else:
                _count(self.records, rank, {level == "I"})

    def _track_traceback(self, text: str, rank: int | None, line_no: int, time: float | None) -> PyTraceback | None:
        """Follow this rank's open traceback; the traceback when `text` is the exception line that ends it."""
        if text.lstrip().startswith("Exception ignored in"):
            self.ignored_at[rank] = line_no
            return None
        if text.lstrip().startswith(CHAIN_SENTENCES):
            self.chained_at[rank] = line_no  # the lines a traceback is read from never held it: nothing else changes
            return None
        if text.lstrip().startswith("Traceback (most recent call last)"):
            ignored = line_no - self.ignored_at.get(rank, -10) <= 2
            chained = line_no - self.chained_at.get(rank, -10) <= 2
            self.open_tracebacks[rank] = PyTraceback(
                rank, self.artifact.display, line_no, time=time, ignored=ignored, chained=chained
            )
            return None
        current = self.open_tracebacks.get(rank)
        frame = _FRAME.match(text)
        if current is None:
            if not frame:
                return None
            # A log cut inside a traceback still has its frames: start one without the header.
            current = self.open_tracebacks[rank] = PyTraceback(rank, self.artifact.display, line_no, time=time)
        if frame:
            current.frames.append(
                Frame(
                    frame.group("path"), as_int(frame.group("line"), 0), frame.group("func") or "?", printed_at=line_no
                )
            )
            return None
        if text[:1].isspace():
            return None  # the source line under a frame, or its ^^^^ marker: still inside the traceback
        exception = _EXCEPTION.match(text.strip())
        if exception:
            current.exception = exception.group("type")
            current.message = (exception.group("message") or "").strip()
            current.exception_line = line_no
            if current.time is None:
                current.time = time
        self.records.tracebacks.append(current)
        del self.open_tracebacks[rank]
        return current if exception else None

    def _track_report(self, text: str, line_no: int) -> bool:
        """Follow torchrun's failure report; True while `text` belongs to it."""
        stripped = text.strip()
        if stripped.startswith("Root Cause (first observed failure)"):
            self.report_mode, self.report_entry = True, None
            return True
        if stripped == "Failures:":
            self.report_mode, self.report_entry = False, None
            return True
        if self.report_mode is None:
            return False
        field_match = _REPORT_FIELD.match(text)
        if not field_match:
            self.report_mode, self.report_entry = None, None
            return False
        key, value = field_match.group("key"), field_match.group("value").strip()
        entry = self.report_entry
        if entry is None or key == "time" or (key == "rank" and entry.rank is not None):
            self.report_entry = ChildFailure(self.report_mode, self.artifact.display, line_no)
            self.records.child_failures.append(self.report_entry)
        entry = self.report_entry
        if key == "time":
            entry.time = _report_time(value)
        elif key == "host":
            entry.host = value
        elif key == "rank":
            match = _REPORT_RANK.search(value)
            if match:
                entry.rank = as_int(match.group("rank"), None)  # type: ignore[arg-type]
                entry.local_rank = as_int(match.group("local_rank"), None)  # type: ignore[arg-type]
        elif key == "exitcode":
            match = _REPORT_EXIT.match(value)
            if match:
                entry.exit_code = as_int(match.group("code"), None)
                entry.pid = as_int(match.group("pid"), None) if match.group("pid") else None
        elif key == "traceback":
            entry.traceback = value
        return True

    def close(self) -> None:
        # A traceback cut off by the end of the log still locates the failure.
        self.records.tracebacks.extend(self.open_tracebacks.values())
        self.open_tracebacks.clear()
        self._settle_task_ranks()
        self.named.settle(self.records)
        mine = [tb for tb in self.records.tracebacks if tb.file == self.artifact.display]
        failures = [f for f in self.records.child_failures if f.file == self.artifact.display]
        self.local.settle(self.records, mine, failures)
        if self.launch.finished_at is not None:
            self.records.launches_finished[self.artifact.display] = self.launch.finished_at
        if self.last_boot:
            self.records.boots[self.artifact.display] = self.last_boot
        if self.superseded_before:
            mine = self.records.events[self.first_event :]
            kept = [e for e in mine if e.line > self.superseded_before.get(e.rule.id, 0)]
            self.records.events[self.first_event :] = kept
            for order, event in enumerate(kept, self.first_event):
                event.order = order

    def _settle_task_ranks(self) -> None:
        """A launcher's task or process number (srun's "task 1", mpirun's "process rank 1") is the rank where the
        launcher started the ranks themselves; where the file shows torchrun's agents, the launcher started one
        agent per node (`srun --ntasks-per-node 1 torchrun ...`) and the number is the node's: the line names no
        rank (its host fact still names the machine)."""
        for event in self.task_events:
            if self.agents_seen:
                event.rank = None
            elif event.rank is not None:
                self.records.ranks_seen.add(event.rank)
                event.rank_from = "task"  # an agent's lines need not be in the log that holds srun's
        self.task_events.clear()
        if not self.agents_seen:
            self.records.ended_by_launcher |= self.srun.ended


class _NamedRank:
    """The rank a file's name implies (`rank3.log`, `proc-3.out`: sources/registry.py), given to its lines that carry
    no prefix: a per-rank file's convention. A file whose lines carry other ranks' prefixes is a merged log that only
    its name ties to one rank (named after the rank that failed, say): its unprefixed lines name no rank, and the
    name's rank is not counted as seen."""

    def __init__(self, rank: int | None):
        self.rank = rank
        self.merged = False  # a line carried another rank's prefix
        self.seen: set[bool] = set()  # the levels (True: INFO) of the lines that could match a rule and took its rank
        self.events: list[LogEvent] = []
        self.tracebacks: list[PyTraceback] = []

    def of(self, line) -> tuple[int | None, bool]:
        """A normalised line's rank, and whether it is the name's."""
        if line.rank is None:
            return self.rank, self.rank is not None
        if not line.rank_is_local and line.rank != self.rank:
            self.merged = True
        return line.rank, False

    def of_unprefixed(self) -> int | None:
        """The rank of the file's lines that carry no prefix, once it is read."""
        return None if self.merged else self.rank

    def settle(self, records: LogRecords) -> None:
        if self.merged:
            for item in (*self.events, *self.tracebacks):
                item.rank = None
        elif self.rank is not None and (self.seen or self.events):
            _count(records, self.rank, self.seen)


# torchrun's agent's account of its rendezvous (torch/distributed/elastic/agent/server/api.py, _rendezvous):
# "  group_world_size=2", "  local_ranks=[0, 1, 2, 3]", "  global_ranks=[4, 5, 6, 7]", one field a line.
# NCCL's set-up line of a communicator (src/init.cc: "comm %p rank %d nranks %d cudaDev %d ... - Init START" from
# 2.19, "... - Init COMPLETE"): the process's rank in it, and its size.
_NCCL_INIT_START = "- Init START"
_NCCL_COMM = re.compile(r"NCCL INFO comm 0x[0-9a-f]+ rank (?P<rank>\d{1,7}) nranks (?P<nranks>\d{1,7}) ")
_AGENT_FIELD = re.compile(
    r"^\s{0,8}(?P<key>group_world_size|local_ranks|global_ranks)=(?P<value>\d{1,7}|\[[\d, ]{0,100000}\])\s*$"
)


class _LocalRanks:
    """A file's ranks read from a role's prefix ("[default3]:", torchrun --tee: the rank within its node), and
    what places them in the job: the agent's rendezvous account (local_ranks=[...] / global_ranks=[...]), its
    failure report ("rank : 6 (local_rank: 2)"), or NCCL's set-up line of the world's communicator under the prefix
    ("[default6]:... NCCL INFO comm 0x... rank 14 nranks 64"). Placed, a local rank becomes the job's; on one node
    (no sign of another) it is the job's already; with other nodes and nothing to place it, it names no rank."""

    def __init__(self):
        self.events: list[LogEvent] = []
        self.seen: dict[int, set[bool]] = {}  # local rank -> the levels of its lines that could match (True: INFO)
        self.mappings: list[dict[int, int]] = []  # one per agent account read
        self.other_nodes = False
        self.one_node = False  # the agent's account said so (group_world_size=1)
        self._local_list: list[int] | None = None
        self._comms: dict[int, set[tuple[int, int]]] = {}  # nranks -> (local rank, rank in the communicator)
        self.placing: LocalPlacing | None = None  # once settled, where anything placed the file's local ranks

    def read_comm_line(self, local: int, text: str) -> None:
        """Take in NCCL's set-up line of a communicator, printed under local rank `local`'s prefix."""
        found = _NCCL_COMM.search(text)
        if found is not None and len(self._comms) < 64:
            pairs = self._comms.setdefault(int(found.group("nranks")), set())
            if len(pairs) < 4096:
                pairs.add((local, int(found.group("rank"))))

    def read_agent_line(self, text: str) -> bool:
        """Take in a line of the agent's rendezvous account; whether it was one."""
        found = _AGENT_FIELD.match(text)
        if found is None:
            return False
        key, value = found.group("key"), found.group("value")
        if key == "group_world_size":
            self.other_nodes |= int(value) > 1
            self.one_node |= int(value) == 1
            return True
        numbers = [int(n) for n in value.strip("[]").replace(" ", "").split(",") if n]
        if key == "local_ranks":
            self._local_list = numbers
        elif self._local_list is not None and len(self._local_list) == len(numbers):
            self.mappings.append(dict(zip(self._local_list, numbers, strict=True)))
            self.other_nodes |= any(local != rank for local, rank in zip(self._local_list, numbers, strict=True))
        return True

    def mapping(self, failures: list[ChildFailure]) -> dict[int, int] | None:
        """local -> job rank, where one node's account says it (two agents' accounts in one file: whose lines are
        whose is not said)."""
        mapping: dict[int, int] = {}
        reported = {f.local_rank: f.rank for f in failures if None not in (f.local_rank, f.rank)}
        # NCCL's world communicator, one pair a dict so that two nodes' local rank 6 disagree
        for one in [*self.mappings, reported, *({local: rank} for local, rank in self._world_comm())]:
            for local, rank in one.items():
                if mapping.setdefault(local, rank) != rank:
                    return None
        return mapping

    def _world_comm(self) -> list[tuple[int, int]]:
        """(local rank, rank) in the largest communicator NCCL set up: the world's, whose ranks are the job's."""
        return sorted(self._comms[max(self._comms)]) if self._comms else []

    def settle(self, records: LogRecords, tracebacks: list[PyTraceback], failures: list[ChildFailure]) -> None:
        mapping = self.mapping(failures)
        # Accounts that place one local rank at two ranks speak of two nodes, whose lines this file holds both of; a
        # local rank whose rank in the world's communicator differs is another node's.
        self.other_nodes |= mapping is None or any(local != rank for local, rank in self._world_comm())
        placed = {
            local: (mapping or {}).get(local)
            for local in self.seen.keys() | {e.rank for e in self.events if e.rank is not None}
        }
        assumed = not self.other_nodes and not mapping
        if assumed:
            placed = {local: local for local in placed}  # one node: its local ranks are the job's
        local_only = assumed and not self.one_node  # nothing said there was one node
        if not local_only:  # (local only, the tail's lines read as _UNPLACED)
            self.placing = LocalPlacing(None if assumed else mapping or {})
        for event in self.events:
            event.rank = placed.get(event.rank) if event.rank is not None else None
            event.rank_from = "local" if local_only and event.rank is not None else None
        for traceback in tracebacks:
            if traceback.rank in placed and traceback.rank in self.seen:
                traceback.rank = placed[traceback.rank]
                traceback.rank_from = "local" if local_only and traceback.rank is not None else None
        for local, rank in placed.items():
            if rank is not None and local in self.seen:
                _count(records, rank, self.seen[local])


# Below this many logs, forking costs more than reading them here (a small log takes about 40 µs to read).
_FORK_FROM = 2048


def read_logs(
    artifacts: list[Input],
    matcher: Matcher,
    records: LogRecords | None = None,
    opener=open_input,
) -> LogRecords:
    """Stream every log through the matcher; what cannot be read (fully) is added to the problems.

    Thousands of logs (a folder of every rank's small files) are read on every core the process may use, each
    log's records then added in the order of `artifacts`: the records are those of reading them one by one."""
    records = records or LogRecords()
    tail_bytes = _tail_bytes(len(artifacts))
    jobs = usable_cores()
    if jobs > 1 and len(artifacts) >= _FORK_FROM and opener is open_input and can_fork():
        read = partial(_read_portable, matcher=matcher, tail_bytes=tail_bytes, here=os.getpid())
        with _no_collection():
            for artifact, done in zip(artifacts, map_forked(read, artifacts, jobs), strict=True):
                if done is None:
                    _add(records, _read_log(artifact, matcher, tail_bytes))
                elif isinstance(done, LogRecords):
                    _add(records, done)
                else:
                    _add_portable(records, done, matcher)
    else:
        for artifact in artifacts:
            _add(records, _read_log(artifact, matcher, tail_bytes, opener))
    return records


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """The cyclic garbage collector off while logs are read in children and their records come back: with it on,
    unpickling the records of 57,000 small logs took ten times as long (1 s against 0.1 s), collection after
    collection walking them; and a child that collects writes to every object it shares with this process, copying
    their pages. Reading makes no reference cycles to speak of; any left are collected once the collector is on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _read_log(artifact: Input, matcher: Matcher, tail_bytes: int, opener=open_input) -> LogRecords:
    """One log's records, numbered from 0 in reading order."""
    records = LogRecords()
    try:
        stream = opener(artifact)
    except OSError as err:
        records.problems.append(f"{artifact.display}: cannot be read: {err.strerror or err}.")
        return records
    reader = _FileReader(artifact, matcher, records)
    tail = Tail(tail_bytes)
    try:
        for line_no, raw in scan_lines(stream, matcher.prefilter, tail, matcher.gate, reader.reads_every_hit):
            reader.feed(line_no, raw)
        if getattr(stream, "truncated", False):
            records.problems.append(
                f"{artifact.display}: the gzip file is cut off; reading stopped early, analysed what came before."
            )
    except LimitExceeded as err:
        records.problems.append(
            f"{artifact.display}: {err.what}; read up to the limit and analysed what came before ({err.hint})."
        )
    except (OSError, EOFError, zlib.error) as err:
        records.problems.append(f"{artifact.display}: reading stopped early ({err}); analysed what came before.")
    finally:
        reader.close()
        stream.close()
    log_tail = LogTail(artifact.display, reader.named.of_unprefixed(), tail.first_line, tail.data, tail.wrapping)
    log_tail.local_placing = reader.local.placing
    log_tail.hosts = frozenset(reader.hosts)
    log_tail.cut_at_start = starts_mid_message(log_tail)
    cut = _cut_record(log_tail)
    if cut is not None:
        records.problems.append(f"{artifact.display}: {cut}")
        if cut == _NO_RECORD:
            return records  # nothing in it was read: counted among the unreadable
    records.files_read.append(artifact.display)
    if tail.data:
        records.tails.append(log_tail)
    return records


def _add(records: LogRecords, one: LogRecords) -> None:
    """One log's records after those read before it."""
    for event in one.events:
        event.order += len(records.events)
    records.events += one.events
    records.tracebacks += one.tracebacks
    records.child_failures += one.child_failures
    records.ranks_seen |= one.ranks_seen
    records.ranks_informing |= one.ranks_informing
    records.ranks_reporting |= one.ranks_reporting
    records.files_read += one.files_read
    records.problems += one.problems
    records.tails += one.tails
    records.launches_finished.update(one.launches_finished)
    records.boots.update(one.boots)
    records.ended_by_launcher |= one.ended_by_launcher


# A log's records as a forked reader sends them back: plain tuples, which pickle two to three times faster than the
# dataclasses (thousands of tiny logs cost little more than their records' transport), each event's rule by its
# id (a rule holds compiled patterns, which do not pickle).
_Portable = tuple[
    list[tuple],
    list[PyTraceback],
    list[ChildFailure],
    set[int],
    set[int],
    set[int],
    list[str],
    list[str],
    list[tuple],
    dict,
    dict,
    set[int],
]
_EVENT_FIELDS = tuple(f.name for f in fields(LogEvent))


def _read_portable(artifact: Input, matcher: Matcher, tail_bytes: int, here: int) -> LogRecords | _Portable | None:
    """One log's records, as they are where read in process `here`, else to send back; None for standard input,
    which only process `here` reads."""
    if artifact.path == STDIN:
        return None
    records = _read_log(artifact, matcher, tail_bytes)
    if os.getpid() == here:
        return records
    return (
        [
            tuple(event.rule.id if name == "rule" else getattr(event, name) for name in _EVENT_FIELDS)
            for event in records.events
        ],
        records.tracebacks,
        records.child_failures,
        records.ranks_seen,
        records.ranks_informing,
        records.ranks_reporting,
        records.files_read,
        records.problems,
        [
            (t.file, t.rank, t.first_line, t.data, t.wrapping, t.cut_at_start, t.hosts, t.local_placing)
            for t in records.tails
        ],
        records.launches_finished,
        records.boots,
        records.ended_by_launcher,
    )


def _add_portable(records: LogRecords, portable: _Portable, matcher: Matcher) -> None:
    """What `_add` does, from what a child sent back."""
    (
        events,
        tracebacks,
        child_failures,
        ranks_seen,
        informing,
        reporting,
        files_read,
        problems,
        tails,
        finished,
        boots,
        ended,
    ) = portable
    first = len(records.events)
    for values in events:
        event = LogEvent(*values)
        event.rule, event.order = matcher.rules_by_id[event.rule], event.order + first  # type: ignore[index]
        records.events.append(event)
    records.tracebacks += tracebacks
    records.child_failures += child_failures
    records.ranks_seen |= ranks_seen
    records.ranks_informing |= informing
    records.ranks_reporting |= reporting
    records.files_read += files_read
    records.problems += problems
    records.tails += [LogTail(*tail) for tail in tails]
    records.launches_finished.update(finished)
    records.boots.update(boots)
    records.ended_by_launcher |= ended


_NO_RECORD = "it holds one record of torchtriage's, cut off before its end (the job was killed while writing it?)"


def _cut_record(tail: LogTail) -> str | None:
    """What to say of a file of torchtriage's records whose last record is cut off; None for any other file."""
    last = tail.last_own_record
    if last is None:
        return None
    try:
        json.loads(last)
        return None
    except ValueError:
        pass
    if tail.first_line == 1 and b"\n" not in tail.data.strip():
        return _NO_RECORD
    return "its last record is cut off before its end (the job was killed while writing it?); the others are read"
