"""Can this process attach py-spy to those ranks? Decided from the facts, before trying.

py-spy reads a rank's memory and pauses its threads with ptrace. Linux allows that when:
  * Yama (kernel.yama.ptrace_scope, absent on kernels without Yama) permits it:
        0  classic rules (below);  1  only a descendant of the tracer, or a tracer with CAP_SYS_PTRACE;
        2  only a tracer with CAP_SYS_PTRACE;  3  never, until reboot;
  * and the classic rules hold: same uid as the target, or CAP_SYS_PTRACE.
py-spy runs as our child, so it is never an ancestor of a training rank: under scope 1 it needs the
capability. A target in another pid namespace (a container seen from the host) is fine: py-spy
attaches through the host's pid and enters the target's mount namespace itself; that is noted, not
refused.

`decide` is pure (every scope x capability case is tested on values); `read_facts` is the reader.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from torchtriage.errors import EnvironmentProblem

CAP_SYS_PTRACE = 19  # bit in CapEff (linux/capability.h)

FIX_CAPABILITY = (
    "run torchtriage with CAP_SYS_PTRACE: as root (`sudo`), and in a container started with "
    "`docker run --cap-add=SYS_PTRACE` (Kubernetes: securityContext.capabilities.add: [SYS_PTRACE])"
)
FIX_SCOPE = "or allow ptrace between processes of one user: `sudo sysctl kernel.yama.ptrace_scope=0`"


@dataclass(frozen=True)
class TargetFacts:
    pid: int
    uid: int | None  # real uid from /proc/<pid>/status; None when unreadable
    pid_namespace: str | None  # the /proc/<pid>/ns/pid link; None when unreadable


@dataclass(frozen=True)
class PtraceFacts:
    yama_scope: int | None  # None: no Yama on this kernel
    cap_sys_ptrace: bool
    uid: int
    pid_namespace: str | None
    targets: tuple[TargetFacts, ...] = ()
    # True only when the tracer is an ancestor of every target. py-spy is our child, never the
    # ranks' ancestor, so the capture passes False; kept so the table is complete and tested.
    tracer_is_ancestor: bool = False


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str  # why not (empty when allowed)
    fix: str  # what to do (empty when allowed)
    notes: tuple[str, ...] = field(default_factory=tuple)  # things worth knowing that do not block


def decide(facts: PtraceFacts) -> Decision:
    scope, cap = facts.yama_scope, facts.cap_sys_ptrace
    if scope is not None and scope >= 3:
        return Decision(
            False,
            f"kernel.yama.ptrace_scope is {scope}: this kernel forbids every ptrace attach, and the setting "
            "cannot be lowered until the node reboots",
            "ask the administrators for a node booted with ptrace_scope <= 1, or capture stacks from inside "
            "the job instead (faulthandler / `torchtriage run`)",
        )
    if scope == 2 and not cap:
        return Decision(
            False,
            "kernel.yama.ptrace_scope is 2 (admin-only attach) and this process lacks CAP_SYS_PTRACE",
            FIX_CAPABILITY,
        )
    if scope == 1 and not cap and not facts.tracer_is_ancestor:
        return Decision(
            False,
            "kernel.yama.ptrace_scope is 1 (attach only to your own descendants) and this process lacks "
            "CAP_SYS_PTRACE; py-spy is not an ancestor of the training ranks",
            f"{FIX_CAPABILITY}; {FIX_SCOPE}",
        )
    foreign = [t for t in facts.targets if t.uid is not None and t.uid != facts.uid]
    if foreign and not cap:
        listing = ", ".join(f"pid {t.pid} (uid {t.uid})" for t in foreign)
        return Decision(
            False,
            f"{listing} {'runs' if len(foreign) == 1 else 'run'} as another user than this process "
            f"(uid {facts.uid}), and this process lacks CAP_SYS_PTRACE",
            f"run torchtriage as the job's user, or {FIX_CAPABILITY}",
        )
    notes = []
    other_ns = [t.pid for t in facts.targets if t.pid_namespace and facts.pid_namespace != t.pid_namespace]
    if other_ns and facts.pid_namespace:
        notes.append(
            f"pid {', '.join(map(str, other_ns))} {'runs' if len(other_ns) == 1 else 'run'} in another pid "
            "namespace (a container seen from the host): py-spy attaches through the host's pids; if it "
            "fails, run torchtriage inside the container (`docker exec` / `kubectl exec`)"
        )
    unreadable = [t.pid for t in facts.targets if t.uid is None]
    if unreadable:
        notes.append(f"could not read the owner of pid {', '.join(map(str, unreadable))}")
    return Decision(True, "", "", tuple(notes))


# ---------------------------------------------------------------------------------------------------
# Readers


def parse_status_field(status: str, name: str) -> str | None:
    for line in status.splitlines():
        key, sep, value = line.partition(":")
        if sep and key == name:
            return value.strip()
    return None


def has_capability(cap_eff_hex: str | None, bit: int) -> bool:
    return cap_eff_hex is not None and bool(int(cap_eff_hex, 16) >> bit & 1)


def read_yama_scope(path: Path = Path("/proc/sys/kernel/yama/ptrace_scope")) -> int | None:
    try:
        return int(path.read_text().strip())
    except FileNotFoundError:  # no Yama on this kernel: the classic rules apply
        return None
    except (OSError, ValueError):
        return None


def _read_link(path: Path) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def read_target(pid: int, proc: Path = Path("/proc")) -> TargetFacts:
    uid = None
    try:
        real = parse_status_field((proc / str(pid) / "status").read_text(), "Uid")
        uid = int(real.split()[0]) if real else None
    except (OSError, ValueError):
        pass
    return TargetFacts(pid, uid, _read_link(proc / str(pid) / "ns" / "pid"))


def read_facts(pids: Sequence[int], proc: Path = Path("/proc")) -> PtraceFacts:
    status = (proc / "self" / "status").read_text()
    return PtraceFacts(
        yama_scope=read_yama_scope(proc / "sys" / "kernel" / "yama" / "ptrace_scope"),
        cap_sys_ptrace=has_capability(parse_status_field(status, "CapEff"), CAP_SYS_PTRACE),
        uid=os.getuid(),
        pid_namespace=_read_link(proc / "self" / "ns" / "pid"),
        targets=tuple(read_target(pid, proc) for pid in pids),
    )


@dataclass(frozen=True)
class Preflight:
    facts: PtraceFacts
    decision: Decision

    def to_json(self) -> dict:
        facts = asdict(self.facts)
        facts["targets"] = [asdict(t) for t in self.facts.targets]
        return {
            "ptrace_allowed": self.decision.allowed,
            "yama_ptrace_scope": self.facts.yama_scope,
            "cap_sys_ptrace": self.facts.cap_sys_ptrace,
            "uid": self.facts.uid,
            "pid_namespace": self.facts.pid_namespace,
            "targets": facts["targets"],
            "reason": self.decision.reason or None,
            "notes": list(self.decision.notes),
        }


def check_ptrace(pids: Sequence[int], proc: Path = Path("/proc")) -> Preflight:
    """Read the facts and decide; raises EnvironmentProblem (exit 4) with the reason and the fix when
    attaching cannot work, so nothing is attempted."""
    facts = read_facts(pids, proc)
    decision = decide(facts)
    if not decision.allowed:
        raise EnvironmentProblem(f"cannot attach py-spy: {decision.reason}. To fix: {decision.fix}.")
    return Preflight(facts, decision)
