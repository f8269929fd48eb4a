"""How GPU activities and collective records of a profiler trace are classified, read from
`kernels.toml`: compute, communication or memory, and each collective's kind and bus-bandwidth factor."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from torchtriage.knowledge.loader import (
    KNOWLEDGE_DIR,
    STRING,
    STRING_TABLE,
    STRINGS,
    TABLE,
    KnowledgeError,
    check_table,
    read_toml,
)

KERNELS_FILE = KNOWLEDGE_DIR / "kernels.toml"
COMPUTE, COMMUNICATION, MEMORY = 0, 1, 2
KIND_NAMES = ("compute", "communication", "memory")
_BUSBW = {"2(n-1)/n", "(n-1)/n", "1", "0"}


@dataclass(frozen=True)
class KernelTable:
    ignore_categories: frozenset
    comm_categories: frozenset
    comm_prefixes: tuple
    comm_substrings: tuple
    memory_categories: frozenset
    memory_prefixes: tuple
    gpu_categories: frozenset
    collective_record_names: frozenset
    backend_prefixes: tuple
    collective_kinds: dict  # alias (lowercase) -> kind
    busbw: dict  # kind -> factor expression
    dtype_bytes: dict

    def classify(self, category: str, name: str) -> int | None:
        """COMPUTE, COMMUNICATION or MEMORY for a GPU activity; None for what is not GPU work."""
        if category in self.ignore_categories or category not in self.gpu_categories:
            return None
        if category in self.comm_categories or name.startswith(self.comm_prefixes):
            return COMMUNICATION
        if any(s in name for s in self.comm_substrings):
            return COMMUNICATION
        if category in self.memory_categories or name.startswith(self.memory_prefixes):
            return MEMORY
        return COMPUTE

    def collective_kind(self, name: str) -> str:
        key = name.lower().removeprefix("nccl:").removeprefix("gloo:").removeprefix("c10d::")
        return self.collective_kinds.get(key, key)

    def busbw_factor(self, kind: str, group_size: int) -> float:
        expr = self.busbw.get(kind, "1")
        n = max(group_size, 1)
        return {"2(n-1)/n": 2 * (n - 1) / n, "(n-1)/n": (n - 1) / n, "0": 0.0}.get(expr, 1.0)


_CLASS_KEYS = {"categories": STRINGS, "kernel_prefixes": STRINGS, "kernel_substrings": STRINGS}


def load_kernel_table(path: Path = KERNELS_FILE) -> KernelTable:
    name = path.name
    data = check_table(
        read_toml(path),
        name,
        {"collectives": TABLE},
        {"ignore": TABLE, "communication": TABLE, "memory": TABLE, "compute": TABLE, "collective_records": TABLE,
         "dtype_bytes": STRING_TABLE},
    )  # fmt: skip
    classes = {
        key: check_table(data.get(key, {}), f"{name} [{key}]", {}, _CLASS_KEYS)
        for key in ("ignore", "communication", "memory", "compute")
    }
    records = check_table(
        data.get("collective_records", {}),
        f"{name} [collective_records]",
        {},
        {"names": STRINGS, "backend_prefixes": STRINGS},
    )
    kinds: dict[str, str] = {}
    busbw: dict[str, str] = {}
    for kind, spec in data["collectives"].items():
        where = f"{name} [collectives.{kind}]"
        check_table(spec, where, {"names": STRINGS}, {"busbw": STRING})
        busbw[kind] = spec.get("busbw", "1")
        if busbw[kind] not in _BUSBW:
            raise KnowledgeError(f"{where}: busbw {busbw[kind]!r} is none of {', '.join(sorted(_BUSBW))}")
        for alias in spec["names"]:
            kinds[alias.lower()] = kind
    comm, memory = classes["communication"], classes["memory"]
    gpu = set(classes["compute"].get("categories", [])) | set(memory.get("categories", []))
    gpu |= set(comm.get("categories", []))
    return KernelTable(
        ignore_categories=frozenset(classes["ignore"].get("categories", [])),
        comm_categories=frozenset(comm.get("categories", [])),
        comm_prefixes=tuple(comm.get("kernel_prefixes", [])),
        comm_substrings=tuple(comm.get("kernel_substrings", [])),
        memory_categories=frozenset(memory.get("categories", [])),
        memory_prefixes=tuple(memory.get("kernel_prefixes", [])),
        gpu_categories=frozenset(gpu),
        collective_record_names=frozenset(records.get("names", ["record_param_comms"])),
        backend_prefixes=tuple(records.get("backend_prefixes", [])),
        collective_kinds=kinds,
        busbw=busbw,
        dtype_bytes={str(k): int(v) for k, v in data.get("dtype_bytes", {}).items()},
    )


@lru_cache(maxsize=1)
def kernel_table() -> KernelTable:
    return load_kernel_table()
