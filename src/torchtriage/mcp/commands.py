"""Tool parameters into the CLI's arguments: one builder per tool, typed values in, an argv out.

No value ever becomes an option of its own: every value is joined to its option (`--fr=/abs/dir`), every path
is admitted by the roots (absolute, resolved) and the positionals follow `--`. Live work on this node is built
only when the server allows it; the verbs that reach other nodes (`diagnose --store/--slurm/--pods`) and the
options that write files or raise the CLI's limits are not offered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torchtriage.mcp.roots import Refused, Roots


@dataclass(frozen=True)
class Command:
    verb: str
    options: tuple[str, ...] = ()
    positionals: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if any("\x00" in value for value in self.options + self.positionals):
            raise Refused("a value holds a NUL character; no command line can carry it.")

    def argv(self, as_json: bool) -> list[str]:
        """The arguments after `torchtriage`, with `--json` or without (for the rendered text)."""
        head = [self.verb, *(["--json"] if as_json else []), *self.options]
        return head + (["--", *self.positionals] if self.positionals else [])

    def with_options(self, *options: str) -> Command:
        return Command(self.verb, self.options + options, self.positionals)


def _value(name: str, value: object) -> list[str]:
    return [] if value is None else [f"--{name}={value}"]


def _flag(name: str, on: bool) -> list[str]:
    return [f"--{name}"] if on else []


def _paths(roots: Roots, paths: Sequence[str], what: str) -> tuple[str, ...]:
    if not paths:
        raise Refused(f"give {what}.")
    return tuple(roots.admit_all(paths))


def triage(roots: Roots, paths: Sequence[str], rules_dir: str | None = None) -> Command:
    rules = _value("rules-dir", roots.admit(rules_dir) if rules_dir is not None else None)
    return Command("triage", tuple(rules), _paths(roots, paths, "log files or folders"))


def diagnose(
    roots: Roots,
    allow_live: bool,
    paths: Sequence[str] = (),
    fr: Sequence[str] = (),
    logs: Sequence[str] = (),
    live: bool = False,
    pid: Sequence[int] = (),
    native: bool = False,
    timeout: float | None = None,
) -> Command:
    live = live or bool(pid)
    if live and not allow_live:
        raise Refused(
            "live diagnosis (live, pid) is off: this server was started without --allow-live. "
            "Give the paths of the files the job left instead."
        )
    if live and paths:
        raise Refused("give paths (post-mortem) or live / pid (live, this node), not both.")
    if not live and not paths:
        raise Refused(
            "give paths: the folders and files a job left (stack dumps, flight-recorder dumps, logs)"
            + ("; or live=true / pid to capture this node's jobs." if allow_live else ".")
        )
    options = [f"--fr={p}" for p in roots.admit_all(fr)] + [f"--logs={p}" for p in roots.admit_all(logs)]
    if live:
        options += [f"--pid={int(p)}" for p in pid] + _flag("native", native) + _value("timeout", timeout)
    return Command("diagnose", tuple(options), tuple(roots.admit_all(paths)))


def fr(roots: Roots, paths: Sequence[str], jobs: int | None = None) -> Command:
    return Command("fr", tuple(_value("jobs", jobs)), _paths(roots, paths, "flight-recorder dumps or folders"))


def trace(roots: Roots, paths: Sequence[str]) -> Command:
    return Command("trace", (), _paths(roots, paths, "profiler traces or folders"))


def memory(roots: Roots, paths: Sequence[str]) -> Command:
    if not 1 <= len(paths) <= 2:
        raise Refused("give one memory snapshot, or two of the same job (earlier, later) to compare them.")
    snapshot, *later = roots.admit_all(paths)
    return Command("memory", tuple(_value("compare", later[0] if later else None)), (snapshot,))


def rules(category: str | None = None) -> Command:
    return Command("rules", tuple(_value("category", category)))


def explain(rule: str) -> Command:
    return Command("explain", (), (rule,))


def doctor(no_torch: bool = False) -> Command:
    return Command("doctor", tuple(_flag("no-torch", no_torch)))


LAYOUT_DEGREES = ("world_size", "gpus_per_node", "nvlink_domain", "dp", "tp", "pp", "cp", "ep", "etp", "num_experts")


def check_layout(roots: Roots, config: str | None = None, **degrees: int | None) -> Command:
    unknown = set(degrees) - set(LAYOUT_DEGREES)
    if unknown:
        raise Refused(f"unknown layout settings: {', '.join(sorted(unknown))}.")
    options = [f"--{name.replace('_', '-')}={int(value)}" for name, value in degrees.items() if value is not None]
    options += _value("config", roots.admit(config) if config is not None else None)
    return Command("check-layout", tuple(options))
