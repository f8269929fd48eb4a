"""The editorial half of the skill: which symptom leads to which command, and what the verdict's words mean.

Everything here is checked against the tool when the skill is generated (`generate.py`): a command line must
parse with its verb's real parser, a helper must be a public name of `torchtriage`, a category must be one of
`model.Category`, a described JSON key must be one the verdict has. What the rules know (their ids, the
environment variables and helpers their actions name) is not written here: it is read from the knowledge base.
"""

from __future__ import annotations

from dataclasses import dataclass

NAME = "torchtriage"

# One paragraph, no ": " (a plain YAML scalar), under the 1,024 characters an agent's skill index allows.
DESCRIPTION = (
    "Diagnose a failed, stuck or slow PyTorch distributed training job with the torchtriage command line. "
    "Use it when a training job hangs, hits an NCCL or collective timeout, runs out of GPU or host memory, "
    "logs NaN or Inf, fails in DeepEP or NVSHMEM, crashes with NCCL, CUDA, rendezvous or launcher errors, or "
    "runs slower than it should, and there are logs, flight-recorder dumps, stack dumps, profiler traces, "
    "memory snapshots or live ranks on this node to read. torchtriage returns a deterministic, versioned "
    "verdict (category, culprit ranks, confidence, evidence, fixes) from its knowledge base of failure modes; "
    "run it instead of reading hundreds of rank logs by hand, and report its verdict rather than a guess."
)


@dataclass(frozen=True)
class Command:
    """A command line after `torchtriage `: the verb, real options, and placeholders in capitals."""

    line: str
    when: str


@dataclass(frozen=True)
class Branch:
    title: str
    signs: str  # what the user sees, in their words
    categories: tuple[str, ...]  # the verdict categories this branch ends in
    run_first: tuple[Command, ...]
    reading: str  # what matters in this branch's verdict
    next_time: tuple[Command, ...] = ()
    helpers: tuple[str, ...] = ()  # public names of `torchtriage` worth adding to the training script


# Whatever the symptom: one folder, everything the job left, one verdict.
START = (
    Command(
        "diagnose DIR --json",
        "the job is over and DIR holds what it left (logs, py-spy or faulthandler stacks, flight-recorder dumps, "
        "traces, snapshots, a `torchtriage run` folder): every kind is read and fused into one verdict",
    ),
    Command("triage LOGS --json", "only logs (files, folders, .gz, or - for standard input)"),
    Command("report DIR --html FILE", "one self-contained HTML page of the same, to attach to a bug report"),
    Command(
        "mcp --root DIR",
        "the same verbs as tools of a Model Context Protocol server on stdio, reading only inside DIR (where the "
        "agent's client is configured to start it); each answers with the CLI's verdict JSON, text and exit code",
    ),
)

