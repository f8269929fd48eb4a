"""Each rank says where it runs, as it starts: one small record in the run folder (`DIR/identity/rank<N>.json`).

Called once by the code that arms a rank under `torchtriage run` (runtime/inject/sitecustomize.py), before the
program's own code and before torch is imported:

1. the attempt: under `torchrun --max-restarts` the launcher starts the workers again, with
   TORCHELASTIC_RESTART_COUNT one higher. Attempt 0 writes into DIR, attempt n into DIR/.attempt-<n>, so that no
   attempt writes over the files of another (the first's above all): the run folder and the flight recorder's
   dump path `run` set are pointed at the attempt's folder here, before anything reads them;
2. the record: rank, local rank, world size, host, pid, the attempt, the launcher's run id;
3. the GPU, later: CUDA is never initialised here (that would take a GPU context on device 0 before the program
   chose its device). A daemon thread waits until the program has put CUDA to use, then adds the device this
   process holds memory on: its index, UUID and PCI bus id, as `nvidia-smi` names the card.

Nothing here may stop a rank from starting: a failure is one line on stderr.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import MutableMapping
from pathlib import Path

from torchtriage.protocol import (
    FR_PREFIX,
    FR_SUBDIR,
    IDENTITY_SCHEMA,
    RESTART_COUNT_ENV,
    RUN_DIR_ENV,
    attempt_dir,
    attempt_number,
    host_name,
    identity_file,
    make_private_folders,
    write_whole,
)

# The flight recorder's dump path, in both of torch's spellings (cli/run.py sets them).
FR_DUMP_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
# How often the GPU watcher looks whether the program has put CUDA to use: a dict look-up and a flag each time.
GPU_POLL_S = 2.0


def _int(environ: MutableMapping[str, str], name: str) -> int | None:
    try:
        return int(environ.get(name, ""))
    except ValueError:
        return None


def enter_attempt_folder(environ: MutableMapping[str, str]) -> Path:
    """Point the run folder (and the dump path `run` set, not one of the user's) at this attempt's folder."""
    run_dir = Path(environ[RUN_DIR_ENV])
    folder = attempt_dir(run_dir, attempt_number(environ))
    if folder == run_dir:
        return folder
    make_private_folders(folder)
    environ[RUN_DIR_ENV] = str(folder)
    ours = str(run_dir / FR_SUBDIR / FR_PREFIX)
    for name in FR_DUMP_ENV:
        if environ.get(name) == ours:
            make_private_folders(folder / FR_SUBDIR)
            environ[name] = str(folder / FR_SUBDIR / FR_PREFIX)
    return folder


def identity_record(environ: MutableMapping[str, str]) -> dict:
    return {
        "schema": IDENTITY_SCHEMA,  # first: the registry knows the record by it
        "rank": _int(environ, "RANK"),
        "local_rank": _int(environ, "LOCAL_RANK"),
        "world_size": _int(environ, "WORLD_SIZE"),
        "host": host_name(),
        "pid": os.getpid(),
        "attempt": attempt_number(environ),
        "restart_count": _int(environ, RESTART_COUNT_ENV),
        "run_id": environ.get("TORCHELASTIC_RUN_ID"),
        "cuda_visible_devices": environ.get("CUDA_VISIBLE_DEVICES"),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": None,  # added once the program uses a GPU (watch_for_gpu)
    }


def write_identity(folder: Path, record: dict) -> Path:
    path = identity_file(folder, record["rank"])
    make_private_folders(path.parent)
    write_whole(path, json.dumps(record) + "\n")
    return path


def _imported(name: str):
    """The module if it is imported and done initialising (never import it here)."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return None if module is None or getattr(spec, "_initializing", False) else module


def gpu_in_use() -> dict | None:
    """The GPU this process holds memory on (most, if several), once the program has initialised CUDA; else None.

    The device a thread uses is the thread's own in CUDA, so this thread cannot ask the program's: the caching
    allocator's reserved memory, per device, says which device the process works on."""
    torch = _imported("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return None
    reserved = [(cuda.memory_reserved(index), -index) for index in range(cuda.device_count())]
    if not reserved or max(reserved)[0] == 0:
        return None
    index = -max(reserved)[1]
    props = cuda.get_device_properties(index)
    return {"index": index, "uuid": _uuid(props, torch), "pci_bus_id": _pci_bus_id(props), "name": props.name}


def _uuid(props, torch) -> str | None:
    uuid = getattr(props, "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    # NVIDIA's tools name a card GPU-<uuid> (nvidia-smi -L, NVML, CUDA_VISIBLE_DEVICES); ROCm's do not.
    return text if getattr(torch.version, "hip", None) or text.startswith("GPU-") else f"GPU-{text}"


def _pci_bus_id(props) -> str | None:
    """domain:bus:device.function as nvidia-smi prints it (00000000:19:00.0); None where torch does not say."""
    parts = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if any(not isinstance(part, int) for part in parts):
        return None
    domain, bus, device = parts
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"


def watch_for_gpu(folder: Path, record: dict, poll_s: float = GPU_POLL_S) -> threading.Thread:
    """A daemon thread that adds the GPU to the record once the program uses one, then ends. It looks less often
    as time passes (a job that never uses CUDA costs a look every 30 s)."""

    def watch() -> None:
        delay = poll_s
        while True:
            time.sleep(delay)
            delay = min(delay * 1.25, 30.0)
            try:
                gpu = gpu_in_use()
                if gpu is not None:
                    write_identity(folder, {**record, "gpu": gpu})
                    return
            except Exception as err:  # noqa: BLE001 - never disturb training; the record keeps host and pid
                print(f"torchtriage: the rank's GPU was not recorded: {type(err).__name__}: {err}", file=sys.stderr)
                return

    thread = threading.Thread(target=watch, name="torchtriage-identity", daemon=True)
    thread.start()
    return thread


def on_rank_start(environ: MutableMapping[str, str] = os.environ) -> None:
    """This attempt's folder, this rank's record, and the watcher of its GPU; never raises."""
    try:
        folder = enter_attempt_folder(environ)
        record = identity_record(environ)
        if record["rank"] is None:
            return
        write_identity(folder, record)
        watch_for_gpu(folder, record)
    except Exception as err:  # noqa: BLE001 - never stop a rank from starting
        print(f"torchtriage: where this rank runs was not recorded: {type(err).__name__}: {err}", file=sys.stderr)
