"""A whole capture: find the ranks, check ptrace, run py-spy on every rank at once, write the folder.

    <out>/<host>-<YYYYmmdd-HHMMSS>/
        rank00.txt   rank00.json          (dump: py-spy's own text and JSON output, unmodified)
        rank00.svg   rank00.speedscope.json   (record: py-spy's flame graph and speedscope profile)
        summary.json                      (one entry per process: rank, pid, host, cmdline, ok, error, files)

The folder name carries the host, so the folders of every node of a job can be gathered in one shared
directory (`--out`) without clashing. The default `--out` is node-local and the user's own
($TMPDIR/torchtriage-<uid>), so a capture can never itself hang on a stuck shared file system.

A capture is private: every folder it makes is 0700 and every file 0600, whatever the umask, since py-spy's
--locals show the values a rank holds (a token read from the environment). A folder the user names with --out
is left as it is, and said when other users can read it.

A rank that is stopped (state T or t in /proc: SIGSTOP, Ctrl-Z, a debugger) is not sampled: py-spy cannot pause
what is stopped already, and nothing here resumes it (a debugger may hold it on purpose). Its summary entry says
so (`"state": "T"`), and `diagnose` names it.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torchtriage import __version__
from torchtriage.collect.discovery import RankProcess, find_ranks, looks_like_python, parse_stat
from torchtriage.collect.preflight import FIX_CAPABILITY, Preflight, check_ptrace
from torchtriage.collect.pyspy import ConcurrentRunner, Step, StepResult, find_py_spy, py_spy_version
from torchtriage.errors import EnvironmentProblem
from torchtriage.protocol import host_name, make_private_folders, new_private_folder, open_to_others, write_private
from torchtriage.sources.captures import CAPTURE_SUMMARY as SUMMARY_FILE
from torchtriage.sources.captures import STOPPED_STATES

SUMMARY_SCHEMA = 1
DEFAULT_DUMP_TIMEOUT_S = 10.0
# For record: beyond --duration, the time py-spy gets to attach, and to write its files at the end.
RECORD_SLACK_S = 30.0


def default_out_dir() -> Path:
    """Node-local and the user's own: one folder for every user of the node would be readable by them, and
    whoever made it first would own it."""
    return Path(tempfile.gettempdir()) / f"torchtriage-{os.getuid()}"


def _check_default_folder(folder: Path) -> None:
    """The default folder, when it exists, must be a folder of this user's (its name is known to every user of
    the node, who could make it first, or put a symlink there)."""
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        what = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a folder"
        raise EnvironmentProblem(f"{folder} is {what}; remove it, or choose another folder with --out.")
    if info.st_uid != os.getuid():
        raise EnvironmentProblem(
            f"{folder} belongs to uid {info.st_uid}, not to you (uid {os.getuid()}); remove it, or choose another "
            "folder with --out."
        )


@dataclass
class ProcessCapture:
    target: RankProcess
    ok: bool
    error: str | None
    files: list[str]
    details: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {**self.target.to_json(), "ok": self.ok, "error": self.error, "files": self.files, **self.details}


@dataclass
class CaptureResult:
    kind: str  # "dump" or "record"
    folder: Path
    host: str
    started: str
    py_spy: str
    py_spy_version: str | None
    preflight: Preflight
    options: dict
    processes: list[ProcessCapture]
    interrupted: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[ProcessCapture]:
        return [p for p in self.processes if not p.ok]

    @property
    def ok(self) -> bool:
        return not self.failures and not self.interrupted

    @property
    def summary_path(self) -> Path:
        return self.folder / SUMMARY_FILE

    def to_json(self) -> dict:
        return {
            "schema": f"torchtriage.{self.kind}",
            "schema_version": SUMMARY_SCHEMA,
            "torchtriage_version": __version__,
            "kind": self.kind,
            "host": self.host,
            "started": self.started,
            "folder": str(self.folder),
            "ok": self.ok,
            "interrupted": self.interrupted,
            "py_spy": {"path": self.py_spy, "version": self.py_spy_version},
            "options": self.options,
            "preflight": self.preflight.to_json(),
            "warnings": self.warnings,
            "processes": [p.to_json() for p in self.processes],
        }


def file_stems(targets: Sequence[RankProcess]) -> dict[int, str]:
    """pid -> file stem: `rank03` (zero-padded to the world size), or `pid1234` when the rank is unknown,
    or `rank03-pid1234` when two processes claim one rank (two jobs named with --pid)."""
    world = max([t.world_size or 0 for t in targets] + [t.rank + 1 for t in targets if t.rank is not None] + [1])
    width = max(2, len(str(world - 1)))
    counts: dict[int, int] = {}
    for t in targets:
        if t.rank is not None:
            counts[t.rank] = counts.get(t.rank, 0) + 1
    stems = {}
    for t in targets:
        if t.rank is None:
            stems[t.pid] = f"pid{t.pid}"
        elif counts[t.rank] > 1:
            stems[t.pid] = f"rank{t.rank:0{width}d}-pid{t.pid}"
        else:
            stems[t.pid] = f"rank{t.rank:0{width}d}"
    return stems


def make_folder(out: Path, host: str, now: float | None = None) -> Path:
    """A new private folder `<out>/<host>-<time>` (and `out`, private too, when it does not exist)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = f"{re.sub(r'[^A-Za-z0-9._-]', '_', host)}-{stamp}"
    if out == default_out_dir():
        _check_default_folder(out)
    try:
        make_private_folders(out)
        for n in range(1, 1000):
            folder = out / (base if n == 1 else f"{base}-{n}")
            try:
                new_private_folder(folder)
                return folder
            except FileExistsError:
                continue
    except OSError as err:
        raise EnvironmentProblem(
            f"cannot create the output folder in {out}: {err.strerror}; choose another with --out."
        ) from err
    raise EnvironmentProblem(f"too many captures named {base} in {out}; choose another --out.")


