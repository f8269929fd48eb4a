"""Logs of the long tail of triage, generated from the real format strings, with their ground truth.

A case is drawn from a seed: one of the six classes of failure that triage long missed, written as the
programs print them (tests/long_tail_formats.py: DeepEP's kernels and host code, NVSHMEM's IBGDA transport,
NCCL's socket and IB transports, rdma-core's mlx5 provider, PyTorch's c10 CUDA check and ProcessGroupNCCL
watchdog, TCPStore, gloo, torch elastic, fairseq, DLLogger, verl, mpirun, DeepSpeed's launcher and runner,
cuBLAS, each writer beside the format string it follows), with random values, inside ordinary training output.

The classes (`CLASSES`):

- cascade:    a library reports its own failure (DeepEP's kernel timeouts, its CPU timeout, its device
              assertion, NVSHMEM's IBGDA poll timeout or completion error, NCCL's transport error or
              watchdog timeout), then the generic CUDA error its broken context raises (an illegal memory
              access, an unspecified launch failure) in a traceback or the watchdog's report;
- nonfinite:  NaN/Inf without a keyword: cells of CSV rows, `step value` lines, verl's "grad_norm is not
              finite", fairseq's and DLLogger's loss scale halving to the end, a tensor holding -inf/nan
              where the log stops;
- signal:     a kill other launchers report: mpirun's "exited on signal 9 (Killed)", the shell's `Killed`
              glued to a progress bar, DeepSpeed's launcher "exits with return code = -9";
- nccl_lines: NCCL's own connection lines where the log ends on them: connect retries, the retry count
              exceeded, mlx5's completion error and its CQE dump, NET/IB failures;
- rendezvous: host names that do not resolve (c10d's socket, NCCL's bootstrap), a store wait that times
              out in framework code, gloo's connectFullMesh, torch elastic's rendezvous errors;
- traceback:  DeepSpeed's runner failing its ssh check, cuBLAS's EXECUTION_FAILED (status 13), NCCL's
              duplicate GPU (nccl_transport, environment or usage are all right answers).

Each case carries its truth: the category, and the set of categories that are right answers. It is then
transformed (`TRANSFORMS`), each transform alone and a random chain of them:

- cut:        the log starts mid-message: its first lines dropped and the next one cut in the middle;
- wrap:       hard-wrapped at a terminal width (80 to 160 columns);
- prefix:     every line of the rank under a launcher's prefix: torchrun's `[rankN]:` or `[defaultN]:`,
              srun's `N: `, mpirun's `[1,N]<stderr>:`;
- interleave: another rank's ordinary output interleaved, both under one launcher's prefixes;
- pdsh:       every line under the host that printed it (`node-07: `), as pdsh (DeepSpeed's multi-node runner)
              or clush put it before each line a node's command prints, outside any launcher's prefix;
- cascade:    the generic CUDA error's cascade appended after a library's own error (where the truth is a
              library's: DeepEP, NVSHMEM, NCCL);
- ansi:       terminal colours around lines and words.

Nothing here imports the analysis: `outcome` runs the in-process API, `torchtriage.analysis.pipeline`.
The long run: `python tests/long_tail_logs.py --count 5000 [--seed N] [--out DIR]` prints the seeds whose
verdict is wrong (keep them in long_tail_regressions.txt) and the tally per class.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from long_tail_formats import (
    AGENT,
    CLASSES,
    RANK,
    WRITERS,
    Line,
    Steps,
    Values,
    generic_cascade,
    preamble,
)

TRANSFORMS = ("cut", "wrap", "prefix", "interleave", "pdsh", "cascade", "ansi")


@dataclass(frozen=True)
class Job:
    """How a case's job ran, so that another rank's output (`interleave`) looks like its own."""

    phase: str
    style: str


@dataclass(frozen=True)
class Case:
    seed: int
    family: str
    shape: str
    truth: str
    accept: frozenset[str]
    lines: tuple[Line, ...]
    rank: int
    world: int
    failure_at: int  # the index of the failure's first line: a cut never reaches it
    own_error: bool  # a library reported its own error: the generic CUDA cascade may follow it
    job: Job
    process: tuple  # (host, pid, tid, site, the clock at the last line): what a cascade appended continues
    peers: frozenset[int] = frozenset()  # job ranks the failure names as peers (Failure.peers)
    node_peers: frozenset[int] = frozenset()  # ranks within the printer's node it names as peers

    def ranks_named_rightly(self) -> tuple[set[int], set[int]]:
        """(job ranks, local ranks) a verdict may name: the printer, and the peers its failure's lines name, each
        as the job's rank where the printer's is known, as a rank within its node where not (a `[defaultN]:`
        prefix, an NVLink peer's number)."""
        node = self.rank - self.rank % 8
        ranks = {self.rank, *self.peers, *(node + local for local in self.node_peers)}
        return ranks, {rank % 8 for rank in ranks}


# --- A case -------------------------------------------------------------------------------------------------


def make(seed: int) -> Case:
    """The case of `seed`: its class (seeds cycle through them), its log and its truth."""
    rng = random.Random(seed)
    family = CLASSES[seed % len(CLASSES)]
    writer = rng.choice(WRITERS[family])
    v = Values(rng)
    job = Job(rng.choice(writer.phases), rng.choice(writer.styles))
    head = preamble(v, Steps(v, job.style), job.phase)
    failure = writer.write(v)
    accept = failure.accept or frozenset({failure.truth})
    lines = tuple(head + failure.lines)
    process = (v.host, v.pid, v.tid, v.site, v.clock)
    return Case(
        seed,
        family,
        failure.shape,
        failure.truth,
        accept,
        lines,
        v.rank,
        v.world,
        len(head),
        failure.own_error,
        job,
        process,
        failure.peers,
        failure.node_peers,
    )


# --- Transforms ---------------------------------------------------------------------------------------------

PREFIXES = ("torchrun", "torchrun-default", "srun", "mpirun")


def prefix_of(style: str, rank: int, world: int) -> str:
    if style == "torchrun":
        return f"[rank{rank}]:"
    if style == "torchrun-default":
        return f"[default{rank % 8}]:"  # torchrun --tee: the role's LOCAL rank (tail_log.py)
    if style == "srun":
        return f"{rank:>{len(str(world - 1))}}: "  # srun --label pads the task id to the widest one
    return f"[1,{rank}]<stderr>:"


def prefixed(lines: list[Line], style: str, rank: int, world: int) -> list[Line]:
    """Each line its launcher prefixes: torchrun's and mpirun's the rank's own lines; srun's the agent's too."""
    covered = (RANK, AGENT) if style == "srun" else (RANK,)
    prefix = prefix_of(style, rank, world)
    return [Line(prefix + line.text, line.owner) if line.owner in covered else line for line in lines]


def pdsh(lines: list[Line], host: str) -> list[Line]:
    """pdsh's `-S`-less output: "<host>: " before every line the node's command printed, the launcher's own
    lines and the other ranks' of that node alike (they share the node's stdout)."""
    return [Line(f"{host}: {line.text}", line.owner) for line in lines]


def cut(lines: list[Line], rng: random.Random, failure_at: int) -> list[Line]:
    """The log starts mid-message: lines dropped, the next one cut in the middle (never into the failure)."""
    room = max(failure_at - 1, 0)
    if room == 0:
        return lines
    first = rng.randrange(room)
    text = lines[first].text
    at = rng.randrange(1, max(len(text), 2))
    return [Line(text[at:], lines[first].owner)] + lines[first + 1 :]


def wrap(lines: list[Line], width: int) -> list[Line]:
    """A terminal's or a browser's hard wrap: every line cut into pieces of `width` columns."""
    out = []
    for line in lines:
        pieces = [line.text[i : i + width] for i in range(0, len(line.text), width)] or [""]
        out += [Line(piece, line.owner) for piece in pieces]
    return out


WIDTHS = (80, 100, 120, 132, 160)
_SHOWN = 4  # lines cut at the width: fewer cannot be told from an ordinary log's lines of one length


def shown_width(lines: list[Line], rng: random.Random) -> int:
    """A terminal's width at which the wrap shows in the log (enough lines cut at it, one more for a cut that
    shortens the first): a log with fewer long lines is wrapped at the narrowest, and may not show it."""
    shown = [width for width in WIDTHS if sum(len(line.text) > width for line in lines) >= _SHOWN]
    return rng.choice(shown or WIDTHS[:1])


def ansi(lines: list[Line], rng: random.Random) -> list[Line]:
    """Colours a terminal capture keeps: whole lines, or a level word (WARN, ERROR) alone."""
    out = []
    for line in lines:
        roll = rng.random()
        if roll < 0.3 and line.text:
            out.append(Line(f"\x1b[1;31m{line.text}\x1b[0m", line.owner))
        elif roll < 0.5:
            text = line.text
            for word in ("WARN", "ERROR", "INFO", "Error"):
                text = text.replace(word, f"\x1b[33m{word}\x1b[0m", 1)
            out.append(Line(text, line.owner))
        else:
            out.append(line)
    return out


def interleave(case: Case, lines: list[Line], rng: random.Random, style: str, same_node: bool) -> list[Line]:
    """Another rank's ordinary output among the lines (both ranks under the launcher's prefixes), never after the
    last line: the other rank's step lines, its NCCL start-up, its warnings, its agent's lines (unprefixed under
    torchrun), flushed at random points. `same_node`: a rank of the case's node (one agent's output under torchrun's
    local prefixes, one host's under pdsh's), where two nodes' lines in one file would tell them apart by nothing."""
    if same_node:
        other = case.rank - case.rank % 8 + (case.rank % 8 + rng.randint(1, 7)) % 8
    else:
        other = (case.rank + rng.randint(1, case.world - 1)) % case.world
    v = Values(random.Random(rng.random()))
    v.rank, v.world, v.local_rank = other, case.world, other % 8
    v.clock = case.process[4] - timedelta(seconds=rng.uniform(30, 600))  # the same job: the other rank ran alongside
    steps = Steps(v, case.job.style)
    theirs = preamble(v, steps, case.job.phase)
    if case.job.phase == "training":
        theirs += steps.lines(rng.randint(2, 10))
    theirs = prefixed(theirs, style, other, case.world)
    ours = list(lines)
    out = ours[:1]
    for line in ours[1:]:
        while theirs and rng.random() < 0.3:
            out.append(theirs.pop(0))
        out.append(line)
    return out


def apply(case: Case, names: tuple[str, ...], rng: random.Random) -> str:
    """The case's log with `names` applied in a fixed order: content first (the cascade, the program's colours),
    then the launcher's prefixes and another rank's lines, then how the file was captured (a hard wrap: a pasted
    log keeps no colours), then the cut."""
    lines = list(case.lines)
    if "cascade" in names:
        lines = lines + generic_cascade(_cascade_values(case, rng))
    if "ansi" in names and "wrap" not in names:
        lines = ansi(lines, rng)  # the program's colours: the launcher's prefix goes before them
    style = rng.choice(PREFIXES)
    if "prefix" in names or "interleave" in names:
        lines = prefixed(lines, style, case.rank, case.world)
    if "interleave" in names:
        lines = interleave(case, lines, rng, style, same_node=style == "torchrun-default" or "pdsh" in names)
    if "pdsh" in names:
        lines = pdsh(lines, case.process[0])
    if "wrap" in names:
        lines = wrap(lines, shown_width(lines, rng))
    if "cut" in names:
        lines = cut(lines, rng, case.failure_at)
    return "\n".join(line.text for line in lines) + "\n"


def _cascade_values(case: Case, rng: random.Random) -> Values:
    """The values of the case's own process, its clock where the log ends: the cascade comes after."""
    v = Values(random.Random(rng.random()))
    v.rank, v.world, v.local_rank = case.rank, case.world, case.rank % 8
    v.host, v.pid, v.tid, v.site, v.clock = case.process
    return v


def applicable(case: Case) -> tuple[str, ...]:
    """The transforms that keep what the log shows: the cascade only after a library's own error, a hard wrap
    only where enough lines reach a terminal's width for the wrap to show (a log whose one long line was cut in
    two cannot be told from a log of two lines)."""
    names = [name for name in TRANSFORMS if name != "cascade" or case.own_error]
    if sum(len(line.text) > WIDTHS[0] for line in case.lines) < _SHOWN:
        names.remove("wrap")
    return tuple(names)


def variants(case: Case) -> dict[str, str]:
    """The base log, each applicable transform alone, and one chain of them, by name. pdsh's prefix is drawn from a
    random stream of its own, so that a seed's other variants are those it had before that transform existed (the
    seeds kept in long_tail_regressions.txt name them)."""
    rng = random.Random(case.seed * 7919 + 1)
    out = {"base": apply(case, (), rng)}
    names = tuple(name for name in applicable(case) if name != "pdsh")
    for name in names:
        out[name] = apply(case, (name,), rng)
    chain = tuple(sorted(rng.sample(names, rng.randint(2, min(4, len(names))))))
    if "wrap" in chain and "ansi" in chain:  # a pasted log loses its colours; a captured one is not wrapped
        chain = tuple(name for name in chain if name != "ansi")
    own = random.Random(case.seed * 7919 + 2)
    out["pdsh"] = apply(case, ("pdsh",), own)
    if own.random() < 0.5:
        chain = tuple(sorted((*chain, "pdsh")))
    out["+".join(chain)] = apply(case, chain, rng)
    return out


# --- Verdicts -----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    case: Case
    # variant -> (category, confidence, summary)
    verdicts: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    # variant -> the hosts the verdict names: its culprits' machines, and the host that printed the failure's line
    hosts: dict[str, set[str]] = field(default_factory=dict)
    # variant -> (the job ranks the verdict names, the local ranks it names where no job rank is known)
    ranks: dict[str, tuple[set[int], set[int]]] = field(default_factory=dict)

    def right(self, variant: str) -> bool:
        return self.verdicts[variant][0] in self.case.accept

    def wrong(self) -> list[str]:
        return [name for name in self.verdicts if not self.right(name)]

    def wrong_at_high(self) -> list[str]:
        return [
            name for name, (_, confidence, _) in self.verdicts.items() if confidence == "high" and not self.right(name)
        ]

    def names_another_rank(self, variant: str) -> bool:
        """Whether the verdict names a rank the failure is not on, nor a peer of it (Case.ranks_named_rightly)."""
        ranks, local = self.ranks[variant]
        right, right_local = self.case.ranks_named_rightly()
        return not (ranks <= right and local <= right_local)

    def turned_wrong(self) -> list[str]:
        """The transforms that turned a right verdict of the base log wrong."""
        if not self.right("base"):
            return []
        return [name for name in self.verdicts if name != "base" and not self.right(name)]

    def describe(self, variant: str) -> str:
        category, confidence, summary = self.verdicts[variant]
        return (
            f"{self.case.seed}  # {self.case.family} / {self.case.shape} [{variant}]: want {sorted(self.case.accept)}, "
            f"got {category} ({confidence}): {summary[:140]}"
        )


def outcome(case: Case) -> Outcome:
    from torchtriage.analysis.pipeline import triage_text

    result = Outcome(case)
    for name, text in variants(case).items():
        verdict = triage_text(text)
        result.verdicts[name] = (str(verdict.category), str(verdict.confidence), verdict.summary)
        failing = verdict.facts.get("failing_host") or {}
        named = {m.host for m in verdict.culprit_machines if m.host} | {failing.get("host")}
        result.hosts[name] = named - {None}
        result.ranks[name] = (set(verdict.culprit_ranks), set(verdict.facts.get("local_ranks") or ()))
    return result


def regression_seeds(path: Path) -> list[int]:
    return [int(line.split("#")[0]) for line in path.read_text().splitlines() if line.split("#")[0].strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--out", type=Path, help="write each case's variants there")
    args = parser.parse_args()
    tally: dict[str, Counter] = {family: Counter() for family in CLASSES}
    failed = 0
    for seed in range(args.seed, args.seed + args.count):
        case = make(seed)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            for name, text in variants(case).items():
                (args.out / f"{seed}_{case.family}_{name}.log").write_text(text, encoding="utf-8")
        result = outcome(case)
        counts = tally[case.family]
        counts["cases"] += 1
        counts["base right"] += result.right("base")
        counts["variants"] += len(result.verdicts) - 1
        counts["variants right"] += sum(result.right(n) for n in result.verdicts if n != "base")
        counts["wrong at high"] += len(result.wrong_at_high())
        counts["turned wrong"] += len(result.turned_wrong())
        another = [name for name in result.verdicts if result.names_another_rank(name)]
        counts["another rank"] += len(another)
        wrong = result.wrong()
        if wrong or another:
            failed += 1
            variant = (wrong or another)[0]
            ranks = f" naming {sorted(result.ranks[variant][0])} local {sorted(result.ranks[variant][1])}"
            print(result.describe(variant) + (ranks + f" (printer {case.rank})" if another else ""), flush=True)
    print(f"\n{args.count - failed} of {args.count} cases right in every variant (category, and no other rank named)")
    print(
        f"{'class':>11} {'cases':>6} {'base right':>10} {'variants right':>15} {'turned wrong':>12} {'wrong@high':>10} "
        f"{'another rank':>12}"
    )
    for family, c in tally.items():
        print(
            f"{family:>11} {c['cases']:6d} {c['base right']:10d} {c['variants right']:>8d}/{c['variants']:<6d} "
            f"{c['turned wrong']:12d} {c['wrong at high']:10d} {c['another rank']:12d}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
