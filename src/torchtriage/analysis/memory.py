"""What holds GPU memory, from a CUDA caching-allocator snapshot: pure functions over a `MemorySnapshot`.

Numbers computed, per device:
- current allocated vs reserved (from the segments at the moment the snapshot was taken);
- peak allocated and reserved, by replaying the recorded history. The history is a ring buffer that may
  start mid-run, so the level before its first event is recovered from the end state:
  `level_at_start = current - net change over the history`;
- fragmentation: reserved but unallocated bytes, per segment, and the largest free block;
- the OOM event (request, free device memory) when one was recorded;
- allocation sites by bytes alive at the reference moment (the OOM if one was recorded, else the peak),
  each folded to the innermost frame of the user's own code;
- the largest live blocks.

Two passes over each device's history columns; stacks arrive already folded to sites (`read_snapshot`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from torchtriage.analysis.fusion import verdict_of
from torchtriage.analysis.memory_facts import FRAGMENTATION_SHARE
from torchtriage.knowledge.frames import is_user_file
from torchtriage.model import Assessment, Category, Confidence, Evidence, Finding, Verdict
from torchtriage.sources.fields import as_int, as_text
from torchtriage.sources.memory_snapshot import (
    ALLOC,
    FREE,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    Block,
    DeviceHistory,
    MemorySnapshot,
    interpret,
    load_snapshot,
)

TOP_SITES = 10
TOP_BLOCKS = 10
TOP_SEGMENTS = 10
BEFORE_HISTORY = "(allocated before the recorded history began)"
NO_STACK = "(no stack recorded)"


def format_bytes(value: float) -> str:
    value = float(value)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.2f} {unit}"
        value /= 1024
    return f"{sign}{value:.2f} TiB"  # pragma: no cover


def fold_frames(frames: list) -> tuple[str, tuple[str, ...]]:
    """The allocation site of a stack (innermost first): the user's innermost frame, and a short user stack.

    Falls back to the innermost Python frame of a library, then to the ATen operator that allocated.
    """
    user: list[str] = []
    first_python = None
    first_op = None
    for raw in frames:
        if not isinstance(raw, dict):
            continue
        filename = as_text(raw.get("filename", ""))  # never str(): a crafted field expands when formatted
        name = as_text(raw.get("name", ""))
        if filename.endswith(".py"):
            text = f"{filename}:{as_int(raw.get('line', 0), 0)} in {name}"
            if first_python is None:
                first_python = text
            if is_user_file(filename):
                user.append(text)
                if len(user) == 4:
                    break
        elif first_op is None and name.startswith("at::_ops::"):
            first_op = "aten::" + name[len("at::_ops::") :].split("::", 1)[0] + " (no Python frame recorded)"
    if user:
        return user[0], tuple(user)
    if first_python:
        return first_python, (first_python,)
    if first_op:
        return first_op, ()
    return NO_STACK, ()


@dataclass
class Site:
    site: str
    bytes: int
    count: int
    stack: list[str] = field(default_factory=list)


@dataclass
class DeviceMemory:
    device: int
    allocated: int
    reserved: int
    segments: int
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    peak_time_us: int | None = None
    history_events: int = 0
    oom: dict[str, Any] | None = None
    reference: str = "now"  # "oom", "peak" or "now": the moment the sites are measured at
    reference_bytes: int = 0
    sites: dict[str, Site] = field(default_factory=dict)
    largest_blocks: list[dict[str, Any]] = field(default_factory=list)
    fragmented_segments: list[dict[str, Any]] = field(default_factory=list)
    largest_free_block: int = 0
    expandable: bool = False
    notes: list[str] = field(default_factory=list)
    # Reserved but unallocated memory, in two kinds: whole segments that hold no block (a cache that
    # torch.cuda.empty_cache() returns), and free blocks inside segments that also hold live ones (the
    # fragments that cannot serve a request larger than the largest of them).
    cached_free: int = 0
    cached_segments: int = 0
    fragment_free: int = 0
    largest_fragment: int = 0

    @property
    def unallocated(self) -> int:
        return max(0, self.reserved - self.allocated)

    def top_sites(self, limit: int = TOP_SITES) -> list[Site]:
        return sorted(self.sites.values(), key=lambda s: (-s.bytes, s.site))[:limit]

    def to_facts(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "sites"}
        data["reserved_unallocated"] = self.unallocated
        total = self.reference_bytes or 1
        data["top_sites"] = [asdict(s) | {"share": round(s.bytes / total, 4)} for s in self.top_sites()]
        return data


def _add_site(sites: dict[str, Site], folded: tuple[str, tuple[str, ...]], size: int) -> None:
    site, stack = folded
    entry = sites.get(site)
    if entry is None:
        sites[site] = Site(site, size, 1, list(stack))
    else:
        entry.bytes += size
        entry.count += 1


def _segments(snapshot: MemorySnapshot, device: int) -> DeviceMemory:
    """What the device's segments hold now: totals, the cache and its fragments, the most fragmented segments."""
    allocated = reserved = segments = 0
    largest_free = cached_free = cached_segments = fragment_free = largest_fragment = 0
    expandable = False
    fragmented: list[tuple[int, int, dict[str, Any]]] = []
    for info in snapshot.segment_infos():
        if info.device != device:
            continue
        segments += 1
        reserved += info.total_size
        allocated += info.allocated_size
        largest_free = max(largest_free, info.largest_free_block)
        expandable = expandable or info.is_expandable
        free = info.total_size - info.allocated_size
        if info.allocated_size == 0:
            cached_free += info.total_size
            cached_segments += 1
            continue
        if free <= 0:
            continue
        fragment_free += free
        largest_fragment = max(largest_fragment, info.largest_free_block)
        record = {
            "address": hex(info.address),
            "total": info.total_size,
            "allocated": info.allocated_size,
            "free": free,
            "largest_free_block": info.largest_free_block,
            "stream": info.stream,
            "pool": info.segment_type,
        }
        if len(fragmented) < TOP_SEGMENTS:
            heapq.heappush(fragmented, (free, info.address, record))
        elif free > fragmented[0][0]:
            heapq.heapreplace(fragmented, (free, info.address, record))
    result = DeviceMemory(device, allocated, reserved, segments)
    result.largest_free_block = largest_free
    result.expandable = expandable or bool(snapshot.allocator_settings.get("expandable_segments"))
    result.fragmented_segments = [r for _, _, r in sorted(fragmented, key=lambda x: (-x[0], x[1]))]
    result.cached_free, result.cached_segments = cached_free, cached_segments
    result.fragment_free, result.largest_fragment = fragment_free, largest_fragment
    return result