BRANCHES = (
    Branch(
        title="Hang: the job is stuck, no error yet",
        signs="steps stop advancing, no traceback; GPUs idle or busy at 100 %; the job is still running",
        categories=("hang",),
        run_first=(
            Command("diagnose --json", "alive on this node: every torchrun job here, each rank's stack by py-spy"),
            Command("diagnose --pid PID --json", "one job: a rank's pid or its launcher's"),
            Command("diagnose --slurm JOBID --json", "every node of a SLURM job, as one extra job step"),
            Command(
                "diagnose --store HOST:PORT --json",
                "every node through PyTorch's debug server (the job ran under `torchtriage run --debug-server`)",
            ),
            Command("diagnose DIR --json", "the job is gone: the folder it left"),
            Command("fr DUMPS --json", "flight-recorder dumps alone: the first collective where ranks disagree"),
        ),
        reading=(
            "`culprit_ranks` are the ranks that departed (skipped, reordered or never reached a collective), not "
            "the ranks that wait for them; `culprit_machines` says on which host and GPU. A finding with "
            "`blames` true carries the culprit; the user's line of code is in the text output and in `facts`. "
            "With `low` confidence or no culprit, get the flight recorder's dumps and every rank's stack first."
        ),
        next_time=(
            Command(
                "run --out DIR -- torchrun ...",
                "flight recorder armed and a hang watchdog in every rank: a stall leaves its verdict in {verdict}",
            ),
            Command(
                "run --debug-server --out DIR -- torchrun ...",
                "many nodes: `torchtriage diagnose --store HOST:PORT` then reaches every rank",
            ),
        ),
        helpers=("HangWatchdog", "check_collectives", "assert_rank_uniform", "init_distributed"),
    ),
    Branch(
        title="NCCL or collective timeout",
        signs="the NCCL watchdog's collective operation timeout, a gloo timeout, then the job dies on every rank",
        categories=("nccl_timeout",),
        run_first=(
            Command("triage LOGS --json", "the logs of every rank: who timed out first, and who never arrived"),
            Command("diagnose DIR --json", "logs with flight-recorder dumps or stacks: the sources are fused"),
            Command("fr DUMPS --json", "the flight recorder's dumps (written on timeout when armed)"),
        ),
        reading=(
            "A timeout is a `symptom`: the ranks that print it are waiting for the culprit. Trust `culprit_ranks` "
            "from the flight recorder or stacks over the logs; a `primary` finding of another category in the "
            "same verdict (an OOM, a GPU fault, a killed rank) is the cause and the timeouts are its aftermath."
        ),
        next_time=(
            Command("run --out DIR -- torchrun ...", "arms the flight recorder, so the next timeout leaves dumps"),
        ),
        helpers=("init_distributed", "check_collectives"),
    ),
    Branch(
        title="Out of memory (GPU or host)",
        signs="CUDA out of memory, an allocator or cuBLAS failure, a process Killed by the kernel, a DataLoader "
        "worker killed",
        categories=("oom", "host_oom"),
        run_first=(
            Command("triage LOGS --json", "which rank ran out first; its peers' NCCL errors become collateral"),
            Command("memory SNAPSHOT --json", "a CUDA memory snapshot: the sites that hold memory at the peak or OOM"),
            Command("memory SNAPSHOT --compare OTHER --json", "two snapshots of one job: what grew, by site"),
        ),
        reading=(
            "`oom` is GPU memory, `host_oom` the machine's. A snapshot's verdict tells the allocator's cache from "
            "fragmentation and names the allocation sites; its `actions` come in the order to try them. A "
            "healthy snapshot is `ok`."
        ),
        helpers=("cuda_memory_history", "install_oom_attribution", "oom_attribution", "check_memory_margin"),
    ),
    Branch(
        title="NaN or Inf",
        signs="loss nan or inf, a grad norm that is not finite, a loss scale that keeps halving, anomaly detection",
        categories=("nan_inf",),
        run_first=(
            Command("triage LOGS --json", "the logs: the first step and rank with a non-finite value"),
            Command("triage DIR --json", "a `torchtriage run` folder: also the guard's record of where a NaN was born"),
        ),
        reading=(
            "The finding says whether the first non-finite value came from data (one rank's batch), numerics "
            "(a layer, an op) or hardware; where `NonFiniteGuard` located it, the module and op are named."
        ),
        helpers=("NonFiniteGuard", "locate_nonfinite", "compare_attention", "assert_rank_uniform"),
    ),
    Branch(
        title="DeepEP or NVSHMEM fault",
        signs="DeepEP dispatch or combine timeouts, NVSHMEM or IBGDA errors, a hang in expert parallelism",
        categories=("deepep",),
        run_first=(
            Command("triage LOGS --json", "the logs: DeepEP's own error owns the CUDA errors printed after it"),
            Command(
                "check-layout --world-size N --gpus-per-node G --ep K --json",
                "the parallel layout: rejects one known to deadlock, with the fix",
            ),
            Command("diagnose DIR --json", "stuck rather than failed: stacks and dumps"),
        ),
        reading="A `deepep` verdict is the library's own failure; generic CUDA errors after it are its cascade.",
        next_time=(Command("check-layout --config FILE --json", "before launch, from the job's own config file"),),
    ),
    Branch(
        title="Slow: a straggler, or every step slower than it should be",
        signs="throughput dropped, one rank's steps are longer, collectives wait on a late rank",
        categories=("straggler",),
        run_first=(
            Command("trace TRACES --json", "profiler traces of every rank: per-step compute, communication, idle"),
            Command("triage DIR --json", "a `torchtriage run --monitor` folder: the step monitor's decision"),
            Command("record --duration S", "live on this node: flame graphs of every rank over one window"),
            Command("nvlink --json", "this node's NVLink and GPU health, safe beside a running job"),
        ),
        reading=(
            "`culprit_ranks` is the straggler; the finding's message gives its reason (data, compute, launch or "
            "communication). Traces of fewer ranks than the job name a straggler only among those read."
        ),
        next_time=(Command("run --monitor --out DIR -- torchrun ...", "the step monitor in every rank"),),
        helpers=("StepMonitor", "StepMonitorCallback", "LightningStepMonitor", "profile_steps", "phase"),
    ),
    Branch(
        title="Crash: an error, a dead rank, a job that will not start",
        signs="a traceback, a CUDA or NCCL error, a GPU Xid, a rendezvous or store timeout, a launcher's failure",
        categories=("gpu_fault", "nccl_transport", "rendezvous", "environment", "usage", "unknown"),
        run_first=(
            Command("triage LOGS --json", "every rank's log: the first failure, and the rank that printed it"),
            Command("nvlink --json", "`gpu_fault` or NVLink: run it on the culprit's host (`culprit_machines`)"),
            Command(
                "doctor --json", "`environment` or `rendezvous`: versions, topology, ptrace, /dev/shm, ports, limits"
            ),
            Command("history DIR --json", "a job that restarted: does the failure follow a machine or the code"),
            Command("triage LOGS --rules-dir DIR --json", "`unknown`: add your own rules for your messages"),
        ),
        reading=(
            "The headline is the most explanatory failure: a cause in itself (a GPU fault, an OOM, a killed rank) "
            "outranks the errors of its peers. `unknown` means nothing was recognised, never that all is well; "
            "the log's last lines are in the findings' `evidence`."
        ),
        next_time=(Command("doctor --json", "before launch: what breaks distributed jobs on this machine"),),
        helpers=("init_distributed", "assert_rank_uniform"),
    ),
    Branch(
        title="The job finished, but its log looked wrong",
        signs="the launcher says the job finished, yet its log holds errors or warnings: a caught exception, a "
        "retried connection, a restart",
        categories=("ok",),
        run_first=(
            Command(
                "triage LOGS --json", "the launcher's own success report decides: the lines before it are survived"
            ),
        ),
        reading=(
            "`ok` comes only from the launcher's own report that every worker exited 0 after every line that looks "
            "like a failure (or from a check that read everything and found it healthy), and exits 0. Those lines "
            "are `symptom` findings the job survived: if its results are wrong, start from them."
        ),
    ),
)

