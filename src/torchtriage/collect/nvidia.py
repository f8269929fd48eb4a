"""Reading NVLink and GPU-memory state live (NVML first, `nvidia-smi` as the fallback) or from a capture.

Careful guest beside a running job: NVML and nvidia-smi only read counters (no CUDA context, no GPU
memory); every call is bounded by a timeout, because a GPU falling off the bus can hang both.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchtriage.errors import EnvironmentProblem, InputError
from torchtriage.model import SourceKind
from torchtriage.sources import nvlink as smi
from torchtriage.sources.registry import discover
from torchtriage.sources.streams import read_text

SMI_TIMEOUT_S = 30.0
NVML_TIMEOUT_S = 30.0
KERNEL_LOGS = (Path("/var/log/kern.log"), Path("/var/log/messages"), Path("/var/log/syslog"))
KERNEL_LOG_TAIL_BYTES = 8 << 20
MEMORY_QUERY = ("-q", "-d", "ECC,PAGE_RETIREMENT,ROW_REMAPPER")


def run_smi(args: Sequence[str], timeout: float = SMI_TIMEOUT_S) -> str:
    """nvidia-smi's standard output; EnvironmentProblem (exit 4) when it is missing, fails or hangs."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        raise EnvironmentProblem(
            "nvidia-smi is not on PATH (no NVIDIA driver on this machine, or a container "
            "started without the GPU runtime: `docker run --gpus all`)"
        )
    try:
        done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(
            f"`nvidia-smi {' '.join(args)}` did not answer within {timeout:.0f}s: the driver may be wedged "
            "(a GPU fallen off the bus); check `dmesg` for Xid 79"
        ) from None
    except OSError as err:
        raise EnvironmentProblem(f"cannot run nvidia-smi: {err}") from None
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise EnvironmentProblem(
            f"`nvidia-smi {' '.join(args)}` failed (exit {done.returncode}): {' '.join(reason)[:300] or 'no message'}"
        )
    return done.stdout


def _bounded(call, timeout: float, what: str) -> Any:
    """Run `call` in a daemon thread; a hung driver call cannot hold the command past `timeout`."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target, name=f"torchtriage-{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise EnvironmentProblem(f"{what} did not answer within {timeout:.0f}s: the driver may be wedged")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def read_nvml_live(timeout: float = NVML_TIMEOUT_S) -> dict[str, Any]:
    """NVML's view (sources.nvlink.read_nvml's dict); EnvironmentProblem when NVML cannot be used."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        raise EnvironmentProblem("the NVML bindings are not installed (`pip install nvidia-ml-py`)") from None

    def query() -> dict[str, Any]:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise EnvironmentProblem(f"NVML could not start: {err}") from None
        try:
            return smi.read_nvml(pynvml)
        finally:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass

    return _bounded(query, timeout, "NVML")


def read_kernel_log() -> tuple[str | None, str]:
    """(text, where) of the kernel log: `dmesg`, else the syslog files; (None, why not) when unreadable."""
    reasons = []
    if shutil.which("dmesg"):
        try:
            done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10, errors="replace")
            if done.returncode == 0:
                return done.stdout, "dmesg"
            reasons.append(f"dmesg: {(done.stderr.strip() or 'failed')[:120]}")
        except (OSError, subprocess.TimeoutExpired) as err:
            reasons.append(f"dmesg: {err}")
    for path in KERNEL_LOGS:
        try:
            with path.open("rb") as stream:
                stream.seek(0, 2)
                size = stream.tell()
                stream.seek(max(0, size - KERNEL_LOG_TAIL_BYTES))
                return stream.read().decode("utf-8", "replace"), str(path)
        except OSError:
            continue
    return None, "; ".join(reasons) or "no dmesg and no readable kernel log file"