def _largest_blocks(live_now: list[Block]) -> list[dict[str, Any]]:
    return [
        {"address": hex(b.address), "size": b.size, "requested_size": b.requested_size, "state": b.state,
         "site": b.site[0]}
        for b in heapq.nlargest(TOP_BLOCKS, live_now, key=lambda b: b.size)
    ]  # fmt: skip


def _peaks(history: DeviceHistory) -> tuple[int, int, int, int, int, int | None]:
    """Pass 1 over the history: net allocated and reserved change, their peaks, the peak's and last OOM's index."""
    level = reserved_level = 0
    peak = peak_reserved = 0
    peak_index = -1
    oom_index = None
    for index, (kind, size) in enumerate(zip(history.kind, history.size, strict=True)):
        if kind == ALLOC:
            level += size
            if level > peak:
                peak, peak_index = level, index
        elif kind == FREE:
            level -= size
        elif kind == SEGMENT_ALLOC:
            reserved_level += size
            if reserved_level > peak_reserved:
                peak_reserved = reserved_level
        elif kind == SEGMENT_FREE:
            reserved_level -= size
        elif kind == OOM:
            oom_index = index
    return level, peak, peak_index, reserved_level, peak_reserved, oom_index


def _alive_at(history: DeviceHistory, stop: int, baseline: int) -> tuple[dict[int, tuple[int, int]], set[int], int]:
    """Pass 2: replay up to `stop`, keeping who allocated each live address; the addresses ever touched; the level."""
    live: dict[int, tuple[int, int]] = {}
    touched: set[int] = set()
    level = baseline
    columns = zip(history.kind, history.addr, history.size, history.site, strict=True)
    for index, (kind, addr, size, site) in enumerate(columns):
        if kind == ALLOC:
            touched.add(addr)
            if index <= stop:
                live[addr] = (size, site)
                level += size
        elif kind == FREE:
            touched.add(addr)
            if index <= stop:
                live.pop(addr, None)
                level -= size
    return live, touched, level


