"""`torchtriage nvlink [--per-link] [--json] [--from PATH]`: NVLink, GPU-memory and Xid health."""

from __future__ import annotations

import argparse
import json

from torchtriage import exit_codes
from torchtriage.analysis.nvlink import MARGINAL, OK, UNHEALTHY, NvlinkReport, analyse


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--per-link", action="store_true", help="list every link, not only the flagged ones")
    parser.add_argument("--json", action="store_true", help="print the full report as one JSON object")
    parser.add_argument(
        "--from",
        dest="recorded",
        action="append",
        metavar="PATH",
        help="analyse captured outputs instead of this machine: nvidia-smi text (nvlink -s, nvlink -e, "
        "-q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER; bare, or after `+ nvidia-smi ...` lines), an NVML JSON dump, "
        "a dmesg log; a folder means the files in it (repeatable)",
    )
    parser.epilog = (
        "exit codes:\n  0  healthy, or only marginal links (FEC or replay is absorbing errors)\n"
        "  1  something is unhealthy: a link down or with hard errors, a GPU with fewer links than its peers,\n"
        "     uncorrectable or pending memory errors, a fatal Xid\n  2  usage error\n"
        "  3  a captured input is unreadable or malformed\n  4  neither NVML nor nvidia-smi is usable here"
    )


def render_text(report: NvlinkReport, per_link: bool) -> str:
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


def run(args: argparse.Namespace) -> int:
    from torchtriage.collect import nvidia

    inputs = nvidia.load_recorded(args.recorded) if args.recorded else nvidia.gather_live()
    report = analyse(inputs)
    print(json.dumps(report.to_json(), indent=2, default=str) if args.json else render_text(report, args.per_link))
    return exit_codes.PROBLEM_FOUND if report.status == UNHEALTHY else exit_codes.OK
