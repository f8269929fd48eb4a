"""The knowledge base: `rules/<prefix>.toml`, one `[[rule]]` table per failure mode.

Two kinds of rule share one format (docs/rules.md):
- a **log rule** has `patterns`: the lines it matches follow a format string of PyTorch, NCCL, CUDA,
  DeepEP, a launcher or a framework, and its `examples` are checked through the real scanner;
- an **analysis rule** has `found_by` instead: a failure mode an analyzer names from what several lines,
  ranks or artifacts say together (a rank that never joined a collective, fragmentation in a memory
  snapshot, a straggler in profiler traces).

Either way the rule holds the cause and the actions, so `torchtriage rules` lists every failure mode
the tool can name and every action a verdict carries comes from here. A rule lives in the file named
by its id's prefix (`nccl.watchdog_timeout` in `nccl.toml`). A rule that does not validate stops
loading with a message naming the file and the rule: a broken knowledge base must never silently drop
a failure mode.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from torchtriage.knowledge.actions import ActionTemplate
from torchtriage.knowledge.linear_regex import compile_linear
from torchtriage.knowledge.loader import (
    BOOLEAN,
    INTEGER,
    KNOWLEDGE_DIR,
    STRING,
    STRING_TABLE,
    STRINGS,
    TABLE,
    TABLES,
    KnowledgeError,
    check_table,
    read_toml,
)
from torchtriage.model import CATEGORIES, ROLES

RULES_DIR = KNOWLEDGE_DIR / "rules"
_STDLIB_PATH = re.compile(r"/lib/python3(?:\.\d+)?/")  # an interpreter's own library (installed packages excluded)
_MIN_ANCHOR = 4

RuleError = KnowledgeError  # the name callers have always caught

_REQUIRED = {"id": STRING, "category": STRING, "title": STRING, "role": STRING, "cause": STRING, "source": STRING}
_OPTIONAL = {
    "patterns": STRINGS,
    "unless": STRINGS,
    "anchors": STRINGS,
    "found_by": STRING,
    "actions": TABLES,
    "priority": INTEGER,
    "examples": STRINGS,
    "example_facts": STRING_TABLE,
    "collateral_of": STRINGS,
    "superseded_by": STRINGS,
    "aftermath_after": STRINGS,
    "rank_fact": STRING,
    "ratio": TABLE,
    "ending": BOOLEAN,
    "printer_waits": BOOLEAN,
    "printer_lost_peer": BOOLEAN,
    "raised_in": STRINGS,
    "ends_the_job": BOOLEAN,
    "node_event": BOOLEAN,
    "shared_cause": BOOLEAN,
    "culprit_of": STRINGS,
    "calibration": BOOLEAN,
    "shared_state": BOOLEAN,
    "local_numbering": BOOLEAN,
}
_ACTION_KEYS = ({"title": STRING}, {"detail": STRING, "command": STRING, "env": STRING_TABLE, "when": STRING})


@dataclass(frozen=True)
class Rule:
    id: str
    category: str
    title: str
    role: str
    cause: str
    source: str
    patterns: tuple[Any, ...]  # compiled for linear time (knowledge.linear_regex)
    anchors: tuple[str, ...]
    actions: tuple[ActionTemplate, ...]
    priority: int = 50
    # Patterns that veto a match: a pattern's match whose text one of these finds is not this failure mode
    # (the search goes on after it). They say what a lookaround would, in linear time.
    unless: tuple[Any, ...] = ()
    examples: tuple[str, ...] = ()
    example_facts: dict[str, str] = field(default_factory=dict)
    # Categories whose presence (on any rank) makes this rule's lines the aftermath, not the cause:
    # e.g. peers' NCCL errors after one rank ran out of memory.
    collateral_of: tuple[str, ...] = ()
    # Literal text that, appearing later in the same file, withdraws this rule's lines: for rules that
    # describe where a log stops ("NCCL initialised, then nothing"), a later sign of progress refutes them.
    superseded_by: tuple[str, ...] = ()
    # Literal text that, appearing earlier in the same file, makes this rule's later lines the aftermath of what it
    # says: srun's "Terminating StepId=..." is srun ending the step itself (--kill-on-bad-exit, after a task
    # failed), so the step's cancel that slurmstepd reports next is no scheduler's decision.
    aftermath_after: tuple[str, ...] = ()
    # The fact that names the rank a line is about, when that is not the rank that printed it
    # (a rank-0 report naming the slowest rank).
    rank_fact: str | None = None
    # A line counts only when facts[numerator] / facts[denominator] >= at_least.
    ratio: tuple[str, str, float] | None = None
    # For an analysis rule: the analysis that names it ("the flight recorder", "memory snapshots").
    found_by: str | None = None
    file: str = ""
    # The distinctive phrase of each pattern (the longest literal every match contains, when it is long
    # enough to name the message alone): a line that holds one but is cut short, or printed by another
    # version with other fields, still reaches the rule, with fewer facts.
    phrases: tuple[str, ...] = ()
    # A report of how a rank's process ended (a signal), printed by its launcher once it was gone: where the
    # same rank printed a failure of its own, the ending is that failure's aftermath (a Python error's exit
    # that aborts in a C++ destructor, a watchdog's throw that ends in abort()), not a failure of its own.
    ending: bool = False
    # The rank that prints the line waits there for another rank or for the store's host (a barrier that timed
    # out, a key never set, a store it cannot reach): it reports the failure, it is not where the failure is.
    # Such a line names no culprit by its printer (a rank_fact it captures still names one).
    printer_waits: bool = False
    # The rank that prints the line lost its connection to a peer: the victim of whichever rank left first (or of
    # the network between them). It is not named for it; the rank that appears in no failure line is.
    printer_lost_peer: bool = False
    # Where the rule's line ends a Python traceback: the places (path fragments) whose code raises this failure.
    # A traceback whose innermost frame outside the standard library is another library's is not it (an
    # `OSError: [Errno 98]` from a metrics server's or a debugger's own socket is no rendezvous port).
    raised_in: tuple[str, ...] = ()
    # The line says the job was ended from outside (a scheduler's time limit, preemption or cancel; the launcher's
    # own death signal): the ends of ranks reported after it in its file (SIGKILL, SIGTERM) are its aftermath.
    ends_the_job: bool = False
    # The line is the node's kernel or GPU driver speaking (dmesg: an Xid, the OOM killer), not the job: after its
    # launcher's report that every worker exited 0 it tells the machine's health, not that the job failed.
    node_event: bool = False
    # The failure is the set-up the ranks of a host share, or a link's (no interface matches NCCL_SOCKET_IFNAME,
    # an RDMA verbs call refused, peer access the platform does not allow): every rank there meets it alike, so
    # where every rank the logs show prints it, none of them is named; the rank's host or the link's peer is.
    shared_cause: bool = False
    # Rule ids of failures that this line's printer causes in its peers: where one of them is the verdict's
    # failure, the ranks that printed this line are its culprits (a rank that warned it advertises its loopback
    # address is the rank its peers cannot connect to).
    culprit_of: tuple[str, ...] = ()
    # The line reports a step the program recovered from by itself (the fp16 loss scaler skipped it and halved its
    # scale): normal while the scale settles. Where the same rank's training states a finite loss on more than one
    # line after the last such line of its file, it was calibration, borne out, and causes nothing after it.
    calibration: bool = False
    # The line reports a state every rank keeps alike (the fp16 loss scale: each rank checks gradients the
    # all-reduce made equal, or all-reduces the overflow flag, before the scale changes): the rank that prints it
    # is whichever logs it (rank 0) or gets there first, never its culprit.
    shared_state: bool = False
    # The line numbers ranks within its node (DeepEP's intranode kernels number the NVLink peers 0-7): where its
    # printer's job rank is not known (no launcher's prefix), the rank it names (`rank_fact`) is a local rank.
    local_numbering: bool = False

    def raised_elsewhere(self, files: Sequence[str]) -> bool:
        """Whether a traceback ending in this rule's line, its frames' files innermost first, was raised by a
        library that none of `raised_in` names (the job's own code is never elsewhere)."""
        if not self.raised_in:
            return False
        for file in files:
            path = file.replace("\\", "/")
            if any(fragment in path for fragment in self.raised_in):
                return False
            installed = "-packages/" in path
            if not installed and (_STDLIB_PATH.search(path) or path.startswith("<")):
                continue  # the standard library's socket, socketserver ...: who called it decides
            return installed
        return False

    def accepts(self, facts: dict[str, str]) -> bool:
        """Whether a matching line's facts meet the rule's condition, if it has one."""
        if self.ratio is None:
            return True
        numerator, denominator, at_least = self.ratio
        try:
            return float(facts[numerator]) >= at_least * float(facts[denominator])
        except (KeyError, ValueError, OverflowError):
            return False


def _regex_internals():
    """The regex parser and its opcode constants (private modules; renamed in Python 3.11)."""
    if hasattr(re, "_parser"):
        return re._parser, re._constants
    import sre_constants  # pragma: no cover - Python 3.10
    import sre_parse  # pragma: no cover

    return sre_parse, sre_constants  # pragma: no cover


def required_literal(pattern: str) -> str | None:
    """The longest literal text every match of `pattern` must contain, if one exists.

    Only top-level literal runs count: text inside alternations or optional groups is not required.
    """
    parser, literal_op = _regex_internals()
    try:
        parsed = parser.parse(pattern)
    except re.error:
        return None
    if parsed.state.flags & re.IGNORECASE:
        return None
    best, run = "", []
    for op, arg in list(parsed) + [(None, None)]:
        if op == literal_op.LITERAL:
            run.append(chr(arg))
            continue
        if op == literal_op.SUBPATTERN and arg[-1] is not None:
            # a capture group around plain literals still requires them
            inner = arg[-1]
            if all(sub_op == literal_op.LITERAL for sub_op, _ in inner) and not (arg[1] or 0) & re.IGNORECASE:
                run.extend(chr(sub_arg) for _, sub_arg in inner)
                continue
        candidate = "".join(run)
        if len(candidate) > len(best):
            best = candidate
        run = []
    return best or None


def _actions(raw: list[dict], where: str) -> tuple[ActionTemplate, ...]:
    actions = []
    for index, item in enumerate(raw):
        check_table(item, f"{where}, action #{index + 1}", *_ACTION_KEYS)
        env = {str(k): str(v) for k, v in (item.get("env") or {}).items()}
        actions.append(
            ActionTemplate(item["title"], item.get("detail", ""), item.get("command"), env, item.get("when"))
        )
    return tuple(actions)


def _ratio(raw: dict | None, where: str) -> tuple[str, str, float] | None:
    if raw is None:
        return None
    try:
        return str(raw["numerator"]), str(raw["denominator"]), float(raw["at_least"])
    except (KeyError, TypeError, ValueError):
        raise RuleError(f"{where}: `ratio` needs numerator, denominator and at_least") from None


_MIN_ANCHOR_LETTERS = 3


def _patterns(raw: dict, where: str) -> tuple[list[Any], list[str]]:
    for text in raw.get("patterns", []):
        if text.endswith(" ") and not text.endswith("\\ "):
            # Lines are matched with their trailing whitespace stripped: a message cut right after this
            # space would never match.
            raise RuleError(f"{where}: pattern {text!r} ends with a space, which a stripped line never has")
    patterns = [compile_linear(text, where) for text in raw.get("patterns", [])]
    anchors = list(raw.get("anchors", []))
    if patterns and not anchors:
        for text in raw["patterns"]:
            literal = required_literal(text)
            if not literal or len(literal) < _MIN_ANCHOR:
                raise RuleError(
                    f"{where}: pattern {text!r} has no literal run of {_MIN_ANCHOR}+ characters; "
                    "give `anchors` explicitly"
                )
            anchors.append(literal)
    for anchor in anchors:
        if sum(c.isalpha() for c in anchor) < _MIN_ANCHOR_LETTERS:
            # The prefilter passes every line holding an anchor: " -> 2" is in every NCCL channel line.
            raise RuleError(f"{where}: anchor {anchor!r} is too common to find the rule's lines (give words)")
    return patterns, anchors


def _build_rule(raw: dict, file: str) -> Rule:
    where = f"{file}: rule {raw.get('id', '<no id>') if isinstance(raw, dict) else '?'}"
    check_table(raw, where, _REQUIRED, _OPTIONAL)
    rule_id = raw["id"]
    prefix = Path(file).stem
    if not rule_id.startswith(prefix + "."):
        raise RuleError(f"{where}: the ids in {file} start with `{prefix}.`: a failure mode has one home")
    if raw["category"] not in CATEGORIES:
        raise RuleError(f"{where}: unknown category {raw['category']!r} (one of {', '.join(CATEGORIES)})")
    if raw["role"] not in ROLES:
        raise RuleError(f"{where}: role must be one of {', '.join(ROLES)}")
    if bool(raw.get("patterns")) == bool(raw.get("found_by")):
        raise RuleError(f"{where}: give `patterns` (a log rule) or `found_by` (an analysis rule), one of them")
    if raw.get("patterns") and not raw.get("examples"):
        raise RuleError(f"{where}: a log rule shows the lines it matches in `examples`")
    if raw.get("patterns") and not raw.get("actions"):
        raise RuleError(f"{where}: a log rule routes to at least one action (`[[rule.actions]]`)")
    patterns, anchors = _patterns(raw, where)
    return Rule(
        id=rule_id,
        category=raw["category"],
        title=raw["title"],
        role=raw["role"],
        cause=raw["cause"].strip(),
        source=raw["source"],
        patterns=tuple(patterns),
        unless=tuple(compile_linear(text, f"{where}, unless") for text in raw.get("unless", [])),
        anchors=tuple(dict.fromkeys(anchors)),
        actions=_actions(raw.get("actions", []), where),
        priority=int(raw.get("priority", 50)),
        examples=tuple(raw.get("examples", [])),
        example_facts={str(k): str(v) for k, v in (raw.get("example_facts") or {}).items()},
        collateral_of=tuple(raw.get("collateral_of", [])),
        superseded_by=tuple(raw.get("superseded_by", [])),
        aftermath_after=tuple(raw.get("aftermath_after", [])),
        rank_fact=raw.get("rank_fact"),
        ratio=_ratio(raw.get("ratio"), where),
        found_by=raw.get("found_by"),
        file=file,
        phrases=_phrases(raw.get("patterns", [])),
        ending=bool(raw.get("ending", False)),
        printer_waits=bool(raw.get("printer_waits", False)),
        printer_lost_peer=bool(raw.get("printer_lost_peer", False)),
        raised_in=tuple(raw.get("raised_in", [])),
        ends_the_job=bool(raw.get("ends_the_job", False)),
        node_event=bool(raw.get("node_event", False)),
        shared_cause=bool(raw.get("shared_cause", False)),
        culprit_of=tuple(raw.get("culprit_of", [])),
        calibration=bool(raw.get("calibration", False)),
        shared_state=bool(raw.get("shared_state", False)),
        local_numbering=bool(raw.get("local_numbering", False)),
    )


# A phrase this long names its message alone ("Watchdog caught collective operation timeout: WorkNCCL(");
# shorter literals ("CUDA error: ", "Killed") are shared by many messages.
MIN_PHRASE = 20


def _is_phrase(text: str) -> bool:
    """Words of a message, not a place: paths and frame lines ("torch/distributed/...py", line") locate
    a stack, and their patterns' other parts decide what the line is."""
    return len(text) >= MIN_PHRASE and text.count(" ") >= 2 and not any(c in text for c in '/"\\')


def _phrases(patterns: list[str]) -> tuple[str, ...]:
    found = (required_literal(text) for text in patterns)
    return tuple(dict.fromkeys(p.strip() for p in found if p and _is_phrase(p.strip())))


def _load_file(path: Path) -> list[Rule]:
    data = check_table(read_toml(path), path.name, {"rule": TABLES})
    return [_build_rule(raw, path.name) for raw in data["rule"]]


def load_rules(directory: Path = RULES_DIR) -> list[Rule]:
    """Every rule in `directory`/*.toml; a KnowledgeError names what does not validate."""
    if not directory.is_dir():
        raise RuleError(f"{directory}: no such folder of rules")
    files = sorted(directory.glob("*.toml"))
    if not files:
        raise RuleError(f"{directory}: holds no rule files (*.toml)")
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    for path in files:
        for rule in _load_file(path):
            if rule.id in seen:
                raise RuleError(f"{path.name}: rule id {rule.id} is also defined in {seen[rule.id]}")
            seen[rule.id] = path.name
            rules.append(rule)
    return rules


def with_extra_rules(directory: Path) -> list[Rule]:
    """The built-in rules and the user's in `directory`; a user rule may not reuse a built-in id."""
    extra = load_rules(directory)
    built_in = {rule.id: rule for rule in default_rules()}
    shadowing = [rule for rule in extra if rule.id in built_in]
    if shadowing:
        names = ", ".join(f"{r.id} ({r.file})" for r in shadowing[:5])
        raise RuleError(
            f"{directory}: {names} reuse{'s' if len(shadowing) == 1 else ''} the id of a built-in rule; "
            "give your rule an id of its own (`torchtriage rules` lists the built-in ones)"
        )
    return list(default_rules()) + extra


@lru_cache(maxsize=1)
def default_rules() -> tuple[Rule, ...]:
    return tuple(load_rules())


@cache
def _rules_of_prefix(prefix: str) -> dict[str, Rule]:
    path = RULES_DIR / f"{prefix}.toml"
    return {rule.id: rule for rule in _load_file(path)} if path.is_file() else {}


def rule_by_id(rule_id: str) -> Rule | None:
    """The built-in rule of this id. A rule lives in the file of its prefix: only that file is read."""
    prefix = rule_id.split(".", 1)[0]
    return _rules_of_prefix(prefix).get(rule_id) if prefix.isidentifier() else None
