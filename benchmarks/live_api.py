"""Real hung jobs written with the real framework APIs (tests/jobs/api_hangs.py), diagnosed live as a user would.

Usage: python benchmarks/live_api.py [--out /tmp/live_api] [--modes bare,armed] [--stall-seconds 5]
       [--settle 4] [--ranks N] [--culprit R] [CASE ...]

For each case (all of them, or those named), in two modes:

    bare    `torchrun --standalone --nproc_per_node N tests/jobs/api_hangs.py` with CASE set; once every rank
            printed its READY line and the job had --settle seconds to block, `torchtriage diagnose --pid
            <torchrun agent> --json --out <case>/bare/capture` (mode `bare`), then the same with --native
            (mode `bare-native`, into capture-native).
    armed   `torchtriage run --out <case>/armed/run --stall-seconds S -- torchrun ...`; the verdict the
            watchdog writes into run/hang/verdict.json, waited for (mode `armed`); then `torchtriage diagnose
            --pid <torchrun agent> --json` on the same job (mode `armed-pid`: the live capture with the armed
            ranks' fresh flight-recorder dumps).

A job that ends instead of hanging (a SIGKILLed rank: torchrun stops the others) is diagnosed post mortem as
a user would, from its console log (bare: `diagnose console.log`) or its run folder and log (armed), and
the mode's name says so (`bare-postmortem`, `armed-postmortem`).

Everything a job started is killed in a finally block: the launcher's session, each rank's process group
(a rank's DataLoader workers are in it) and every process found below the launcher. Everything is kept
under --out: per case and mode the console log, the verdict JSON, diagnose's stderr, the captured stacks
and the run folder with its dumps, and `provenance.json` (the commit and a digest of the changes under
src/ the case ran with); `results.json` and `table.txt` at the top.

The verdict is right when it names exactly the case's culprit ranks and its `user_frame` is a line of
tests/jobs/api_hangs.py that the job marks for that case (`# [<case>] departure` or `# [<case>] culprit
waits`); `culprit` when only the ranks are right.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB_REL = "tests/jobs/api_hangs.py"
JOB = ROOT / JOB_REL
TORCHRUN = Path(sys.executable).parent / "torchrun"
sys.path.insert(0, str(ROOT / "tests"))

from hung_job import clean_environment  # noqa: E402
from live_job import Job, torchtriage  # noqa: E402
from live_job import leftovers as live_leftovers  # noqa: E402
from live_job import provenance as live_provenance  # noqa: E402

MARK = re.compile(r"#\s*\[(\w+)\]\s*(departure|culprit waits|victim waits)")


# --- what each case expects ---------------------------------------------------------------------------


def job_cases() -> dict[str, tuple[int, list[int] | str | None]]:
    """name -> (ranks, culprits: None for CULPRIT, a list, or "all but 0"), read from the job's CASES table
    without importing it (the job imports torch)."""
    text = JOB.read_text()
    table = text[text.index("CASES = {") : text.index("}", text.index("CASES = {")) + 1]
    cases = {}
    for name, ranks, culprits in re.findall(r'"(\w+)": \(\w+, (\d+), (None|\[[\d, ]*\]|"all but 0")\)', table):
        cases[name] = (int(ranks), None if culprits == "None" else json.loads(culprits))
    return cases


def marked_lines() -> dict[str, dict[str, list[int]]]:
    marks: dict[str, dict[str, list[int]]] = {}
    for number, line in enumerate(JOB.read_text().splitlines(), start=1):
        for case, role in MARK.findall(line):
            marks.setdefault(case, {}).setdefault(role, []).append(number)
    return marks


def expected(case: str, culprit: int, ranks: int | None = None) -> dict:
    default_ranks, culprits = job_cases()[case]
    ranks = ranks or default_ranks
    if culprits is None:
        culprits = [culprit]
    elif culprits == "all but 0":
        culprits = list(range(1, ranks))
    marks = marked_lines().get(case, {})
    return {
        "case": case,
        "ranks": ranks,
        "culprit_ranks": culprits,
        "departure_lines": marks.get("departure", []),
        "culprit_wait_lines": marks.get("culprit waits", []),
        "victim_wait_lines": marks.get("victim waits", []),
    }


def judge(verdict: dict | None, want: dict) -> str:
    if not verdict:
        return "no verdict"
    culprit_ok = sorted(verdict.get("culprit_ranks") or []) == sorted(want["culprit_ranks"])
    frame = (verdict.get("facts") or {}).get("user_frame") or {}
    lines = set(want["departure_lines"]) | set(want["culprit_wait_lines"])
    line_ok = (
        str(frame.get("file", "")).replace("\\", "/").endswith("api_hangs.py")
        and frame.get("line") in lines
        and frame.get("rank") in (None, *want["culprit_ranks"])
    )
    if culprit_ok and line_ok:
        return "yes"
    return "culprit" if culprit_ok else "no"


# --- the modes ----------------------------------------------------------------------------------------


def record(folder: Path, mode: str, code: int, stdout: str, stderr: str, seconds: float, note: str = "") -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{mode}.stderr.txt").write_text(stderr)
    try:
        verdict = json.loads(stdout)
    except ValueError:
        verdict = None
        (folder / f"{mode}.stdout.txt").write_text(stdout)
    if verdict is not None:
        (folder / f"{mode}.verdict.json").write_text(json.dumps(verdict, indent=2))
    return {"mode": mode, "exit": code, "seconds": round(seconds, 1), "verdict": verdict, "note": note}


def diagnose_live(folder: Path, mode: str, job: Job, native: bool) -> dict:
    agent = job.agent
    args = ["diagnose", "--json", "--out", str(folder / ("capture-native" if native else "capture"))]
    if agent is not None:
        args[1:1] = ["--pid", str(agent)]
    if native:
        args.append("--native")
    t0 = time.monotonic()
    code, out, err = torchtriage(*args)
    return record(folder, mode, code, out, err, time.monotonic() - t0, note=f"agent pid {agent}")


def postmortem(folder: Path, mode: str, *paths: Path) -> dict:
    t0 = time.monotonic()
    code, out, err = torchtriage("diagnose", "--json", *map(str, paths))
    return record(folder, mode, code, out, err, time.monotonic() - t0, note="the job ended: diagnosed post mortem")


def job_env(case: str, culprit: int, folder: Path) -> dict[str, str]:
    return clean_environment(CASE=case, CULPRIT=str(culprit), CKPT_DIR=str(folder / "ckpt"))


def launcher(ranks: int) -> list[str]:
    return [str(TORCHRUN), "--standalone", "--nproc_per_node", str(ranks), JOB_REL]


def bare(case: str, want: dict, culprit: int, out: Path, settle: float, ready_timeout: float) -> list[dict]:
    folder = out / case / "bare"
    folder.mkdir(parents=True, exist_ok=True)
    job = Job(launcher(want["ranks"]), job_env(case, culprit, folder), want["ranks"], folder / "console.log")
    rows = []
    try:
        ready = job.wait_ready(ready_timeout)
        time.sleep(settle)
        job.remember()
        state = {"ready": ready, "ranks_alive": job.ranks_alive(), "launcher_exit": job.proc.poll()}
        if ready and job.proc.poll() is None and any(state["ranks_alive"].values()):
            rows.append(diagnose_live(folder, "bare", job, native=False))
            rows.append(diagnose_live(folder, "bare-native", job, native=True))
            state["ranks_alive_after"] = job.ranks_alive()
        else:
            job.proc.wait(timeout=60)
            time.sleep(1)
        (folder / "job_state.json").write_text(json.dumps(state, indent=2))
    finally:
        job.kill()
    if not rows:
        rows.append(postmortem(folder, "bare-postmortem", folder / "console.log"))
        rows[-1]["note"] += f" (ready={state['ready']}, launcher exit {job.proc.returncode})"
    return rows


def armed(
    case: str, want: dict, culprit: int, out: Path, stall: float, ready_timeout: float, verdict_timeout: float
) -> list[dict]:
    folder = out / case / "armed"
    folder.mkdir(parents=True, exist_ok=True)
    run_dir = folder / "run"
    command = [sys.executable, "-m", "torchtriage", "run", "--out", str(run_dir), "--stall-seconds", str(stall)]
    env = job_env(case, culprit, folder)
    job = Job([*command, "--", *launcher(want["ranks"])], env, want["ranks"], folder / "console.log")
    rows = []
    verdict_file = run_dir / "hang" / "verdict.json"
    try:
        ready = job.wait_ready(ready_timeout)
        t0 = time.monotonic()
        while ready and time.monotonic() - t0 < verdict_timeout and not verdict_file.exists():
            if job.proc.poll() is not None:
                break
            time.sleep(0.5)
        job.remember()
        state = {"ready": ready, "ranks_alive": job.ranks_alive(), "launcher_exit": job.proc.poll()}
        if verdict_file.exists():
            time.sleep(1)  # the reporter writes the JSON, then the text
            verdict = json.loads(verdict_file.read_text())
            (folder / "armed.verdict.json").write_text(json.dumps(verdict, indent=2))
            rows.append(
                {
                    "mode": "armed",
                    "exit": None,
                    "seconds": round(time.monotonic() - t0, 1),
                    "verdict": verdict,
                    "note": "seconds: from the last READY line to the watchdog's verdict",
                }
            )
        else:
            rows.append(
                {
                    "mode": "armed",
                    "exit": None,
                    "seconds": round(time.monotonic() - t0, 1),
                    "verdict": None,
                    "note": f"no watchdog verdict (ready={ready}, launcher exit {job.proc.poll()})",
                }
            )
        if ready and job.proc.poll() is None and any(state["ranks_alive"].values()):
            rows.append(diagnose_live(folder, "armed-pid", job, native=False))
        (folder / "job_state.json").write_text(json.dumps(state, indent=2))
    finally:
        job.kill()
    if job.proc.returncode is not None and not any(r["mode"] == "armed-pid" for r in rows):
        rows.append(postmortem(folder, "armed-postmortem", run_dir, folder / "console.log"))
    return rows


# --- the table ----------------------------------------------------------------------------------------


def frame_text(verdict: dict | None) -> str:
    frame = ((verdict or {}).get("facts") or {}).get("user_frame") or {}
    if not frame:
        return "-"
    rank = f" r{frame['rank']}" if frame.get("rank") is not None else ""
    return f"{Path(str(frame.get('file', '?'))).name}:{frame.get('line')} {frame.get('function', '')}{rank}"


def table(rows: list[dict]) -> str:
    head = ("case", "mode", "category", "culprits", "conf", "user_frame", "right", "s")
    body = []
    for r in rows:
        v = r["verdict"] or {}
        body.append(
            (
                r["case"],
                r["mode"],
                v.get("category", "-"),
                ",".join(map(str, v.get("culprit_ranks") or [])) or "-",
                v.get("confidence", "-"),
                frame_text(r["verdict"]),
                f"{r['right']} (want {','.join(map(str, r['want']))})",
                str(r["seconds"]),
            )
        )
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip() for line in (head, *body)]
    wrong = [r for r in rows if r["right"] != "yes"]
    if wrong:
        lines += ["", "summaries of the verdicts not right:"]
        for r in wrong:
            summary = (r["verdict"] or {}).get("summary") or r["note"]
            lines.append(f"  {r['case']} / {r['mode']}: {summary}")
    return "\n".join(lines)


def provenance() -> dict:
    """The commit and the uncommitted changes under src/ the cases ran with."""
    return live_provenance({"src": "src"})


def leftovers() -> list[str]:
    return live_leftovers("api_hangs.py")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="cases of tests/jobs/api_hangs.py (default: all)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/live_api"))
    parser.add_argument("--modes", default="bare,armed", help="bare, armed or both (comma-separated)")
    parser.add_argument("--culprit", type=int, default=1, help="CULPRIT for the cases that take it")
    parser.add_argument(
        "--ranks", type=int, help="run every case on this many ranks (pipeline_skip_send needs 2, dtensor_mesh_skip 4)"
    )
    parser.add_argument("--stall-seconds", type=float, default=5)
    parser.add_argument("--settle", type=float, default=4, help="seconds between the READY lines and diagnose")
    parser.add_argument("--ready-timeout", type=float, default=180)
    parser.add_argument("--verdict-timeout", type=float, default=120)
    args = parser.parse_args()
    cases = job_cases()
    unknown = [c for c in args.cases if c not in cases]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; the cases: {', '.join(cases)}")
    modes = set(args.modes.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    results_file = args.out / "results.json"
    rows: list[dict] = []
    nccl_only = re.search(r"NCCL_ONLY = \(([^)]*)\)", JOB.read_text())
    skipped = set(re.findall(r'"(\w+)"', nccl_only.group(1))) if nccl_only else set()
    on_nccl = os.environ.get("BACKEND") == "nccl"
    for case in args.cases or [c for c in cases if on_nccl or c not in skipped]:
        want = expected(case, args.culprit, args.ranks)
        shutil.rmtree(args.out / case, ignore_errors=True)
        (args.out / case).mkdir(parents=True)
        (args.out / case / "expected.json").write_text(json.dumps(want, indent=2))
        code = provenance()
        (args.out / case / "provenance.json").write_text(json.dumps(code, indent=2))
        print(
            f"== {case}: {want['ranks']} ranks, culprit {want['culprit_ranks']} "
            f"(HEAD {code['head'][:8]}, src diff {code['src_diff_sha256']})",
            flush=True,
        )
        got = []
        try:
            if "bare" in modes:
                got += bare(case, want, args.culprit, args.out, args.settle, args.ready_timeout)
            if "armed" in modes:
                got += armed(
                    case, want, args.culprit, args.out, args.stall_seconds, args.ready_timeout, args.verdict_timeout
                )
        except Exception as err:  # keep going: one case that fails to run is noted, not fatal
            got.append({"mode": "error", "exit": None, "seconds": 0, "verdict": None, "note": repr(err)})
        for row in got:
            row.update(case=case, want=want["culprit_ranks"], right=judge(row["verdict"], want), code=code)
            v = row["verdict"] or {}
            print(
                f"   {row['mode']:<17} {v.get('category', '-'):<13} culprits {v.get('culprit_ranks')} "
                f"{v.get('confidence', '-'):<6} {frame_text(row['verdict'])}  right: {row['right']}  "
                f"({row['seconds']} s) {row['note']}",
                flush=True,
            )
        rows += got
        results_file.write_text(
            json.dumps(
                [
                    {k: v for k, v in r.items() if k != "verdict"}
                    | {
                        "category": (r["verdict"] or {}).get("category"),
                        "culprit_ranks": (r["verdict"] or {}).get("culprit_ranks"),
                        "confidence": (r["verdict"] or {}).get("confidence"),
                        "summary": (r["verdict"] or {}).get("summary"),
                        "user_frame": ((r["verdict"] or {}).get("facts") or {}).get("user_frame"),
                    }
                    for r in rows
                ],
                indent=2,
            )
        )
    text = table(rows)
    (args.out / "table.txt").write_text(text + "\n")
    print()
    print(text)
    left = leftovers()
    print("\nprocesses left behind:", "none" if not left else "\n  " + "\n  ".join(left))
    return 0


if __name__ == "__main__":
    sys.exit(main())
