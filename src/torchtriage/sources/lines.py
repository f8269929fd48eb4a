"""Peeling what launchers and loggers put in front of a message: colour, rank prefixes, log headers.

Real logs wrap one message in several layers, e.g.
`[default3]:[rank3]:[E1130 02:54:48.068043558 ProcessGroupNCCL.cpp:689] [Rank 3] Watchdog caught ...`.
`normalise` peels them off, remembering the rank and the time, so rules match the message itself.
"""

from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass

from torchtriage.sources import limits
from torchtriage.sources.fields import as_int

# Terminal sequences a log may carry (ECMA-48): CSI (colours, cursor), OSC ended by BEL or ST (titles,
# hyperlinks), DCS/SOS/PM/APC strings ended by ST, other two-character escapes, and the one-byte C1 CSI.
# Each alternative stops at the next ESC, so a line full of unterminated ones costs linear time.
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
    r"|\x1b[PX^_][^\x1b]*\x1b\\"
    r"|\x1b[ -/]*[0-~]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)

# Launcher prefixes that carry a rank. Each is tried at the start of what remains of the line. A rank is all
# the digits there (a role's name never ends in one: "[rank9999999]" is not role "rank9" and rank 999999), and
# a number past the largest rank read (the policy's `rank` limit) makes no rank prefix: the line is left as it
# is, and no census lists a million ranks that never printed.
_RANK_DIGITS = r"(?<!\d)(?P<rank>\d{1,12})(?!\d)"
_RANK_PREFIXES = [
    # torchrun --tee / --local-ranks-filter: "[default3]:" (role + local rank); torch logging "[rank3]:"
    re.compile(rf"\[(?:rank|default|[A-Za-z_][\w-]*?){_RANK_DIGITS}\]:\s?"),
    # mpirun --tag-output: "[1,3]<stderr>:"
    re.compile(rf"\[\d+,{_RANK_DIGITS}\]<std(?:out|err)>:\s?"),
    # "[Rank 3]" / "[RANK 3]" / "Rank 3:" / "rank3:" at the start of the message
    re.compile(rf"\[(?:rank|RANK|Rank) ?{_RANK_DIGITS}\]:?\s?"),
    re.compile(rf"(?:rank|RANK|Rank) ?{_RANK_DIGITS}:\s"),
    # srun --label: "3: " (only digits, then colon and a space)
    re.compile(rf"\s{{0,5}}{_RANK_DIGITS}: "),
]

# Any of them, in one call: most lines start with none, and one failed match rules out all five.
_ANY_RANK_PREFIX = re.compile("|".join(f"(?:{p.pattern.replace('(?P<rank>', '(')})" for p in _RANK_PREFIXES))

# What launchers and collectors put before those, naming a host or a process but no rank: pdsh/clush's
# "10.0.0.5: " or "node-07: " (peeled only before a rank prefix: "RuntimeError: " is a message), Ray's
# "(RayTrainWorker pid=1234, ip=10.0.0.5) " and "(pid=1234) ".
_ADDRESS_PREFIX = re.compile(r"(?P<ip>(?:\d{1,3}\.){3}\d{1,3}): ")
_RAY_PREFIX = re.compile(r"\((?:[\w.-]{1,64} )?pid=\d{1,10}(?:, ip=(?P<ip>[\d.]{7,15}))?\) ?")
_HOSTNAME = re.compile(r"[\w.-]{1,64}: ")
# What pdsh (DeepSpeed's multi-node launcher) or clush puts a host before that no message starts with: a Python
# traceback's header, its frames and their source lines (indented), and the exception line that ends it.
_TRACEBACK_AFTER_HOST = re.compile(
    r"Traceback \(most recent call last\):|\s{2,}\S"
    r"|(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit)(?::|$)"
)

