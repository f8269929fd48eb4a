"""What frames mean, read from `frames.toml`: the one decision of "is this the user's code", and the
tables the stack classifier (`analysis.positions`) uses to tell what a rank is doing."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from torchtriage.knowledge.loader import (
    BOOLEAN,
    KNOWLEDGE_DIR,
    STRING,
    STRING_TABLE,
    STRINGS,
    TABLE,
    TABLES,
    KnowledgeError,
    check_table,
    read_toml,
)
from torchtriage.model import CATEGORIES, Frame

FRAMES_FILE = KNOWLEDGE_DIR / "frames.toml"
_STDLIB = frozenset(sys.stdlib_module_names)
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")


@dataclass(frozen=True)
class StackKnowledge:
    library_packages: frozenset[str]
    library_paths: re.Pattern[str]
    collectives: tuple[tuple[tuple[str, ...], dict[str, str]], ...]  # (file suffixes, function -> op)
    generic_collectives: tuple[tuple[tuple[str, ...], dict[str, str]], ...]
    gpu_waits: dict[tuple[str, str], str]  # (file suffix, function) -> the wait's name
    dataloader_path: str
    dataloader_waits: frozenset[str]
    locks: dict[str, frozenset[str]]  # file suffix -> functions
    native_work_wait: re.Pattern[str]
    native_p2p_wait: re.Pattern[str]
    native_c10d: re.Pattern[str]
    native_gpu_wait: re.Pattern[str]
    native_lock: re.Pattern[str]
    native_sleep: re.Pattern[str]
    native_store: re.Pattern[str]
    native_socket: re.Pattern[str]
    backward: tuple[str, frozenset[str]] = ("", frozenset())  # (file suffix, functions) of autograd's backward
    raised_in: tuple[tuple[tuple[str, ...], frozenset[str], str], ...] = ()  # (path fragments, functions, category)
    raised_as: dict[str, str] = field(default_factory=dict)  # exception type (last dotted name) -> category
    # (file suffix, functions, name) of calls every rank must make (frames.toml [[all_rank_calls]])
    all_rank_calls: tuple[tuple[str, frozenset[str], str], ...] = ()

    def holds_all_rank_calls(self, path: str) -> bool:
        """Whether the file is one that holds calls every rank must make."""
        path = "/" + path.replace("\\", "/")
        return any(path.endswith("/" + suffix) for suffix, _, _ in self.all_rank_calls)

    def all_rank_call(self, path: str, function: str) -> str | None:
        """The name of the call every rank must make that this frame is in, or None."""
        path = "/" + path.replace("\\", "/")
        name = function.rsplit(".", 1)[-1]
        for suffix, functions, call in self.all_rank_calls:
            if name in functions and path.endswith("/" + suffix):
                return call
        return None

    def category_raised_as(self, exception: str | None) -> str | None:
        """The category an exception's type implies, or None."""
        return self.raised_as.get((exception or "").rsplit(".", 1)[-1])

    def category_raised_in(self, frames: Sequence[Frame]) -> str | None:
        """The category of the place an exception was raised: the innermost frame (`frames` innermost
        first) in a `raised_in` place, or None."""
        for frame in frames:
            path = "/" + frame.file.replace("\\", "/")
            name = frame.function.rsplit(".", 1)[-1]
            for fragments, functions, category in self.raised_in:
                if any("/" + fragment in path for fragment in fragments) and (not functions or name in functions):
                    return category
        return None

    def is_library_file(self, path: str) -> bool:
        """Library code: installed packages, the standard library, torch; anything else is the user's.

        Full paths are judged by their directories; short names (`torch/cuda/__init__.py`,
        `threading.py`) by their top-level package.
        """
        if not path or (path.startswith("<") and path.endswith(">")):
            return True  # <frozen importlib._bootstrap>, <string>, <unknown> ...
        if path.startswith("/") or _WINDOWS_DRIVE.match(path):
            return bool(self.library_paths.search(path.replace("\\", "/")))
        top = re.split(r"[\\/]", path, maxsplit=1)[0]
        top = top[:-3] if top.endswith(".py") else top
        return top in _STDLIB or top in self.library_packages