def gather_live() -> smi.NvlinkInputs:
    inputs = smi.NvlinkInputs()
    failures = []
    try:
        dump = read_nvml_live()
        inputs.gpus = smi.parse_nvml_dump(dump, "NVML")
        inputs.driver = dump.get("driver") if isinstance(dump.get("driver"), str) else None
        inputs.sources.append("nvml")
    except EnvironmentProblem as err:
        failures.append(f"NVML: {err}")
    smi_ok = shutil.which("nvidia-smi") is not None
    if not inputs.sources:
        try:
            gpus = smi.parse_nvlink_status(run_smi(["nvlink", "-s"]))
            smi.parse_nvlink_errors(run_smi(["nvlink", "-e"]), gpus)
            inputs.gpus = [gpus[i] for i in sorted(gpus)]
            inputs.sources.append("nvidia-smi nvlink")
        except EnvironmentProblem as err:
            failures.append(f"nvidia-smi: {err}")
            smi_ok = False
    if not inputs.sources:
        raise EnvironmentProblem(
            "neither NVML nor nvidia-smi could be used, so NVLink cannot be checked here:\n  "
            + "\n  ".join(failures)
            + "\nRun this on a GPU node (inside the job's container), or analyse a capture with --from"
        )
    if smi_ok:
        try:
            inputs.memory = smi.parse_memory_query(run_smi(list(MEMORY_QUERY)))
            inputs.sources.append("nvidia-smi -q")
        except (EnvironmentProblem, InputError) as err:
            inputs.problems.append(f"GPU memory health not read: {err}")
    else:
        inputs.problems.append("GPU memory health (ECC, retired pages, remapped rows) needs nvidia-smi")
    text, where = read_kernel_log()
    if text is not None:
        inputs.xids = smi.parse_xids(text)
        inputs.sources.append(where)
    else:
        inputs.problems.append(f"kernel log not readable ({where}): Xid events were not checked")
    return inputs


def _read_text(path: Path) -> str:
    return read_text(str(path))


def load_recorded(paths: Sequence[str]) -> smi.NvlinkInputs:
    """Inputs from captured files: `+ nvidia-smi ...` session recordings (or bare outputs), NVML JSON
    dumps (`read_nvml`'s shape), and kernel logs (dmesg output; names starting with dmesg/kern). A
    folder contributes the files in it, found by the source registry. NVML wins over nvidia-smi text for
    the links."""
    for raw in paths:
        if not Path(raw).exists():
            raise InputError(f"{raw}: no such file or folder")
    unread: list[str] = []  # a FIFO, a device, a link out of the folder: said, not read
    found = discover(list(paths), unread)
    files = [Path(i.path) for i in found if i.kind in (SourceKind.NVIDIA, SourceKind.LOG, SourceKind.UNKNOWN)]
    inputs = smi.NvlinkInputs()
    inputs.problems += unread
    nvml_gpus: list[smi.GpuRecord] | None = None
    smi_gpus: dict[int, smi.GpuRecord] = {}
    for path in files:
        text = _read_text(path)
        if path.suffix == ".json" or text.lstrip().startswith("{"):
            if '"gpus"' not in text:
                continue
            data = smi.load_nvml_json(text, str(path))
            nvml_gpus = smi.parse_nvml_dump(data, str(path))
            driver = data.get("driver")
            inputs.driver = driver if isinstance(driver, str) else inputs.driver
            inputs.sources.append(f"nvml:{path}")
            continue
        if path.name.startswith(("dmesg", "kern")) or ("NVRM:" in text and "+ nvidia-smi" not in text):
            inputs.xids = (inputs.xids or []) + smi.parse_xids(text)
            inputs.sources.append(f"kernel_log:{path}")
            continue
        for command, body in smi.split_capture(text).items():
            kind = smi.command_kind(command) if command else smi.sniff_kind(body)
            try:
                if kind == "nvlink_status":
                    smi.parse_nvlink_status(body, smi_gpus)
                elif kind == "nvlink_errors":
                    smi.parse_nvlink_errors(body, smi_gpus)
                elif kind == "memory":
                    inputs.memory = smi.parse_memory_query(body)
                else:
                    continue
            except InputError as err:
                raise InputError(f"{path}: {err}") from None
            inputs.sources.append(f"{command or kind}:{path}")
    if inputs.xids is None:
        inputs.problems.append("no kernel log (dmesg output) among the inputs: Xid events were not checked")
    if nvml_gpus is not None:
        inputs.gpus = nvml_gpus
    elif smi_gpus:
        inputs.gpus = [smi_gpus[i] for i in sorted(smi_gpus)]
    if not inputs.gpus and not inputs.memory:
        why = f" ({'; '.join(unread[:3])})" if unread else ""
        raise InputError(
            f"no NVLink or GPU-memory data found in {', '.join(paths)}{why}: expected nvidia-smi output "
            "(`nvidia-smi nvlink -s`, `nvlink -e`, `-q -d ECC,...`, optionally after `+ nvidia-smi ...` "
            "header lines) or an NVML JSON dump"
        )
    return inputs
