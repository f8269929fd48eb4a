"""Real jobs that hang, written apart from every fixture and simulator of this project, diagnosed live as a user
would diagnose them.

    python benchmarks/live_hangs/run.py [--cases A,B] [--modes bare,armed] [--out /tmp/live_hangs]
                                        [--stall-seconds 5] [--settle 4]

Each case is one job file of this folder (torchrun + gloo on CPU, 2 to 4 ranks), a small training program with
one bug that makes one rank (or a few) leave the program its peers run; its docstring tells the story. CASES
below declares each case's ground truth: the culprit rank(s) and the culprit's lines, found in the job's files
by their markers (`# [<case>] departure`: where the culprit leaves its peers' program; `# [<case>] culprit
waits`: where it then waits, if elsewhere).

For each case, two modes:

    bare    `torchrun --standalone --nproc_per_node N <case>.py`; once every rank printed its READY line and the
            job had --settle seconds to block, `torchtriage diagnose --pid <torchrun agent> --json`.
    armed   `torchtriage run --out <run> --stall-seconds S -- torchrun ...`; once the hang watchdog wrote
            run/hang/verdict.json, `torchtriage diagnose <run> --json`.

A job that ends instead of hanging (a rank that exits or is killed: torchrun stops the others, or the gloo
peers of a closed connection fail) is diagnosed post mortem as a user would: bare from its console log, armed
from the run folder and the console log; the mode then reads `bare (ended)` / `armed (ended)`.

Everything a job started is killed when its mode ends; the processes of the case left alive afterwards are
listed (none, or a leak). Each mode's console, verdict and captures are kept under --out/<case>/<mode>/, the
results in --out/results.json and the table in --out/table.txt.

A verdict is `right` when it names exactly the culprit ranks and its user frame is one of the culprit's lines
(on a culprit rank); `ranks` when only the ranks are right; `candidates` when it names no culprit but lists
candidates that hold every culprit; `wrong` when it names a rank that is not a culprit, `none` when it names
nobody. A wrong verdict at confidence high is the worst outcome and is flagged `WRONG-HIGH`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TORCHRUN = Path(sys.executable).parent / "torchrun"
sys.path.insert(0, str(ROOT / "tests"))

from hung_job import clean_environment  # noqa: E402
from live_job import Job, torchtriage  # noqa: E402
from live_job import leftovers as live_leftovers  # noqa: E402
from live_job import provenance as live_provenance  # noqa: E402


@dataclass(frozen=True)
class Case:
    job: str  # the job's file in this folder
    ranks: int
    culprits: tuple[int, ...]
    lines: tuple[str, ...]  # "<file>:<role>": the culprit's lines, by the markers `# [<case>] <role>` in that file
    story: str  # one line: how the culprit departs


CASES = {
    "eval_loader_short": Case(
        "eval_loader_short.py", 3, (2,),
        ("eval_loader_short.py:departure", "eval_loader_short.py:culprit waits"),
        "no_grad eval over a hand-split DataLoader shard one batch short: leaves the per-batch all_reduce loop early",
    ),
    "grad_accum_skip_empty": Case(
        "grad_accum_skip_empty.py", 3, (1,),
        ("grad_accum_skip_empty.py:departure", "grad_accum_skip_empty.py:culprit waits"),
        "DDP no_sync micro-step skipped (empty after a filter): exchanges pair off by one, backward meets all_gather",
    ),
    "fsdp2_eval_no_reshard": Case(
        "fsdp2_eval_no_reshard.py", 3, (2,),
        ("fsdp2_eval_no_reshard.py:departure", "fsdp2_eval_no_reshard.py:culprit waits"),
        "FSDP2 reshard_after_forward=False, eval scheduled on samples counted per rank: the culprit evaluates late",
    ),
    "pipeline_gpipe_short_data": Case(
        "pipeline_gpipe_short_data.py", 2, (0,),
        ("pipeline_gpipe_short_data.py:departure", "pipeline_gpipe_short_data.py:culprit waits"),
        "ScheduleGPipe, 2 stages: the first stage's loader drops the last batch, it leaves the loop for a broadcast",
    ),
    "mesh2d_seq_parallel_pad": Case(
        "mesh2d_seq_parallel_pad.py", 4, (3,),
        ("metrics.py:departure", "mesh2d_seq_parallel_pad.py:culprit waits"),
        "2-D DeviceMesh (dp x sp): an all-padding sequence half makes a helper return before its all_gather on sp",
    ),
    "store_wait_never_set": Case(
        "store_wait_never_set.py", 3, (0,),
        ("checkpointing.py:departure", "store_wait_never_set.py:culprit waits"),
        "rank 0 publishes the best checkpoint in the store only when improved; peers store.wait for a key never set",
    ),
    "random_step_ckpt_barrier": Case(
        "random_step_ckpt_barrier.py", 3, (0,),
        ("checkpointing.py:departure",),
        "sharded save at a random step: a helper returns on ranks != 0 before the barrier, rank 0 waits in it",
    ),
    "thread_join_deadlock": Case(
        "thread_join_deadlock.py", 3, (0,),
        ("thread_join_deadlock.py:departure",),
        "rank 0 joins its uploader thread before sending it the sentinel; peers wait in DDP's all-reduce",
    ),
    "gather_object_eval": Case(
        "gather_object_eval.py", 3, (2,),
        ("metrics.py:departure", "gather_object_eval.py:culprit waits"),
        "no_grad eval with no batch for the last rank: a helper returns before all_gather_object, it waits in barrier",
    ),
    "os_exit_early_stop": Case(
        "os_exit_early_stop.py", 3, (2,),
        ("os_exit_early_stop.py:departure",),
        "a rank-local early stop leaves with os._exit(0) while its peers go on to the next all-reduce",
    ),
    "sigkill_memory_guard": Case(
        "sigkill_memory_guard.py", 2, (1,),
        ("sigkill_memory_guard.py:departure",),
        "the job's own memory guard SIGKILLs a rank staging a checkpoint; its peer waits in DDP's all-reduce",
    ),
    "nan_loss_skip_ddp": Case(
        "nan_loss_skip_ddp.py", 3, (1,),
        ("nan_loss_skip_ddp.py:departure", "nan_loss_skip_ddp.py:culprit waits"),
        "a corrupt record gives one rank a non-finite loss: it alone skips backward, hangs at the epoch's all_gather",
    ),
    "moe_all_to_all_empty": Case(
        "moe_all_to_all_empty.py", 4, (2,),
        ("moe_all_to_all_empty.py:departure", "moe_all_to_all_empty.py:culprit waits"),
        "expert-parallel MoE: an all-padding batch returns before the all-to-alls, waits in the gradient all_reduce",
    ),
    "ring_wrong_peer": Case(
        "ring_wrong_peer.py", 4, (1,),
        ("ring_wrong_peer.py:departure", "ring_wrong_peer.py:culprit waits"),
        "gossip SGD, hop 1 then 2: a C-style wrap-around gives rank 1 the wrong receive peer once the hop is 2",
    ),
    "tp_wrong_group": Case(
        "tp_wrong_group.py", 4, (0,),
        ("tp_wrong_group.py:departure", "tp_wrong_group.py:culprit waits"),
        "TP communicators used in turn by iteration: rank 0's iteration jumps at its checkpoint, it picks the other",
    ),
    "local_early_stop": Case(
        "local_early_stop.py", 3, (2,),
        ("local_early_stop.py:departure", "local_early_stop.py:culprit waits"),
        "early stop on each rank's own validation loss: the culprit breaks to the final barrier, peers train on",
    ),
    "monitored_barrier_straggler": Case(
        "monitored_barrier_straggler.py", 3, (1,),
        ("monitored_barrier_straggler.py:departure",),
        "a cache lock kept by an early return: the culprit blocks in acquire, rank 0's monitored_barrier raises",
    ),
    "broadcast_wrong_src": Case(
        "broadcast_wrong_src.py", 3, (1,),
        ("broadcast_wrong_src.py:departure", "broadcast_wrong_src.py:culprit waits"),
        "LR sync by broadcast from a per-rank leader: a loss spike makes the culprit src=itself, its peers src=0",
    ),
    "fsdp1_no_sync_mismatch": Case(
        "fsdp1_no_sync_mismatch.py", 3, (0,),
        ("fsdp1_no_sync_mismatch.py:departure", "fsdp1_no_sync_mismatch.py:culprit waits"),
        "FSDP1 no_sync accumulation, an all-NaN micro-batch skipped: reduce-scatter meets peers' forward all_gather",
    ),
    "zero_redundancy_step_skip": Case(
        "zero_redundancy_step_skip.py", 3, (2,),
        ("zero_redundancy_step_skip.py:departure", "zero_redundancy_step_skip.py:culprit waits"),
        "ZeroRedundancyOptimizer, a rank-local loss-spike guard skips step(): backward meets peers' broadcasts",
    ),
    "rpc_or_object_list_deadlock": Case(
        "rpc_or_object_list_deadlock.py", 3, (0,),
        ("rpc_or_object_list_deadlock.py:departure", "rpc_or_object_list_deadlock.py:culprit waits"),
        "hard-example mining: rank 0 returns before broadcast_object_list when it mined nothing, peers wait in it",
    ),
}  # fmt: skip

MODES = ("bare", "armed")


# --- ground truth ---------------------------------------------------------------------------------------


def culprit_lines(name: str) -> list[tuple[str, int]]:
    """(file, line) of each of the case's declared markers; a marker missing or repeated is an error."""
    found = []
    for spec in CASES[name].lines:
        file, role = spec.split(":", 1)
        marker = f"# [{name}] {role}"
        lines = (HERE / file).read_text().splitlines()
        numbers = [n for n, text in enumerate(lines, 1) if text.rstrip().endswith(marker)]
        if not numbers:
            raise SystemExit(f"{name}: no line of {file} ends with {marker!r}")
        found += [(file, n) for n in numbers]
    return found


