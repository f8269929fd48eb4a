"""NVLink, GPU-memory and Xid health: pure decisions over the records of sources/nvlink.py.

Per link (the thresholds and why are in docs/preflight.md):
  * unhealthy: the link is down; or any hard error (newer layout: a counter of HARD_ERROR_COUNTERS
    above 0; older layout: `Recovery Errors` above 0, the link had to retrain); or its GPU has fewer
    active links than its peers of the same model.
  * marginal: not unhealthy, and the FEC correction rate is above 1e-8 or a codeword needed 3 or more
    corrections (a deep bin); older layout: `Replay Errors` or `CRC Errors` above 0 (errors the link
    caught and retransmitted: nothing was lost, but the lane is taking errors).
  * ok: otherwise.
NVML's data-CRC and ECC-data counters are reported, never flagged: they count errors the link's ECC
corrected in flight, read in the tens to hundreds on every link of a healthy idle H200, and
`nvidia-smi nvlink -e` itself prints 0 errors for those links.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from torchtriage.analysis.fusion import verdict_of
from torchtriage.model import Assessment, Evidence, Finding, Verdict
from torchtriage.sources.nvlink import HARD_ERROR_COUNTERS, GpuRecord, LinkRecord, MemoryHealth, NvlinkInputs, XidEvent

MARGINAL_FEC_RATE = 1e-8  # healthy links run near 1e-9; a marginal lane near 1e-7
DEEP_FEC_BIN = 3  # a codeword needing this many symbol corrections is close to FEC's limit

OK, MARGINAL, UNHEALTHY = "ok", "marginal", "unhealthy"
_RANK = {OK: 0, MARGINAL: 1, UNHEALTHY: 2}

# Xid -> (severity, meaning). fatal: the GPU needs a reset or service, a job cannot continue on it;
# job: the job on that GPU was killed, the GPU itself recovers; info: nothing to act on by itself.
# Source: NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors).
XID_TABLE: dict[int, tuple[str, str]] = {
    13: ("job", "graphics engine exception (often an out-of-bounds access in a kernel)"),
    31: ("job", "GPU memory page fault (a kernel used an illegal address)"),
    32: ("fatal", "invalid or corrupted push buffer stream (driver, PCIe or hardware)"),
    43: ("job", "GPU stopped processing (a user kernel faulted; its context was killed)"),
    45: ("info", "preemptive cleanup after another error"),
    48: ("fatal", "double-bit (uncorrectable) ECC error"),
    61: ("fatal", "internal micro-controller breakpoint"),
    62: ("fatal", "internal micro-controller halt"),
    63: ("info", "ECC page retirement or row remapping recorded (applied at the next reset)"),
    64: ("fatal", "ECC page retirement or row remapping failure"),
    74: ("fatal", "NVLink error"),
    79: ("fatal", "GPU has fallen off the bus"),
    92: ("info", "high single-bit ECC error rate"),
    94: ("job", "contained ECC error: the application that touched the memory was killed"),
    95: ("fatal", "uncontained ECC error"),
    109: ("job", "context switch timeout"),
    119: ("fatal", "GSP RPC timeout"),
    120: ("fatal", "GSP error"),
    140: ("fatal", "unrecovered ECC error"),
    143: ("fatal", "GPU initialisation failure"),
    154: ("fatal", "GPU recovery action changed (a reset or reboot is required)"),
    **{x: ("fatal", "NVLink 5 error") for x in range(144, 151)},
}


@dataclass
class LinkVerdict:
    gpu: int
    link: int
    status: str
    active: bool | None
    speed: str | None
    layout: str
    reasons: list[str] = field(default_factory=list)
    hard_errors: dict[str, int] = field(default_factory=dict)
    deep_fec_bins: dict[int, int] = field(default_factory=dict)
    corrected_codewords: int | None = None
    correction_rate: float | None = None
    counters: dict[str, int] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class GpuVerdict:
    gpu: int
    name: str
    status: str
    active_links: int
    reasons: list[str] = field(default_factory=list)


@dataclass
class XidVerdict:
    xid: int
    bus_id: str
    severity: str
    meaning: str
    text: str
    line: int


@dataclass
class NvlinkReport:
    links: list[LinkVerdict]
    gpus: list[GpuVerdict]
    xids: list[XidVerdict] | None
    verdict: Verdict

    @property
    def status(self) -> str:
        statuses = [x.status for x in self.links] + [g.status for g in self.gpus]
        statuses += [UNHEALTHY if x.severity == "fatal" else OK for x in self.xids or []]
        return max(statuses, key=_RANK.__getitem__, default=OK)

    def to_json(self) -> dict[str, Any]:
        data = self.verdict.to_json()
        data["status"] = self.status
        data["links"] = [asdict(link) for link in self.links]
        data["gpus"] = [asdict(gpu) for gpu in self.gpus]
        data["xids"] = None if self.xids is None else [asdict(x) for x in self.xids]
        return data


def classify_link(link: LinkRecord) -> LinkVerdict:
    verdict = LinkVerdict(link.gpu, link.link, OK, link.active, link.speed, link.layout, counters=dict(link.counters))
    verdict.info = dict(link.info)
    if link.active is False:
        verdict.reasons.append(f"link is down ({link.info.get('status', 'inactive')})")
    verdict.hard_errors = {name: n for name, n in link.counters.items() if name in HARD_ERROR_COUNTERS and n > 0}
    if link.counters.get("recovery errors", 0) > 0:
        verdict.hard_errors["recovery errors"] = link.counters["recovery errors"]
    for name, count in verdict.hard_errors.items():
        verdict.reasons.append(f"{name}: {count}")
    if link.fec_bins:
        corrected = sum(n for k, n in link.fec_bins.items() if k > 0)
        total = link.fec_bins.get(0, 0) + corrected
        verdict.corrected_codewords = corrected
        verdict.correction_rate = corrected / total if total else 0.0
        verdict.deep_fec_bins = {k: n for k, n in sorted(link.fec_bins.items()) if k >= DEEP_FEC_BIN and n > 0}
    if verdict.reasons:
        verdict.status = UNHEALTHY
        return verdict
    marginal = []
    if verdict.correction_rate is not None and verdict.correction_rate > MARGINAL_FEC_RATE:
        marginal.append(f"FEC correction rate {verdict.correction_rate:.1e} > {MARGINAL_FEC_RATE:.0e}")
    if verdict.deep_fec_bins:
        bins = ", ".join(f"bin {k}: {n}" for k, n in verdict.deep_fec_bins.items())
        marginal.append(f"codewords needing >= {DEEP_FEC_BIN} corrections ({bins})")
    for name in ("replay errors", "crc errors"):
        if link.counters.get(name, 0) > 0:
            marginal.append(f"{name}: {link.counters[name]} (caught and retransmitted)")
    if marginal:
        verdict.status, verdict.reasons = MARGINAL, marginal
    return verdict


def classify_gpus(gpus: list[GpuRecord]) -> list[GpuVerdict]:
    """Each GPU's active-link count against its peers of the same model."""
    active = {g.index: sum(1 for link in g.links.values() if link.active is not False) for g in gpus}
    by_model: dict[str, list[int]] = {}  # the active counts of each model's GPUs, most first (one pass, not pairs)
    for gpu in gpus:
        by_model.setdefault(gpu.name, []).append(active[gpu.index])
    for counts in by_model.values():
        counts.sort(reverse=True)
    result = []
    for gpu in gpus:
        best = _peers_most(by_model[gpu.name], active[gpu.index])
        verdict = GpuVerdict(gpu.index, gpu.name, OK, active[gpu.index])
        if best is not None and active[gpu.index] < best:
            verdict.status = UNHEALTHY
            verdict.reasons.append(
                f"{active[gpu.index]} active NVLinks while its peers have {best}: this GPU's bandwidth to "
                "the others is reduced, and collectives run at the pace of the slowest link"
            )
        result.append(verdict)
    return result


