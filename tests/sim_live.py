"""Simulated hangs run for real: the programs of tests/sim played by torchrun + gloo (tests/jobs/sim_program.py),
diagnosed live as a user would, and scored against the simulator's truth.

    python tests/sim_live.py [--out /tmp/sim_live] [--modes bare,armed] [--stall-seconds 5] SEED ...
    python tests/sim_live.py --sample 40 [--max-ranks 4]      # the first 40 seeds that hang on gloo

For each seed and mode:

    bare    `torchrun --standalone --nproc_per_node N tests/jobs/sim_program.py` with SEED set; once every rank
            printed its READY line and the ranks had --settle seconds to block, `torchtriage diagnose --pid
            <torchrun agent> --json --out <seed>/bare/capture` (py-spy's stacks of every rank).
    armed   `torchtriage run --out <seed>/armed/run --stall-seconds S -- torchrun ...`: the verdict the watchdog
            writes into run/hang/verdict.json (every rank's stack and flight-recorder dump beside it).

The verdict is scored by `sim.case.score` against the truth of `sim.case.make(seed, backend="gloo",
layout=mode)` (right: the culprit alone; candidates: no culprit, candidates holding it; imprecise; wrong: a
healthy rank blamed; miss). `site` says whether the verdict's user frame is one of the truth's departure
points, by function (the real job's lines are not the simulator's). The simulated artifacts of the same case
are written beside the real ones (`<seed>/<mode>/sim`) and diagnosed too (`sim_outcome`): where the two
verdicts differ, the real run shows what the simulator does not.

A job that ends instead of hanging (a rank that exits or is killed makes torchrun stop the others, or a
peer's gloo op fails when its connection closes) has no hang to diagnose: it is reported as `ended`, with
the launcher's exit status and the ranks' errors, and diagnosed post mortem from its console log (and the run
folder, armed), scored apart (`postmortem`): the survivors fail wherever they were, and only the rank that
left may be named.

Everything a job started is killed when its mode ends (the launcher's session, each rank's process group and
every process found below the launcher), and `leftovers()` says whether any process of the job survived.
Every mode's folder is kept under --out; `results.json` and `table.txt` at the top.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "jobs"))

from hung_job import TORCHRUN, clean_environment  # noqa: E402
from live_job import Job, torchtriage  # noqa: E402
from live_job import leftovers as _leftovers  # noqa: E402
from live_job import provenance as live_provenance  # noqa: E402
from sim.case import Case, make, score  # noqa: E402
from sim.frames import waiting_frames  # noqa: E402

JOB = TESTS / "jobs" / "sim_program.py"
JOB_MARK = "sim_program.py"  # in the command line of every process of a job (a forked worker's too)


def leftovers() -> list[str]:
    """Processes of a sim job still running (any seed): none may outlive its mode."""
    return _leftovers(JOB_MARK)


MODES = ("bare", "armed")


# --- which seeds ---------------------------------------------------------------------------------------


def runnable(seed: int, max_ranks: int = 4, layout: str = "bare") -> Case | None:
    """The simulated case of this seed on gloo, when it hangs in the simulation and fits on `max_ranks`."""
    from sim_program import unsupported  # tests/jobs: imports torch

    case = make(seed, backend="gloo", layout=layout)
    if case is None or case.program.mesh.size > max_ranks or unsupported(case.program, case.departure):
        return None
    return case


def sample(count: int, max_ranks: int = 4, start: int = 0, families: tuple[str, ...] = ()) -> list[int]:
    seeds, seed = [], start
    while len(seeds) < count and seed < start + 100_000:
        case = runnable(seed, max_ranks)
        if case is not None and (not families or case.departure.kind in families):
            seeds.append(seed)
        seed += 1
    return seeds


def _json(text: str) -> dict | None:
    try:
        found = json.loads(text)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


# --- one seed, one mode --------------------------------------------------------------------------------


@dataclass
class Row:
    seed: int
    mode: str
    world: int
    dims: str
    family: str
    culprit: int
    step: int
    visible_by: str
    truth_candidates: list[int]
    state: str = ""  # hung | ended | not ready | no verdict
    outcome: str = ""  # sim.case.score's, or the state where there is no verdict to score
    confidence: str = ""
    named: list[int] = field(default_factory=list)
    candidates: list[int] = field(default_factory=list)
    site: bool | None = None  # the verdict's user frame is a departure point of the truth (by function)
    user_frame: str = ""
    summary: str = ""
    sim_outcome: str = ""  # the same case's simulated artifacts, diagnosed
    sim_confidence: str = ""
    sim_named: list[int] = field(default_factory=list)
    postmortem: str = ""  # a job that ended: its console log (and run folder) diagnosed, scored as a hang would be
    note: str = ""
    seconds: float = 0.0
    folder: str = ""

    @property
    def hung(self) -> bool:
        return self.state == "hung"


def truth_functions(case: Case) -> set[str]:
    """The functions of the truth's departure points: the simulator's lines mapped to the sites they are in."""
    program, d = case.program, case.departure
    sites = [s.site for s in program.template] + [b.site for s in program.template for b in s.batch]
    sites += [program.end_site] + ([d.new_site] if d.new_site else [])
    at_line: dict[int, str] = {}
    for site in sites:
        at_line[site.line] = site.function
        for function, line in site.callers:
            at_line.setdefault(line, function)
    if d.kind == "stuck" and d.new_site:
        for function, _, line in waiting_frames(d.detail, d.new_site)[0]:
            at_line.setdefault(line, function)
    return {at_line[line] for _, line in case.truth.sites if line in at_line}


def frame_text(frame: dict) -> str:
    if not frame:
        return ""
    rank = f" r{frame['rank']}" if frame.get("rank") is not None else ""
    return f"{Path(str(frame.get('file', '?'))).name}:{frame.get('line')} {frame.get('function', '')}{rank}"


def scored(row: Row, case: Case, verdict: dict) -> None:
    s = score(case, verdict)
    row.outcome, row.confidence, row.named, row.candidates = s.outcome, s.confidence, s.named, s.candidates
    facts = verdict.get("facts") or {}
    frame = facts.get("user_frame") or {}
    row.user_frame = frame_text(frame)
    row.summary = str(verdict.get("summary", ""))[:600]
    if case.truth.sites and s.named == [case.truth.culprit]:
        row.site = frame.get("function") in truth_functions(case)


def simulated(row: Row, case: Case, folder: Path) -> None:
    """The same case's simulated artifacts beside the real ones, and their verdict."""
    from torchtriage.analysis.postmortem import analyse_run, gather

    where = folder / "sim"
    shutil.rmtree(where, ignore_errors=True)
    case.write(where)
    verdict = analyse_run(gather([str(where)])).verdict.to_json()
    (folder / "sim.verdict.json").write_text(json.dumps(verdict, indent=2))
    s = score(case, verdict)
    row.sim_outcome, row.sim_confidence, row.sim_named = s.outcome, s.confidence, s.named