def exposure_warning(out: Path) -> list[str]:
    """A warning when other users can read the folder the capture was made in."""
    exposed = open_to_others(out)
    if exposed is None:
        return []
    return [
        f"{out} is readable by other users ({exposed}): the capture in it is private (its folder 0700, files "
        "0600); keep copies of it private too (py-spy's locals may hold secrets)"
    ]


def process_state(pid: int) -> str | None:
    """The one-letter state of a process from /proc/<pid>/stat; None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return parse_stat(file.read())[0]
    except (OSError, ValueError):
        return None


def stopped_targets(targets: Sequence[RankProcess]) -> dict[int, str]:
    """pid -> state, of the targets that are stopped: no py-spy is attached to them."""
    states = {t.pid: process_state(t.pid) for t in targets}
    return {pid: state for pid, state in states.items() if state in STOPPED_STATES}


def not_sampled(target: RankProcess, state: str) -> ProcessCapture:
    """A stopped target: said, never sampled, never resumed."""
    reason = (
        f"is stopped (SIGSTOP/SIGTSTP or a debugger: state {state} in /proc); a stopped rank stops every rank "
        f"that waits for it. Not sampled and left as it is: `grep -E 'State|TracerPid' /proc/{target.pid}/status` "
        f"names a debugger holding it; else `kill -CONT {target.pid}` resumes it"
    )
    return ProcessCapture(target, False, f"{describe(target)} {reason}", [], {"state": state})


def describe(target: RankProcess) -> str:
    rank = f"rank {target.rank}" if target.rank is not None else "rank unknown"
    return f"{rank} (pid {target.pid})"


def explain_failure(target: RankProcess, reason: str) -> str:
    """py-spy's own reason, with what we know that helps: not Python, or a permission problem."""
    try:
        exe = os.readlink(f"/proc/{target.pid}/exe")
    except OSError:
        exe = None
    hint = ""
    if "Permission" in reason or "not permitted" in reason:
        hint = f" To fix: {FIX_CAPABILITY}."
    elif not looks_like_python(target.cmdline, exe):
        shown = " ".join(target.cmdline)[:100] or exe or "?"
        hint = f" (pid {target.pid} runs `{shown}`, which does not look like a Python program)"
    return f"{describe(target)}: {reason}{hint}"


def _merge(target: RankProcess, results: Sequence[StepResult], folder: Path) -> ProcessCapture:
    errors, files = [], []
    for res in results:
        if res.error and res.error.startswith("not run:"):
            continue
        produced = ([res.step.stdout_path] if res.step.stdout_path else []) + list(res.step.output_paths)
        if res.ok:
            files += [p.name for p in produced if p.exists()]
        else:
            errors.append(res.error or "failed")
            for path in produced:  # a half-written file would pass for a capture
                if path.exists():
                    path.unlink()
    error = None
    if errors:
        error = explain_failure(target, "; ".join(dict.fromkeys(errors)))
    return ProcessCapture(target, not errors, error, files)


