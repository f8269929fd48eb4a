"""Find the ranks of a distributed job on this node.

By default: every torchrun (`torchrun`, `python -m torch.distributed.run`, `torch.distributed.launch`)
agent on this node, expanded to its worker processes. With explicit pids: an agent expands to its
workers; any other pid is taken as a worker as it is (SLURM `srun`, `mpirun`, `mp.spawn`, Ray actors).

The parsing functions are pure (bytes in, values out) and tested on data; `read_process` and
`ProcTable` are the thin /proc readers.

Only the launcher variables below are ever read from a process's environment: environments hold
tokens and passwords, and nothing else from them is kept or written anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torchtriage.errors import EnvironmentProblem, UsageError
from torchtriage.protocol import host_name

# The first variable present wins: torchrun's own names, then the launchers that set their own.
RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
WORLD_SIZE_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
# How many ranks the launcher started on this node: a rank of the node with no process has died or exited.
LOCAL_WORLD_SIZE_VARS = ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
# A torchrun worker: the agent sets these (and nothing else marks a worker as surely).
WORKER_VARS = ("RANK", "LOCAL_RANK")
# A SLURM job step's own job and node: a capture step (`srun --overlap --jobid J`) takes job J's ranks on its
# node, not another job's that shares the node.
SLURM_PLACE_VARS = ("SLURM_JOB_ID", "SLURM_NODEID")
# What else tells jobs on one node apart, when none can be chosen: a job step, the launcher's run id.
JOB_LABEL_VARS = ("SLURM_STEP_ID", "TORCHELASTIC_RUN_ID")
# How many times torchrun restarted this node's workers (`--max-restarts`): a restarted group's setup can wait on
# what the previous attempt left in the rendezvous store it shares with them.
RESTART_VARS = ("TORCHELASTIC_RESTART_COUNT",)
# In a Kubernetes pod (KUBERNETES_SERVICE_HOST set), HOSTNAME is the pod's name: a capture in one pod takes
# that pod's ranks, not those of other pods that share the node's process table (hostPID).
POD_PLACE_VARS = ("HOSTNAME",)
LAUNCHER_ENV = tuple(
    dict.fromkeys(
        RANK_VARS
        + LOCAL_RANK_VARS
        + WORLD_SIZE_VARS
        + LOCAL_WORLD_SIZE_VARS
        + JOB_LABEL_VARS
        + RESTART_VARS
        + SLURM_PLACE_VARS
        + POD_PLACE_VARS
    )
)

_AGENT_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_AGENT_SCRIPTS = ("torchrun",)

PID_HINT = (
    "name them with --pid: a rank's pid, or its launcher's (torchrun) pid; "
    "`ps -ef --forest` shows them (look for your training script)"
)


@dataclass(frozen=True)
class ProcessFacts:
    """What /proc says about one process: the raw inputs of discovery."""

    pid: int
    ppid: int
    state: str  # one letter from /proc/<pid>/stat: R, S, D, Z, T, ...
    cmdline: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # LAUNCHER_ENV only
    env_readable: bool = True
    exe: str | None = None


@dataclass(frozen=True)
class RankProcess:
    """One process to capture: a rank of the job (its rank is None when its launcher set none)."""

    pid: int
    rank: int | None
    local_rank: int | None
    world_size: int | None
    host: str
    cmdline: tuple[str, ...]
    agent_pid: int | None = None  # the torchrun agent it was found under
    note: str | None = None  # why a field is unknown, e.g. its environment was not readable
    local_world_size: int | None = None
    restart_count: int | None = None  # torchrun's restarts of the worker group it belongs to

    def to_json(self) -> dict:
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "local_world_size": self.local_world_size,
            "restart_count": self.restart_count,
            "pid": self.pid,
            "host": self.host,
            "cmdline": list(self.cmdline),
            "agent_pid": self.agent_pid,
        }


# ---------------------------------------------------------------------------------------------------
# Pure parsing


def parse_cmdline(data: bytes) -> tuple[str, ...]:
    """/proc/<pid>/cmdline: NUL-separated arguments (a kernel thread's is empty)."""
    return tuple(arg.decode("utf-8", "replace") for arg in data.split(b"\0") if arg)


def parse_environ(data: bytes, keys: Iterable[str] = LAUNCHER_ENV) -> dict[str, str]:
    """/proc/<pid>/environ, keeping only `keys` (never a secret the job's environment may hold)."""
    wanted = {key.encode(): key for key in keys}
    found: dict[str, str] = {}
    for entry in data.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name in wanted:
            found[wanted[name]] = value.decode("utf-8", "replace")
    return found


def parse_stat(data: bytes) -> tuple[str, int]:
    """(state, ppid) from /proc/<pid>/stat. The command name is in parentheses and may itself hold
    spaces and parentheses, so the fields are read after the *last* ')'."""
    text = data.decode("utf-8", "replace")
    close = text.rfind(")")
    if close < 0:
        raise ValueError(f"unexpected /proc stat line: {text[:80]!r}")
    fields = text[close + 1 :].split()
    if len(fields) < 2:
        raise ValueError(f"unexpected /proc stat line: {text[:80]!r}")
    return fields[0], int(fields[1])


def first_int(env: Mapping[str, str], names: Sequence[str]) -> int | None:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                continue
    return None


def is_agent(cmdline: Sequence[str]) -> bool:
    """A torchrun agent: `torchrun ...`, `python /path/bin/torchrun ...`, `python -m torch.distributed.run`
    (or the deprecated `torch.distributed.launch`)."""
    if not cmdline:
        return False
    head = list(cmdline[:3])
    if any(Path(arg).name in _AGENT_SCRIPTS for arg in head[:2]):
        return True
    for i, arg in enumerate(cmdline[:-1]):
        if arg == "-m" and cmdline[i + 1] in _AGENT_MODULES:
            return True
    return any(arg.startswith("-m") and arg[2:] in _AGENT_MODULES for arg in head)


def looks_like_python(cmdline: Sequence[str], exe: str | None) -> bool:
    names = [Path(exe).name] if exe else []
    names += [Path(cmdline[0]).name] if cmdline else []
    # Ray actors and setproctitle users rename the process (`ray::Actor`), but exe stays python.
    return any(name.startswith("python") or name.startswith("pypy") for name in names)


def rank_process(facts: ProcessFacts, host: str, agent_pid: int | None = None) -> RankProcess:
    note = None if facts.env_readable else "its environment could not be read, so its rank is unknown"
    return RankProcess(
        pid=facts.pid,
        rank=first_int(facts.env, RANK_VARS),
        local_rank=first_int(facts.env, LOCAL_RANK_VARS),
        world_size=first_int(facts.env, WORLD_SIZE_VARS),
        local_world_size=first_int(facts.env, LOCAL_WORLD_SIZE_VARS),
        restart_count=first_int(facts.env, RESTART_VARS),
        host=host,
        cmdline=facts.cmdline,
        agent_pid=agent_pid,
        note=note,
    )


def workers_of(agent: int, table: Mapping[int, ProcessFacts]) -> list[ProcessFacts]:
    """The agent's workers: the highest descendants that carry RANK or LOCAL_RANK.

    Below a worker the search stops, so its DataLoader workers and compile subprocesses (which inherit
    the same environment) are not taken for ranks. A non-Python process with the variables (a shell
    run by `torchrun --no-python`) is looked through, to the Python process it starts.
    """
    children: dict[int, list[int]] = {}
    for facts in table.values():
        children.setdefault(facts.ppid, []).append(facts.pid)
    found: list[ProcessFacts] = []
    frontier = sorted(children.get(agent, []))
    while frontier:
        pid = frontier.pop(0)
        facts = table[pid]
        if facts.state == "Z":  # an exited worker the agent has not reaped yet
            continue
        has_vars = any(var in facts.env for var in WORKER_VARS)
        if has_vars and (looks_like_python(facts.cmdline, facts.exe) or not children.get(pid)):
            found.append(facts)
        else:
            frontier.extend(sorted(children.get(pid, [])))
    return found


def order(ranks: Iterable[RankProcess]) -> list[RankProcess]:
    return sorted(ranks, key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.pid))