def _new_row(case: Case, mode: str) -> Row:
    d, t = case.departure, case.truth
    dims = "x".join(f"{n}{k}" for k, n in case.program.mesh.dims)
    return Row(case.seed, mode, case.program.mesh.size, dims, case.family, d.rank, d.step, t.visible_by,
               list(t.candidates))  # fmt: skip


def _ended(job: Job, row: Row, grace: float) -> bool:
    """Whether the job is ending rather than hanging: a rank is gone and the launcher exits within `grace`."""
    if all(job.ranks_alive().values()) and job.proc.poll() is None:
        return False
    try:
        job.proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        row.note = f"ranks gone, the job hangs on: {[r for r, up in job.ranks_alive().items() if not up]}"
        return False
    time.sleep(0.5)  # the last of its output
    row.state = row.outcome = "ended"
    errors = sorted({line.strip()[:160] for line in job.lines if "Error" in line and "[rank" in line})
    row.note = f"launcher exit {job.proc.returncode}; ranks alive {job.ranks_alive()}; " + " | ".join(errors[:4])
    return True


def run_mode(case: Case, mode: str, out: Path, opts: argparse.Namespace) -> Row:
    row = _new_row(case, mode)
    folder = out / f"seed{case.seed}" / mode
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    row.folder = str(folder)
    env = clean_environment(SEED=str(case.seed), SIM_JOB_DIR=str(folder / "job"))
    launcher = [str(TORCHRUN), "--standalone", "--nproc_per_node", str(case.program.mesh.size), str(JOB)]
    run_dir = folder / "run"
    if mode == "armed":
        armed = [sys.executable, "-m", "torchtriage", "run", "--out", str(run_dir), "--stall-seconds"]
        launcher = [*armed, str(opts.stall_seconds), "--", *launcher]
    t0 = time.monotonic()
    job = Job(launcher, env, case.program.mesh.size, folder / "console.log")
    verdict = None
    try:
        if not job.wait_ready(opts.ready_timeout):
            row.state = row.outcome = "not ready"
            row.note = "".join(job.lines[-6:])[-600:]
        elif mode == "bare":
            time.sleep(opts.settle)
            if not _ended(job, row, opts.grace):
                row.state = "hung"
                code, stdout, stderr = torchtriage("diagnose", "--pid", str(job.agent or job.proc.pid), "--json",
                                                   "--out", str(folder / "capture"))  # fmt: skip
                (folder / "diagnose.stderr.txt").write_text(stderr)
                verdict = _json(stdout)
                if verdict is None:
                    row.note += f" diagnose exit {code}: {(stdout or stderr)[-300:]}"
        else:
            verdict_file = run_dir / "hang" / "verdict.json"
            if verdict_file.exists():  # a stall before the departing step (a slow start): not this hang's verdict
                row.note += " a verdict was written before every rank was READY (moved to early.verdict.json)"
                verdict_file.rename(folder / "early.verdict.json")
            deadline = time.monotonic() + opts.verdict_timeout
            while time.monotonic() < deadline and not verdict_file.exists() and job.proc.poll() is None:
                time.sleep(0.3)
            if verdict_file.exists():
                time.sleep(0.5)  # the reporter writes the JSON whole, then the text
                verdict = _json(verdict_file.read_text())
                row.state = "hung"
                _ended(job, row, 0)  # a verdict, and the job went on to end (noted, still scored)
                row.state = "hung"
            elif not _ended(job, row, opts.grace):
                row.state = row.outcome = "no verdict"
        job.remember()
    finally:
        left = job.kill()
        if left:
            row.note += f" LEFT BEHIND: pids {left}"
    row.seconds = round(time.monotonic() - t0, 1)
    if verdict is not None:
        (folder / "verdict.json").write_text(json.dumps(verdict, indent=2))
        scored(row, case, verdict)
    elif row.state == "ended" and opts.postmortem:
        paths = [str(folder / "console.log")] + ([str(run_dir)] if run_dir.exists() else [])
        code, stdout, _ = torchtriage("diagnose", "--json", *paths)
        found = _json(stdout)
        if found is not None:
            (folder / "postmortem.verdict.json").write_text(json.dumps(found, indent=2))
            s = score(case, found)
            row.postmortem = f"{s.outcome} {s.confidence} {s.named or ''}".strip()
            row.note += f" || post mortem: {str(found.get('summary', ''))[:300]}"
    try:
        simulated(row, case, folder)
    except Exception as err:  # noqa: BLE001 - the comparison is a note, never the result
        row.sim_outcome = f"error: {type(err).__name__}: {err}"
    return row