def _prepare(pids: Sequence[int] | None) -> tuple[str, str | None, list[RankProcess], Preflight]:
    """Everything that can refuse before anything is attached: py-spy, the ranks, ptrace."""
    py_spy = find_py_spy()
    targets = find_ranks(pids)
    preflight = check_ptrace([t.pid for t in targets])
    return py_spy, py_spy_version(py_spy), targets, preflight


def _finish(result: CaptureResult, report_warnings: list[str]) -> CaptureResult:
    result.warnings += report_warnings
    result.warnings += [f"{describe(t)}: {t.note}" for t in (p.target for p in result.processes) if t.note]
    tmp = result.summary_path.with_suffix(".json.tmp")
    write_private(tmp, json.dumps(result.to_json(), indent=2) + "\n")
    tmp.replace(result.summary_path)
    return result


def capture_stacks(
    pids: Sequence[int] | None = None,
    out: Path | None = None,
    *,
    native: bool = False,
    timeout_s: float = DEFAULT_DUMP_TIMEOUT_S,
) -> CaptureResult:
    """Every rank's stacks, captured at once: py-spy `dump` (text, then `--json`) per rank, all ranks in
    parallel, each py-spy run bounded by `timeout_s`. Raises TriageError subclasses (usage 2, environment
    4) before attaching anything; attach failures are reported per process in the result."""
    py_spy, version, targets, preflight = _prepare(pids)
    host = host_name()
    started = time.time()
    folder = make_folder(out or default_out_dir(), host, started)
    stems = file_stems(targets)
    extra = ["--native"] if native else []
    stopped = stopped_targets(targets)
    sampled = [t for t in targets if t.pid not in stopped]
    lanes = []
    for t in sampled:
        base = [py_spy, "dump", "--pid", str(t.pid), *extra]
        stem = folder / stems[t.pid]
        lanes.append(
            [
                Step(tuple(base), timeout_s, stdout_path=stem.with_suffix(".txt")),
                # The JSON dump carries the locals: which group each collective was given.
                Step((*base, "--json", "--locals"), timeout_s, stdout_path=stem.with_suffix(".json")),
            ]
        )
    report = ConcurrentRunner(graceful_stop=False).run(lanes, [t.pid for t in sampled])
    merged = {t.pid: _merge(t, res, folder) for t, res in zip(sampled, report.results, strict=True)}
    processes = [merged[t.pid] if t.pid in merged else not_sampled(t, stopped[t.pid]) for t in targets]
    left_stopped = list(report.left_stopped)
    if not native:
        left_stopped += _native_where_unclear(py_spy, folder, stems, processes, timeout_s)
    result = CaptureResult(
        kind="dump",
        folder=folder,
        host=host,
        started=time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        py_spy=py_spy,
        py_spy_version=version,
        preflight=preflight,
        options={"native": native, "timeout_s": timeout_s, "nonblocking": False},
        processes=processes,
        interrupted=report.interrupted,
    )
    return _finish(result, left_stopped + (exposure_warning(out) if out is not None else []))


def _unclear_places(folder: Path, processes: Sequence[ProcessCapture]) -> dict[tuple, ProcessCapture]:
    """One process per place where a main thread sits in a C call its Python frames do not name (the job's own
    line: store.get, a socket's recv, .item() waiting for the device, time.sleep; or inside backward): its
    native frames tell which, and the ranks at the same place take its reading."""
    from torchtriage.analysis.positions import BACKWARD_OP, classify_frames
    from torchtriage.errors import InputError
    from torchtriage.model import RankState
    from torchtriage.sources.pyspy import read_dump

    # Running the job's own line may be spinning in a C call too (a CUDA sync under .item() spins): natives tell.
    unclear = (RankState.SLEEPING, RankState.BLOCKED, RankState.NO_STACK, RankState.COMPUTING)
    chosen: dict[tuple, ProcessCapture] = {}
    for process in sorted(processes, key=lambda p: (p.target.rank is None, p.target.rank or 0)):
        text = next((name for name in process.files if name.endswith(".txt")), None)
        if not process.ok or text is None:
            continue
        try:
            (stack,) = read_dump(folder / text)
        except (InputError, ValueError):
            continue
        thread = stack.main_thread()
        if thread is None or any(f.native for f in thread.frames):
            continue
        state, op, _ = classify_frames(thread.frames, thread.active)
        if state in unclear or op == BACKWARD_OP:
            place = tuple((f.file, f.line, f.function) for f in thread.frames)
            chosen.setdefault(place, process)
    return chosen