ROLE_MEANING = {
    "primary": "a cause in itself (an OOM, a GPU fault, a rank that departed)",
    "symptom": "a failure whose cause may lie elsewhere (a timeout, a peer's error)",
    "collateral": "the aftermath of another rank's failure: never the thing to fix",
}

CONFIDENCE_MEANING = {
    "high": "the deciding evidence is a cause in itself and nothing read outranks it, or independent sources "
    "agree on the culprit: act on it",
    "medium": "a symptom decided, or a rival cause or a disagreeing source held it back: act, but show the user "
    "the evidence lines",
    "low": "only aftermath or an absence of evidence (where a log stops): collect more (flight-recorder dumps, "
    "stacks) before acting",
}

# The verdict's keys (model.Verdict.to_json) and what an agent does with each.
VERDICT_KEYS = {
    "schema": "the version of this format; keys may be added within a version, never renamed or removed",
    "category": "the branch above it belongs to",
    "culprit_ranks": "global ranks that started it; empty when the evidence singles no one out",
    "summary": "one line: quote it",
    "confidence": "how sure (below)",
    "findings": "what was found, most explanatory first",
    "actions": "the fixes, from the knowledge base, the one that names the culprit first",
    "facts": "what was extracted: the culprit's line of code, ranks the evidence cannot decide between, "
    "the sources used and missing",
    "sources": "the files read",
    "problems": "inputs that could not be (fully) read, each with what to do",
    "culprit_machines": "one per culprit rank: where it ran",
}
FINDING_KEYS = {
    "kind": "the rule id: `torchtriage explain RULE` tells what it is",
    "role": "how much it explains (below)",
    "blames": "true when its ranks are the culprits rather than the ranks that reported",
    "evidence": "the lines it rests on",
}
ACTION_KEYS = {
    "rule": "the rule it comes from",
    "command": "a shell command to run, or null",
    "env": "environment variables to set for the next run",
}