# glog (c10) headers, bracketed by torch ("[E1130 02:54:48.068043558 ProcessGroupNCCL.cpp:689] ")
# or bare ("E1130 02:54:48.068043 1234 ProcessGroupNCCL.cpp:689] "); torch's Python logging uses the
# bare form too ("W1130 02:54:18.606000 625 torch/distributed/run.py:851] "). c10's own header writes the date
# as (month) * 100 + day, unpadded (c10/util/Logging.cpp MessageLogger): July 28th is "[W728 ...".
_GLOG = re.compile(
    r"\[?(?P<sev>[IWEF])(?P<month>1[0-2]|0?[1-9])(?P<day>[0-3]\d) (?P<hms>\d\d:\d\d:\d\d(?:\.\d+)?)"
    r"(?:\s+\d+)?\s+[^\s\]]+:\d+\]\s?"
)
# c10's older header, without date or time: "[W socket.cpp:663] ", "[E ProcessGroupNCCL.cpp:737] ".
_GLOG_SHORT = re.compile(r"\[(?P<sev>[IWEF]) [^\s\]]{1,200}:\d{1,7}\]\s?")
# ISO-like dates, optionally bracketed, optionally followed by a separator: "2026-11-30 04:32:11,123 - "
_ISO = re.compile(
    r"\[?(?:(?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d)[ T_](?P<hms>\d\d:\d\d:\d\d(?:[.,]\d+)?))"
    r"(?:Z|[+-]\d\d:?\d\d)?\]?(?:\s*[-|:]\s*|\s+)"
)
# The time a container runtime puts before every line it collects (`docker logs --timestamps`, `kubectl logs
# --timestamps`: RFC 3339 with nanoseconds in UTC, then a space). It is outside what the process wrote: the
# launcher's rank prefix and c10's header follow it as they would start a line, and its clock is the one every
# line shares (a process's own headers may be in another zone).
_COLLECTOR_STAMP = re.compile(r"(?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d)T(?P<hms>\d\d:\d\d:\d\d(?:\.\d{1,9})?)Z ")
# A rank as a field of a Python logging format, right after its date and delimited like the fields around it
# (`%(asctime)s - rank %(rank)s - %(levelname)s - %(message)s`: "2025-11-06 10:14:02,551 - rank 2 - ERROR - ...",
# "... | rank=2 | ERROR | ..."). Without the delimiter after it, a rank behind a header is the message's ("[Rank 3]
# Watchdog caught ...", DeepSpeed's "[Rank 0] step=10").
_LOGGER_RANK = re.compile(rf"\[?(?:rank|RANK|Rank)[ =:]?{_RANK_DIGITS}\]?\s{{1,4}}[-|]\s")
_MAX_LAYERS = 6


@dataclass(frozen=True)
class Normalised:
    text: str  # the message with prefixes removed
    rank: int | None
    time: float | None  # seconds within the year (launchers rarely print the year); comparable only
    severity: str | None  # glog's I/W/E/F when present
    # The rank came from a launcher role's prefix (torchrun --tee's "[default3]:", `[{role}{local_rank}]:`): the
    # rank within its node, which equals the job's rank only on one node (sources/log_records.py maps it).
    rank_is_local: bool = False
    # The host a launcher or collector put before the line (pdsh's "node-07: ", Ray's "ip=10.0.0.5"): the
    # machine that printed it, the outermost where several are stacked.
    host: str | None = None


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text or "\x9b" in text else text


def _seconds(month: str, day: str, hms: str) -> float:
    hours, minutes, seconds = hms.replace(",", ".").split(":")
    return (((int(month) * 31 + int(day)) * 24 + int(hours)) * 60 + int(minutes)) * 60 + float(seconds)


# NCCL's line header of any level and release ("host:pid:tid [dev] ", its debug.cc), as the start of a line: the
# host and the process that printed it (analysis/xid_buses.py places an Xid's pid by it).
NCCL_HEADER = re.compile(r"(?P<host>[^\s:]{1,255}):(?P<pid>\d{1,10}):\d{1,10} \[\d{1,4}\] ")
# That header then, for a warning, "file:line " and (2.19+) "(func) ": releases up to 2.3 printed the level without
# the "NCCL " tag ("... [0] misc/ibvwrap.cc:212 WARN Call to ..."); the tag is put back so that one pattern serves
# every release.
_NCCL_UNTAGGED = re.compile(rf"(?P<head>{NCCL_HEADER.pattern}(?:[\w/.-]{{1,200}}:\d{{1,7}} )?)(?P<level>WARN|INFO) ")


def starts_with_log_header(text: str) -> bool:
    """Whether `text` starts with a header only a record of a log starts with: c10's or Python logging's header with
    its time, an ISO date, NCCL's `host:pid:tid [dev]`, a container runtime's timestamp. No piece of a message cut
    by a terminal's wrap starts so, unless the cut fell right before one inside the message."""
    return bool(_GLOG.match(text) or _ISO.match(text) or NCCL_HEADER.match(text) or _COLLECTOR_STAMP.match(text))


def _nccl_tagged(text: str) -> str:
    if " WARN " not in text and " INFO " not in text:
        return text
    found = _NCCL_UNTAGGED.match(text)
    return f"{found.group('head')}NCCL {text[found.start('level') :]}" if found else text