def _native_where_unclear(
    py_spy: str, folder: Path, stems: dict[int, str], processes: Sequence[ProcessCapture], timeout_s: float
) -> list[str]:
    """`py-spy dump --native` of one rank per unclear place (see `_unclear_places`), beside its plain dump. It
    costs most of a second per process (libtorch's symbols), so it is taken where it decides, once per place."""
    chosen = list(_unclear_places(folder, processes).values())
    if not chosen:
        return []
    lanes = []
    for process in chosen:
        path = folder / f"{stems[process.target.pid]}.native.txt"
        argv = (py_spy, "dump", "--pid", str(process.target.pid), "--native")
        lanes.append([Step(argv, timeout_s, stdout_path=path)])
    report = ConcurrentRunner(graceful_stop=False).run(lanes, [p.target.pid for p in chosen])
    for process, results in zip(chosen, report.results, strict=True):
        (result,) = results
        path = result.step.stdout_path
        if result.ok and path is not None and path.exists():
            process.files.append(path.name)
        elif path is not None and path.exists():
            path.unlink()  # a native dump that failed says nothing; the plain one stands
    return list(report.left_stopped)


_SAMPLES = re.compile(r"Samples: (\d+) Errors: (\d+)")


def record_profiles(
    pids: Sequence[int] | None = None,
    out: Path | None = None,
    *,
    duration_s: int = 30,
    rate: int = 100,
    native: bool = False,
    idle: bool = False,
    nonblocking: bool = False,
    timeout_s: float = RECORD_SLACK_S,
) -> CaptureResult:
    """Per-rank flame graphs (SVG) and speedscope profiles over one shared window: py-spy `record` is
    started on every rank at once. py-spy writes one format per run, so each rank gets two recorders
    side by side (their ptrace pauses occasionally collide: py-spy counts those as sample errors, which
    the summary reports). Each is bounded by `duration_s + timeout_s`; Ctrl-C stops them all, keeping
    what they recorded."""
    py_spy, version, targets, preflight = _prepare(pids)
    host = host_name()
    started = time.time()
    folder = make_folder(out or default_out_dir(), host, started)
    stems = file_stems(targets)
    extra = (["--native"] if native else []) + (["--idle"] if idle else []) + (["--nonblocking"] if nonblocking else [])
    stopped = stopped_targets(targets)
    sampled = [t for t in targets if t.pid not in stopped]
    lanes, owners = [], []
    for t in sampled:
        for fmt, suffix in (("flamegraph", ".svg"), ("speedscope", ".speedscope.json")):
            path = folder / f"{stems[t.pid]}{suffix}"
            argv = (py_spy, "record", "--pid", str(t.pid), "--duration", str(duration_s), "--rate", str(rate))
            argv += ("--format", fmt, "--output", str(path), *extra)
            lanes.append([Step(argv, duration_s + timeout_s, output_paths=(path,))])
            owners.append(t)
    report = ConcurrentRunner(graceful_stop=True).run(lanes, [t.pid for t in sampled])
    processes = []
    for t in targets:
        if t.pid in stopped:
            processes.append(not_sampled(t, stopped[t.pid]))
            continue
        results = [res for owner, lane in zip(owners, report.results, strict=True) if owner is t for res in lane]
        capture = _merge(t, results, folder)
        counts = [_SAMPLES.search(r.stdout + r.stderr) for r in results]
        capture.details["samples"] = {
            Path(r.step.output_paths[0]).name: {"samples": int(m.group(1)), "errors": int(m.group(2))}
            for r, m in zip(results, counts, strict=True)
            if m
        }
        processes.append(capture)
    result = CaptureResult(
        kind="record",
        folder=folder,
        host=host,
        started=time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        py_spy=py_spy,
        py_spy_version=version,
        preflight=preflight,
        options={
            "duration_s": duration_s,
            "rate": rate,
            "native": native,
            "idle": idle,
            "nonblocking": nonblocking,
            "timeout_s": timeout_s,
        },
        processes=processes,
        interrupted=report.interrupted,
    )
    return _finish(result, report.left_stopped + (exposure_warning(out) if out is not None else []))
