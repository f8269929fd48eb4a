"""`torchtriage nvlink [--per-link] [--json] [--from PATH]`: NVLink, GPU-memory and Xid health."""

from __future__ import annotations

import argparse

from torchtriage import exit_codes
from torchtriage.analysis.nvlink import UNHEALTHY, analyse
from torchtriage.cli.common import add_limits, emit
from torchtriage.report.json_report import json_text
from torchtriage.report.tables import nvlink_text


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
    add_limits(parser)
    parser.epilog = (
        "exit codes:\n  0  healthy, or only marginal links (FEC or replay is absorbing errors)\n"
        "  1  something is unhealthy: a link down or with hard errors, a GPU with fewer links than its peers,\n"
        "     uncorrectable or pending memory errors, a fatal Xid\n  2  usage error\n"
        "  3  a captured input is unreadable or malformed\n  4  neither NVML nor nvidia-smi is usable here"
    )


def run(args: argparse.Namespace) -> int:
    from torchtriage.collect import nvidia

    inputs = nvidia.load_recorded(args.recorded) if args.recorded else nvidia.gather_live()
    report = analyse(inputs)
    emit(json_text(report.to_json()) if args.json else nvlink_text(report, args.per_link))
    return exit_codes.PROBLEM_FOUND if report.status == UNHEALTHY else exit_codes.OK