def select_ranks(
    table: Mapping[int, ProcessFacts],
    host: str,
    pids: Sequence[int] | None = None,
    exclude: Iterable[int] = (),
    place: Mapping[str, str] | None = None,
) -> list[RankProcess]:
    """The processes to capture, from a snapshot of the process table. `place`: the SLURM job (and
    node) this capture runs in, whose agents alone are taken when an agent says which job it belongs to.

    Raises UsageError for a pid that does not exist (or a named agent with no workers, or several
    jobs found when none was named), EnvironmentProblem when nothing was found to capture.
    """
    excluded = set(exclude)
    if pids:
        chosen: dict[int, RankProcess] = {}
        for pid in pids:
            facts = table.get(pid)
            if facts is None or facts.state == "Z":
                raise UsageError(
                    f"--pid {pid}: no such process on this node (it has exited, or it runs in another "
                    "container: run torchtriage inside the job's container, e.g. `docker exec` / `kubectl exec`)."
                )
            if is_agent(facts.cmdline):
                workers = workers_of(pid, table)
                if not workers:
                    raise UsageError(
                        f"--pid {pid} is a torchrun agent with no worker processes (they exited, or are "
                        "restarting); name the workers with --pid, or retry once they run."
                    )
                for worker in workers:
                    chosen.setdefault(worker.pid, rank_process(worker, host, agent_pid=pid))
            else:
                chosen.setdefault(pid, rank_process(facts, host))
        return order(chosen.values())

    jobs: dict[int, list[ProcessFacts]] = {}
    for facts in table.values():
        if facts.pid not in excluded and facts.state != "Z" and is_agent(facts.cmdline):
            workers = [w for w in workers_of(facts.pid, table) if w.pid not in excluded]
            if workers:
                jobs[facts.pid] = workers
    # A wrapper that looks like an agent (`timeout 600 torchrun ...`) finds the same workers as the
    # real agent below it: keep the innermost.
    wrappers = {
        a
        for a in jobs
        for b in jobs
        if a != b and _is_descendant(b, a, table) and {w.pid for w in jobs[a]} & {w.pid for w in jobs[b]}
    }
    for agent in wrappers:
        jobs.pop(agent)
    found_here = dict(jobs)
    if place:
        jobs = jobs_in_place(jobs, table, place)
    if not jobs:
        raise EnvironmentProblem(_none_found(host, place, found_here, table))
    if len(jobs) > 1:
        listing = "; ".join(describe_job(agent, workers, table) for agent, workers in sorted(jobs.items()))
        raise UsageError(
            f"found {len(jobs)} torchrun jobs on this node ({listing}); name the one to capture with --pid AGENT_PID."
        )
    ((agent, workers),) = jobs.items()
    return order(rank_process(w, host, agent_pid=agent) for w in workers)


