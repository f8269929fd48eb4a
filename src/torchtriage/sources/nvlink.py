"""NVLink, GPU-memory and kernel-log records from `nvidia-smi` text, NVML and `dmesg`.

Parsers only: text (or NVML's answers) in, plain records out; no verdicts (analysis/nvlink.py decides).

Two `nvidia-smi nvlink -e` layouts exist, and both are read:
  * the older one (Volta to Hopper drivers), three counters per link:
        Link 0: Replay Errors: 0 / Link 0: Recovery Errors: 0 / Link 0: CRC Errors: 0
  * the newer one (NVLink 5, Blackwell drivers): hard-error counters (`Malformed packet Errors`,
    `Buffer overrun Errors`, `Rx Errors`, `Rx remote Errors`, `Rx General Errors`, `Local link
    integrity Errors`, `Tx discards`, `Link recovery successful/failed events`, `Total link recovery
    events`, `Effective Errors`, `Symbol Errors`), a forward-error-correction histogram
    (`FEC Errors - 0` .. `FEC Errors - 15`: bin k counts codewords that needed k symbol corrections, so
    bin 0 counts clean codewords and reads in the billions), and informational lines whose values are
    not counts (`Effective BER: 15e-255`, `Raw BER Lane 0: 2061`, `Raw Errors Lane 0: 82`).

A value that is not a plain integer is kept as text in `LinkRecord.info`, never truncated into a
number (`15e-255` is not 15).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchtriage.errors import InputError
from torchtriage.sources.fields import as_int, as_text, strict_json
from torchtriage.sources.lines import strip_ansi

# Counter names, lower-cased, as the newer layout prints them. Any non-zero one is a hard error.
HARD_ERROR_COUNTERS = (
    "malformed packet errors",
    "buffer overrun errors",
    "rx errors",
    "rx remote errors",
    "rx general errors",
    "local link integrity errors",
    "tx discards",
    "link recovery successful events",
    "link recovery failed events",
    "total link recovery events",
    "effective errors",
    "symbol errors",
)
# The older layout's counters.
LEGACY_COUNTERS = ("replay errors", "recovery errors", "crc errors")
# Counters that are reported but never flag a link, with the reason (see docs/preflight.md).
INFO_COUNTER_PREFIXES = ("raw ber", "raw errors", "effective ber", "symbol ber", "crc data", "ecc data")

_FEC_BIN = re.compile(r"^fec errors\s*-\s*(\d+)$")


@dataclass
class LinkRecord:
    gpu: int
    link: int
    active: bool | None = None  # None: the source did not say
    speed: str | None = None  # "26.562 GB/s" as printed
    counters: dict[str, int] = field(default_factory=dict)  # lower-cased name -> count
    fec_bins: dict[int, int] = field(default_factory=dict)  # k -> codewords needing k corrections
    info: dict[str, Any] = field(default_factory=dict)  # reported, never flagged

    @property
    def layout(self) -> str:
        if self.fec_bins or any(name in self.counters for name in HARD_ERROR_COUNTERS):
            return "fec"
        if any(name in self.counters for name in LEGACY_COUNTERS):
            return "legacy"
        return "none"


@dataclass
class MemoryHealth:
    """GPU memory error state from `nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER`."""

    gpu: int
    bus_id: str
    ecc_enabled: bool | None = None
    volatile_uncorrectable: int = 0
    volatile_correctable: int = 0
    aggregate_uncorrectable: int = 0
    aggregate_correctable: int = 0
    retired_pages_dbe: int | None = None  # None: N/A on this GPU (row remapping replaces it)
    retired_pages_sbe: int | None = None
    retirement_pending: bool = False
    remapped_uncorrectable: int = 0
    remapped_correctable: int = 0
    remap_pending: bool = False
    remap_failed: bool = False
    sram_threshold_exceeded: bool = False
    repair_pending: list[str] = field(default_factory=list)  # "Channel Repair Pending", ...
    unrepairable_memory: bool = False


@dataclass
class GpuRecord:
    index: int
    name: str = ""
    uuid: str = ""
    bus_id: str = ""
    links: dict[int, LinkRecord] = field(default_factory=dict)

    def link(self, number: int) -> LinkRecord:
        if number not in self.links:
            self.links[number] = LinkRecord(self.index, number)
        return self.links[number]


@dataclass
class XidEvent:
    bus_id: str  # as the kernel printed it ("PCI:0000:00:06")
    xid: int
    text: str  # the rest of the line
    line: int  # 1-based line in the kernel log


@dataclass
class NvlinkInputs:
    """Everything read for one report, and where it came from."""

    gpus: list[GpuRecord] = field(default_factory=list)
    memory: list[MemoryHealth] = field(default_factory=list)
    xids: list[XidEvent] | None = None  # None: no kernel log was readable
    sources: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    driver: str | None = None


# ---------------------------------------------------------------------------------------------------
# nvidia-smi text

# The GPUs of one machine, as nvidia-smi and NVML list them: the largest hosts hold 16. A list of more is not one
# machine's, and the analysis compares each GPU with its peers (their number squared) and each Xid with them all.
MAX_GPUS = 256

_GPU_HEADER = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]+)\))?\s*$")
_LINK_LINE = re.compile(r"^\s*Link (\d+): (.*?)\s*$")


def _past_gpus(what: str, count: int) -> InputError:
    return InputError(
        f"{what}: lists {count:,} GPUs, and one machine has at most {MAX_GPUS}: not the output of one machine; "
        "give each machine's output in a file of its own"
    )


def _gpu(gpus: dict[int, GpuRecord], index: int, what: str) -> GpuRecord:
    """The record of GPU `index`, made on first sight, within the GPUs of one machine."""
    if index not in gpus and len(gpus) >= MAX_GPUS:
        raise _past_gpus(what, len(gpus) + 1)
    return gpus.setdefault(index, GpuRecord(index))


def _split_gpus(text: str, what: str) -> list[tuple[int, str, str, list[str]]]:
    """[(index, name, uuid, body lines)] of `nvidia-smi nvlink ...` output, one entry per `GPU n:` header."""
    blocks: list[tuple[int, str, str, list[str]]] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        header = _GPU_HEADER.match(line)
        if header:
            blocks.append((as_int(header.group(1), -1), header.group(2).strip(), header.group(3) or "", []))
        elif line.strip():
            if not blocks:
                raise InputError(f"{what}: expected a `GPU <n>: <name>` line first, found {line.strip()[:80]!r}")
            blocks[-1][3].append(line)
    return blocks


def _value(text: str) -> int | str:
    text = text.strip()
    number = as_int(text, -1, 0) if text.isdigit() else -1  # a counter past 64 bits is not a counter
    return number if number >= 0 else text


def parse_nvlink_status(text: str, gpus: dict[int, GpuRecord] | None = None) -> dict[int, GpuRecord]:
    """`nvidia-smi nvlink -s`: one `Link n: <speed>` line per link; `<inactive>` (or any text without a
    rate) means the link is down."""
    gpus = {} if gpus is None else gpus
    for index, name, uuid, body in _split_gpus(text, "nvidia-smi nvlink -s"):
        gpu = _gpu(gpus, index, "nvidia-smi nvlink -s")
        gpu.name, gpu.uuid = name or gpu.name, uuid or gpu.uuid
        for line in body:
            match = _LINK_LINE.match(line)
            if not match:
                if "nvlink" in line.lower() and ("not" in line.lower() or "disabled" in line.lower()):
                    continue  # "NVLink is not supported on this GPU" and similar: no links
                raise InputError(f"nvidia-smi nvlink -s: cannot read line {line.strip()[:80]!r}")
            link = gpu.link(as_int(match.group(1), -1))
            state = match.group(2)
            if re.search(r"\d+(\.\d+)?\s*[GM]B/s", state):
                link.active, link.speed = True, state
            else:
                link.active, link.speed = False, None
                link.info["status"] = state
    return gpus


def parse_nvlink_errors(text: str, gpus: dict[int, GpuRecord] | None = None) -> dict[int, GpuRecord]:
    """`nvidia-smi nvlink -e`, either layout: `Link n: <counter name>: <value>` lines."""
    gpus = {} if gpus is None else gpus
    for index, name, uuid, body in _split_gpus(text, "nvidia-smi nvlink -e"):
        gpu = _gpu(gpus, index, "nvidia-smi nvlink -e")
        gpu.name, gpu.uuid = name or gpu.name, uuid or gpu.uuid
        for line in body:
            match = _LINK_LINE.match(line)
            counter, sep, value = match.group(2).rpartition(":") if match else ("", "", "")
            if not match or not sep or not counter.strip():
                if "nvlink" in line.lower() and ("not" in line.lower() or "disabled" in line.lower()):
                    continue
                raise InputError(f"nvidia-smi nvlink -e: cannot read line {line.strip()[:80]!r}")
            add_counter(gpu.link(as_int(match.group(1), -1)), counter, _value(value))
    return gpus


def add_counter(link: LinkRecord, name: str, value: int | str) -> None:
    """File one counter of a link under the right heading (FEC bin, count, or information only)."""
    key = " ".join(name.strip().lower().split())
    fec = _FEC_BIN.match(key)
    if fec and isinstance(value, int):
        link.fec_bins[as_int(fec.group(1), -1)] = value
    elif isinstance(value, int) and not key.startswith(INFO_COUNTER_PREFIXES):
        link.counters[key] = value
    else:
        link.info[key] = value


# `nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER`: an indented tree of `Key : Value` lines.
_QUERY_GPU = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_QUERY_KV = re.compile(r"^(\s*)(.*?)\s*(?::\s*(.*?))?\s*$")


def _count(value: str) -> int:
    value = value.strip()
    return as_int(value, 0, 0) if value.isdigit() else 0


def parse_memory_query(text: str) -> list[MemoryHealth]:
    """ECC counters, retired pages and remapped rows, per GPU, in the order nvidia-smi lists them."""
    result: list[MemoryHealth] = []
    stack: list[tuple[int, str]] = []  # (indent, section name)
    for raw in text.splitlines():
        line = raw.rstrip()
        gpu = _QUERY_GPU.match(line)
        if gpu:
            if len(result) >= MAX_GPUS:
                raise _past_gpus("nvidia-smi -q", len(result) + 1)
            result.append(MemoryHealth(len(result), gpu.group(1)))
            stack = []
            continue
        if not result or not line.strip():
            continue
        match = _QUERY_KV.match(line)
        indent, key, value = len(match.group(1)), match.group(2), match.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if value is None:
            stack.append((indent, key))
            continue
        path = tuple(name for _, name in stack)
        _file_memory_value(result[-1], path, key, value)
    return result


def _file_memory_value(mem: MemoryHealth, path: tuple[str, ...], key: str, value: str) -> None:
    yes = value.strip().lower() == "yes"
    if path[-1:] == ("ECC Mode",) and key == "Current":
        mem.ecc_enabled = value.strip().lower() == "enabled"
    elif "ECC Errors" in path and ("Volatile" in path or "Aggregate" in path) and path[-1] in ("Volatile", "Aggregate"):
        if key.endswith("Threshold Exceeded"):
            mem.sram_threshold_exceeded |= yes
            return
        kind = "uncorrectable" if "Uncorrectable" in key else "correctable" if "Correctable" in key else None
        if kind:
            attr = f"{'volatile' if 'Volatile' in path else 'aggregate'}_{kind}"
            setattr(mem, attr, getattr(mem, attr) + _count(value))
    elif "ECC Errors" in path and key.endswith("Repair Pending") and yes:
        mem.repair_pending.append(key)
    elif "ECC Errors" in path and key == "Unrepairable Memory":
        mem.unrepairable_memory = yes
    elif path[-1:] == ("Retired Pages",):
        if key.startswith("Single Bit"):
            mem.retired_pages_sbe = _count(value) if value.strip().isdigit() else None
        elif key.startswith("Double Bit"):
            mem.retired_pages_dbe = _count(value) if value.strip().isdigit() else None
        elif key.startswith("Pending"):
            mem.retirement_pending = yes
    elif path[-1:] == ("Remapped Rows",):
        if key == "Correctable Error":
            mem.remapped_correctable = _count(value)
        elif key == "Uncorrectable Error":
            mem.remapped_uncorrectable = _count(value)
        elif key == "Pending":
            mem.remap_pending = yes
        elif key == "Remapping Failure Occurred":
            mem.remap_failed = yes


def parse_topology(text: str) -> dict[str, dict[str, str]]:
    """`nvidia-smi topo -m`: {"GPU0": {"GPU1": "NV18", ...}, ...}, GPU-to-GPU cells only."""
    text = strip_ansi(text)
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return {}
    header = lines[0].split("\t")
    columns = [name.strip() for name in header if name.strip()]
    matrix: dict[str, dict[str, str]] = {}
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.split("\t")]
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            if line.startswith("Legend"):
                break
            continue
        row = {}
        for name, cell in zip(columns, cells[1:], strict=False):
            if re.fullmatch(r"GPU\d+", name) and name != cells[0]:
                row[name] = cell
        matrix[cells[0]] = row
    return matrix


# ---------------------------------------------------------------------------------------------------
# A recorded session: `+ nvidia-smi <args>` headers (as `set -x` prints them) before each output

_SECTION = re.compile(r"^\+ (nvidia-smi\b.*?)\s*$")


def split_capture(text: str) -> dict[str, str]:
    """{"nvidia-smi nvlink -s": output, ...}; a text without headers is returned as {"": text}."""
    sections: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        header = _SECTION.match(line)
        if header:
            current = " ".join(header.group(1).split())
            sections[current] = []
        else:
            sections.setdefault(current, []).append(line)
    return {name: "\n".join(body) for name, body in sections.items() if name or "".join(body).strip()}


def command_kind(command: str) -> str | None:
    """Which parser reads the output of this nvidia-smi command line."""
    args = command.split()[1:]
    if args[:1] == ["nvlink"]:
        rest = args[1:]
        if any(a in ("-s", "--status") for a in rest):
            return "nvlink_status"
        if any(a in ("-e", "--errorcounters") for a in rest):
            return "nvlink_errors"
        return None
    if args[:2] == ["topo", "-m"]:
        return "topology"
    if "-q" in args or "--query" in args:
        return "memory"
    return None


def sniff_kind(text: str) -> str | None:
    """The kind of a headerless nvidia-smi output, from its content."""
    if re.search(r"^\s*Link \d+: [\d.]+ [GM]B/s", text, re.M) or re.search(r"^\s*Link \d+: <inactive>", text, re.M):
        return "nvlink_status"
    if re.search(r"^\s*Link \d+: [^:]+: ", text, re.M):
        return "nvlink_errors"
    if "Remapped Rows" in text or "ECC Errors" in text:
        return "memory"
    return None


# ---------------------------------------------------------------------------------------------------
# NVML (nvidia-ml-py): a live reader and the JSON it produces, read back by the same parser

NVML_DL_COUNTERS = {  # nvmlNvLinkErrorCounter_t name -> key in the JSON dump
    "NVML_NVLINK_ERROR_DL_REPLAY": "replay",
    "NVML_NVLINK_ERROR_DL_RECOVERY": "recovery",
    "NVML_NVLINK_ERROR_DL_CRC_FLIT": "crc_flit",
    "NVML_NVLINK_ERROR_DL_CRC_DATA": "crc_data",
    "NVML_NVLINK_ERROR_DL_ECC_DATA": "ecc_data",
}
# JSON key -> the nvidia-smi counter it corresponds to. `nvidia-smi nvlink -e`'s "CRC Errors" is the
# flit CRC counter: on our H200 recording both read 0 while the data-CRC counter did not.
NVML_TO_SMI = {
    "replay": "replay errors",
    "recovery": "recovery errors",
    "crc_flit": "crc errors",
    "crc_data": "crc data errors",
    "ecc_data": "ecc data errors",
}
# Per-link NVML field values (newer GPUs; NOT_SUPPORTED = 3 on Hopper) -> the nvidia-smi counter name.
NVML_FIELDS = {
    "NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS": "malformed packet errors",
    "NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS": "buffer overrun errors",
    "NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS": "rx errors",
    "NVML_FI_DEV_NVLINK_COUNT_RCV_REMOTE_ERRORS": "rx remote errors",
    "NVML_FI_DEV_NVLINK_COUNT_RCV_GENERAL_ERRORS": "rx general errors",
    "NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS": "local link integrity errors",
    "NVML_FI_DEV_NVLINK_COUNT_XMIT_DISCARDS": "tx discards",
    "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS": "link recovery successful events",
    "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS": "link recovery failed events",
    "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS": "total link recovery events",
    "NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS": "effective errors",
    "NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS": "symbol errors",
    **{f"NVML_FI_DEV_NVLINK_COUNT_FEC_HISTORY_{k}": f"fec errors - {k}" for k in range(16)},
}
NVML_SUCCESS = 0
MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS on current drivers


def read_nvml(nvml: Any, max_links: int = MAX_NVLINKS) -> dict[str, Any]:
    """Query NVML through an initialised `pynvml` module, as a JSON-able dict (the shape of
    tests/fixtures/h200x2/nvml.json, plus per-link field values). Reads counters only: no context is
    created and no GPU memory is allocated, so it is safe beside a running job."""

    def attempt(call: Callable[..., Any], *args: Any) -> Any:
        try:
            value = call(*args)
        except nvml.NVMLError as err:
            return f"error: {err}"
        return value.decode() if isinstance(value, bytes) else value

    out: dict[str, Any] = {
        "driver": attempt(nvml.nvmlSystemGetDriverVersion),
        "nvml": attempt(nvml.nvmlSystemGetNVMLVersion),
        "gpus": [],
    }
    counters = {key: getattr(nvml, name) for name, key in NVML_DL_COUNTERS.items() if hasattr(nvml, name)}
    fields = {name: getattr(nvml, name) for name in NVML_FIELDS if hasattr(nvml, name)}
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        gpu: dict[str, Any] = {
            "index": index,
            "name": attempt(nvml.nvmlDeviceGetName, handle),
            "uuid": attempt(nvml.nvmlDeviceGetUUID, handle),
            "bus_id": attempt(lambda h: nvml.nvmlDeviceGetPciInfo(h).busId, handle),
            "links": [],
        }
        for number in range(max_links):
            state = attempt(nvml.nvmlDeviceGetNvLinkState, handle, number)
            if isinstance(state, str):  # NOT_SUPPORTED / INVALID_ARGUMENT: no such link on this GPU
                continue
            link: dict[str, Any] = {"link": number, "state": state}
            for key, counter in counters.items():
                link[key] = attempt(nvml.nvmlDeviceGetNvLinkErrorCounter, handle, number, counter)
            if fields:
                try:
                    values = nvml.nvmlDeviceGetFieldValues(handle, [(fid, number) for fid in fields.values()])
                    link["fields"] = {
                        name: {"ret": int(v.nvmlReturn), "value": int(v.value.ullVal)}
                        for name, v in zip(fields, values, strict=False)
                    }
                except nvml.NVMLError as err:
                    link["fields"] = f"error: {err}"
            gpu["links"].append(link)
        out["gpus"].append(gpu)
    return out


def parse_nvml_dump(data: Any, what: str = "NVML dump") -> list[GpuRecord]:
    """GPU and link records from `read_nvml`'s dict (or tests/fixtures/h200x2/nvml.json)."""
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise InputError(f"{what}: expected a JSON object with a `gpus` list (as `read_nvml` writes)")
    if len(data["gpus"]) > MAX_GPUS:
        raise _past_gpus(what, len(data["gpus"]))
    gpus = []
    for position, raw in enumerate(data["gpus"]):
        if not isinstance(raw, dict) or not isinstance(raw.get("links", []), list):
            raise InputError(f"{what}: gpus[{position}] is not an object with a `links` list")
        index = as_int(raw.get("index", position), position, 0)
        gpu = GpuRecord(index, as_text(raw.get("name")), as_text(raw.get("uuid")))
        bus_id = as_text(raw.get("bus_id"))
        gpu.bus_id = bus_id if not bus_id.startswith("error") else ""
        for item in raw.get("links", []):
            if not isinstance(item, dict) or as_int(item.get("link"), -1, 0, 1 << 16) < 0:
                raise InputError(f"{what}: gpus[{position}] has a link entry without an integer `link`")
            state = item.get("state")
            if isinstance(state, str):  # the query failed: the link does not exist or is unreadable
                continue
            link = gpu.link(as_int(item["link"]))
            link.active = bool(state == 1)
            if "version" in item and not isinstance(item["version"], str):
                link.info["nvlink version"] = item["version"]
            for key, name in NVML_TO_SMI.items():
                value = as_int(item.get(key), -1, 0)
                if value >= 0:
                    add_counter(link, name, value)
            fields = item.get("fields")
            if isinstance(fields, dict):
                for field_name, answer in fields.items():
                    name = NVML_FIELDS.get(field_name)
                    if name and isinstance(answer, dict) and answer.get("ret") == NVML_SUCCESS:
                        add_counter(link, name, as_int(answer.get("value", 0), 0))
        gpus.append(gpu)
    return gpus


def load_nvml_json(text: str, what: str) -> dict:
    """The NVML JSON dump as a dict; InputError says what is wrong with it."""
    try:
        data = strict_json(text)
    except ValueError as err:
        raise InputError(f"{what}: {err}") from None
    if not isinstance(data, dict):
        raise InputError(f"{what}: expected a JSON object with a `gpus` list (as `read_nvml` writes)")
    return data


# ---------------------------------------------------------------------------------------------------
# Kernel log

_XID = re.compile(r"NVRM: Xid \((PCI:[0-9A-Fa-f:.]+)\): (\d+),?\s*(.*)$")


def parse_xids(text: str) -> list[XidEvent]:
    """`NVRM: Xid (PCI:0000:00:06): 79, pid=..., GPU has fallen off the bus.` lines of dmesg / kern.log."""
    events = []
    for number, line in enumerate(text.splitlines(), 1):
        match = _XID.search(line)
        if match:
            events.append(XidEvent(match.group(1), as_int(match.group(2), -1), match.group(3).strip(), number))
    return events
