"""py-spy `dump` output, text or `--json`, as plain records: processes, threads, frames.

The text form (py-spy's src/dump.rs) is, per process:

    Process 4242: /usr/bin/python3 -u train.py
    Python v3.11.7 (/usr/bin/python3.11)
    Parent Process 4200: torchrun ...            (only with --subprocesses)

    Thread 4242 (idle): "MainThread"             (id: the OS thread id, or 0x... without one;
        all_reduce (torch/distributed/distributed_c10d.py:3252)      status: idle|active|active+gil)
            Arguments:                           (only with --locals)
                tensor: <Tensor at 0x7f...>
        0x7f56ea81488e (libcuda.so.580.159.04)   (a native frame, with --native: no line number)

`--subprocesses` separates processes with a line of dashes. The JSON form is a list of threads:
`{pid, thread_id, thread_name, os_thread_id, active, owns_gil, frames: [{name, filename, module,
short_filename, line, locals: [{name, addr, arg, repr}] | null, is_entry, ...}], process_info}`; it
has no command line or Python version, and gives full file names where the text gives short ones.

Frames are kept **innermost first**, the order py-spy prints them in both forms: `frames[0]` is where
the thread is now, `frames[-1]` its entry point.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace

from torchtriage.errors import InputError
from torchtriage.model import Frame, Local
from torchtriage.sources.fields import as_int, as_text, describe, json_reason
from torchtriage.sources.lines import strip_ansi
from torchtriage.sources.registry import rank_from_name
from torchtriage.sources.streams import read_input

_JSON_START = re.compile(r"\s*\[\s*([{\]]|$)")
_PROCESS = re.compile(r"^Process (\d+): ?(.*)$")
_PYTHON = re.compile(r"^Python v(\S+)(?: \((.*)\))?$")
_PARENT = re.compile(r"^Parent Process (\d+): ?(.*)$")
_THREAD = re.compile(r'^Thread (0[xX][0-9a-fA-F]+|\d+) \(([a-z+]+)\)(?:: "(.*)")?$')
# The name may hold spaces and parentheses (C++ symbols); the file part is the last "(...)".
_FRAME = re.compile(r"^ {4}(\S.*?) \(([^()]*?)(?::(\d+))?\)$")
_LOCALS_HEADER = re.compile(r"^ {8}(Arguments|Locals)::?$")
_LOCAL = re.compile(r"^ {12}([^:]+): ?(.*)$")
_SEPARATOR = re.compile(r"^-{10,}$")
_NATIVE_SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".cu", ".h", ".hpp", ".rs", ".S")


@dataclass(frozen=True)
class ThreadStack:
    thread_id: int  # the OS thread id when py-spy knows it (as it prints), else the Python thread id
    name: str | None
    active: bool  # False: py-spy saw the thread idle (blocked in a system call)
    owns_gil: bool
    frames: tuple[Frame, ...]  # innermost first
    os_thread_id: int | None = None
    state_known: bool = True  # py-spy says idle or active; a faulthandler dump does not

    @property
    def python_frames(self) -> tuple[Frame, ...]:
        return tuple(f for f in self.frames if not f.native)


@dataclass(frozen=True)
class ProcessStack:
    pid: int
    source: str  # the file it was read from
    threads: tuple[ThreadStack, ...]
    command: str | None = None  # text form only
    python_version: str | None = None  # text form only
    python_executable: str | None = None  # text form only
    parent_pid: int | None = None
    has_native_frames: bool = False
    has_full_paths: bool = False  # JSON: `file` is a full path, so library files are known for sure

    def main_thread(self) -> ThreadStack | None:
        """The thread named MainThread, else the one whose OS id is the pid, else the first."""
        for thread in self.threads:
            if thread.name == "MainThread":
                return thread
        for thread in self.threads:
            if thread.os_thread_id == self.pid or thread.thread_id == self.pid:
                return thread
        return self.threads[0] if self.threads else None


def _is_native(file: str, line: int) -> bool:
    if file.endswith((".py", ".pyw")) or file.startswith("<"):
        return False
    return line == 0 or file.endswith(_NATIVE_SOURCE_SUFFIXES)


def _decode(data: bytes | str, source: str) -> str:
    if isinstance(data, str):
        text = data
    else:
        if b"\x00" in data[:8192]:
            raise InputError(f"{source}: this is a binary file, not py-spy dump output (text or --json)")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError(
                f"{source}: not UTF-8 text at byte {err.start}; expected the output of `py-spy dump`"
            ) from None
    if not text.strip():
        raise InputError(f"{source}: the file is empty; re-run `py-spy dump --pid PID > {source}` while the job hangs")
    return text


def parse_dump(data: bytes | str, source: str = "<input>") -> list[ProcessStack]:
    """Parse py-spy dump output in either form (JSON: a `.json` name, or a list of objects)."""
    text = _decode(data, source)
    if source.endswith(".json") or _JSON_START.match(text):
        return parse_json(text, source)
    return parse_text(text, source)


def read_dump(path: str | os.PathLike) -> list[ProcessStack]:
    return parse_dump(read_input(str(path), "the dump"), str(path))


class _TextParser:
    def __init__(self, text: str, source: str) -> None:
        self.lines = strip_ansi(text).splitlines()
        self.truncated_tail = not text.endswith(("\n", "\r"))
        self.source = source
        self.processes: list[ProcessStack] = []

    def fail(self, number: int, what: str) -> InputError:
        line = self.lines[number - 1] if 0 < number <= len(self.lines) else ""
        cut = " (the file looks truncated)" if number == len(self.lines) and self.truncated_tail else ""
        return InputError(f"{self.source}:{number}: {what}{cut}: {line.strip()[:120]!r}")

    def parse(self) -> list[ProcessStack]:
        first = next((i for i, line in enumerate(self.lines) if line.strip()), None)
        head = self.lines[first].strip()
        if head.startswith("Error:") or head.startswith("error:"):
            raise InputError(f"{self.source}: py-spy failed instead of dumping stacks: {head[:300]}")
        if not _PROCESS.match(head):
            raise self.fail(
                first + 1, "not py-spy dump output: expected 'Process <pid>: <command>' (or '[' for --json)"
            )
        index = first
        while index < len(self.lines):
            line = self.lines[index].rstrip()
            if not line or _SEPARATOR.match(line):
                index += 1
            elif _PROCESS.match(line):
                index = self._process(index)
            else:
                raise self.fail(index + 1, "expected 'Process <pid>: <command>'")
        return self.processes

    def _process(self, index: int) -> int:
        pid_text, command = _PROCESS.match(self.lines[index].rstrip()).groups()
        header_line = index + 1
        index += 1
        version = executable = parent = None
        while index < len(self.lines):
            line = self.lines[index].rstrip()
            if m := _PYTHON.match(line):
                version, executable = m.groups()
            elif m := _PARENT.match(line):
                parent = as_int(m.group(1), None)
            elif line:
                break
            index += 1
        if version is None:
            raise self.fail(min(header_line + 1, len(self.lines)), "expected 'Python v<version> (<executable>)'")
        threads: list[ThreadStack] = []
        native = False
        while index < len(self.lines):
            line = self.lines[index].rstrip()
            if not line:
                index += 1
                continue
            m = _THREAD.match(line)
            if not m:
                break
            thread, index = self._thread(m, index + 1)
            native = native or any(f.native for f in thread.frames)
            threads.append(thread)
        if not threads:
            raise self.fail(min(index + 1, len(self.lines)), "no 'Thread <id> (<status>)' stack after the header")
        self.processes.append(
            ProcessStack(
                pid=int(pid_text),
                source=self.source,
                threads=tuple(threads),
                command=command or None,
                python_version=version,
                python_executable=executable,
                parent_pid=parent,
                has_native_frames=native,
            )
        )
        return index

    def _thread(self, header: re.Match, index: int) -> tuple[ThreadStack, int]:
        ident, status, name = header.groups()
        tokens = set(status.split("+"))
        if not tokens <= {"idle", "active", "gil"}:
            raise self.fail(index, f"unknown thread status {status!r} (py-spy prints idle, active or active+gil)")
        frames: list[Frame] = []
        locals_: list[Local] = []
        is_argument = False
        while index < len(self.lines):
            line = self.lines[index].rstrip()
            if m := _FRAME.match(line):
                self._attach_locals(frames, locals_)
                function, file, number = m.groups()
                line_no = int(number) if number else 0
                frames.append(Frame(file, line_no, function, _is_native(file, line_no), printed_at=index + 1))
            elif m := _LOCALS_HEADER.match(line):
                is_argument = m.group(1) == "Arguments"
            elif frames and (m := _LOCAL.match(line)):
                locals_.append(Local(m.group(1).strip(), m.group(2), is_argument))
            elif line.startswith(" "):
                raise self.fail(index + 1, "not a frame line ('    <function> (<file>:<line>)')")
            else:
                break
            index += 1
        self._attach_locals(frames, locals_)
        thread_id = int(ident, 16) if ident.lower().startswith("0x") else int(ident)
        thread = ThreadStack(
            thread_id=thread_id,
            name=name,
            active="idle" not in tokens,
            owns_gil="gil" in tokens,
            frames=tuple(frames),
            # py-spy prints the OS thread id in decimal when it has one, the Python id in hex otherwise.
            os_thread_id=None if ident.lower().startswith("0x") else thread_id,
        )
        return thread, index

    @staticmethod
    def _attach_locals(frames: list[Frame], locals_: list[Local]) -> None:
        if frames and locals_:
            frames[-1] = replace(frames[-1], locals=tuple(locals_))
            locals_.clear()


def parse_text(text: str, source: str = "<input>") -> list[ProcessStack]:
    """Parse `py-spy dump` text output (with or without --native, --locals, --subprocesses)."""
    return _TextParser(_decode(text, source), source).parse()


def parse_json(text: str, source: str = "<input>") -> list[ProcessStack]:
    """Parse `py-spy dump --json` output: a list of threads, grouped here into processes by pid."""
    text = _decode(text, source)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        at_end = err.pos >= len(text.rstrip()) - 1
        why = "it ends before the JSON does (truncated?)" if at_end else f"malformed JSON: {err.msg}"
        raise InputError(f"{source}:{err.lineno}: {why}; expected the output of `py-spy dump --json`") from None
    except (ValueError, RecursionError) as err:
        raise InputError(f"{source}: {json_reason(err)}; expected the output of `py-spy dump --json`") from None
    if not isinstance(data, list) or not data:
        raise InputError(f"{source}: expected a non-empty JSON list of threads, as `py-spy dump --json` writes")
    by_pid: dict[int, list[ThreadStack]] = {}
    commands: dict[int, str] = {}
    for position, item in enumerate(data):
        pid, thread, command = _json_thread(item, source, position)
        by_pid.setdefault(pid, []).append(thread)
        if command:
            commands.setdefault(pid, command)
    return [
        ProcessStack(
            pid=pid,
            source=source,
            threads=tuple(threads),
            command=commands.get(pid),
            has_native_frames=any(f.native for t in threads for f in t.frames),
            has_full_paths=True,
        )
        for pid, threads in by_pid.items()
    ]


def _json_int(value: object, where: str, name: str) -> int:
    number = as_int(value, -1, 0)
    if number < 0:
        raise InputError(f"{where}: {name!r} is {describe(value)}, not a number; is this `py-spy dump --json` output?")
    return number


def _json_text(value: object, where: str, name: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"{where}: {name!r} is {describe(value)}, not text; is this `py-spy dump --json` output?")
    return as_text(value)


def _json_locals(frame: dict, where: str) -> tuple[Local, ...]:
    found = frame.get("locals") or ()
    if not isinstance(found, (list, tuple)) or not all(isinstance(v, dict) for v in found):
        raise InputError(f"{where}: 'locals' is {describe(found)}, not a list of variables")
    return tuple(Local(as_text(v.get("name"), "?"), _repr_of(v), bool(v.get("arg"))) for v in found)


def _repr_of(variable: dict) -> str | None:
    shown = variable.get("repr")
    return as_text(shown) if shown is not None else None


def _json_thread(item: object, source: str, position: int) -> tuple[int, ThreadStack, str | None]:
    where = f"{source}: thread #{position}"
    if not isinstance(item, dict):
        raise InputError(f"{where}: expected an object with pid, thread_id and frames, found {describe(item)}")
    missing = [key for key in ("pid", "thread_id", "frames") if key not in item]
    if missing:
        raise InputError(f"{where}: missing {', '.join(missing)}; is this `py-spy dump --json` output?")
    if not isinstance(item["frames"], list):
        raise InputError(f"{where}: 'frames' is {describe(item['frames'])}, not a list")
    frames = []
    for index, frame in enumerate(item["frames"]):
        at = f"{where}, frame #{index}"
        if not isinstance(frame, dict) or "name" not in frame or "filename" not in frame:
            raise InputError(f"{at}: expected an object with name and filename")
        line = _json_int(frame.get("line") or 0, at, "line")
        file = _json_text(frame["filename"], at, "filename")
        # Native frames name their shared library as the module; Python frames have none.
        native = frame.get("module") is not None or _is_native(file, line)
        short = frame.get("short_filename")
        short = _json_text(short, at, "short_filename") if short is not None else None
        frames.append(Frame(file, line, _json_text(frame["name"], at, "name"), native, short, _json_locals(frame, at)))
    info = item.get("process_info")
    command = info.get("command_line") if isinstance(info, dict) else None
    name = item.get("thread_name")
    os_thread = item.get("os_thread_id")
    thread = ThreadStack(
        thread_id=_json_int(item["thread_id"], where, "thread_id"),
        name=_json_text(name, where, "thread_name") if name is not None else None,
        active=bool(item.get("active", True)),
        owns_gil=bool(item.get("owns_gil", False)),
        frames=tuple(frames),
        os_thread_id=_json_int(os_thread, where, "os_thread_id") if os_thread is not None else None,
    )
    return _json_int(item["pid"], where, "pid"), thread, command if isinstance(command, str) else None


def read_rank_dump(path: str | os.PathLike, rank: int | None = None) -> tuple[int, ProcessStack]:
    """One rank's dump: the rank from `rank` or the file name (rank03.txt, pyspy_rank3.json)."""
    rank = rank_from_name(str(path)) if rank is None else rank
    if rank is None:
        raise InputError(f"{path}: cannot tell which rank this dump is; name it rank<N>.txt or rank<N>.json")
    processes = read_dump(path)
    if len(processes) != 1:
        pids = ", ".join(str(p.pid) for p in processes)
        raise InputError(f"{path}: holds {len(processes)} processes ({pids}); dump each rank into its own file")
    return rank, processes[0]
