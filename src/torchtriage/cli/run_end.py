"""What `torchtriage run` says once its launcher has ended, and the record it keeps of it (`DIR/run-exit.json`).

Printed last on the job's console, where triage reads them:
- when the hang watchdog wrote a verdict, that verdict itself: category, culprit, confidence and summary (rule
  hang.watchdog_verdict): the signal that ended the stalled job afterwards is its consequence, not its cause. It
  stays out of the run folder: `diagnose DIR` reads the stacks and dumps the verdict was made of, and would count
  their own verdict again as the logs agreeing with them;
- how the launcher ended: it exited 0 (the job finished: knowledge/stall.toml [finished]), exited with another
  code, or died of a signal (rule logs.launcher_ended), after any signal `run` passed on to it. This one is also
  kept in DIR/run-exit.json (schema torchtriage.run_exit/1), which the registry reads as a log: a run folder whose
  logs only stop is known to have finished (sources/run_exit.py).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from torchtriage.protocol import (
    RUN_EXIT_FILE,
    RUN_EXIT_SCHEMA,
    VERDICT_STEM,
    hang_dir,
    recorded_attempts,
    write_whole,
)

_SHOWN_CULPRITS = 32
_SUMMARY_CHARS = 400
_HOST_CHARS = 64


@dataclass(frozen=True)
class LauncherEnd:
    """How the launcher ended."""

    launcher: str  # its program's name ("torchrun"): its arguments may hold what is not ours to keep
    returncode: int  # as subprocess gives it: negative for the signal that ended it
    started: float
    ended: float
    forwarded: tuple[int, ...] = ()  # the signals `run` passed on to it, in order

    @property
    def signal(self) -> str | None:
        return _signal_name(-self.returncode) if self.returncode < 0 else None

    @property
    def exit_code(self) -> int:
        """What `run` returns: the launcher's exit code, or 128 + the signal that ended it, as a shell says it."""
        return self.returncode if self.returncode >= 0 else 128 - self.returncode

    @property
    def sentence(self) -> str:
        if self.signal is not None:
            how = f"the job was ended by a signal: its launcher ({self.launcher}) died of {self.signal}"
        elif self.exit_code != 0:
            how = f"the job failed: its launcher ({self.launcher}) exited with code {self.exit_code}"
        else:
            how = f"the job finished: its launcher ({self.launcher}) exited 0"
        passed = [_signal_name(sig) for sig in dict.fromkeys(self.forwarded)]
        after = f", after torchtriage run passed it {' and '.join(passed)}" if passed else ""
        return f"torchtriage run: {how} after {self.ended - self.started:.1f} s{after}"

    def record(self) -> dict:
        return {
            "schema": RUN_EXIT_SCHEMA,  # first: the registry knows the record by it
            "line": self.sentence,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "forwarded_signals": [_signal_name(sig) for sig in dict.fromkeys(self.forwarded)],
            "launcher": self.launcher,
            "started_at": _utc(self.started),
            "ended_at": _utc(self.ended),
            "seconds": round(self.ended - self.started, 3),
        }


def stall_line(out_dir: Path) -> str | None:
    """The watchdog's verdict in one line, if a stall was diagnosed in the folder (an attempt's); else None. The
    line's form is rule hang.watchdog_verdict's: triage reads it on the job's console."""
    folder = hang_dir(out_dir)
    text = folder / f"{VERDICT_STEM}.txt"
    if not text.exists():
        return None
    headline = _verdict_headline(folder / f"{VERDICT_STEM}.json")
    if headline is None:  # unreadable: the file still says it all
        return f"torchtriage run: a stall was diagnosed: {text}"
    return f"torchtriage run: a stall was diagnosed: {headline}; the verdict and its evidence: {text}"


def _verdict_headline(path: Path) -> str | None:
    """'hang, culprit rank 1 (medium confidence): <summary>; the culprit ran on node-b (pid 4242, GPU 1)' from the
    watchdog's verdict.json, or None."""
    try:
        verdict = json.loads(path.read_text(encoding="utf-8"))
        category, confidence = str(verdict["category"]), str(verdict["confidence"])
        ranks = [int(rank) for rank in verdict["culprit_ranks"]]
        summary = " ".join(str(verdict["summary"]).split())[:_SUMMARY_CHARS]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not ranks:
        who = "culprit not identified"
    else:
        shown = ", ".join(str(rank) for rank in ranks[:_SHOWN_CULPRITS])
        more = f" and {len(ranks) - _SHOWN_CULPRITS} more" if len(ranks) > _SHOWN_CULPRITS else ""
        who = f"culprit rank{'s' if len(ranks) > 1 else ''} {shown}{more}"
    return f"{category}, {who} ({confidence} confidence): {summary}{_where(verdict, ranks)}"


def _where(verdict: dict, ranks: list[int]) -> str:
    """'; the culprit ran on node-b (pid 4242, GPU 1)' for a lone culprit whose machine the verdict names."""
    machines = verdict.get("culprit_machines")
    if len(ranks) != 1 or not isinstance(machines, list) or not machines or not isinstance(machines[0], dict):
        return ""
    machine = machines[0]
    host, pid, gpu = machine.get("host"), machine.get("pid"), machine.get("gpu_index")
    if not isinstance(host, str):
        return ""
    details = [f"pid {pid}" if isinstance(pid, int) else "", f"GPU {gpu}" if isinstance(gpu, int) else ""]
    details = [d for d in details if d]
    shown = " ".join(host.split())[:_HOST_CHARS]
    return f"; the culprit ran on {shown}" + (f" ({', '.join(details)})" if details else "")


def attempts_line(out_dir: Path, first: int) -> str | None:
    """Where each attempt of this run left its files, when there was more than one or earlier runs' come first."""
    ours = {n: folder for n, folder in recorded_attempts(out_dir).items() if n >= first}
    if not ours or (first == 0 and list(ours) == [0]):
        return None
    folders = ", ".join(f"attempt {n}: {folder}" for n, folder in ours.items())
    return (
        f"torchtriage run: the workers ran {len(ours)} time(s), each attempt's files in a folder of its own "
        f"({folders}); torchtriage history {out_dir} compares the attempts"
    )


def forget_earlier_end(out_dir: Path) -> None:
    """Remove the record an earlier run in the same folder left: while this job runs, the folder must not say that
    it finished (a hung job's logs only stop, and a finished run's record would explain them away)."""
    try:
        (out_dir / RUN_EXIT_FILE).unlink()
    except OSError:  # none there; or not ours to remove, which the end's record will say when it cannot replace it
        pass


def say_and_record(out_dir: Path, end: LauncherEnd, first_attempt: int = 0) -> None:
    """Print the watchdog's verdict of each attempt that stalled, if any, and where each attempt's files are when
    the launcher restarted the workers, then how the launcher ended (on stderr, last), and keep the end in
    DIR/run-exit.json: whole or not at all, private like the rest of DIR. A folder that can no longer be written
    costs the record, never the job's exit code."""
    attempts = {n: f for n, f in recorded_attempts(out_dir).items() if n >= first_attempt} or {0: out_dir}
    for folder in attempts.values():
        stall = stall_line(folder)
        if stall is not None:
            print(stall, file=sys.stderr)
    where = attempts_line(out_dir, first_attempt)
    if where is not None:
        print(where, file=sys.stderr)
    print(end.sentence, file=sys.stderr)
    try:
        write_whole(out_dir / RUN_EXIT_FILE, json.dumps(end.record()) + "\n")
    except OSError as err:
        why = err.strerror or err
        print(f"torchtriage run: could not record how the job ended in {out_dir}: {why}", file=sys.stderr)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
