"""Across the attempts of a job (launcher restarts, requeues, earlier jobs): does the failure follow a machine or
the program?

An operator drains a machine whose hardware fails and fixes code whose line fails; doing the one for the other
costs a node or a week. One attempt cannot tell them apart; several can, where ranks and machines were placed
differently:

- the same host (or the same GPU, by UUID) blamed under different ranks: the failure follows the machine;
- the same rank, or the same line of code, blamed on different machines: it follows the program;
- the same rank on the same machine every time: the attempts cannot tell (the ranks must be placed elsewhere);
- nothing blamed twice: each attempt failed elsewhere.

Pure: attempts in (each with the verdict `diagnose` makes of its folder), a judgement out, its findings routed
to actions through the knowledge base (knowledge/rules/history.toml).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from torchtriage.knowledge.actions import route
from torchtriage.knowledge.rules import rule_by_id
from torchtriage.model import Action, Category, Finding, Machine, Role, Verdict
from torchtriage.ranks import format_ranks


@dataclass(frozen=True)
class AttemptResult:
    """One attempt: its number, its folder and the verdict of what it left (None, with `note`, when nothing)."""

    number: int
    folder: str
    verdict: Verdict | None
    note: str = ""
    label: str = ""  # how messages name it: "attempt 1", or with its folder when several runs are read

    @property
    def name(self) -> str:
        return self.label or f"attempt {self.number}"

    @property
    def failed(self) -> bool:
        return self.verdict is not None and self.verdict.diagnosed_problem

    @property
    def blamed(self) -> list[Machine]:
        """Where each culprit of this attempt ran (nothing known where no source said)."""
        if not self.failed:
            return []
        return [self.verdict.machine_of(rank) for rank in self.verdict.culprit_ranks]

    @property
    def site(self) -> str | None:
        """The culprit's line (file:line), when the verdict names it."""
        frame = self.verdict.facts.get("user_frame") if self.failed else None
        if not isinstance(frame, dict) or not frame.get("file"):
            return None
        return f"{frame['file']}:{frame.get('line', 0)}"


@dataclass
class Judgement:
    """What the attempts say together: which pattern, its findings (the first leads) and their actions."""

    attempts: list[AttemptResult]
    pattern: str  # machine, program, both, undecided, no_repeat, too_few
    summary: str
    findings: list[Finding] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)


@dataclass(frozen=True)
class _Blame:
    attempt: int  # the attempt's place in the order they ran
    name: str
    rank: int
    host: str | None
    gpu: str | None
    site: str | None


def _blames(attempts: Iterable[AttemptResult]) -> list[_Blame]:
    return [
        _Blame(index, a.name, m.rank, m.host, m.gpu_uuid, a.site if len(a.blamed) == 1 else None)
        for index, a in enumerate(attempts)
        for m in a.blamed
    ]


def _group(blames: list[_Blame], key: str) -> dict[object, list[_Blame]]:
    grouped: dict[object, list[_Blame]] = defaultdict(list)
    for blame in blames:
        value = getattr(blame, key)
        if value is not None:
            grouped[value].append(blame)
    return grouped


def _across(blames: list[_Blame], what: str) -> bool:
    """Blamed in two attempts or more, with two values or more of `what` (ranks, hosts) among them."""
    return len({b.attempt for b in blames}) > 1 and len({getattr(b, what) for b in blames} - {None}) > 1


def _attempts_text(blames: list[_Blame], shown: str) -> str:
    parts = [f"{b.name}: {shown.format(rank=b.rank, host=b.host or 'host not recorded')}" for b in blames]
    return "; ".join(parts)


def _and(names: Iterable[str]) -> str:
    """'a', 'a and b', 'a, b and c', each name once."""
    unique = list(dict.fromkeys(names))
    return " and ".join([", ".join(unique[:-1]), unique[-1]]) if len(unique) > 1 else "".join(unique)


def _machine_finding(blames: list[_Blame], host: str | None, gpu: str | None) -> Finding:
    where = f"GPU {gpu} of {host}" if gpu and host else f"GPU {gpu}" if gpu else host
    message = (
        f"the failures follow the machine {where}, whatever rank runs there: {_attempts_text(blames, 'rank {rank}')}"
    )
    facts = {"host": host, "gpu_uuid": gpu, "attempts": _and(b.name for b in blames)}
    ranks = sorted({b.rank for b in blames})
    return Finding("history.follows_machine", ranks, message, Role.PRIMARY, Category.GPU_FAULT, facts=facts)