def run_all(seeds: list[int], out: Path, opts: argparse.Namespace, modes=MODES, jobs: int = 1, echo=None) -> list[Row]:
    """Every seed in every mode, `jobs` modes at a time; rows in the order of the seeds."""
    tasks = [(seed, mode) for seed in seeds for mode in modes]

    def one(task: tuple[int, str]) -> Row:
        seed, mode = task
        row = run_mode(make(seed, backend="gloo", layout=mode), mode, out, opts)
        if echo is not None:
            echo(row)
        return row

    if jobs <= 1:
        return [one(task) for task in tasks]
    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, tasks))


def line(row: Row) -> str:
    return (
        f"seed {row.seed:<4} {row.mode:<5} {row.dims:<10} {row.family:<18} culprit {row.culprit}: {row.state:<6} "
        f"{row.outcome:<10} {row.confidence:<6} named {row.named} cands {row.candidates} site {row.site} | sim "
        f"{row.sim_outcome} {row.sim_confidence} {row.sim_named} | post mortem {row.postmortem or '-'} "
        f"({row.seconds} s) "
        f"{row.note[:200]}"
    )


def options(**overrides) -> argparse.Namespace:
    defaults = dict(stall_seconds=5.0, settle=2.0, grace=8.0, ready_timeout=120.0, verdict_timeout=90.0,
                    postmortem=True)  # fmt: skip
    return argparse.Namespace(**(defaults | overrides))


def provenance() -> dict:
    """The commit and the uncommitted changes of the analysis (src/) and the simulator (tests/sim/)."""
    return live_provenance({"src": "src", "sim": "tests/sim"})


