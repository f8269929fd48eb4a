"""Self-contained HTML pages: inline CSS and SVG only, no script, nothing fetched from the network."""

from __future__ import annotations

import html
from typing import Any

from torchtriage.model import Verdict

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
.verdict{padding:12px;border-left:6px solid #e15759;background:#fdf3f3}
.ok{border-left-color:#59a14f;background:#f3fbf2}
table{border-collapse:collapse;font-size:13px}td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}
th{background:#f6f6f6}td.l,th.l{text-align:left}.legend span{display:inline-block;margin-right:14px;font-size:12px}
.sw{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:middle}
.problems{color:#8a5a00;font-size:13px}svg text{font-size:11px;font-family:inherit}
"""

esc = html.escape


def page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f"<style>{_CSS}</style></head><body>{body}</body></html>"
    )


def verdict_block(verdict: Verdict) -> str:
    ok = "" if verdict.findings else " ok"
    parts = [
        f'<div class="verdict{ok}"><b>{esc(verdict.category)}</b> (confidence {esc(verdict.confidence)})'
        + (f" — culprit rank {', '.join(map(str, verdict.culprit_ranks))}" if verdict.culprit_ranks else "")
        + f"<p>{esc(verdict.summary)}</p></div>"
    ]
    if verdict.actions:
        parts.append("<h2>What to do</h2><ol>")
        for action in verdict.actions:
            env = "".join(f"<br><code>export {esc(k)}={esc(v)}</code>" for k, v in action.env.items())
            parts.append(
                f"<li><b>{esc(action.title)}</b> <small>[{esc(action.rule)}]</small><br>{esc(action.detail)}{env}</li>"
            )
        parts.append("</ol>")
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
    facts = verdict.facts
    ranks = facts.get("ranks", [])
    body = ["<h1>torchtriage trace</h1>", verdict_block(verdict)]
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
    return page("torchtriage trace", "".join(body))