def analyse_device(snapshot: MemorySnapshot, device: int) -> DeviceMemory:
    result = _segments(snapshot, device)
    live_now = [b for b in snapshot.blocks() if b.device == device and b.state.startswith("active")]
    result.largest_blocks = _largest_blocks(live_now)
    history = snapshot.history(device)
    if not len(history):
        result.reference = "now"
        result.reference_bytes = result.allocated
        for block in live_now:
            _add_site(result.sites, block.site, block.size)
        return result

    level, peak, peak_index, reserved_level, peak_reserved, oom_index = _peaks(history)
    result.history_events = len(history)
    baseline = result.allocated - level
    reserved_baseline = result.reserved - reserved_level
    if baseline < 0 or reserved_baseline < 0:
        result.notes.append(
            "the history and the segments disagree (the snapshot was taken while memory changed?): "
            "peaks are measured from zero at the start of the history"
        )
        baseline, reserved_baseline = max(0, baseline), max(0, reserved_baseline)
    result.peak_allocated = max(baseline + peak, result.allocated)
    result.peak_reserved = max(reserved_baseline + peak_reserved, result.reserved)
    result.peak_time_us = _time_at(history, peak_index)
    if oom_index is not None:
        site, stack = snapshot.sites[history.site[oom_index]]
        result.oom = {
            "requested": history.size[oom_index],
            "device_free": history.device_free.get(oom_index),
            "time_us": _time_at(history, oom_index),
            "site": site,
            "stack": list(stack),
            "history_index": oom_index,
        }
        result.reference, stop = "oom", oom_index
    else:
        result.reference, stop = "peak", peak_index

    live, touched, result.reference_bytes = _alive_at(history, stop, baseline)
    tracked = 0
    for size, site in live.values():
        _add_site(result.sites, snapshot.sites[site], size)
        tracked += size
    # Blocks alive now that the history never touched were alive all along: their stacks name their sites.
    for block in live_now:
        if block.address not in touched:
            _add_site(result.sites, block.site, block.size)
            tracked += block.size
    if result.reference_bytes - tracked > 0:
        result.sites[BEFORE_HISTORY] = Site(BEFORE_HISTORY, result.reference_bytes - tracked, 0)
    return result


def _time_at(history: DeviceHistory, index: int) -> int | None:
    if index < 0 or history.time_us[index] < 0:
        return None
    return history.time_us[index]


def read_snapshot(path: str, progress: Callable[[int], None] | None = None) -> MemorySnapshot:
    """Read a snapshot file, folding each recorded stack to its allocation site as it is read."""
    return load_snapshot(path, fold_frames, progress)


def snapshot_from_data(data: Any, path: str = "<memory>") -> MemorySnapshot:
    """The same, for snapshot data already in memory (as `torch.cuda.memory._snapshot()` returns it)."""
    return interpret(data, path, fold_frames)


@dataclass
class MemoryReport:
    path: str
    devices: list[DeviceMemory]
    format: str
    problems: list[str]

    @property
    def primary(self) -> DeviceMemory | None:
        with_oom = [d for d in self.devices if d.oom]
        pool = with_oom or self.devices
        return max(pool, key=lambda d: (d.reserved, d.history_events), default=None)


def analyse_snapshot(snapshot: MemorySnapshot) -> MemoryReport:
    devices = [analyse_device(snapshot, device) for device in snapshot.devices()]
    devices = [d for d in devices if d.reserved or d.history_events]
    return MemoryReport(snapshot.path, devices, snapshot.format, list(snapshot.problems))