def judge(name: str, verdict: dict | None) -> str:
    if not verdict:
        return "none"
    case = CASES[name]
    named = sorted(verdict.get("culprit_ranks") or [])
    facts = verdict.get("facts") or {}
    if named and set(named) - set(case.culprits):
        return "WRONG-HIGH" if verdict.get("confidence") == "high" else "wrong"
    if named != sorted(case.culprits):
        candidates = set(facts.get("candidates") or [])
        return "candidates" if candidates and set(case.culprits) <= candidates else "none"
    frame = facts.get("user_frame") or {}
    lines = culprit_lines(name)
    at = (Path(str(frame.get("file", ""))).name, frame.get("line"))
    line_ok = at in lines and frame.get("rank") in (None, *case.culprits)
    return "right" if line_ok else "ranks"


# --- the modes ------------------------------------------------------------------------------------------


def launcher(case: Case) -> list[str]:
    return [str(TORCHRUN), "--standalone", "--nproc_per_node", str(case.ranks), str(HERE / case.job)]


def job_env(folder: Path) -> dict[str, str]:
    return clean_environment(CKPT_DIR=str(folder / "ckpt"))


def diagnose(folder: Path, *args: str) -> tuple[dict | None, float, int]:
    t0 = time.monotonic()
    code, out, err = torchtriage("diagnose", "--json", *args)
    seconds = time.monotonic() - t0
    (folder / "diagnose.stderr.txt").write_text(err)
    try:
        verdict = json.loads(out)
    except ValueError:
        (folder / "diagnose.stdout.txt").write_text(out)
        return None, seconds, code
    (folder / "verdict.json").write_text(json.dumps(verdict, indent=2))
    return verdict, seconds, code