def classify_memory(mem: MemoryHealth) -> tuple[str, list[str]]:
    unhealthy, marginal = [], []
    if mem.volatile_uncorrectable:
        unhealthy.append(f"{mem.volatile_uncorrectable} uncorrectable ECC errors since the last driver load")
    if mem.remap_failed:
        unhealthy.append("a row-remapping failure occurred: the GPU has run out of spare rows")
    if mem.remap_pending:
        unhealthy.append("a row remapping is pending: it takes effect only after a GPU reset")
    if mem.retirement_pending:
        unhealthy.append("a page retirement is pending: it takes effect only after a GPU reset")
    if mem.sram_threshold_exceeded:
        unhealthy.append("the SRAM error threshold was exceeded")
    if mem.unrepairable_memory:
        unhealthy.append("memory is marked unrepairable")
    for what in mem.repair_pending:
        unhealthy.append(f"{what}: a GPU reset is required")
    if mem.aggregate_uncorrectable and not mem.volatile_uncorrectable:
        marginal.append(f"{mem.aggregate_uncorrectable} uncorrectable ECC errors over the GPU's lifetime")
    if mem.remapped_uncorrectable:
        marginal.append(f"{mem.remapped_uncorrectable} rows remapped after uncorrectable errors")
    if mem.retired_pages_dbe:
        marginal.append(f"{mem.retired_pages_dbe} pages retired after double-bit errors")
    if mem.ecc_enabled is False:
        marginal.append("ECC is disabled: memory errors go undetected")
    if unhealthy:
        return UNHEALTHY, unhealthy + marginal
    return (MARGINAL, marginal) if marginal else (OK, [])


def classify_xid(event: XidEvent) -> XidVerdict:
    severity, meaning = XID_TABLE.get(event.xid, ("unknown", "not in torchtriage's table"))
    if 144 <= event.xid <= 150 and "nonfatal" in event.text.lower():
        severity, meaning = "info", "NVLink 5 non-fatal event, absorbed by FEC (watch the FEC rate)"
    return XidVerdict(event.xid, event.bus_id, severity, meaning, event.text, event.line)