def is_fragmented(device: DeviceMemory) -> bool:
    """Free memory stuck in pieces: free blocks inside segments that still hold live ones.

    Whole segments that hold no block are a cache, and one large free block serves any request up to
    its size: neither is fragmentation. The memory is fragmented when a request would have fitted in
    the free pieces together but in none of them, or when the pieces are a large share of what is
    reserved and no one of them holds most of it.
    """
    request = device.oom["requested"] if device.oom else None
    if request and device.fragment_free >= request and device.largest_fragment < request:
        return True
    large_share = device.reserved > 0 and device.fragment_free / device.reserved >= FRAGMENTATION_SHARE
    return large_share and device.largest_fragment < device.fragment_free / 2


def _usage(device: DeviceMemory) -> str:
    parts = []
    if device.cached_free:
        segments = f"{device.cached_segments} segment{'s' if device.cached_segments != 1 else ''}"
        parts.append(f"{format_bytes(device.cached_free)} cached in {segments} that hold no tensor")
    if device.fragment_free:
        parts.append(f"{format_bytes(device.fragment_free)} free inside segments in use")
    split = f": {', '.join(parts)}" if parts else ""
    return (
        f"{format_bytes(device.allocated)} allocated in {format_bytes(device.reserved)} reserved "
        f"({format_bytes(device.unallocated)} reserved but unallocated{split})"
    )


def _top_site_text(device: DeviceMemory, top: list[Site]) -> str:
    if not top:
        return ""
    share = top[0].bytes / max(device.reference_bytes, 1)
    moment = {"oom": "at the OOM", "peak": "at the peak", "now": "now"}[device.reference]
    return f" Most memory alive {moment} comes from {top[0].site} ({format_bytes(top[0].bytes)}, {share:.0%})."


def _memory_facts(device: DeviceMemory, top: list[Site]) -> dict[str, Any]:
    """What the memory rules' action templates name (knowledge/rules/memory.toml)."""
    facts: dict[str, Any] = {
        "device": device.device,
        "unallocated": format_bytes(device.fragment_free),
        "share": f"{device.fragment_free / max(device.reserved, 1):.0%}",
    }
    if top and top[0].site != BEFORE_HISTORY:
        facts["top_site"] = top[0].site
    if is_fragmented(device):
        facts["fragmented"] = True
        if not device.expandable:
            facts["not_expandable"] = True
    return facts


def _memory_findings(report: MemoryReport, device: DeviceMemory, top: list[Site]) -> list[Finding]:
    ev = Evidence("memory_snapshot", report.path)
    facts = _memory_facts(device, top)
    findings: list[Finding] = []
    if device.oom:
        oom = device.oom
        free = f" with {format_bytes(oom['device_free'])} free on the device" if oom["device_free"] is not None else ""
        findings.append(
            Finding(
                "memory.oom",
                [],
                f"allocation of {format_bytes(oom['requested'])} failed{free}, at {oom['site']}",
                role="primary",
                category="oom",
                evidence=[Evidence("memory_snapshot", report.path, text=f"oom event #{oom['history_index']}")],
                facts=facts,
            )
        )
    if is_fragmented(device):
        findings.append(
            Finding(
                "memory.fragmentation",
                [],
                f"{format_bytes(device.fragment_free)} of {format_bytes(device.reserved)} reserved is free inside "
                f"segments that hold live tensors (largest such block {format_bytes(device.largest_fragment)}): "
                "the caching allocator is fragmented",
                role="primary" if not device.oom else "symptom",
                category="oom",
                evidence=[ev],
                facts=facts,
            )
        )
    if top and findings:
        findings.append(
            Finding(
                "memory.top_site",
                [],
                f"top allocation site: {top[0].site} holds {format_bytes(top[0].bytes)} in {top[0].count} blocks",
                role="symptom",
                category="oom",
                evidence=[ev],
                facts=facts,
            )
        )
    return findings


