"""`torchtriage doctor`: what breaks distributed jobs before they start, one line per check.

`gather_facts` is the only reader (environment, /proc, statvfs, rlimits, torch imported lazily,
nvidia-smi with a timeout); every `check_*` is a pure function of the facts dict, tested on data. The
facts are plain JSON so that `--ranks` can all-gather them and name the ranks that differ.
"""

from __future__ import annotations

import os
import platform
import re
import resource
import shutil
import socket
import sys
import tempfile
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from torchtriage import __version__

SCHEMA = "torchtriage.doctor/1"
OK, WARN, FAIL = "ok", "warn", "fail"
_RANK = {OK: 0, WARN: 1, FAIL: 2}

AF_UNIX_PATH_MAX = 108  # sun_path, bytes, including the terminating NUL
# Names that torch / multiprocessing / NCCL put under TMPDIR (`/pymp-xxxxxxxx/listener-xxxxxxxx`, ...)
# take about 33 bytes: a TMPDIR longer than this leaves no room.
TMPDIR_MAX = 75
TMPDIR_WARN = 60
SHM_FAIL_BYTES = 256 << 20  # Docker's default is 64 MiB: NCCL's shared-memory transport fails to extend it
SHM_WARN_BYTES = 1 << 30
NOFILE_WARN = 65536
DISK_FAIL_BYTES = 1 << 30
DISK_WARN_BYTES = 10 << 30