def hanging(job: Job) -> bool:
    return job.proc.poll() is None and all(job.ranks_alive().values())


def bare(case: Case, folder: Path, settle: float, ready_timeout: float) -> dict:
    job = Job(launcher(case), job_env(folder), case.ranks, folder / "console.log")
    try:
        ready = job.wait_ready(ready_timeout)
        time.sleep(settle)
        job.remember()
        alive = ready and job.proc.poll() is None and any(job.ranks_alive().values())
        state = {"ready": ready, "ranks_alive": job.ranks_alive(), "launcher_exit": job.proc.poll()}
        if alive:
            verdict, seconds, code = diagnose(folder, "--pid", str(job.agent), "--out", str(folder / "capture"))
    finally:
        left = job.kill()
    (folder / "job_state.json").write_text(json.dumps(state, indent=2))
    if alive:
        return {"mode": "bare", "verdict": verdict, "seconds": seconds, "exit": code, "left": left, "state": state}
    verdict, seconds, code = diagnose(folder, str(folder / "console.log"))
    return {"mode": "bare (ended)", "verdict": verdict, "seconds": seconds, "exit": code, "left": left, "state": state}


def armed(case: Case, folder: Path, stall: float, ready_timeout: float, verdict_timeout: float) -> dict:
    run_dir = folder / "run"
    command = [sys.executable, "-m", "torchtriage", "run", "--out", str(run_dir), "--stall-seconds", str(stall)]
    job = Job([*command, "--", *launcher(case)], job_env(folder), case.ranks, folder / "console.log")
    watchdog = run_dir / "hang" / "verdict.json"
    try:
        ready = job.wait_ready(ready_timeout)
        t0 = time.monotonic()
        while ready and job.proc.poll() is None and not watchdog.exists() and time.monotonic() - t0 < verdict_timeout:
            time.sleep(0.5)
        time.sleep(1)  # the watchdog writes its verdict's JSON, then the text
        job.remember()
        state = {
            "ready": ready, "ranks_alive": job.ranks_alive(), "launcher_exit": job.proc.poll(),
            "watchdog_verdict": watchdog.exists(), "seconds_to_watchdog": round(time.monotonic() - t0, 1),
        }  # fmt: skip
    finally:
        left = job.kill()
    (folder / "job_state.json").write_text(json.dumps(state, indent=2))
    if watchdog.exists():
        verdict, seconds, code = diagnose(folder, str(run_dir))
        mode = "armed"
    else:
        verdict, seconds, code = diagnose(folder, str(run_dir), str(folder / "console.log"))
        mode = "armed (ended)"
    return {"mode": mode, "verdict": verdict, "seconds": seconds, "exit": code, "left": left, "state": state}


