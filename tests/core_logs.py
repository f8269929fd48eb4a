"""Logs of the core failure categories, generated from the real format strings, with their ground truth.

A case is drawn from a seed: one writer of tests/core_formats.py (seeds cycle through `WRITERS`: CUDA out of memory
as each torch release words it, NCCL and cuBLAS running out, XLA's RESOURCE_EXHAUSTED, the kernel's OOM killer,
Slurm's and Kubernetes' OOM reports, Xid faults, device-side asserts, NaN checks and loss scalers that run out,
watchdog timeouts in each release's wording, NCCL's IB and socket errors, TCPStore and its barriers, set-up errors,
program bugs, hangs, DeepEP's kernel timeouts), its values drawn from one made-up job (`Job`): its torch release,
launcher, nodes, ranks, hosts, the rank that fails, its peers' collateral and the launcher's report.

Each case carries its truth: the category, the set of categories that are right answers, and the ranks a verdict
may name (`Case.culprits`: the failing rank, where the writer's lines put the failure on it and its peers' lines are
what it did to them; None where any rank may be the one the lines show, or the file cannot say: srun's task numbers
under torchrun, several nodes' lines under torchrun --tee's local-rank prefix). It is rendered as the
job's launcher captured it (`render`): every line under its launcher's prefix (torchrun's `[rankN]:` from 2.2 or
`[defaultN]:`, srun's `N: `, DeepSpeed's pdsh `host: `, Ray's `(WorkerDict pid=.., ip=..) `, mpirun's
`[1,N]<stderr>:`; the kernel's and the launcher's own lines bare), and, for some, under `kubectl logs --timestamps`.

What triage does not yet read (`KNOWN_GAPS`), by the case's shape, with the reason; there a verdict of `unknown` is
tolerated, never a wrong category:

- cudnn no valid algorithm: "Unable to find a valid cuDNN algorithm to run convolution" is most often a full GPU,
  else a cuDNN/driver mismatch; no rule reads it, and where no other line decides the verdict is unknown.

Nothing here imports the analysis: `outcome` runs the in-process API, `torchtriage.analysis.pipeline`.
The long run: `python tests/core_logs.py --count 5000 [--seed N]` prints the seeds whose verdict is wrong (keep them in
core_regressions.txt) and the tally per category and writer.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from core_formats import AGENT, KERNEL, LAUNCHER, RANK, WRITERS, Job, L, preamble

CATEGORIES = tuple(dict.fromkeys(writer.category for writer in WRITERS))

# Shapes whose verdict may be `unknown` (never another category), and why: see the module's docstring.
KNOWN_GAPS = {
    "cudnn no valid algorithm": "no rule reads cuDNN's 'Unable to find a valid cuDNN algorithm' (a full GPU, or a "
    "cuDNN/driver mismatch)",
}

REGRESSIONS = Path(__file__).parent / "core_regressions.txt"


# --- Rendering ---------------------------------------------------------------------------------------------


def prefix_of(job: Job, line: L) -> str:
    """The launcher's prefix of a line: torchrun's `[rankN]:` (2.2+, its log line prefix) or `[defaultN]:` (--tee, N
    the local rank), srun --label's task id (the rank: one task a GPU), DeepSpeed's pdsh `host: ` on several nodes,
    Ray's `(WorkerDict pid=%d, ip=%s) ` (python/ray/_private/log_monitor.py), mpirun's `[1,N]<stderr>:`
    (--tag-output)."""
    if line.kind == KERNEL or line.kind == LAUNCHER:
        return ""
    p = job.prefix
    if line.kind == AGENT:
        if p == "deepspeed" and job.nodes > 1:
            return f"{job.hosts[line.node or 0]}: "
        return ""
    rank = line.rank if line.rank is not None else 0
    if p == "rank":
        return f"[rank{rank}]:"
    if p == "default":
        return f"[default{job.local(rank)}]:"  # --tee's role and LOCAL rank (tail_log.py): node 1's rank 4 is default0
    if p == "srun":
        return f"{rank}: "
    if p == "deepspeed":
        return f"{job.hosts[job.node_of(rank)]}: " if job.nodes > 1 else ""
    if p == "ray":
        return f"(WorkerDict pid={job.pids[rank]}, ip={job.ips[job.node_of(rank)]}) "
    if p == "mpirun":
        return f"[1,{rank}]<stderr>:"
    return ""


def render(job: Job, lines: list[L]) -> str:
    out = []
    clock = job.v.clock - timedelta(hours=2)
    last = None
    for line in lines:
        text = prefix_of(job, line) + line.text
        if job.timestamps and line.kind != KERNEL:
            # One write (a traceback, a report) reaches the container runtime at once: its lines' stamps differ by
            # microseconds; another printer's, or the next step line, come later.
            who = (line.kind, line.rank, line.node)
            step = (
                line.text.lstrip().startswith(("step ", "{'loss'", "Epoch", "[", "iteration"))
                or "train_inner" in line.text
            )
            if who != last or step:
                clock += timedelta(milliseconds=job.rng.randint(1, 3000))
            else:
                clock += timedelta(microseconds=job.rng.randint(1, 200))
            last = who
            text = f"{clock:%Y-%m-%dT%H:%M:%S}.{clock.microsecond:06d}{job.rng.randint(100, 999)}Z {text}"
        out.append(text)
    return "\n".join(out) + "\n"


# --- A case -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    seed: int
    category: str  # the writer's category ("mixed" writers: their truth's)
    shape: str
    truth: str
    accept: frozenset[str]
    text: str
    note: str = ""
    job: str = ""  # torch release, launcher/prefix, nodes x ranks, training style
    # The ranks a verdict may name (the failing rank: its peers' lines are what it did to them), or None where any
    # rank may be the one the lines show (core_formats.Writer.names_culprit).
    culprits: frozenset[int] | None = None


def _local_prefixes_of_nodes(job: Job, lines: list[L]) -> bool:
    """Whether the ranks' lines come from several nodes under torchrun --tee's local-rank prefix: a merged file in
    which `[default0]:` is every node's first rank, and the writers give only the first failed rank's node's agent
    report, so what the file says of whose line is whose may place the culprit's lines on another node."""
    nodes = {job.node_of(line.rank) for line in lines if line.kind == RANK and line.rank is not None}
    return job.prefix == "default" and len(nodes) > 1