def jobs_in_place(
    jobs: Mapping[int, list[ProcessFacts]], table: Mapping[int, ProcessFacts], place: Mapping[str, str]
) -> dict[int, list[ProcessFacts]]:
    """The jobs of `place` (a SLURM job, a pod): those whose agent's environment carries it, value for value. A
    SLURM job is nothing else: SLURM sets SLURM_JOB_ID in every process of a job, its batch script's and its
    steps', so a job that does not carry it is another's. A pod's HOSTNAME may be missing from an environment
    its process replaced: only when no job carries it, those that say nothing to the contrary are the pod's."""
    carrying = {a: w for a, w in jobs.items() if all(table[a].env.get(k) == v for k, v in place.items())}
    if carrying or "SLURM_JOB_ID" in place:
        return carrying
    return {a: w for a, w in jobs.items() if all(table[a].env.get(k, v) == v for k, v in place.items())}


def describe_job(agent: int, workers: list[ProcessFacts], table: Mapping[int, ProcessFacts]) -> str:
    """What tells one job on the node from another: its agent, ranks, SLURM job and step, run id, and command."""
    env = {**(workers[0].env if workers else {}), **table[agent].env}
    ranks = sorted(r for r in (first_int(w.env, RANK_VARS) for w in workers) if r is not None)
    world = first_int(env, WORLD_SIZE_VARS)
    parts = [f"agent {agent}: {len(workers)} workers"]
    if ranks:
        span = f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
        parts.append(f"ranks {span}" + (f" of {world}" if world else ""))
    parts += [f"{name}={env[name]}" for name in ("SLURM_JOB_ID", *JOB_LABEL_VARS) if env.get(name)]
    parts.append(f"`{' '.join(table[agent].cmdline)[:120]}`")
    return ", ".join(parts)


