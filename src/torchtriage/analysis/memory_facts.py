"""What the caching allocator's OOM message says about memory, in bytes, and whether it is fragmentation.

The allocator prints: tried to allocate X; total capacity; free; in use by this process; allocated by
PyTorch; reserved by PyTorch but unallocated. When the reserved-but-unallocated part could have held
the request, or is a large share of what PyTorch reserved, the memory is there but in pieces: that is
fragmentation, and expandable segments fix it without shrinking the model.
"""

from __future__ import annotations

import re

from torchtriage.model import Evidence, Finding

_SIZE = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[KMGTP]?i?B|bytes?)", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
FRAGMENTATION_SHARE = 0.20
_MEMORY_FACTS = ("alloc", "gpu_total", "gpu_free", "gpu_in_use", "allocated", "reserved_unallocated")


def parse_size(text: str) -> int | None:
    """'2.00 GiB' -> 2147483648; '0 bytes' -> 0. Decimal units (GB) are read as binary, as torch prints."""
    match = _SIZE.search(text)
    if not match:
        return None
    unit = match.group("unit").upper()
    scale = 1 if unit.startswith("BYTE") else _UNITS.get(unit[0] if unit[0] in _UNITS else "", 1)
    size = float(match.group("number")) * scale
    return int(size) if size < 2.0**63 else None  # a size past any memory is not a size


def _gib(value: int) -> str:
    return f"{value / (1 << 30):.2f} GiB"


def memory_findings(events) -> tuple[list[Finding], dict]:
    """Facts in bytes from the OOM events, and a fragmentation finding when the numbers show one."""
    sizes: dict[str, int] = {}
    source = None
    for event in events:
        for key in _MEMORY_FACTS:
            if key in event.facts and key not in sizes:
                parsed = parse_size(event.facts[key])
                if parsed is not None:
                    sizes[key] = parsed
                    source = source or event
    if not sizes:
        return [], {}
    facts = {"memory_bytes": sizes}
    allocated, unallocated = sizes.get("allocated"), sizes.get("reserved_unallocated")
    if allocated is None or unallocated is None:
        return [], facts
    reserved = allocated + unallocated
    share = unallocated / reserved if reserved else 0.0
    facts["reserved_unallocated_share"] = round(share, 3)
    request = sizes.get("alloc")
    fragmented = share >= FRAGMENTATION_SHARE or (request is not None and unallocated >= request and unallocated > 0)
    if not fragmented:
        return [], facts
    message = (
        f"{_gib(unallocated)} is reserved by PyTorch but unallocated ({share:.0%} of what it reserved)"
        + (
            f", enough for the {_gib(request)} request had it been contiguous"
            if request and unallocated >= request
            else ""
        )
        + ": the allocator's cache is fragmented"
    )
    ranks = sorted({e.rank for e in events if e.rank is not None})
    evidence = [Evidence("log", source.file, source.line, source.rank, source.text[:500])] if source else []
    return [Finding("logs.oom_fragmentation", ranks, message, "primary", "oom", evidence)], facts
