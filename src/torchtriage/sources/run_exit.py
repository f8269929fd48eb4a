"""How a job run under `torchtriage run` ended: the record its run folder keeps (`DIR/run-exit.json`).

`torchtriage run` writes one record once its launcher has ended (cli/run_end.py): the launcher's exit code, or the
signal that ended it, and when it started and ended. The record holds, in `line`, the sentence `run` printed last,
so the registry reads the file as a log and the rules read that sentence (logs.launcher_ended). Here the record is
read as data, for what no sentence can say of another log: that a job whose logs only stop ran to its end.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchtriage.protocol import RUN_EXIT_SCHEMA
from torchtriage.sources.fields import as_int, as_text, strict_json
from torchtriage.sources.log_records import LogTail


@dataclass(frozen=True)
class RunExit:
    """One job's end, as `torchtriage run` saw it."""

    file: str
    exit_code: int  # what `run` returned: the launcher's exit code, or 128 + the signal that ended it
    signal: str | None  # the signal that ended the launcher ("SIGKILL"), if one did
    sentence: str  # the line `run` printed last

    @property
    def finished(self) -> bool:
        """The launcher exited 0: the job ran to its end."""
        return self.exit_code == 0 and self.signal is None


def run_exit_of(tail: LogTail) -> RunExit | None:
    """The end of a run that a log's tail records, when the log is `run`'s record."""
    last = tail.last_own_record
    if last is None:
        return None
    try:
        record = strict_json(last)
    except ValueError:
        return None  # cut off or hand-edited: the log reader says so
    if not isinstance(record, dict) or record.get("schema") != RUN_EXIT_SCHEMA:
        return None
    code = as_int(record.get("exit_code"), -1, 0, 255)
    if code < 0:
        return None
    signal = as_text(record.get("signal"), limit=32) or None
    return RunExit(tail.file, code, signal, as_text(record.get("line"), limit=500))


def run_exits(tails: list[LogTail]) -> list[RunExit]:
    """The ends of the runs whose records are among the logs read."""
    return [found for found in map(run_exit_of, tails) if found is not None]
