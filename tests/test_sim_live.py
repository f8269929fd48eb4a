"""The simulator's hangs run for real: seeded programs of tests/sim played by torchrun + gloo, diagnosed live.

Each seed's program, departure and per-rank actions are the simulator's (`sim.case.make(seed, backend="gloo")`),
executed with real calls by tests/jobs/sim_program.py; tests/sim_live.py runs each one bare (`diagnose --pid`
on the hung job) and armed (`torchtriage run`'s watchdog verdict) and scores the verdict against the
simulator's truth, as tests/test_sim_hangs.py scores the simulated artifacts. The same properties must hold
on real runs: no high-confidence verdict names anyone but the culprit, a rank named is the culprit, a
culprit that a stack shows outside any collective is named. A rank that exits or is killed does not hang a
gloo job under torchrun (its peers' connections close, torchrun stops the rest): such cases are reported as
ended and read post mortem, where no survivor may be blamed.

TORCHTRIAGE_SIM_LIVE_CASES seeds (default 16: the first that hang in the simulation on 2 to 4 ranks), two jobs
at a time (TORCHTRIAGE_SIM_LIVE_JOBS): about 15 s a seed on 2 cores. The folders of the cases not right are kept
under TORCHTRIAGE_SIM_LIVE_OUT (/tmp/sim_live/test), each beside the simulated artifacts of the same case
(`sim/`); the table of every case is `table.txt` there, with the commit and the digests of the uncommitted
changes to src/ and tests/sim/ it ran with.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from hung_job import TORCHRUN
from sim.case import make
from sim_live import MODES, Row, leftovers, options, provenance, report, run_all, sample

pytestmark = pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed")
slow = pytest.mark.slow

CASES = int(os.environ.get("TORCHTRIAGE_SIM_LIVE_CASES", "16"))
JOBS = int(os.environ.get("TORCHTRIAGE_SIM_LIVE_JOBS", "2"))
OUT = Path(os.environ.get("TORCHTRIAGE_SIM_LIVE_OUT", "/tmp/sim_live/test"))
DROPPED = ("right", "candidates", "ended")  # outcomes whose folders are removed (the others are kept)


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    code = provenance()
    found = run_all(sample(CASES, max_ranks=4), OUT, options(), MODES, jobs=JOBS)
    report(found, OUT, code)
    for row in found:
        if row.outcome in DROPPED:
            shutil.rmtree(row.folder, ignore_errors=True)
    for seed in OUT.glob("seed*"):
        if not any(seed.iterdir()):
            seed.rmdir()
    return found


def _listed(rows: list[Row]) -> str:
    return "\n".join(
        f"seed {r.seed} {r.mode} ({r.dims}, rank {r.culprit} {r.family}, visible by {r.visible_by or 'nothing'}): "
        f"{r.outcome} {r.confidence} named {r.named} candidates {r.candidates} [sim: {r.sim_outcome} "
        f"{r.sim_confidence} {r.sim_named}] {r.summary or r.note}"
        for r in rows[:12]
    )


def test_the_job_runs_the_simulators_program():
    from sim_program import build  # tests/jobs: imports torch

    for seed in sample(6, max_ranks=8):
        case = make(seed, backend="gloo")
        assert build(seed) == (case.program, case.departure), seed


def test_every_name_the_site_functions_load_is_defined(tmp_path):
    """The site functions are written from a template at run time: a name it lacks fails only when a rank
    reaches that branch (a departure), as the job's traceback, not as the hang it should be."""
    import builtins
    import dis

    from sim_program import load_sites, write_sites

    module = load_sites(write_sites(0, ["attention", "wait_for_data", "end_of_training"], tmp_path))
    known = set(vars(module)) | set(dir(builtins))
    for function in [*module.SITES.values(), module._compute]:
        loaded = {i.argval for i in dis.get_instructions(function) if i.opname == "LOAD_GLOBAL"}
        assert loaded <= known, (function.__name__, sorted(loaded - known))


@slow
def test_no_process_outlives_its_job(rows):
    assert not [r for r in rows if "LEFT BEHIND" in r.note], _listed([r for r in rows if "LEFT BEHIND" in r.note])
    assert not leftovers()


@slow
def test_every_case_hangs_or_ends_because_a_rank_is_gone(rows):
    """A job hangs as the simulator says, except where its culprit's process ends: gloo's peers then fail on the
    closed connection and torchrun stops the job (the simulator keeps them waiting)."""
    odd = [r for r in rows if not (r.hung or (r.state == "ended" and r.family in ("exit", "die")))]
    assert not odd, _listed(odd)
    assert any(r.hung for r in rows)


@slow
def test_no_verdict_at_high_confidence_names_anyone_but_the_culprit(rows):
    bad = [r for r in rows if r.hung and r.confidence == "high" and r.outcome != "right"]
    assert not bad, _listed(bad)


@slow
def test_a_rank_named_is_the_culprit(rows):
    wrong = [r for r in rows if r.hung and r.named and r.outcome == "wrong"]
    assert not wrong, _listed(wrong)


@slow
def test_where_a_stack_shows_the_culprit_outside_any_collective_it_is_named(rows):
    shown = [r for r in rows if r.hung and r.visible_by == "stack"]
    missed = [r for r in shown if r.outcome != "right"]
    assert not missed, _listed(missed)


@slow
def test_the_culprits_site_is_its_own_departure_point(rows):
    """By function: the real job's lines are not the simulator's (tests/jobs/sim_program.py)."""
    sites = [r for r in rows if r.site is not None]
    wrong = [r for r in sites if not r.site]
    assert len(wrong) <= 0.2 * len(sites), _listed(wrong)


@slow
def test_a_job_that_ended_is_read_post_mortem_without_blaming_a_survivor(rows):
    """A rank that exits or dies ends a gloo job: its peers fail on the closed connection wherever they were.
    Their places are not a departure; the rank that left is named, or nobody."""
    ended = [(r, r.postmortem.split()) for r in rows if r.state == "ended" and r.postmortem]
    bad = [
        r
        for r, (outcome, confidence, *_) in ended
        if outcome == "wrong" or (confidence == "high" and outcome != "right")
    ]
    assert not bad, _listed(bad)


@slow
def test_report_the_confusion(rows, capsys):
    with capsys.disabled():
        print(f"\n{(OUT / 'table.txt').read_text()}")
