"""Text renderers of the verbs whose output is more than a verdict: tables under a verdict (trace,
memory), and the reports of the checks (nvlink, check-layout, doctor) and captures (dump, record)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchtriage.model import Verdict

if TYPE_CHECKING:
    from torchtriage.analysis.layout import LayoutReport
    from torchtriage.analysis.nvlink import NvlinkReport
    from torchtriage.collect.capture import CaptureResult


def trace_tables(verdict: Verdict) -> str:
    """Per rank, per collective and the straggler ranking, under the verdict of `torchtriage trace`."""
    ms = lambda us: f"{us / 1000:8.2f}"  # noqa: E731
    lines = ["", "per rank, mean step (ms)      step  compute     comm   memory     idle  overlapped-comm"]
    for rank in verdict.facts["ranks"]:
        m = rank["mean_step"]
        if not m:
            lines.append(f"  rank {rank['rank']:<4} no steps")
        elif rank["has_gpu"]:
            lines.append(
                f"  rank {rank['rank']:<4} ({len(rank['steps'])} steps)  {ms(m['duration'])} {ms(m['compute'])} "
                f"{ms(m['communication'])} {ms(m['memory'])} {ms(m['idle'])} {ms(m['overlapped_communication'])}"
            )
        else:
            lines.append(
                f"  rank {rank['rank']:<4} ({len(rank['steps'])} steps)  {ms(m['cpu_duration'])}  CPU only: "
                f"{ms(m['collective_cpu'])} in collective calls"
            )
    colls = verdict.facts["collectives"]
    if colls:
        lines += ["", f"collectives matched across ranks: {len(colls)} (slowest to agree first)"]
        lines.append("  key                         op            size      latency   busbw GB/s   skew      last")
        for c in sorted(colls, key=lambda c: -c["skew"])[:10]:
            size = f"{c['bytes'] / 2**20:.1f} MiB" if c["bytes"] else "?"
            bw = f"{c['busbw_gbps']:.1f}" if c["busbw_gbps"] is not None else "-"
            last = c["last_rank"] if c["last_rank"] is not None else "-"
            lines.append(
                f"  {c['key'][:27]:<27} {c['name'][:12]:<12} {size:>9} {c['latency'] / 1000:9.3f}ms {bw:>10} "
                f"{c['skew'] / 1000:8.3f}ms  {last}"
            )
    ranking = verdict.facts["straggler_ranking"]
    if ranking:
        lines += ["", "straggler ranking (others' wait per step caused by each rank)"]
        for row in ranking:
            lines.append(
                f"  rank {row['rank']:<4} last at {row['last_arrivals']}/{row['of_collectives']}  "
                f"{row['wait_caused_per_step_us'] / 1000:.2f} ms/step"
            )
    return "\n".join(lines)


def memory_tables(verdict: Verdict) -> str:
    """Per device the numbers, sites, blocks and segments (and what grew), under `torchtriage memory`."""
    from torchtriage.analysis.memory import format_bytes

    lines: list[str] = []
    for device in verdict.facts.get("devices", []):
        lines += ["", f"device {device['device']}"]
        lines.append(
            f"  now       allocated {format_bytes(device['allocated'])}   reserved {format_bytes(device['reserved'])}"
            f"   reserved-unallocated {format_bytes(device['reserved_unallocated'])}   segments {device['segments']}"
        )
        if device["peak_allocated"] is not None:
            lines.append(
                f"  peak      allocated {format_bytes(device['peak_allocated'])}   "
                f"reserved {format_bytes(device['peak_reserved'])}   ({device['history_events']} history events)"
            )
        if device["oom"]:
            oom = device["oom"]
            free = format_bytes(oom["device_free"]) if oom["device_free"] is not None else "unknown"
            requested = format_bytes(oom["requested"])
            lines.append(f"  OOM       requested {requested}   device free {free}   at {oom['site']}")
        moment = {"oom": "at the OOM", "peak": "at the peak", "now": "now"}[device["reference"]]
        if device["top_sites"]:
            lines.append(f"  top allocation sites, by bytes alive {moment} ({format_bytes(device['reference_bytes'])})")
            for site in device["top_sites"]:
                lines.append(
                    f"    {format_bytes(site['bytes']):>11}  {site['share']:>5.0%}  {site['count']:>6} blocks  "
                    f"{site['site']}"
                )
        if device["largest_blocks"]:
            lines.append("  largest live blocks")
            for block in device["largest_blocks"][:5]:
                lines.append(f"    {format_bytes(block['size']):>11}  {block['address']}  {block['site']}")
        if device["fragmented_segments"]:
            lines.append("  segments with the most reserved-but-unallocated memory")
            for seg in device["fragmented_segments"][:5]:
                lines.append(
                    f"    {format_bytes(seg['free']):>11} free of {format_bytes(seg['total'])}  "
                    f"(largest free block {format_bytes(seg['largest_free_block'])})  {seg['address']}"
                )
    if "totals" in verdict.facts:
        lines += ["", "what changed, by site (before → after)"]
        for row in verdict.facts["sites"][:15]:
            lines.append(
                f"  {'+' if row['delta'] > 0 else ''}{format_bytes(row['delta']):>11}  "
                f"{format_bytes(row['before'])} → {format_bytes(row['after'])}  {row['site']}"
            )
    return "\n".join(lines)


def nvlink_text(report: NvlinkReport, per_link: bool) -> str:
    """`torchtriage nvlink`: the flagged links, GPUs and Xid events, then the status and what to do."""
    from torchtriage.analysis.nvlink import MARGINAL, OK, UNHEALTHY

    lines = []
    shown = [x for x in report.links if per_link or x.status != OK]
    for link in shown:
        label = {UNHEALTHY: "UNHEALTHY", MARGINAL: "marginal", OK: "ok"}[link.status]
        state = link.speed or ("down" if link.active is False else "up" if link.active else "?")
        extra = ""
        if link.correction_rate is not None:
            extra = f"  corrected {link.corrected_codewords}  rate {link.correction_rate:.1e}"
        lines.append(f"GPU {link.gpu} link {link.link:>2}  {label:<9}  {state}{extra}")
        for reason in link.reasons:
            lines.append(f"    {reason}")
    for gpu in report.gpus:
        if gpu.status != OK:
            lines.append(f"GPU {gpu.gpu} {gpu.name}  {gpu.status.upper() if gpu.status == UNHEALTHY else gpu.status}")
            lines += [f"    {reason}" for reason in gpu.reasons]
    for xid in report.xids or []:
        if xid.severity != "info" or per_link:
            lines.append(f"Xid {xid.xid} ({xid.bus_id}) {xid.severity}: {xid.meaning}")
    if lines:
        lines.append("")
    verdict = report.verdict
    lines.append(f"{report.status.upper() if report.status == UNHEALTHY else report.status}: {verdict.summary}")
    if report.links and not per_link and report.status == OK:
        lines.append("(--per-link lists every link)")
    for action in verdict.actions:
        lines.append(f"what to do: {action.title}. {action.detail}")
    for problem in verdict.problems:
        lines.append(f"note: {problem}")
    lines.append(f"sources: {', '.join(verdict.sources)}")
    return "\n".join(lines)


def layout_text(report: LayoutReport) -> str:
    """`torchtriage check-layout`: the layout, every rule that fired with its fix, and the decision."""
    lay = report.layout
    lines = [
        f"layout   world {lay['world_size']} = dp {lay['dp']}{' (derived)' if lay['dp_derived'] else ''}"
        f" x cp {lay['cp']}"
        f" x tp {lay['tp']} x pp {lay['pp']};  experts: ep {lay['ep']} x etp {lay['etp']};  "
        f"{lay['gpus_per_node']} GPUs/node, NVLink domain {lay['nvlink_domain']}",
    ]
    for finding in report.findings:
        lines.append(f"{finding.severity:<7}{finding.id}: {finding.reason}")
        lines.append(f"         fix: {finding.fix}")
    warnings = sum(1 for f in report.findings if f.severity == "warn")
    if report.accepted:
        lines.append(f"ACCEPTED{f' with {warnings} warning(s)' if warnings else ''}")
    else:
        rejects = sum(1 for f in report.findings if f.severity == "reject")
        lines.append(f"REJECTED: {rejects} rule(s) fail{f', {warnings} warning(s)' if warnings else ''}")
    return "\n".join(lines)


def doctor_text(checks) -> str:
    """`torchtriage doctor`: one line per check, with its fix when it is not ok."""
    lines = []
    for check in checks:
        lines.append(f"{check.status:<5} {check.name:<22} {check.message}")
        if check.fix and check.status != "ok":
            lines.append(f"{'':28}fix: {check.fix}")
    counts = {s: sum(1 for c in checks if c.status == s) for s in ("ok", "warn", "fail")}
    lines.append("")
    lines.append(f"{counts['fail']} fail, {counts['warn']} warn, {counts['ok']} ok")
    return "\n".join(lines)


def capture_summary(result: CaptureResult, what: str) -> str:
    """`torchtriage dump` / `record`: which ranks were captured, into which files, and what failed."""
    n, ok = len(result.processes), len(result.processes) - len(result.failures)
    agents = sorted({p.target.agent_pid for p in result.processes if p.target.agent_pid})
    via = f" (torchrun agent {', '.join(map(str, agents))})" if agents else ""
    lines = [f"{what} {ok} of {n} process{'es' if n != 1 else ''} on {result.host}{via}"]
    for p in result.processes:
        rank = f"rank {p.target.rank}" if p.target.rank is not None else "rank ?"
        status = "ok      " + " ".join(p.files) if p.ok else "FAILED"
        lines.append(f"  {rank:<9} pid {p.target.pid:<8} {status}")
        if not p.ok:
            lines.append(f"    {p.error}")
    for warning in result.warnings:
        lines.append(f"  warning: {warning}")
    for note in result.preflight.decision.notes:
        lines.append(f"  note: {note}")
    if result.interrupted:
        lines.append("interrupted: every py-spy was stopped; what finished is kept")
    lines.append(f"files: {result.folder}/ (summary.json)")
    return "\n".join(lines)