def _compile(text: str, where: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as err:
        raise KnowledgeError(f"{where}: {text!r} does not compile: {err}") from None


def load_stack_knowledge(path: Path = FRAMES_FILE) -> StackKnowledge:
    data = check_table(
        read_toml(path),
        path.name,
        {"libraries": TABLE, "collectives": TABLES, "gpu_waits": TABLES, "dataloader": TABLE, "locks": TABLES},
        {"native": TABLE, "raised_in": TABLES, "raised_as": TABLES, "backward": TABLE, "all_rank_calls": TABLES},
    )
    name = path.name
    libraries = check_table(data["libraries"], f"{name} [libraries]", {"packages": STRINGS, "path_patterns": STRINGS})
    collectives: list = []
    generic: list = []  # wrappers around any collective: they decide only where no specific one does
    for index, raw in enumerate(data["collectives"]):
        entry = check_table(
            raw,
            f"{name} [[collectives]] #{index + 1}",
            {"files": STRINGS},
            {"functions": STRINGS, "ops": STRING_TABLE, "generic": BOOLEAN},
        )
        ops = {function: function for function in entry.get("functions", [])} | {
            str(k): str(v) for k, v in entry.get("ops", {}).items()
        }
        (generic if entry.get("generic") else collectives).append((tuple(entry["files"]), ops))
    gpu_waits = {}
    for index, raw in enumerate(data["gpu_waits"]):
        entry = check_table(
            raw, f"{name} [[gpu_waits]] #{index + 1}", {"file": STRING, "function": STRING, "op": STRING}
        )
        gpu_waits[(entry["file"], entry["function"])] = entry["op"]
    dataloader = check_table(data["dataloader"], f"{name} [dataloader]", {"path": STRING, "waiting": STRINGS})
    locks = {}
    for index, raw in enumerate(data["locks"]):
        entry = check_table(raw, f"{name} [[locks]] #{index + 1}", {"file": STRING, "functions": STRINGS})
        locks[entry["file"]] = frozenset(entry["functions"])
    raised_in = []
    for index, raw in enumerate(data.get("raised_in", [])):
        entry = check_table(
            raw, f"{name} [[raised_in]] #{index + 1}", {"files": STRINGS, "category": STRING}, {"functions": STRINGS}
        )
        if entry["category"] not in CATEGORIES:
            raise KnowledgeError(f"{name} [[raised_in]] #{index + 1}: unknown category {entry['category']!r}")
        raised_in.append((tuple(entry["files"]), frozenset(entry.get("functions", [])), entry["category"]))
    raised_as: dict[str, str] = {}
    for index, raw in enumerate(data.get("raised_as", [])):
        entry = check_table(raw, f"{name} [[raised_as]] #{index + 1}", {"exceptions": STRINGS, "category": STRING})
        if entry["category"] not in CATEGORIES:
            raise KnowledgeError(f"{name} [[raised_as]] #{index + 1}: unknown category {entry['category']!r}")
        raised_as |= dict.fromkeys(entry["exceptions"], entry["category"])
    all_rank_calls = []
    for index, raw in enumerate(data.get("all_rank_calls", [])):
        entry = check_table(
            raw, f"{name} [[all_rank_calls]] #{index + 1}", {"file": STRING, "functions": STRINGS, "name": STRING}
        )
        all_rank_calls.append((entry["file"], frozenset(entry["functions"]), entry["name"]))
    backward = check_table(data.get("backward", {"file": "", "functions": []}), f"{name} [backward]",
                           {"file": STRING, "functions": STRINGS})  # fmt: skip
    native_keys = ("work_wait", "p2p_wait", "c10d", "gpu_wait", "lock", "sleep", "store", "socket")
    native = check_table(data.get("native", {}), f"{name} [native]", {k: STRING for k in native_keys})
    where = f"{name} [native]"
    return StackKnowledge(
        library_packages=frozenset(libraries["packages"]),
        library_paths=_compile("|".join(libraries["path_patterns"]), f"{name} [libraries]"),
        collectives=tuple(collectives),
        generic_collectives=tuple(generic),
        gpu_waits=gpu_waits,
        dataloader_path=dataloader["path"],
        dataloader_waits=frozenset(dataloader["waiting"]),
        locks=locks,
        native_work_wait=_compile(native["work_wait"], where),
        native_p2p_wait=_compile(native["p2p_wait"], where),
        native_c10d=_compile(native["c10d"], where),
        native_gpu_wait=_compile(native["gpu_wait"], where),
        native_lock=_compile(native["lock"], where),
        native_sleep=_compile(native["sleep"], where),
        native_store=_compile(native["store"], where),
        native_socket=_compile(native["socket"], where),
        backward=(backward["file"], frozenset(backward["functions"])),
        raised_in=tuple(raised_in),
        raised_as=raised_as,
        all_rank_calls=tuple(all_rank_calls),
    )


@lru_cache(maxsize=1)
def stack_knowledge() -> StackKnowledge:
    return load_stack_knowledge()


def is_library_file(path: str) -> bool:
    """Whether a frame's file is library code (see StackKnowledge.is_library_file)."""
    return stack_knowledge().is_library_file(path)


def is_user_file(path: str) -> bool:
    return not stack_knowledge().is_library_file(path)