def make(seed: int) -> Case:
    """The case of `seed`: its writer (seeds cycle through them), its job, its log and its truth."""
    rng = random.Random(seed)
    writer = WRITERS[seed % len(WRITERS)]
    job = Job(rng)
    head = [] if writer.category == "mixed" else preamble(job, writer.phase)
    failure = writer.write(job)
    accept = failure.accept or frozenset({failure.truth})
    text = render(job, head + failure.lines)
    stamps = ", k8s timestamps" if job.timestamps else ""
    desc = f"torch {job.era}, {job.launcher}/{job.prefix}, {job.nodes}x{job.per_node}, {job.style}{stamps}"
    category = failure.truth if writer.category == "mixed" else writer.category
    culprits = failure.culprits if failure.culprits is not None else frozenset({job.culprit})
    claim = culprits if writer.names_culprit and culprits and not _local_prefixes_of_nodes(job, failure.lines) else None
    return Case(seed, category, failure.writer, failure.truth, accept, text, failure.note, desc, claim)


# --- Verdicts -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    case: Case
    category: str
    confidence: str
    summary: str
    culprits: tuple[int, ...] = ()

    @property
    def right(self) -> bool:
        return self.category in self.case.accept and not self.names_another_rank

    @property
    def names_another_rank(self) -> bool:
        """The verdict names a rank the case's truth does not (naming none is no wrong: the rank may be unsaid)."""
        claim = self.case.culprits
        return claim is not None and bool(self.culprits) and not set(self.culprits) <= claim

    @property
    def tolerated(self) -> bool:
        """The category right, or `unknown` where triage does not yet read the shape (`KNOWN_GAPS`)."""
        return self.category in self.case.accept or (self.category == "unknown" and self.case.shape in KNOWN_GAPS)

    @property
    def wrong_at(self) -> str | None:
        """The confidence of a wrong verdict (an `unknown` that names no rank is no wrong), else None."""
        return None if self.right or (self.category == "unknown" and not self.culprits) else self.confidence

    def describe(self) -> str:
        c = self.case
        ranks = (
            f" naming ranks {list(self.culprits)} (truth {sorted(c.culprits or [])})" if self.names_another_rank else ""
        )
        return (
            f"{c.seed}  # {c.category} / {c.shape} [{c.job}]: want {sorted(c.accept)}, got {self.category} "
            f"({self.confidence}){ranks}: {self.summary[:140]}"
        )


def outcome(case: Case) -> Outcome:
    from torchtriage.analysis.pipeline import triage_text

    verdict = triage_text(case.text)
    return Outcome(case, str(verdict.category), str(verdict.confidence), verdict.summary, tuple(verdict.culprit_ranks))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--dump", type=int, help="print the log of this seed and its verdict, then stop")
    args = parser.parse_args()
    if args.dump is not None:
        result = outcome(make(args.dump))
        print(result.case.text + result.describe())
        return 0
    tally: dict[tuple[str, str], Counter] = defaultdict(Counter)
    failed = 0
    for seed in range(args.seed, args.seed + args.count):
        result = outcome(make(seed))
        counts = tally[(result.case.category, result.case.shape)]
        counts["cases"] += 1
        counts["right"] += result.right
        counts["unknown"] += result.category == "unknown"
        counts[f"wrong@{result.wrong_at}"] += result.wrong_at is not None
        counts["another"] += result.names_another_rank
        if not result.right:
            print(result.describe(), flush=True)
        failed += not result.tolerated or result.wrong_at is not None
    print(f"\n{args.count - failed} of {args.count} cases right (or unknown where KNOWN_GAPS says so)")
    print(
        f"{'category':<15} {'writer':<52} {'cases':>5} {'right':>5} {'unknown':>7} {'wrong@high/med/low':>18} "
        f"{'another rank':>12}"
    )
    totals: Counter = Counter()
    for (category, shape), c in [*sorted(tally.items()), (("total", ""), None)]:
        if c is None:
            c = totals
        else:
            totals.update(c)
        wrong = f"{c['wrong@high']}/{c['wrong@medium']}/{c['wrong@low']}"
        print(
            f"{category:<15} {shape[:52]:<52} {c['cases']:5d} {c['right']:5d} {c['unknown']:7d} {wrong:>18} "
            f"{c['another']:12d}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