def _program_finding(blames: list[_Blame], rank: int | None, site: str | None) -> Finding:
    what = f"rank {rank}" + (f" at {site}" if site else "") if rank is not None else f"the line {site}"
    message = (
        f"the failures follow the program, not a machine: {what} failed on every machine it ran on "
        f"({_attempts_text(blames, 'rank {rank} on {host}')})"
    )
    facts = {"site": site, "rank_text": f"rank {rank}" if rank is not None else format_ranks({b.rank for b in blames})}
    facts["hosts"] = _and(b.host for b in blames if b.host)
    facts["no_site"] = site is None
    ranks = sorted({b.rank for b in blames})
    return Finding("history.follows_program", ranks, message, Role.PRIMARY, Category.UNKNOWN, facts=facts)


def _machine_findings(blames: list[_Blame]) -> list[Finding]:
    """A GPU, by UUID, or a host blamed under different ranks in different attempts."""
    findings = []
    for gpu, group in _group(blames, "gpu").items():
        if _across(group, "rank"):
            findings.append(_machine_finding(group, group[0].host, str(gpu)))
    named = {f.facts["host"] for f in findings}
    for host, group in _group(blames, "host").items():
        if host not in named and _across(group, "rank"):
            findings.append(_machine_finding(group, str(host), None))
    return findings


def _program_findings(blames: list[_Blame]) -> list[Finding]:
    """A rank blamed on different machines in different attempts; else a line blamed so under several ranks."""
    findings = []
    for rank, group in _group(blames, "rank").items():
        if _across(group, "host"):
            sites = {b.site for b in group}
            findings.append(_program_finding(group, int(rank), sites.pop() if len(sites) == 1 else None))
    if findings:
        return findings
    for site, group in _group(blames, "site").items():
        if _across(group, "host"):
            findings.append(_program_finding(group, None, str(site)))
    return findings


def _undecided(blames: list[_Blame]) -> Finding | None:
    """A rank blamed again on the same machine: the attempts placed it alike, and cannot tell."""
    for rank, group in _group(blames, "rank").items():
        hosts = {b.host for b in group}
        if len({b.attempt for b in group}) > 1 and len(hosts) == 1 and None not in hosts:
            host = hosts.pop()
            numbers = ", ".join(b.name for b in group)
            message = (
                f"rank {rank} failed on {host} in every attempt that blamed it ({numbers}): the machine and the "
                "program were the same each time, so the attempts cannot tell them apart"
            )
            facts = {"host": host, "rank_text": f"rank {rank}"}
            return Finding("history.undecided", [int(rank)], message, Role.SYMPTOM, Category.UNKNOWN, facts=facts)
    return None


def judge(attempts: list[AttemptResult], rules: Mapping | None = None) -> Judgement:
    """What the attempts say together (they are given in the order they ran)."""
    failed = [a for a in attempts if a.failed and a.blamed]
    if len(failed) < 2:
        said = "no attempt" if not failed else f"only {failed[0].name}"
        return Judgement(attempts, "too_few", f"{said} named a culprit: there is nothing to compare across attempts")
    blames = _blames(attempts)
    machine, program = _machine_findings(blames), _program_findings(blames)
    if machine and program:
        pattern, summary = "both", "the failures follow a machine and the program both (see each)"
    elif machine:
        pattern, summary = "machine", machine[0].message
    elif program:
        pattern, summary = "program", program[0].message
    else:
        undecided = _undecided(blames)
        if undecided is not None:
            findings = [undecided]
            return _judged(attempts, "undecided", undecided.message, findings, rules)
        unplaced = [b for b in blames if b.host is None]
        why = " (the machines of some culprits were not recorded)" if unplaced else ""
        return _judged(attempts, "no_repeat", f"no machine, rank or line failed twice{why}", [], rules)
    return _judged(attempts, pattern, summary, machine + program, rules)


def _judged(attempts, pattern: str, summary: str, findings: list[Finding], rules: Mapping | None) -> Judgement:
    actions = route(findings, rules if rules is not None else _BuiltIn())
    return Judgement(attempts, pattern, summary, findings, actions)


class _BuiltIn(Mapping):
    """The built-in knowledge base, by rule id."""

    def __getitem__(self, kind):
        rule = rule_by_id(kind)
        if rule is None:
            raise KeyError(kind)
        return rule

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0