# --- the table ------------------------------------------------------------------------------------------


def frame_text(verdict: dict | None) -> str:
    frame = ((verdict or {}).get("facts") or {}).get("user_frame") or {}
    if not frame:
        return "-"
    rank = f" r{frame['rank']}" if frame.get("rank") is not None else ""
    return f"{Path(str(frame.get('file', '?'))).name}:{frame.get('line')}{rank}"


def row_cells(row: dict) -> tuple[str, ...]:
    v = row["verdict"] or {}
    named = ",".join(map(str, v.get("culprit_ranks") or []))
    candidates = (v.get("facts") or {}).get("candidates")
    if not named and candidates:
        named = "cand " + ",".join(map(str, candidates))
    case = CASES[row["case"]]
    want = ",".join(map(str, case.culprits)) + " @ " + ",".join(f"{f}:{n}" for f, n in culprit_lines(row["case"]))
    return (row["case"], row["mode"], v.get("category", "-"), named or "-", v.get("confidence", "-"),
            frame_text(row["verdict"]), row["right"], want)  # fmt: skip


def table(rows: list[dict]) -> str:
    head = ("case", "mode", "verdict", "culprits", "conf", "culprit line", "right", "truth")
    body = [row_cells(r) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip() for line in (head, *body)]
    right = sum(r["right"] == "right" for r in rows)
    ranks = sum(r["right"] in ("right", "ranks") for r in rows)
    high_wrong = sum(r["right"] == "WRONG-HIGH" for r in rows)
    lines += ["", f"right {right} of {len(rows)}; culprit ranks right {ranks} of {len(rows)}"]
    lines[-1] += f"; wrong at high {high_wrong}"
    wrong = [r for r in rows if r["right"] != "right"]
    if wrong:
        lines += ["", "summaries of the verdicts not right:"]
        lines += [f"  {r['case']} / {r['mode']}: {(r['verdict'] or {}).get('summary')}" for r in wrong]
    return "\n".join(lines)


def run_case(name: str, modes: list[str], out: Path, args: argparse.Namespace) -> list[dict]:
    case = CASES[name]
    culprit_lines(name)  # every marker is where the table says, before anything starts
    rows = []
    for mode in modes:
        folder = out / name / mode
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        t0 = time.monotonic()
        try:
            if mode == "bare":
                row = bare(case, folder, args.settle, args.ready_timeout)
            else:
                row = armed(case, folder, args.stall_seconds, args.ready_timeout, args.verdict_timeout)
        except Exception as err:  # one case that fails to run is noted, the others still run
            row = {"mode": mode, "verdict": None, "seconds": 0, "exit": None, "left": [], "state": repr(err)}
        row.update(case=name, right=judge(name, row["verdict"]), wall=round(time.monotonic() - t0, 1))
        left = live_leftovers(case.job)
        row["leftovers"] = left
        print("  ".join(row_cells(row)) + f"  ({row['wall']} s{'; LEFT: ' + str(left) if left else ''})", flush=True)
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="", help=f"comma-separated, of: {', '.join(CASES)} (default: all)")
    parser.add_argument("--modes", default="bare,armed")
    parser.add_argument("--out", type=Path, default=Path("/tmp/live_hangs"))
    parser.add_argument("--stall-seconds", type=float, default=5)
    parser.add_argument("--settle", type=float, default=4, help="seconds between the READY lines and diagnose")
    parser.add_argument("--ready-timeout", type=float, default=180)
    parser.add_argument("--verdict-timeout", type=float, default=120)
    args = parser.parse_args()
    names = [c for c in args.cases.split(",") if c] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    modes = [m for m in args.modes.split(",") if m]
    if unknown or set(modes) - set(MODES):
        parser.error(f"unknown case or mode: {unknown or modes}; cases: {', '.join(CASES)}; modes: bare, armed")
    args.out.mkdir(parents=True, exist_ok=True)
    code = live_provenance({"src": "src"})
    print(f"HEAD {code['head'][:8]}, src diff {code['src_diff_sha256']}", flush=True)
    rows: list[dict] = []
    for name in names:
        rows += run_case(name, modes, args.out, args)
        (args.out / "results.json").write_text(json.dumps({"provenance": code, "rows": rows}, indent=2, default=str))
    text = table(rows)
    (args.out / "table.txt").write_text(text + "\n")
    print("\n" + text)
    left = [p for case in {CASES[n].job for n in names} for p in live_leftovers(case)]
    print("\nprocesses left behind:", "none" if not left else "\n  " + "\n  ".join(left))
    return 0


if __name__ == "__main__":
    sys.exit(main())
