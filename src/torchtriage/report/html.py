"""Self-contained HTML pages: inline CSS and SVG only, no script, nothing fetched from the network."""

from __future__ import annotations

import html
from typing import Any

from torchtriage.model import Verdict
from torchtriage.report.safe_text import encodable
from torchtriage.report.text import machine_lines

_COLOURS = {
    "compute": "#4e79a7",
    "communication": "#e15759",
    "memory": "#f28e2b",
    "idle": "#bab0ac",
    "overlapped_communication": "#b07aa1",
}
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
h3{font-size:14px;margin-top:20px}h4{font-size:13px;margin-top:16px}
.verdict{padding:12px;border-left:6px solid #e15759;background:#fdf3f3}
.ok{border-left-color:#59a14f;background:#f3fbf2}
table{border-collapse:collapse;font-size:13px}td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}
th{background:#f6f6f6}td.l,th.l{text-align:left}.legend span{display:inline-block;margin-right:14px;font-size:12px}
.sw{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:middle}
.problems{color:#8a5a00;font-size:13px}svg text{font-size:11px;font-family:inherit}
tr.culprit td{background:#fde2e2;font-weight:600}pre{background:#f7f7f7;padding:8px;font-size:12px;overflow-x:auto;
white-space:pre-wrap;word-break:break-all}details{margin:4px 0}summary{cursor:pointer;font-size:13px}
.sources li{font-size:13px}.missing{color:#777}.meta{color:#666;font-size:12px}code{font-size:12px}
td.cell{text-align:left;font-size:12px;white-space:nowrap}td.bad{background:#fde2e2}td.absent{background:#eee;color:#999}
"""

esc = html.escape


def page(title: str, body: str) -> str:
    # A name's bytes that are not UTF-8 are written as the terminal shows them (`\xff`): the page is UTF-8.
    return encodable(
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f"<style>{_CSS}</style></head><body>{body}</body></html>"
    )


def verdict_head(verdict: Verdict) -> str:
    """The coloured box: category, confidence, culprit ranks and the summary."""
    ok = "" if verdict.findings else " ok"
    return (
        f'<div class="verdict{ok}"><b>{esc(verdict.category)}</b> (confidence {esc(verdict.confidence)})'
        + (f" — culprit rank {', '.join(map(str, verdict.culprit_ranks))}" if verdict.culprit_ranks else "")
        + "".join(f'<br><span class="machine">machine: {esc(line)}</span>' for line in machine_lines(verdict))
        + f"<p>{esc(verdict.summary)}</p></div>"
    )


def actions_block(verdict: Verdict) -> str:
    if not verdict.actions:
        return ""
    parts = ["<h2>What to do</h2><ol>"]
    for action in verdict.actions:
        env = "".join(f"<br><code>export {esc(k)}={esc(v)}</code>" for k, v in action.env.items())
        parts.append(
            f"<li><b>{esc(action.title)}</b> <small>[{esc(action.rule)}]</small><br>{esc(action.detail)}{env}</li>"
        )
    parts.append("</ol>")
    return "".join(parts)


def verdict_block(verdict: Verdict) -> str:
    parts = [verdict_head(verdict), actions_block(verdict)]
    if verdict.problems:
        parts.append('<h2>Could not read everything</h2><ul class="problems">')
        parts += [f"<li>{esc(p)}</li>" for p in verdict.problems]
        parts.append("</ul>")
    return "".join(parts)


def _legend(keys: list[str]) -> str:
    return (
        '<div class="legend">'
        + "".join(
            f'<span><i class="sw" style="background:{_COLOURS[k]}"></i>{esc(k.replace("_", " "))}</span>' for k in keys
        )
        + "</div>"
    )


def stacked_bars(ranks: list[dict[str, Any]]) -> str:
    """One horizontal bar per rank: its mean step split into compute / communication / memory / idle."""
    keys = ["compute", "communication", "memory", "idle"]
    rows = [r for r in ranks if r["mean_step"] and r["has_gpu"]]
    if not rows:
        return "<p>No GPU events: no GPU breakdown (CPU-only traces).</p>"
    width, label, row_h = 900, 70, 24
    longest = max(r["mean_step"]["duration"] for r in rows) or 1
    scale = (width - label - 80) / longest
    svg = [f'<svg width="{width}" height="{row_h * len(rows) + 10}" role="img" aria-label="step breakdown">']
    for i, r in enumerate(rows):
        y = 5 + i * row_h
        svg.append(f'<text x="0" y="{y + 15}">rank {r["rank"]}</text>')
        x = float(label)
        for key in keys:
            w = r["mean_step"][key] * scale
            if w > 0:
                title = f"rank {r['rank']} {key}: {r['mean_step'][key] / 1000:.2f} ms"
                svg.append(
                    f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 6}" fill="{_COLOURS[key]}">'
                    f"<title>{esc(title)}</title></rect>"
                )
            x += w
        svg.append(f'<text x="{x + 4:.1f}" y="{y + 15}">{r["mean_step"]["duration"] / 1000:.1f} ms</text>')
    svg.append("</svg>")
    return _legend(keys) + "".join(svg)


def step_timeline(timelines: dict[int, list[tuple[float, float, str]]], title: str) -> str:
    """Per-rank lanes of one step, each rank on its own clock (time from its step's start)."""
    if not timelines:
        return "<p>No timeline.</p>"
    width, label, lane = 900, 70, 22
    longest = max((max(e for _, e, _ in events) for events in timelines.values() if events), default=1) or 1
    scale = (width - label - 10) / longest
    svg = [f'<svg width="{width}" height="{lane * len(timelines) + 30}" role="img" aria-label="{esc(title)}">']
    for i, (rank, events) in enumerate(sorted(timelines.items())):
        y = 5 + i * lane
        svg.append(f'<text x="0" y="{y + 14}">rank {rank}</text>')
        svg.append(f'<rect x="{label}" y="{y}" width="{width - label - 10}" height="{lane - 6}" fill="#f4f4f4"/>')
        for start, end, kind in events:
            w = max((end - start) * scale, 0.5)
            svg.append(
                f'<rect x="{label + start * scale:.1f}" y="{y}" width="{w:.1f}" height="{lane - 6}" '
                f'fill="{_COLOURS.get(kind, "#999")}"><title>{esc(kind)} {(end - start) / 1000:.3f} ms</title></rect>'
            )
    axis_y = 5 + len(timelines) * lane + 12
    svg.append(f'<text x="{label}" y="{axis_y}">0</text>')
    svg.append(f'<text x="{width - 80}" y="{axis_y}">{longest / 1000:.1f} ms</text></svg>')
    return _legend(["compute", "communication", "memory"]) + "".join(svg)


def skew_heatmap(collectives: list[dict[str, Any]], ranks: list[int], limit: int = 120) -> str:
    """Ranks × collectives: how long each rank waited in each collective (white: none, red: the most)."""
    shown = collectives[:limit]
    if not shown or not ranks:
        return "<p>No collectives matched across ranks.</p>"
    cell_w = max(4, min(20, 820 // len(shown)))
    cell_h, label = 18, 70
    worst = max((max(c["waits"].values(), default=0) for c in shown), default=0) or 1
    svg = [f'<svg width="{label + cell_w * len(shown) + 10}" height="{cell_h * len(ranks) + 10}" role="img" '
           'aria-label="collective skew heat map">']  # fmt: skip
    for i, rank in enumerate(ranks):
        y = 5 + i * cell_h
        svg.append(f'<text x="0" y="{y + 13}">rank {rank}</text>')
        for j, c in enumerate(shown):
            wait = c["waits"].get(rank, c["waits"].get(str(rank)))
            if wait is None:
                fill, tip = "#ddd", "absent"
            else:
                level = int(255 * (1 - min(wait / worst, 1.0)))
                fill, tip = f"rgb(255,{level},{level})", f"waited {wait / 1000:.3f} ms"
            last = " (arrived last)" if c["last_rank"] == rank else ""
            svg.append(
                f'<rect x="{label + j * cell_w}" y="{y}" width="{cell_w - 1}" height="{cell_h - 2}" fill="{fill}">'
                f"<title>{esc(c['key'])} {esc(c['name'])}: rank {rank} {tip}{last}</title></rect>"
            )
    svg.append("</svg>")
    note = f"<p><small>first {len(shown)} of {len(collectives)} collectives; darker = longer wait</small></p>"
    return "".join(svg) + note


def render_trace_html(verdict: Verdict, timelines: dict[int, list] | None = None) -> str:
    body = ["<h1>torchtriage trace</h1>", verdict_block(verdict)]
    body += trace_sections(verdict, timelines)
    return page("torchtriage trace", "".join(body))


def trace_sections(verdict: Verdict, timelines: dict[int, list] | None = None) -> list[str]:
    """The plots and the per-rank table of a trace verdict (shared by `trace --html` and `report`)."""
    facts = verdict.facts
    ranks = facts.get("ranks", [])
    body: list[str] = []
    body.append("<h2>Where a step's time goes (mean step, GPU timeline)</h2>")
    body.append(stacked_bars(ranks))
    body.append("<h2>One step, every rank</h2>")
    body.append(step_timeline(timelines or facts.get("timelines", {}), "step timeline"))
    body.append("<h2>Collective skew: how long each rank waited</h2>")
    body.append(skew_heatmap(facts.get("collectives", []), [r["rank"] for r in ranks]))
    headers = ("rank", "steps", "step ms", "compute", "comm", "memory", "idle", "overlapped comm", "last arrivals")
    body.append("<h2>Per rank</h2><table><tr>" + "".join(f"<th>{h}</th>" for h in headers) + "</tr>")
    for r in ranks:
        m = r["mean_step"]
        if not m:
            continue
        cells = [m[k] / 1000 for k in ("duration", "compute", "communication", "memory", "idle")]
        cells.append(m["overlapped_communication"] / 1000)
        body.append(
            f"<tr><td>{r['rank']}</td><td>{len(r['steps'])}</td>"
            + "".join(f"<td>{v:.2f}</td>" for v in cells)
            + f"<td>{r['last_arrivals']}</td></tr>"
        )
    body.append("</table>")
    return body


# ----------------------------------------------------------------------------- memory


def _bytes(value: float) -> str:
    from torchtriage.analysis.memory import format_bytes

    return format_bytes(value)


def memory_series(snapshot: Any, device: Any, points: int = 800) -> dict[str, Any] | None:
    """Allocated and reserved bytes over the recorded history of one device, at most `points` samples.

    One pass over the history, O(points) memory: each sample is a bucket of events, keeping the highest
    level inside it, so no peak is lost however long the history. The level before the first event is
    recovered from the end state, as `analyse_device` does. `snapshot` is a MemorySnapshot, `device`
    the DeviceMemory of its analysis. (It belongs beside `analyse_device`; it lives here while only the
    HTML uses it.)
    """
    from torchtriage.sources.memory_snapshot import ALLOC, FREE, OOM, SEGMENT_ALLOC, SEGMENT_FREE

    events = device.history_events
    if not events:
        return None
    history = snapshot.history(device.device)
    bucket = max(1, -(-events // points))
    index: list[int] = []
    allocated: list[int] = []
    reserved: list[int] = []
    level = reserved_level = 0
    high = high_reserved = None
    oom_index = None
    for event, (kind, size) in enumerate(zip(history.kind, history.size, strict=True)):
        if kind == ALLOC:
            level += size
        elif kind == FREE:
            level -= size
        elif kind == SEGMENT_ALLOC:
            reserved_level += size
        elif kind == SEGMENT_FREE:
            reserved_level -= size
        elif kind == OOM:
            oom_index = event
        high = level if high is None or level > high else high
        high_reserved = reserved_level if high_reserved is None or reserved_level > high_reserved else high_reserved
        if event % bucket == bucket - 1:
            index.append(event)
            allocated.append(high)
            reserved.append(high_reserved)
            high = high_reserved = None
    if high is not None:
        index.append(events - 1)
        allocated.append(high)
        reserved.append(high_reserved or 0)
    baseline = max(0, device.allocated - level)
    reserved_baseline = max(0, device.reserved - reserved_level)
    return {
        "device": device.device,
        "events": events,
        "index": index,
        "allocated": [baseline + v for v in allocated],
        "reserved": [reserved_baseline + v for v in reserved],
        "oom_index": oom_index,
        "oom_requested": device.oom["requested"] if device.oom else None,
    }


def _chart_frame(label, width, height, left, base, scale, highest, format_value) -> list[str]:
    """An SVG chart's opening, its x axis and five labelled horizontal grid lines up to `highest`."""
    svg = [
        f'<svg width="{width}" height="{height}" role="img" aria-label="{esc(label)}">',
        f'<line x1="{left}" y1="{base}" x2="{width - 10}" y2="{base}" stroke="#999"/>',
    ]
    for k in range(5):
        value = highest * k / 4
        y = base - value * scale
        svg.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - 10}" y2="{y:.1f}" stroke="#eee"/>')
        svg.append(f'<text x="0" y="{y + 4:.1f}">{esc(format_value(value))}</text>')
    return svg


def allocation_timeline(series: dict[str, Any] | None) -> str:
    """Allocated (filled) and reserved (line) bytes over the history events, the OOM marked."""
    if not series or not series["index"]:
        return "<p>No allocation history in this snapshot: no timeline (record it with _record_memory_history).</p>"
    if not max(series["reserved"]) and not max(series["allocated"]):
        return "<p>Nothing was allocated on this device over the recorded history.</p>"
    width, height, left, bottom, top = 900, 240, 80, 24, 10
    events = max(series["events"] - 1, 1)
    highest = max(max(series["reserved"]), max(series["allocated"])) or 1
    sx = (width - left - 10) / events
    sy = (height - top - bottom) / highest

    def point(i: int, v: float) -> str:
        return f"{left + i * sx:.1f},{height - bottom - v * sy:.1f}"

    base = height - bottom
    area = " ".join(point(i, v) for i, v in zip(series["index"], series["allocated"], strict=True))
    first, last = series["index"][0], series["index"][-1]
    svg = _chart_frame("allocation timeline", width, height, left, base, sy, highest, _bytes)
    svg.append(
        f'<polygon points="{left + first * sx:.1f},{base} {area} {left + last * sx:.1f},{base}" '
        f'fill="{_COLOURS["compute"]}" fill-opacity="0.55" stroke="{_COLOURS["compute"]}">'
        f"<title>allocated, peak {esc(_bytes(max(series['allocated'])))}</title></polygon>"
    )
    line = " ".join(point(i, v) for i, v in zip(series["index"], series["reserved"], strict=True))
    svg.append(
        f'<polyline points="{line}" fill="none" stroke="#555" stroke-width="1.5" stroke-dasharray="4 2">'
        f"<title>reserved, peak {esc(_bytes(max(series['reserved'])))}</title></polyline>"
    )
    if series["oom_index"] is not None:
        x = left + series["oom_index"] * sx
        requested = f" ({_bytes(series['oom_requested'])} requested)" if series["oom_requested"] else ""
        svg.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{base}" stroke="{_COLOURS["communication"]}" '
            f'stroke-width="2"><title>OOM at event {series["oom_index"]}{esc(requested)}</title></line>'
        )
        svg.append(
            f'<text x="{x - 4:.1f}" y="{base - 8}" text-anchor="end" fill="{_COLOURS["communication"]}">'
            f"OOM{esc(requested)}</text>"
        )
    svg.append(f'<text x="{left}" y="{height - 6}">event 0</text>')
    svg.append(f'<text x="{width - 110}" y="{height - 6}">event {series["events"] - 1:,}</text></svg>')
    legend = (
        '<div class="legend"><span><i class="sw" style="background:#4e79a7"></i>allocated</span>'
        '<span><i class="sw" style="background:#555"></i>reserved (dashed)</span>'
        + ('<span><i class="sw" style="background:#e15759"></i>OOM</span>' if series["oom_index"] is not None else "")
        + "</div>"
    )
    return legend + "".join(svg)


def sites_chart(sites: list[dict[str, Any]], moment: str) -> str:
    """Horizontal bars: bytes alive per allocation site at the reference moment, largest first."""
    if not sites:
        return "<p>No allocation site recorded.</p>"
    width, row = 900, 34
    largest = max(s["bytes"] for s in sites) or 1
    scale = (width - 200) / largest
    svg = [f'<svg width="{width}" height="{row * len(sites) + 6}" role="img" aria-label="bytes by site {esc(moment)}">']
    for i, site in enumerate(sites):
        y = 4 + i * row
        name = site["site"] if len(site["site"]) <= 130 else site["site"][:127] + "..."
        w = max(site["bytes"] * scale, 1)
        svg.append(f'<text x="0" y="{y + 10}">{esc(name)}<title>{esc(site["site"])}</title></text>')
        svg.append(
            f'<rect x="0" y="{y + 14}" width="{w:.1f}" height="12" fill="{_COLOURS["memory"]}">'
            f"<title>{esc(site['site'])}: {esc(_bytes(site['bytes']))} in {site['count']} blocks</title></rect>"
        )
        share = ""
        if "share" in site:
            share = f" ({site['share']:.0%})" if site["share"] >= 0.005 else " (<1%)"
        svg.append(f'<text x="{w + 6:.1f}" y="{y + 24}">{esc(_bytes(site["bytes"]))}{share}</text>')
    svg.append("</svg>")
    return "".join(svg)


_MOMENT = {"oom": "at the OOM", "peak": "at the peak", "now": "when the snapshot was taken"}


def memory_sections(verdict: Verdict, series: dict[int, dict[str, Any] | None], level: int = 2) -> list[str]:
    """Per device: the numbers, the allocation timeline and the by-site chart."""
    body: list[str] = []
    h = f"h{level}"
    for device in verdict.facts.get("devices", []):
        number = device["device"]
        body.append(f"<{h}>Device {number}</{h}>")
        cells = [
            ("allocated now", _bytes(device["allocated"])),
            ("reserved now", _bytes(device["reserved"])),
            ("reserved but unallocated", _bytes(device["reserved_unallocated"])),
            ("segments", str(device["segments"])),
        ]
        if device["peak_allocated"] is not None:
            cells += [
                ("peak allocated", _bytes(device["peak_allocated"])),
                ("peak reserved", _bytes(device["peak_reserved"])),
            ]
        if device["oom"]:
            oom = device["oom"]
            cells.append(("OOM request", _bytes(oom["requested"])))
            if oom["device_free"] is not None:
                cells.append(("device free at the OOM", _bytes(oom["device_free"])))
        body.append(
            "<table><tr>"
            + "".join(f"<th>{esc(k)}</th>" for k, _ in cells)
            + "</tr><tr>"
            + "".join(f"<td>{esc(v)}</td>" for _, v in cells)
            + "</tr></table>"
        )
        if device["oom"]:
            body.append(f"<p>The failed allocation came from <code>{esc(device['oom']['site'])}</code></p>")
        body.append(f"<p><b>Allocation timeline</b> ({device['history_events']:,} history events)</p>")
        body.append(allocation_timeline(series.get(number)))
        moment = _MOMENT[device["reference"]]
        body.append(f"<p><b>Bytes alive {esc(moment)}, by allocation site</b></p>")
        body.append(sites_chart(device["top_sites"], moment))
        if device["largest_blocks"]:
            body.append("<details><summary>largest live blocks</summary><table><tr><th>size</th>"
                        '<th class="l">address</th><th class="l">site</th></tr>')  # fmt: skip
            for block in device["largest_blocks"]:
                body.append(
                    f"<tr><td>{esc(_bytes(block['size']))}</td><td class='l'><code>{esc(block['address'])}</code></td>"
                    f"<td class='l'>{esc(block['site'])}</td></tr>"
                )
            body.append("</table></details>")
    return body


def render_memory_html(verdict: Verdict, series: dict[int, dict[str, Any] | None], title: str) -> str:
    """The verdict (or the --compare diff); with `series`, the devices of the verdict's facts too."""
    body = [f"<h1>torchtriage memory: {esc(title)}</h1>", verdict_block(verdict)]
    if series:
        body += memory_sections(verdict, series)
    if "sites" in verdict.facts and "totals" in verdict.facts:  # --compare
        body.append('<h2>What grew, by site</h2><table><tr><th>change</th><th>before</th><th>after</th>'
                    '<th class="l">site</th></tr>')  # fmt: skip
        for row in verdict.facts["sites"][:30]:
            sign = "+" if row["delta"] > 0 else ""
            body.append(
                f"<tr><td>{sign}{esc(_bytes(row['delta']))}</td><td>{esc(_bytes(row['before']))}</td>"
                f"<td>{esc(_bytes(row['after']))}</td><td class='l'>{esc(row['site'])}</td></tr>"
            )
        body.append("</table>")
    return page(f"torchtriage memory: {title}", "".join(body))


# ----------------------------------------------------------------------------- the run-folder report


def findings_table(verdict: Verdict) -> str:
    if not verdict.findings:
        return "<p>No finding.</p>"
    rows = ['<table><tr><th class="l">role</th><th class="l">kind</th><th class="l">ranks</th>'
            '<th class="l">what</th></tr>']  # fmt: skip
    for finding in verdict.findings:
        evidence = "".join(
            f"<li><code>{esc(e.file or e.source)}{':' + str(e.line) if e.line else ''}</code>"
            f"{' rank ' + str(e.rank) if e.rank is not None else ''}: {esc(e.text)}</li>"
            for e in finding.evidence
        )
        detail = f"<details><summary>evidence ({len(finding.evidence)})</summary><ul>{evidence}</ul></details>"
        rows.append(
            f"<tr><td class='l'>{esc(finding.role)}</td><td class='l'><code>{esc(finding.kind)}</code></td>"
            f"<td class='l'>{esc(', '.join(map(str, finding.ranks)))}</td>"
            f"<td class='l'>{esc(finding.message)}{detail if finding.evidence else ''}</td></tr>"
        )
    rows.append("</table>")
    return "".join(rows)


def stacks_section(positions: dict[int, Any], dumps: dict[int, Any], culprits: list[int]) -> str:
    """Per rank: its state and where (a RankPosition), and its main thread's stack."""
    from torchtriage.analysis.positions import describe

    rows = ['<table><tr><th>rank</th><th class="l">state</th><th class="l">op</th><th class="l">user frame</th>'
            '<th class="l">dump</th></tr>']  # fmt: skip
    for rank, position in sorted(positions.items()):
        frame = position.user_frame.text if position.user_frame else ""
        mark = ' class="culprit"' if rank in culprits else ""
        rows.append(
            f"<tr{mark}><td>{rank}{' (culprit)' if rank in culprits else ''}</td>"
            f"<td class='l'>{esc(position.state)}</td><td class='l'>{esc(position.op or '')}</td>"
            f"<td class='l'><code>{esc(frame)}</code></td><td class='l'><code>{esc(position.file)}</code></td></tr>"
        )
    rows.append("</table>")
    for rank, process in sorted(dumps.items()):
        thread = process.main_thread()
        frames = [f for f in thread.frames] if thread else []
        text = "\n".join(f"  {'[native] ' if f.native else ''}{f.text}" for f in frames) or "  (no frame)"
        name = (thread.name if thread else None) or "main thread"
        state = describe(positions[rank]) if rank in positions else ""
        rows.append(
            f"<details{' open' if rank in culprits else ''}><summary>rank {rank}: {esc(state)}</summary>"
            f"<pre>pid {process.pid}, {esc(name)} (innermost first)\n{esc(text)}</pre></details>"
        )
    return "".join(rows)


def flight_recorder_section(load: Any, culprits: list[int], columns: int = 12) -> str:
    """Per process group: ranks × the last collectives each recorded (sources.flight_recorder.LoadResult).

    A cell is the op and its state; a missing entry (a rank that never enqueued that seq) is marked.
    """
    dumps = sorted(load.dumps, key=lambda d: d.rank)
    if not dumps:
        return "<p>No flight-recorder dump could be read.</p>"
    groups: dict[str, str] = {}
    for dump in dumps:
        for name in dump.tracks:
            groups.setdefault(
                name, dump.pg_desc.get(name) or (dump.pg_config[name].desc if name in dump.pg_config else "")
            )
    parts = [f"<p class='meta'>{len(dumps)} dumps, backend {esc(dumps[0].backend)}, format {esc(dumps[0].version)}</p>"]
    for name, desc in sorted(groups.items()):
        seqs = sorted({s for d in dumps if name in d.tracks for s in d.tracks[name].seqs})
        shown = seqs[-columns:]
        parts.append(f"<p><b>process group {esc(name)}</b> {esc(desc)}: the last {len(shown)} of {len(seqs)} seqs</p>")
        head = "".join(f"<th>seq {s}</th>" for s in shown)
        parts.append(f'<table><tr><th>rank</th><th class="l">enqueued / started / completed</th>{head}</tr>')
        for dump in dumps:
            track = dump.tracks.get(name)
            by_seq = {}
            if track is not None:
                for i, seq in enumerate(track.seqs):
                    sig = dump.signatures.get(track.keys[i])
                    by_seq[seq] = (sig.op if sig else track.keys[i], track.states[i], track.sites[i])
            status = dump.pg_status.get(dump.pg_ids.get(name, ""), None)
            status_text = " / ".join(map(str, status)) if status else "?"
            cells = []
            for seq in shown:
                if seq not in by_seq:
                    cells.append('<td class="cell absent">never enqueued</td>')
                    continue
                op, state, site = by_seq[seq]
                bad = " bad" if state != "completed" else ""
                tip = f"{site.file}:{site.line} in {site.function}" if site else "no call site recorded"
                cells.append(f'<td class="cell{bad}" title="{esc(tip)}">{esc(op)}<br><small>{esc(state)}</small></td>')
            mark = ' class="culprit"' if dump.rank in culprits else ""
            parts.append(f"<tr{mark}><td>{dump.rank}</td><td class='l'>{esc(status_text)}</td>{''.join(cells)}</tr>")
        parts.append("</table>")
    if load.problems:
        parts.append(
            '<ul class="problems">'
            + "".join(f"<li>{esc(p.path)}: {esc(p.message)}</li>" for p in load.problems)
            + "</ul>"
        )
    return "".join(parts)


def glance_table(verdicts: list[tuple[str, Verdict]]) -> str:
    """One row per source's own verdict: what each says on its own."""
    rows = ['<table><tr><th class="l">source</th><th class="l">verdict</th><th class="l">culprit</th>'
            '<th class="l">summary</th></tr>']  # fmt: skip
    for name, verdict in verdicts:
        bad = " class='culprit'" if verdict.diagnosed_problem else ""
        rows.append(
            f"<tr{bad}><td class='l'>{esc(name)}</td><td class='l'>{esc(verdict.category)}</td>"
            f"<td class='l'>{esc(', '.join(map(str, verdict.culprit_ranks)) or '-')}</td>"
            f"<td class='l' style='font-weight:normal'>{esc(verdict.summary)}</td></tr>"
        )
    rows.append("</table>")
    return "".join(rows)


def render_report_html(
    folder: str,
    headline: Verdict | None,
    verdicts: list[tuple[str, Verdict]],
    sources: list[tuple[str, str, bool]],
    sections: list[tuple[str, str]],
    problems: list[str],
    generated: str = "",
) -> str:
    """The run-folder report: the headline verdict, which sources were found, then a section per source.

    `verdicts`: each source's own verdict, for the at-a-glance table; `sources`: (name, what was found or
    why not, found?); `sections`: (title, HTML already escaped).
    """
    body = [f"<h1>torchtriage report: {esc(folder)}</h1>"]
    if generated:
        body.append(f"<p class='meta'>{esc(generated)}</p>")
    if headline is not None:
        body.append(verdict_head(headline))
    if len(verdicts) > 1:
        body.append("<h2>Every source's verdict</h2>")
        body.append(glance_table(verdicts))
    body.append('<h2>Sources</h2><ul class="sources">')
    for name, detail, found in sources:
        body.append(
            f"<li{'' if found else ' class=missing'}><b>{esc(name)}</b>: "
            f"{'' if found else 'missing — '}{esc(detail)}</li>"
        )
    body.append("</ul>")
    for title, html_text in sections:
        body.append(f"<h2>{esc(title)}</h2>{html_text}")
    if problems:
        body.append('<h2>Could not read everything</h2><ul class="problems">')
        body += [f"<li>{esc(p)}</li>" for p in problems]
        body.append("</ul>")
    return page(f"torchtriage report: {folder}", "".join(body))


def monitor_section(windows: dict[int, list[dict[str, Any]]], decisions: list[dict[str, Any]]) -> str:
    """Step time by rank over the windows, the straggler decisions marked; the last window per rank."""
    ranks = sorted(windows)
    points = [(r, w) for r in ranks for w in windows[r] if w.get("step_ms_p50") is not None]
    if not points:
        return "<p>The step monitor wrote no complete window.</p>"
    width, height, left, bottom, top = 900, 260, 60, 24, 10
    last_step = max(w["last_step"] for _, w in points)
    highest = max(max(w["step_ms_p50"], w.get("data_ms") or 0) for _, w in points) or 1.0
    sx = (width - left - 10) / max(last_step, 1)
    sy = (height - top - bottom) / highest
    base = height - bottom
    svg = _chart_frame("step time by rank", width, height, left, base, sy, highest, lambda v: f"{v:.0f} ms")
    palette = ["#4e79a7", "#f28e2b", "#59a14f", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"]
    for index, rank in enumerate(ranks):
        colour = palette[index % len(palette)]
        line = " ".join(
            f"{left + w['last_step'] * sx:.1f},{base - w['step_ms_p50'] * sy:.1f}"
            for w in windows[rank]
            if w.get("step_ms_p50") is not None
        )
        svg.append(
            f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.5">'
            f"<title>rank {rank}: median step time per window</title></polyline>"
        )
    for decision in decisions:
        step = decision.get("step") or 0
        x = left + step * sx
        if decision.get("rank") is None:
            svg.append(
                f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{base}" stroke="{_COLOURS["communication"]}" '
                f'stroke-dasharray="3 2"><title>{esc(decision.get("line", "communication"))}</title></line>'
            )
            continue
        window = next((w for w in windows.get(decision["rank"], []) if w.get("last_step") == step), None)
        value = window["step_ms_p50"] if window else highest
        svg.append(
            f'<circle cx="{x:.1f}" cy="{base - value * sy:.1f}" r="5" fill="{_COLOURS["communication"]}">'
            f"<title>{esc(decision.get('line', ''))}</title></circle>"
        )
    svg.append(f'<text x="{left}" y="{height - 6}">step 0</text>')
    svg.append(f'<text x="{width - 80}" y="{height - 6}">step {last_step:,}</text></svg>')
    legend = "".join(
        f'<span><i class="sw" style="background:{palette[i % len(palette)]}"></i>rank {r}</span>'
        for i, r in enumerate(ranks[:16])
    )
    legend += f'<span><i class="sw" style="background:{_COLOURS["communication"]}"></i>straggler decision</span>'
    columns = ("step_ms_p50", "data_ms", "forward_ms", "backward_ms", "gpu_forward_ms", "tokens_per_s", "mfu")
    rows = []
    for rank in ranks:
        last = windows[rank][-1]
        named = any(d.get("rank") == rank and d.get("step") == last.get("last_step") for d in decisions)
        cells = "".join(
            f"<td>{'' if last.get(c) is None else format(last[c], '.3g' if c == 'mfu' else ',.1f')}</td>"
            for c in columns
        )
        rows.append(f"<tr{' class=culprit' if named else ''}><td>{rank}</td>{cells}</tr>")
    header = "".join(f"<th>{esc(c.replace('_', ' '))}</th>" for c in ("rank", *columns))
    table = f"<h3>The last window of each rank</h3><table><tr>{header}</tr>{''.join(rows)}</table>"
    said = "".join(f"<li>{esc(d.get('line', ''))}</li>" for d in decisions[-20:])
    listed = f"<h3>Decisions (the last 20)</h3><ul>{said}</ul>" if said else "<p>No rank was named: an even job.</p>"
    return f'<div class="legend">{legend}</div>' + "".join(svg) + table + listed