# Environment variables that matter, with what they do (prefixes end with "_").
ENV_MEANING = {
    "NCCL_DEBUG": "NCCL log level (INFO shows transports and topology at init)",
    "NCCL_DEBUG_SUBSYS": "which NCCL subsystems log (INIT,NET for transport problems)",
    "NCCL_SOCKET_IFNAME": "network interfaces NCCL's bootstrap and socket transport may use",
    "NCCL_IB_DISABLE": "1 disables InfiniBand/RoCE: inter-node traffic falls back to TCP sockets",
    "NCCL_P2P_DISABLE": "1 disables GPU peer-to-peer (NVLink/PCIe P2P): intra-node traffic goes through host memory",
    "NCCL_SHM_DISABLE": "1 disables the shared-memory transport",
    "NCCL_NVLS_ENABLE": "NVLink SHARP (multicast) collectives",
    "NCCL_CUMEM_ENABLE": "NCCL buffers through cuMem (needed for some weight-sync setups)",
    "NCCL_TIMEOUT": "NCCL's own timeout for some operations",
    "NCCL_ASYNC_ERROR_HANDLING": "deprecated name of TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT": "deprecated name of TORCH_NCCL_BLOCKING_WAIT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "what the watchdog does on a timeout or error (0: nothing, the job hangs)",
    "TORCH_NCCL_BLOCKING_WAIT": "1 makes wait() block and raise on timeout (slower; for debugging)",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "flight-recorder entries per rank (0 or unset: flight recorder off)",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1 writes the flight recorder when the watchdog fires",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "path prefix of the flight-recorder dumps",
    "TORCH_NCCL_ENABLE_MONITORING": "the heartbeat monitor that kills a rank whose watchdog is stuck",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "how long the monitor waits for a stuck watchdog",
    "TORCH_NCCL_ENABLE_TIMING": "1 records when each collective began on the GPU: the flight recorder then tells a "
    "rank whose GPU never began one (costs a few % of short steps)",
    "TORCH_FR_BUFFER_SIZE": "flight-recorder entries per rank (newer name)",
    "TORCH_FR_DUMP_TEMP_FILE": "path prefix of the flight-recorder dumps (newer name)",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL checks that every rank calls the same collective with the same shapes",
    "TORCH_SHOW_CPP_STACKTRACES": "C++ stacks in errors",
    "CUDA_DEVICE_MAX_CONNECTIONS": "hardware work queues per device; 1 orders communication before compute "
    "(Megatron TP overlap, DeepEP need it set before CUDA starts)",
    "CUDA_VISIBLE_DEVICES": "which GPUs this process sees",
    "CUDA_LAUNCH_BLOCKING": "1 makes every kernel launch synchronous (debugging only: very slow)",
    "PYTORCH_CUDA_ALLOC_CONF": "the caching allocator's settings (expandable_segments:True reduces fragmentation)",
    "DIST_NCCL_TIMEOUT_MINUTES": "the collective watchdog timeout used by launchers that read it",
    "DIST_STORE_TIMEOUT_HOURS": "the c10d store wait timeout used by launchers that read it",
    "MASTER_ADDR": "rendezvous host",
    "MASTER_PORT": "rendezvous port",
    "WORLD_SIZE": "number of ranks",
    "OMP_NUM_THREADS": "CPU threads per rank",
    "GLOO_SOCKET_IFNAME": "network interface of the gloo backend",
    "TMPDIR": "where sockets, dumps and temporary files go",
}
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_FR_", "DIST_")
# Per-rank by nature: never reported as a difference between ranks.
PER_RANK_ENV = {"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "CUDA_VISIBLE_DEVICES", "TORCHELASTIC_RUN_ID"}
ALLOC_CONF_KEYS = {
    "backend",
    "max_split_size_mb",
    "roundup_power2_divisions",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "expandable_segments",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
}


@dataclass
class Check:
    name: str
    status: str
    message: str
    fix: str = ""


# ---------------------------------------------------------------------------------------------------
# Reading the facts (the only side effects)


def _statvfs(path: str) -> dict[str, int] | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return {"total": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}


def _limit(kind: int) -> list[int | None]:
    soft, hard = resource.getrlimit(kind)
    return [None if v == resource.RLIM_INFINITY else v for v in (soft, hard)]


def _torch_facts() -> dict[str, Any]:
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - a broken install is a fact to report, not a crash
        return {"installed": False, "error": f"{type(err).__name__}: {err}"[:300]}
    facts: dict[str, Any] = {"installed": True, "version": torch.__version__, "cuda": torch.version.cuda}
    try:
        # device_count() asks NVML when it can and creates no CUDA context: safe beside a job.
        facts["device_count"] = torch.cuda.device_count()
    except Exception as err:  # noqa: BLE001
        facts["device_count_error"] = str(err)[:200]
    try:
        version = torch.cuda.nccl.version() if torch.cuda.is_available() or torch.version.cuda else None
        facts["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else version
    except Exception as err:  # noqa: BLE001
        facts["nccl_error"] = str(err)[:200]
    facts["distributed"] = bool(torch.distributed.is_available())
    return facts


def _topology() -> dict[str, Any]:
    from torchtriage.collect.nvidia import run_smi
    from torchtriage.errors import EnvironmentProblem
    from torchtriage.sources.nvlink import parse_topology

    if shutil.which("nvidia-smi") is None:
        return {"available": False, "error": "nvidia-smi is not on PATH"}
    try:
        names = [n.strip() for n in run_smi(["--query-gpu=name", "--format=csv,noheader"], 15).splitlines()]
        matrix = parse_topology(run_smi(["topo", "-m"], 15))
    except EnvironmentProblem as err:
        return {"available": False, "error": str(err)}
    return {"available": True, "gpus": [n for n in names if n], "matrix": matrix}


def _pyspy() -> dict[str, Any]:
    from torchtriage.collect import preflight
    from torchtriage.collect.pyspy import find_py_spy, py_spy_version
    from torchtriage.errors import EnvironmentProblem

    facts: dict[str, Any] = {}
    try:
        path = find_py_spy()
        facts.update(path=path, version=py_spy_version(path))
    except EnvironmentProblem as err:
        facts.update(path=None, error=str(err))
    try:
        decision = preflight.decide(preflight.read_facts([]))
        facts.update(ptrace_allowed=decision.allowed, ptrace_reason=decision.reason, ptrace_fix=decision.fix)
    except OSError as err:
        facts.update(ptrace_allowed=None, ptrace_reason=f"cannot read /proc: {err}")
    return facts


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def gather_facts(env: dict[str, str] | None = None, with_torch: bool = True, with_gpus: bool = True) -> dict:
    env = dict(os.environ if env is None else env)
    tmpdir = tempfile.gettempdir()
    dump_prefix = env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or env.get("TORCH_FR_DUMP_TEMP_FILE")
    dump_dir = str(Path(dump_prefix).parent) if dump_prefix else tmpdir
    return {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "torchtriage": __version__,
        "torch": _torch_facts() if with_torch else None,
        "topology": _topology() if with_gpus else None,
        "pyspy": _pyspy(),
        "env": {k: v for k, v in sorted(env.items()) if k in ENV_MEANING or k.startswith(ENV_PREFIXES)},
        "tmpdir": tmpdir,
        "shm": _statvfs("/dev/shm"),
        "port_range": _read("/proc/sys/net/ipv4/ip_local_port_range"),
        "nofile": _limit(resource.RLIMIT_NOFILE),
        "memlock": _limit(resource.RLIMIT_MEMLOCK),
        "rdma_devices": sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir("/sys/class/infiniband") else [],
        "net_interfaces": sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else None,
        "dump_dir": dump_dir,
        "dump_dir_exists": os.path.isdir(dump_dir),
        "dump_dir_writable": os.access(dump_dir, os.W_OK),
        "dump_disk": _statvfs(dump_dir),
    }


# ---------------------------------------------------------------------------------------------------
# Checks: pure functions of the facts


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def check_torch(facts: dict) -> list[Check]:
    torch = facts.get("torch")
    if torch is None:
        return []
    if not torch.get("installed"):
        return [
            Check(
                "torch",
                WARN,
                f"torch is not importable in this Python ({torch.get('error', 'not installed')})",
                f"run doctor with the job's Python ({facts.get('executable')} is not it), or "
                "`pip install torch`; the other checks below still apply",
            )
        ]
    checks = [Check("torch", OK, f"torch {torch['version']}")]
    if not torch.get("cuda"):
        checks.append(
            Check(
                "cuda",
                WARN,
                "this torch build has no CUDA (CPU only): NCCL is unavailable",
                "install a CUDA build of torch (https://pytorch.org/get-started/locally/)",
            )
        )
    else:
        count = torch.get("device_count")
        status = OK if count else WARN
        fix = "" if count else "check CUDA_VISIBLE_DEVICES and the container's GPU runtime (`--gpus all`)"
        checks.append(Check("cuda", status, f"CUDA {torch['cuda']}, {count} visible GPU(s)", fix))
        nccl = torch.get("nccl")
        checks.append(
            Check("nccl", OK, f"NCCL {nccl}")
            if nccl
            else Check("nccl", WARN, f"NCCL version unknown ({torch.get('nccl_error', 'not reported')})")
        )
    return checks


def check_topology(facts: dict) -> list[Check]:
    topo = facts.get("topology")
    if topo is None:
        return []
    if not topo.get("available"):
        return [
            Check(
                "gpus",
                WARN,
                f"GPU topology not read: {topo.get('error')}",
                "run on a GPU node; without nvidia-smi NVLink and PCIe paths cannot be checked",
            )
        ]
    gpus, matrix = topo.get("gpus", []), topo.get("matrix", {})
    names = sorted(set(gpus))
    message = f"{len(gpus)} GPU(s): {', '.join(names) or 'none'}"
    if len(names) > 1:
        return [Check("gpus", WARN, message + " (mixed models: the slowest sets the pace)")]
    paths = {cell for row in matrix.values() for cell in row.values()}
    nv = sorted(p for p in paths if p.startswith("NV"))
    slow = sorted(p for p in paths if not p.startswith("NV"))
    if nv and slow:
        pairs = [
            f"{a}-{b}:{c}" for a, row in matrix.items() for b, c in row.items() if not c.startswith("NV") and a < b
        ]
        return [
            Check(
                "topology",
                WARN,
                f"{message}; some GPU pairs have no NVLink ({', '.join(pairs[:6])})",
                "check `torchtriage nvlink` for links down; NCCL rings over PCIe/SYS pairs run far slower",
            ),
        ]
    link = f"NVLink ({', '.join(nv)})" if nv else (f"PCIe/host ({', '.join(slow)})" if slow else "single GPU")
    return [Check("topology", OK, f"{message}; GPU-to-GPU: {link}")]


def check_pyspy(facts: dict) -> list[Check]:
    spy = facts.get("pyspy") or {}
    checks = []
    if spy.get("path"):
        checks.append(Check("py-spy", OK, f"{spy.get('version') or 'py-spy'} at {spy['path']}"))
    else:
        checks.append(
            Check(
                "py-spy",
                WARN,
                "py-spy not found: `torchtriage dump/diagnose` cannot read stacks",
                (spy.get("error") or "pip install py-spy").split("; ", 1)[-1],
            )
        )
    if spy.get("ptrace_allowed") is False:
        checks.append(
            Check("ptrace", WARN, f"ptrace not permitted: {spy.get('ptrace_reason')}", spy.get("ptrace_fix") or "")
        )
    elif spy.get("ptrace_allowed"):
        checks.append(Check("ptrace", OK, "ptrace permitted (py-spy can attach to ranks of this user)"))
    return checks


def _positive_number(value: str) -> bool:
    try:
        return float(value) >= 1
    except ValueError:
        return False


def _interface_matches(spec: str, interfaces: list[str]) -> bool:
    """NCCL_SOCKET_IFNAME semantics: `^a,b` excludes, `=a` is exact, otherwise each entry is a prefix."""
    spec = spec.strip()
    if spec.startswith("^"):
        excluded = [s for s in spec[1:].split(",") if s]
        return any(not any(i.startswith(e) for e in excluded) for i in interfaces)
    exact = spec.startswith("=")
    wanted = [s for s in spec.lstrip("=").split(",") if s]
    return any((i == w if exact else i.startswith(w)) for w in wanted for i in interfaces)


def check_env(facts: dict) -> list[Check]:
    env: dict[str, str] = facts.get("env") or {}
    checks = []
    for name, value in env.items():
        meaning = ENV_MEANING.get(name, "")
        status, fix = OK, ""
        if name in ("NCCL_ASYNC_ERROR_HANDLING", "NCCL_BLOCKING_WAIT"):
            status, fix = WARN, f"rename it TORCH_{name}: torch ignores the old name"
        elif name == "TORCH_NCCL_ASYNC_ERROR_HANDLING" and value.strip() == "0":
            status, fix = WARN, "unset it (default 3): with 0 a failed collective hangs every rank instead of aborting"
        elif name in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE") and value.strip() == "1":
            status, fix = WARN, "unset it unless you are working around a known fault: it forces a slower transport"
        elif name == "CUDA_LAUNCH_BLOCKING" and value.strip() == "1":
            status, fix = WARN, "unset it outside debugging: every kernel launch waits for completion"
        elif name in ("DIST_NCCL_TIMEOUT_MINUTES", "DIST_STORE_TIMEOUT_HOURS") and not _positive_number(value):
            status, fix = FAIL, f"set {name} to a number >= 1 (0, negative or text disarms or breaks the timeout)"
        elif name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") and facts.get("net_interfaces") is not None:
            if not _interface_matches(value, facts["net_interfaces"]):
                status = FAIL
                fix = (
                    f"no interface here matches {value!r} (have: {', '.join(facts['net_interfaces'])}); fix or unset it"
                )
        elif name == "PYTORCH_CUDA_ALLOC_CONF":
            keys = [part.split(":", 1)[0].strip() for part in re.split(r"[,;]", value) if part.strip()]
            unknown = [k for k in keys if k not in ALLOC_CONF_KEYS]
            if unknown:
                status, fix = FAIL, f"unknown key(s) {', '.join(unknown)}: torch raises at the first CUDA allocation"
        elif name == "CUDA_DEVICE_MAX_CONNECTIONS" and value.strip() != "1":
            status, fix = WARN, "set it to 1 for TP communication overlap or DeepEP (before CUDA starts)"
        checks.append(Check(f"env {name}", status, f"{name}={value}" + (f"  ({meaning})" if meaning else ""), fix))
    fr = env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or env.get("TORCH_FR_BUFFER_SIZE")
    if not fr or fr.strip() == "0":
        checks.append(
            Check(
                "flight recorder",
                WARN,
                "off: after a hang there will be no record of which collective each rank was in",
                "export TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 (or use `torchtriage run`)",
            )
        )
    return checks


def check_tmpdir(facts: dict) -> list[Check]:
    tmpdir = facts.get("tmpdir") or ""
    size = len(tmpdir.encode())
    message = f"TMPDIR {tmpdir} ({size} bytes; AF_UNIX socket paths are limited to {AF_UNIX_PATH_MAX})"
    fix = "export TMPDIR=/tmp (or another short path)"
    if size > TMPDIR_MAX:
        return [Check("tmpdir", FAIL, message + ": too long, sockets under it fail with `AF_UNIX path too long`", fix)]
    if size > TMPDIR_WARN:
        return [Check("tmpdir", WARN, message + ": close to the limit once torch adds its names", fix)]
    return [Check("tmpdir", OK, message)]


def check_shm(facts: dict) -> list[Check]:
    shm = facts.get("shm")
    fix = (
        "give the container more: `docker run --shm-size=16g` (or --ipc=host); "
        "Kubernetes: an emptyDir with medium: Memory"
    )
    if not shm:
        return [
            Check(
                "/dev/shm",
                FAIL,
                "/dev/shm is missing: NCCL's shared-memory transport and DataLoader workers need it",
                fix,
            )
        ]
    message = f"/dev/shm {_gib(shm['total'])} ({_gib(shm['free'])} free)"
    if shm["total"] < SHM_FAIL_BYTES:
        return [Check("/dev/shm", FAIL, message + ": too small for NCCL (`failed to extend /dev/shm`)", fix)]
    if shm["total"] < SHM_WARN_BYTES or shm["free"] < SHM_FAIL_BYTES:
        return [Check("/dev/shm", WARN, message + ": tight for NCCL plus DataLoader workers", fix)]
    return [Check("/dev/shm", OK, message)]


def check_ports(facts: dict) -> list[Check]:
    text = facts.get("port_range")
    if not text:
        return [Check("ports", WARN, "ephemeral port range not readable (/proc/sys/net/ipv4/ip_local_port_range)")]
    try:
        low, high = (int(x) for x in text.split())
    except ValueError:
        return [Check("ports", WARN, f"ephemeral port range unreadable: {text!r}")]
    message = f"ephemeral ports {low}-{high} ({high - low + 1})"
    fix = 'sudo sysctl net.ipv4.ip_local_port_range="32768 60999"'
    master = (facts.get("env") or {}).get("MASTER_PORT", "")
    if master.isdigit() and low <= int(master) <= high:
        return [
            Check(
                "ports",
                WARN,
                f"{message}; MASTER_PORT {master} is inside it and can be taken by another connection",
                "choose a MASTER_PORT below " + str(low),
            )
        ]
    if high - low + 1 < 10000:
        return [Check("ports", WARN, message + ": few ports for many ranks' connections", fix)]
    return [Check("ports", OK, message)]


def check_limits(facts: dict) -> list[Check]:
    checks = []
    soft, hard = facts.get("nofile") or [None, None]
    if soft is not None and soft < NOFILE_WARN:
        checks.append(
            Check(
                "open files",
                WARN,
                f"open-file limit {soft} (hard {hard if hard is not None else 'unlimited'}):"
                " many ranks, sockets and DataLoader workers exhaust it (`Too many open files`)",
                f"ulimit -n {hard}"
                if hard is not None and hard > soft
                else "raise the hard limit (/etc/security/limits.conf, or docker --ulimit nofile=1048576), "
                "then ulimit -n 1048576",
            )
        )
    else:
        checks.append(Check("open files", OK, f"open-file limit {soft if soft is not None else 'unlimited'}"))
    soft, _ = facts.get("memlock") or [None, None]
    rdma = facts.get("rdma_devices") or []
    if soft is not None and rdma:
        checks.append(
            Check(
                "locked memory",
                WARN,
                f"locked-memory limit {soft} bytes with RDMA devices "
                f"({', '.join(rdma)}): NCCL's InfiniBand/EFA transport cannot register its buffers",
                "ulimit -l unlimited (docker: --ulimit memlock=-1)",
            )
        )
    else:
        checks.append(
            Check(
                "locked memory",
                OK,
                f"locked-memory limit {soft if soft is not None else 'unlimited'}"
                + ("" if rdma else " (no RDMA devices)"),
            )
        )
    return checks


def check_disk(facts: dict) -> list[Check]:
    where, disk = facts.get("dump_dir"), facts.get("dump_disk")
    if not facts.get("dump_dir_exists"):
        return [
            Check(
                "dump space",
                FAIL,
                f"{where} (where flight-recorder dumps go) does not exist",
                f"mkdir -p {where}, or point TORCH_NCCL_DEBUG_INFO_TEMP_FILE at an existing folder",
            )
        ]
    if not facts.get("dump_dir_writable"):
        return [
            Check("dump space", FAIL, f"{where} is not writable", "point TORCH_NCCL_DEBUG_INFO_TEMP_FILE elsewhere")
        ]
    if not disk:
        return [Check("dump space", WARN, f"free space in {where} unknown")]
    message = f"{_gib(disk['free'])} free in {where} (dumps, stacks and traces go there)"
    fix = "free space there, or point TORCH_NCCL_DEBUG_INFO_TEMP_FILE / TMPDIR at a larger local disk"
    if disk["free"] < DISK_FAIL_BYTES:
        return [Check("dump space", FAIL, message, fix)]
    if disk["free"] < DISK_WARN_BYTES:
        return [Check("dump space", WARN, message, fix)]
    return [Check("dump space", OK, message)]


CHECKS = (
    check_torch,
    check_topology,
    check_pyspy,
    check_env,
    check_tmpdir,
    check_shm,
    check_ports,
    check_limits,
    check_disk,
)


def run_checks(facts: dict) -> list[Check]:
    return [check for function in CHECKS for check in function(facts)]


def overall(checks: list[Check]) -> str:
    return max((c.status for c in checks), key=_RANK.__getitem__, default=OK)


# ---------------------------------------------------------------------------------------------------
# Across ranks


# Facts compared across ranks: (name, how to read it from the facts, status when ranks differ).
def comparable(facts: dict) -> dict[str, Any]:
    torch = facts.get("torch") or {}
    flat: dict[str, Any] = {
        "python": facts.get("python"),
        "torchtriage": facts.get("torchtriage"),
        "torch": torch.get("version"),
        "cuda": torch.get("cuda"),
        "nccl": torch.get("nccl"),
        "tmpdir length": len((facts.get("tmpdir") or "").encode()),
        "/dev/shm size": (facts.get("shm") or {}).get("total"),
        "open-file limit": (facts.get("nofile") or [None])[0],
        "locked-memory limit": (facts.get("memlock") or [None])[0],
        "ephemeral ports": facts.get("port_range"),
    }
    for name, value in (facts.get("env") or {}).items():
        if name not in PER_RANK_ENV:
            flat[f"env {name}"] = value
    return flat


def compare_ranks(all_facts: list[dict]) -> list[dict[str, Any]]:
    """Each fact whose value differs between ranks: the values, with the ranks holding each. A variable
    set on some ranks only counts (its value is None where unset)."""
    flats = [comparable(f) for f in all_facts]
    keys = sorted({k for flat in flats for k in flat})
    differences = []
    for key in keys:
        groups: dict[str, list[int]] = {}
        for rank, flat in enumerate(flats):
            groups.setdefault(repr(flat.get(key)), []).append(rank)
        if len(groups) > 1:
            majority = max(groups.values(), key=len)
            odd = sorted(r for ranks in groups.values() if ranks is not majority for r in ranks)
            differences.append(
                {
                    "fact": key,
                    "values": {value: ranks for value, ranks in groups.items()},
                    "odd_ranks": odd,
                    "hosts": sorted({all_facts[r].get("host", "?") for r in odd}),
                }
            )
    return differences


def check_ranks(differences: list[dict[str, Any]], world_size: int) -> list[Check]:
    if not differences:
        return [Check("ranks", OK, f"all {world_size} ranks agree on versions, limits and environment")]
    checks = []
    for diff in differences:
        values = "; ".join(f"{value} on rank {', '.join(map(str, ranks))}" for value, ranks in diff["values"].items())
        serious = diff["fact"].startswith("env ") or diff["fact"] in ("torch", "cuda", "nccl", "python")
        checks.append(
            Check(
                f"ranks {diff['fact']}",
                FAIL if serious else WARN,
                f"{diff['fact']} differs across ranks: {values}",
                f"make ranks {', '.join(map(str, diff['odd_ranks']))} match the others (same image, "
                "same launcher environment): ranks that disagree are a classic source of hangs",
            )
        )
    return checks


def gather_across_ranks(facts: dict, timeout_s: float = 120.0) -> list[dict]:
    """All ranks' facts, in rank order, exchanged through the launcher's c10d store (env:// rendezvous:
    RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as torchrun sets them). No process group, no collective
    and no numpy: each rank writes its facts as JSON under its own key and reads the others'. Every rank
    must call it; rank 0 waits until every rank has read everything, since it may host the store."""
    import json

    import torch.distributed as dist

    store, rank, world_size = next(iter(dist.rendezvous("env://", timeout=timedelta(seconds=timeout_s))))
    store.set_timeout(timedelta(seconds=timeout_s))
    prefix = "torchtriage/doctor/"
    store.set(f"{prefix}facts/{rank}", json.dumps(facts, default=str))
    gathered = [json.loads(store.get(f"{prefix}facts/{r}")) for r in range(world_size)]
    store.set(f"{prefix}done/{rank}", "1")
    if rank == 0:
        store.wait([f"{prefix}done/{r}" for r in range(world_size)])
    return gathered


def report(checks: list[Check], facts: dict, differences: list | None = None) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "status": overall(checks),
        "checks": [asdict(c) for c in checks],
        "facts": facts,
        "rank_differences": differences,
    }