def _peers_most(counts: list[int], own: int) -> int | None:
    """The most active links a GPU's peers of its model have (`counts`: all of the model's, most first), or None
    for a GPU with no peer: the model's most, unless that is this GPU's own count (then the next, which a peer
    with as many holds too)."""
    if len(counts) < 2:
        return None
    return counts[1] if own == counts[0] else counts[0]


def _gpu_for_bus(bus_id: str, gpus: list[GpuRecord], memory: list[MemoryHealth]) -> int | None:
    """The GPU index of an Xid's `PCI:0000:00:06`-style address, if any record carries that bus id."""
    wanted = bus_id.removeprefix("PCI:").lower()
    for gpu_index, known in [(g.index, g.bus_id) for g in gpus] + [(m.gpu, m.bus_id) for m in memory]:
        if known and known.lower().rsplit(".", 1)[0].endswith(wanted.rsplit(".", 1)[0][-7:]):
            return gpu_index
    return None


def analyse(inputs: NvlinkInputs) -> NvlinkReport:
    links = [classify_link(link) for gpu in inputs.gpus for _, link in sorted(gpu.links.items())]
    gpus = classify_gpus(inputs.gpus)
    by_gpu = {g.gpu: g for g in gpus}
    for mem in inputs.memory:
        status, reasons = classify_memory(mem)
        gpu = by_gpu.get(mem.gpu)
        if gpu is None:
            gpu = by_gpu[mem.gpu] = GpuVerdict(mem.gpu, "", OK, 0)
            gpus.append(gpu)
        gpu.reasons += reasons
        gpu.status = max(gpu.status, status, key=_RANK.__getitem__)
    xids = None if inputs.xids is None else [classify_xid(x) for x in inputs.xids]

    findings: list[Finding] = []
    for link in links:
        if link.status != OK:
            findings.append(
                Finding(
                    kind=f"nvlink.link_{link.status}",
                    ranks=[],
                    message=f"GPU {link.gpu} link {link.link} {link.status}: {'; '.join(link.reasons)}",
                    role="primary" if link.status == UNHEALTHY else "symptom",
                    category="gpu_fault",
                    evidence=[Evidence("nvlink", text=f"gpu {link.gpu} link {link.link}")],
                )
            )
    for gpu in gpus:
        if gpu.status != OK:
            findings.append(
                Finding(
                    f"nvlink.gpu_{gpu.status}",
                    [],
                    f"GPU {gpu.gpu} {gpu.status}: {'; '.join(gpu.reasons)}",
                    "primary" if gpu.status == UNHEALTHY else "symptom",
                    "gpu_fault",
                )
            )
    gpu_of_bus: dict[str, int | None] = {}  # a kernel log repeats a few bus ids thousands of times
    for xid in xids or []:
        if xid.severity in ("fatal", "job", "unknown"):
            if xid.bus_id not in gpu_of_bus:
                gpu_of_bus[xid.bus_id] = _gpu_for_bus(xid.bus_id, inputs.gpus, inputs.memory)
            gpu_index = gpu_of_bus[xid.bus_id]
            where = f"GPU {gpu_index}" if gpu_index is not None else xid.bus_id
            findings.append(
                Finding(
                    f"nvlink.xid_{xid.severity}",
                    [],
                    f"Xid {xid.xid} on {where} ({xid.severity}): {xid.meaning}",
                    "primary" if xid.severity == "fatal" else "symptom",
                    "gpu_fault",
                    [Evidence("kernel_log", line=xid.line, text=f"Xid {xid.xid}: {xid.text}")],
                )
            )
    report = NvlinkReport(links, gpus, xids, Verdict("unknown", [], ""))
    report.verdict = _verdict(report, findings, inputs)
    return report


def _verdict(report: NvlinkReport, findings: list[Finding], inputs: NvlinkInputs) -> Verdict:
    counts = {s: sum(1 for x in report.links if x.status == s) for s in (OK, MARGINAL, UNHEALTHY)}
    summary = (
        f"{len(report.links)} NVLink links on {len(inputs.gpus)} GPUs: {counts[UNHEALTHY]} unhealthy, "
        f"{counts[MARGINAL]} marginal, {counts[OK]} ok"
    )
    bad_gpus = [g.gpu for g in report.gpus if g.status == UNHEALTHY]
    fatal = [x for x in report.xids or [] if x.severity == "fatal"]
    if bad_gpus:
        summary += f"; GPU {', '.join(map(str, bad_gpus))} unhealthy"
    if fatal:
        summary += f"; {len(fatal)} fatal Xid event(s) in the kernel log"
    status = report.status
    assessment = Assessment(
        source="nvlink",
        findings=findings,
        summary=summary,
        category="gpu_fault" if status != OK else ("ok" if inputs.gpus else "unknown"),
        confidence="high" if status == UNHEALTHY else "medium",
        facts={"status": status, "link_counts": counts, "driver": inputs.driver},
        files=list(inputs.sources),
        problems=list(inputs.problems),
        lead=findings[0] if findings else None,
    )
    return verdict_of(assessment)