def _peel_rank(text: str, rank: int | None, rank_is_local: bool) -> tuple[str, int | None, bool, bool]:
    """One rank prefix off the start of `text`: (text, rank, whether it is a role's local rank, whether one was
    peeled)."""
    if not _ANY_RANK_PREFIX.match(text):
        return text, rank, rank_is_local, False
    for index, prefix in enumerate(_RANK_PREFIXES):
        match = prefix.match(text)
        number = as_int(match.group("rank"), -1, 0, limits.active().rank) if match else -1
        if number >= 0:
            # "[default3]:[rank35]:" — torchrun's tee prefix (`[{role}{local_rank}]:`, tail_log.py) carries the
            # local rank, the one torch's excepthook puts on a rank's own lines ("[rank35]:",
            # distributed_c10d.py) the global one: a prefix that says "rank" wins, otherwise the outermost. A
            # role named "rank" (`torchrun --role rank`, as torchtitan runs) stacks "[rank3]:[rank35]:": the
            # inner one, the process's own, wins.
            says_rank = "rank" in match.group(0).lower()
            if rank is None or says_rank:
                rank, rank_is_local = number, index == 0 and not says_rank
            return text[match.end() :], rank, rank_is_local, True
    return text, rank, rank_is_local, False


def _host_prefix(text: str, hosts: Container[str]) -> tuple[int, str | None]:
    """Where a host's prefix ends at the start of `text`, or 0, and the host it names (None for Ray's
    "(pid=1234) ", which names a process only). A name is a host's before what starts a line (`_starts_a_line`),
    or before anything where the same file's lines already showed it is one (`hosts`): pdsh puts it before every
    line, a kernel's printf and a progress line alike."""
    tagged = _ADDRESS_PREFIX.match(text) or _RAY_PREFIX.match(text)
    if tagged:
        return tagged.end(), tagged.group("ip")
    named = _HOSTNAME.match(text)
    # a host's name carries a digit, a dot or a dash ("node-07", "gpu12"); "RuntimeError" none
    name = named.group(0)[:-2] if named else ""
    if not any(c.isdigit() or c in ".-" for c in name):
        return 0, None
    rest = text[named.end() :]
    return (named.end(), name) if name in hosts or _starts_a_line(rest) else (0, None)


def _starts_a_line(text: str) -> bool:
    """Whether `text` starts the way a line of a process does and no message's words do: a launcher's rank prefix,
    a Python traceback's line, NCCL's `host:pid:tid [dev]` header, or a log header with its time (c10's, Python
    logging's). What pdsh put a host before is then known to be a line, not a message that starts with a name."""
    return bool(
        _ANY_RANK_PREFIX.match(text)
        or _TRACEBACK_AFTER_HOST.match(text)
        or _GLOG_SHORT.match(text)
        or starts_with_log_header(text)
    )


def normalise(raw: str, hosts: Container[str] = ()) -> Normalised:
    """Remove colour codes and peel rank prefixes and log headers off one line; `hosts`: the names the line's file
    already showed to be a host's prefix (`Normalised.host` of its earlier lines)."""
    text = strip_ansi(raw).rstrip()
    stamp = _COLLECTOR_STAMP.match(text)
    if stamp:
        text = text[stamp.end() :]
    rank: int | None = None
    time: float | None = None
    severity: str | None = None
    rank_is_local = False
    host: str | None = None
    after_header = False  # rank markers after a log header belong to the message
    for _ in range(_MAX_LAYERS):
        peeled = False
        # Rank markers after a log header belong to the message ("[Rank 3] Watchdog caught ..."):
        # rules read them there.
        if not after_header:
            text, rank, rank_is_local, peeled = _peel_rank(text, rank, rank_is_local)
        if not peeled and rank is None and not after_header:
            end, named = _host_prefix(text, hosts)
            if end:
                text, host = text[end:], host or named
                continue
        if time is None:
            match = _GLOG.match(text) or _ISO.match(text)
            if match:
                time = _seconds(match.group("month"), match.group("day"), match.group("hms"))
                severity = match.groupdict().get("sev")
                text = text[match.end() :]
                peeled = after_header = True
                field = _LOGGER_RANK.match(text) if rank is None and "sev" not in match.groupdict() else None
                number = as_int(field.group("rank"), -1, 0, limits.active().rank) if field else -1
                if number >= 0:
                    rank, text = number, text[field.end() :]
        if not peeled and severity is None:
            short = _GLOG_SHORT.match(text)
            if short:
                severity, text, peeled, after_header = short.group("sev"), text[short.end() :], True, True
        if not peeled:
            break
    if stamp:
        time = _seconds(stamp.group("month"), stamp.group("day"), stamp.group("hms"))
    return Normalised(_nccl_tagged(text), rank, time, severity, rank_is_local, host)
