"""One seeded case: a program, its departure, the hang it leads to, its artifacts, its truth; and the score
of a verdict against that truth.

    case = make(seed)              # None when the departure did not hang the job (nothing to diagnose)
    case.write(folder)             # the files a real job would have left
    score(case, verdict_json)      # right / candidates / imprecise / wrong / miss, and the culprit's line

Scores:
- `right`: the verdict names the culprit alone;
- `candidates`: it names no culprit but candidates that hold it (what an undecidable case should get), or says
  that a rank above the highest that left a dump may hold the others (`candidates_above`), where the culprit is one;
- `imprecise`: it names the culprit among other ranks, as culprits;
- `wrong`: it names culprits, none of them the culprit (a healthy rank blamed);
- `miss`: it names neither the culprit nor candidates holding it.
"""

from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from . import artifacts
from .artifacts import Layout, draw_layout
from .departures import Departure, draw, schedule
from .engine import Engine, Outcome
from .program import Program, generate, with_broadcasts
from .truth import Truth, find

BACKENDS = ("gloo", "nccl")
LAYOUT_NAMES = tuple(artifacts.LAYOUTS)


@dataclass
class Case:
    seed: int
    backend: str
    program: Program
    departure: Departure
    outcome: Outcome
    layout: Layout
    truth: Truth

    def write(self, folder: Path) -> None:
        artifacts.write(folder, self.program, self.outcome, self.backend, self.layout, random.Random(self.seed))

    @property
    def family(self) -> str:
        return self.departure.kind + (f":{self.departure.detail}" if self.departure.kind == "stuck" else "")

    def describe(self) -> str:
        d, t = self.departure, self.truth
        dims = "x".join(f"{n}{k}" for k, n in self.program.mesh.dims)
        return (
            f"seed {self.seed}: {self.backend} {dims} {self.layout.name}; rank {d.rank} {self.family} at step "
            f"{d.step} op {d.at}; lines {[line for _, line in t.sites]}; visible by {t.visible_by or 'nothing'}; "
            f"candidates {t.candidates}"
        )


def run(program: Program, departure: Departure | None, backend: str) -> Outcome:
    engine = Engine(backend, schedule(program, departure), program.eager_init, program.mismatch_completes)
    return engine.run()


def make(seed: int, backend: str | None = None, layout: str | None = None, kinds: tuple[str, ...] = ()) -> Case | None:
    """The seed's case; with `kinds`, one whose departure is of those kinds (drawn on request: `ON_REQUEST`), None
    where the program offers none."""
    rng = random.Random(seed)
    backend = backend or rng.choice(BACKENDS)
    program = generate(rng, backend)
    if "wrong_root" in kinds:
        program = with_broadcasts(program, rng)
    departure = draw(rng, program, backend, kinds)
    if departure is None:
        return None
    outcome = run(program, departure, backend)
    if outcome.finished or outcome.errored:
        return None  # nothing hangs: the job finished, or gloo refused mismatched sizes and the ranks failed
    chosen = draw_layout(rng, backend, layout or rng.choice(LAYOUT_NAMES))
    truth = find(program, departure, outcome, backend, chosen)
    return Case(seed, backend, program, departure, outcome, chosen, truth)


def with_lost_dump(case: Case, lost_at: float | None = None) -> Case:
    """The case with one living rank's flight-recorder dump lost (a dump that timed out, a node's folder never
    gathered), where its layout writes dumps: the rank at `lost_at` of those that dump, else drawn from its
    seed, whatever TORCHTRIAGE_SIM_LOST_DUMPS says."""
    if not case.layout.dumps:
        return case
    if lost_at is None:
        lost_at = random.Random(f"lost-{case.seed}").random()
    return replace(case, layout=replace(case.layout, lost_at=lost_at))


def diagnose(case: Case) -> dict:
    """The verdict `diagnose` gives on the case's artifacts, as its JSON."""
    from torchtriage.analysis.postmortem import analyse_run, gather

    with tempfile.TemporaryDirectory() as folder:
        case.write(Path(folder))
        return analyse_run(gather([folder])).verdict.to_json()


def scored(seed: int, kinds: tuple[str, ...] = ()) -> tuple[Case, Score] | None:
    """The seed's case (of `kinds`, when given) and the score of its verdict; None where nothing hangs."""
    case = make(seed, kinds=kinds)
    return None if case is None else _scored(case)


def scored_with_lost_dump(seed: int) -> tuple[Case, Score] | None:
    """As `scored`, with one living rank's dump lost where the case has dumps."""
    case = make(seed)
    return None if case is None else _scored(with_lost_dump(case))


def _scored(case: Case) -> tuple[Case, Score]:
    return case, score(case, diagnose(case))


@dataclass
class Score:
    outcome: str  # right | candidates | imprecise | wrong | miss
    confidence: str
    line: bool | None  # the verdict's line for the culprit is its departure point (None: no line to check)
    named: list[int]
    candidates: list[int]


def score(case: Case, verdict: dict) -> Score:
    culprit = case.truth.culprit
    named = list(verdict.get("culprit_ranks") or [])
    facts = verdict.get("facts") or {}
    candidates = list(facts.get("candidates") or [])
    if named == [culprit]:
        outcome = "right"
    elif named and culprit in named:
        outcome = "imprecise"
    elif named:
        outcome = "wrong"
    elif culprit in candidates or culprit > facts.get("candidates_above", culprit):
        outcome = "candidates"  # named among candidates, or a rank above the highest that left a dump
    else:
        outcome = "miss"
    return Score(outcome, str(verdict.get("confidence")), _line(case.truth, facts, named), named, candidates)


def _line(truth: Truth, facts: dict, named: list[int]) -> bool | None:
    if not truth.sites or named != [truth.culprit]:
        return None
    frame = facts.get("user_frame") or {}
    if not frame:
        return False
    return any(
        frame.get("line") == line and str(frame.get("file", "")).endswith(file.rsplit("/", 1)[-1])
        for file, line in truth.sites
    )