# --- the table -----------------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    head = ("seed", "mode", "mesh", "family", "culprit", "visible", "state", "outcome", "conf", "named", "cands",
            "site", "sim", "post mortem", "user_frame")  # fmt: skip
    body = []
    for r in rows:
        sim = f"{r.sim_outcome} {r.sim_confidence} {r.sim_named or ''}".strip()
        site = "-" if r.site is None else ("yes" if r.site else "no")
        body.append((str(r.seed), r.mode, r.dims, r.family, str(r.culprit), r.visible_by or "-", r.state,
                     r.outcome, r.confidence or "-", ",".join(map(str, r.named)) or "-",
                     ",".join(map(str, r.candidates)) or "-", site, sim, r.postmortem or "-",
                     r.user_frame or "-"))  # fmt: skip
    widths = [max(len(x) for x in column) for column in zip(head, *body, strict=True)]
    lines = ["  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)).rstrip() for line in (head, *body)]
    return "\n".join(lines)


def confusion(rows: list[Row]) -> str:
    """Outcomes per family and mode, over the hung cases; and what the ended ones did."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for r in rows:
        key = (r.family.split(":")[0], r.mode)
        counts.setdefault(key, {})
        outcome = f"ended (post mortem {r.postmortem.split()[0]})" if r.state == "ended" and r.postmortem else r.outcome
        counts[key][outcome] = counts[key].get(outcome, 0) + 1
    lines = []
    for (family, mode), found in sorted(counts.items()):
        lines.append(f"{family:<20} {mode:<6} " + ", ".join(f"{k} {v}" for k, v in sorted(found.items())))
    return "\n".join(lines)


def report(rows: list[Row], out: Path, code: dict | None = None) -> str:
    """The table, the confusion and what was not right, into out/table.txt and out/results.json. `code`: the
    provenance at the start; where the code changed before the end, the table says so."""
    now = provenance()
    head = ""
    if code is not None:
        (out / "provenance.json").write_text(json.dumps({"start": code, "end": now}, indent=1))
        changed = "" if code == now else " (CHANGED during the run: see provenance.json)"
        head = f"HEAD {code['head'][:10]}, src diff {code['src_diff_sha256']}, sim diff {code['sim_diff_sha256']}"
        head += changed + "\n\n"
    text = head + table(rows) + "\n\nconfusion (family, mode: outcomes)\n" + confusion(rows)
    notes = [f"seed {r.seed} {r.mode}: {r.summary or r.note}" for r in rows if r.outcome not in ("right",)]
    if notes:
        text += "\n\nnot right:\n" + "\n".join(notes)
    (out / "table.txt").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seeds", nargs="*", type=int)
    parser.add_argument("--sample", type=int, default=0, help="the first N runnable seeds that hang on gloo")
    parser.add_argument("--start", type=int, default=0, help="where --sample starts")
    parser.add_argument("--max-ranks", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "sim_live")
    parser.add_argument("--modes", default="bare,armed")
    parser.add_argument("--stall-seconds", type=float, default=5.0)
    parser.add_argument("--settle", type=float, default=2.0)
    parser.add_argument("--jobs", type=int, default=1, help="modes run at once (each a job of its own)")
    parser.add_argument("--no-postmortem", action="store_true", help="do not diagnose the jobs that ended")
    args = parser.parse_args()
    seeds = args.seeds + (sample(args.sample, args.max_ranks, args.start) if args.sample else [])
    skipped = [seed for seed in args.seeds if runnable(seed, max(args.max_ranks, 8)) is None]
    if skipped:  # no hang in the simulation, more than 8 ranks, or NCCL's features
        print(f"not run: seeds {skipped}", flush=True)
        seeds = [seed for seed in seeds if seed not in skipped]
    if not seeds:
        parser.error("give seeds, or --sample N")
    modes = tuple(m for m in args.modes.split(",") if m in MODES)
    opts = options(stall_seconds=args.stall_seconds, settle=args.settle, postmortem=not args.no_postmortem)
    args.out.mkdir(parents=True, exist_ok=True)
    code = provenance()
    stream = args.out / "rows.jsonl"  # each row as it comes: a run cut short keeps what it did
    stream.write_text("")

    def echo(row: Row) -> None:
        print(line(row), flush=True)
        with stream.open("a") as file:
            file.write(json.dumps(asdict(row)) + "\n")

    rows = run_all(seeds, args.out, opts, modes, args.jobs, echo=echo)
    print()
    print(report(rows, args.out, code))
    left = leftovers()
    print("\nprocesses left behind:", "none" if not left else "\n  " + "\n  ".join(left))
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