def assess_memory(report: MemoryReport) -> Assessment:
    """What one snapshot says: the OOM and what filled the device, fragmentation, or that all is well."""
    device = report.primary
    facts: dict[str, Any] = {
        "snapshot": report.path,
        "format": report.format,
        "devices": [d.to_facts() for d in report.devices],
    }
    notes = [n for d in report.devices for n in d.notes]
    if device is None:
        summary = "the snapshot holds no segments and no history: nothing was allocated when it was taken."
        return Assessment("memory_snapshot", [], summary, Category.OK, facts=facts, files=[report.path])
    facts["primary_device"] = device.device
    top = device.top_sites()
    findings = _memory_findings(report, device, top)
    usage = _usage(device)
    peak = (
        f"; peak {format_bytes(device.peak_allocated)} allocated, {format_bytes(device.peak_reserved)} reserved"
        if device.peak_allocated is not None
        else ""
    )
    if device.oom:
        oom = device.oom
        free = f" with {format_bytes(oom['device_free'])} free on the device" if oom["device_free"] is not None else ""
        summary = (
            f"CUDA out of memory on device {device.device}: a {format_bytes(oom['requested'])} request{free}; "
            f"{usage}.{_top_site_text(device, top)}"
        )
        category, confidence = Category.OOM, Confidence.HIGH
    elif findings:
        summary = f"device {device.device}: {usage}{peak}.{_top_site_text(device, top)}"
        category, confidence = Category.OOM, Confidence.MEDIUM
    else:
        summary = f"ok: device {device.device}: {usage}{peak}.{_top_site_text(device, top)}"
        category, confidence = Category.OK, Confidence.MEDIUM
    return Assessment(
        source="memory_snapshot",
        findings=findings,
        summary=summary,
        category=category,
        confidence=confidence,
        facts=facts,
        files=[report.path],
        problems=report.problems + notes,
        lead=findings[0] if findings else None,
    )


def build_memory_verdict(report: MemoryReport) -> Verdict:
    """The verdict of one snapshot (`torchtriage memory`)."""
    return verdict_of(assess_memory(report))


def compare_reports(before: MemoryReport, after: MemoryReport) -> Verdict:
    """What grew from `before` to `after`, by allocation site (each measured at its OOM, peak or now)."""
    a, b = before.primary, after.primary
    empty = DeviceMemory(0, 0, 0, 0)
    a, b = a or empty, b or empty
    names = set(a.sites) | set(b.sites)
    rows = []
    for name in names:
        x, y = a.sites.get(name), b.sites.get(name)
        bx, by = (x.bytes if x else 0), (y.bytes if y else 0)
        if bx != by:
            rows.append({"site": name, "before": bx, "after": by, "delta": by - bx})
    rows.sort(key=lambda r: (-r["delta"], r["site"]))
    grew = [r for r in rows if r["delta"] > 0]
    totals = {
        key: {"before": getattr(a, key), "after": getattr(b, key)}
        for key in ("allocated", "reserved", "peak_allocated", "peak_reserved", "reference_bytes")
    }
    facts = {"before": before.path, "after": after.path, "totals": totals, "sites": rows[:50]}
    growth = b.reference_bytes - a.reference_bytes
    findings = []
    if grew and growth > 0:
        top = grew[0]
        findings.append(
            Finding(
                "memory.growth",
                [],
                f"memory alive grew by {format_bytes(growth)}; the most from {top['site']} "
                f"(+{format_bytes(top['delta'])})",
                role="primary",
                category="oom",
                evidence=[Evidence("memory_snapshot", after.path), Evidence("memory_snapshot", before.path)],
                facts={"site": top["site"], "delta": format_bytes(top["delta"])},
            )
        )
        summary = (
            f"{format_bytes(a.reference_bytes)} → {format_bytes(b.reference_bytes)} alive "
            f"(+{format_bytes(growth)}); grew most: {top['site']} (+{format_bytes(top['delta'])})."
        )
    else:
        summary = (
            f"no growth: {format_bytes(a.reference_bytes)} → {format_bytes(b.reference_bytes)} alive "
            f"({format_bytes(growth)})."
        )
    assessment = Assessment(
        "memory_snapshot",
        findings,
        summary,
        Category.OOM if findings else Category.OK,
        confidence=Confidence.MEDIUM,
        facts=facts,
        files=[before.path, after.path],
        problems=before.problems + after.problems,
        lead=findings[0] if findings else None,
    )
    return verdict_of(assessment)