def _none_found(
    host: str,
    place: Mapping[str, str] | None,
    here: Mapping[int, list[ProcessFacts]],
    table: Mapping[int, ProcessFacts],
) -> str:
    if not place or not here:
        return f"found no torchrun workers on this node ({host}); {PID_HINT}."
    wanted = ", ".join(f"{name}={value}" for name, value in place.items())
    others = "; ".join(describe_job(agent, workers, table) for agent, workers in sorted(here.items()))
    return (
        f"found no torchrun workers of {wanted} on this node ({host}): the jobs here are others' ({others}); check the "
        "job id (squeue -u $USER), or name the job with --pid AGENT_PID."
    )


def _is_descendant(pid: int, ancestor: int, table: Mapping[int, ProcessFacts]) -> bool:
    seen: set[int] = set()
    while pid in table and pid not in seen:
        seen.add(pid)
        pid = table[pid].ppid
        if pid == ancestor:
            return True
    return False


def ancestors(pid: int, table: Mapping[int, ProcessFacts]) -> set[int]:
    found: set[int] = set()
    while pid in table and pid not in found:
        found.add(pid)
        pid = table[pid].ppid
    return found


# ---------------------------------------------------------------------------------------------------
# The /proc reader


def read_process(pid: int, proc: Path = Path("/proc")) -> ProcessFacts | None:
    """One process's facts, or None when it is gone (processes exit while we read)."""
    base = proc / str(pid)
    try:
        state, ppid = parse_stat((base / "stat").read_bytes())
        cmdline = parse_cmdline((base / "cmdline").read_bytes())
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None
    try:
        env = parse_environ((base / "environ").read_bytes())
        env_readable = True
    except PermissionError:  # another user's process, without CAP_SYS_PTRACE
        env, env_readable = {}, False
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        exe: str | None = os.readlink(base / "exe")
    except OSError:
        exe = None
    return ProcessFacts(pid, ppid, state, cmdline, env, env_readable, exe)


def read_process_table(proc: Path = Path("/proc")) -> dict[int, ProcessFacts]:
    try:
        names = os.listdir(proc)
    except OSError as err:
        raise EnvironmentProblem(
            f"cannot list {proc} ({err.strerror}): process discovery needs a mounted /proc on Linux; "
            "run torchtriage on the training node itself, inside the job's container."
        ) from err
    table = {}
    for name in names:
        if name.isdigit():
            facts = read_process(int(name), proc)
            if facts is not None:
                table[facts.pid] = facts
    if not table:
        raise EnvironmentProblem(f"{proc} lists no processes: is procfs mounted here?")
    return table


def find_ranks(pids: Sequence[int] | None = None, proc: Path = Path("/proc")) -> list[RankProcess]:
    """The ranks to capture on this node: `pids` expanded (agents to their workers), or by default the
    workers of the one torchrun job running here. Never this process or its ancestors."""
    table = read_process_table(proc)
    own = ancestors(os.getpid(), table)
    place = {name: os.environ[name] for name in SLURM_PLACE_VARS if os.environ.get(name)}
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        place |= {name: os.environ[name] for name in POD_PLACE_VARS if os.environ.get(name)}
    return select_ranks(table, host_name(), pids, exclude=own, place=place)
