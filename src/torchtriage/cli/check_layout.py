"""`torchtriage check-layout`: validate a parallel layout before launch (rules in knowledge/layouts.toml)."""

from __future__ import annotations

import argparse

from torchtriage import exit_codes
from torchtriage.analysis.layout import (
    Layout,
    check_layout,
    layout_fields_from_config,
    parse_config_text,
)
from torchtriage.cli.common import add_limits, emit
from torchtriage.errors import UsageError
from torchtriage.report.json_report import json_text
from torchtriage.report.tables import layout_text
from torchtriage.sources.fields import as_int, describe
from torchtriage.sources.streams import read_text


def _positive(text: str) -> int:
    value = as_int(text.strip(), -1, 1, 1 << 31)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer (at most 2^31), got {describe(text)}")
    return value


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", type=_positive, metavar="N", help="total number of ranks")
    parser.add_argument("--gpus-per-node", type=_positive, metavar="G", help="ranks (GPUs) per node")
    parser.add_argument(
        "--nvlink-domain", type=_positive, metavar="D", help="GPUs joined by NVLink (default: --gpus-per-node)"
    )
    for name, what in (
        ("dp", "data-parallel degree (default: derived, world / (tp*cp*pp))"),
        ("tp", "tensor-parallel degree (default 1)"),
        ("pp", "pipeline-parallel degree (default 1)"),
        ("cp", "context-parallel degree (default 1)"),
        ("ep", "expert-parallel degree (default 1)"),
        ("etp", "expert-tensor-parallel degree (default 1)"),
    ):
        parser.add_argument(f"--{name}", type=_positive, metavar="K", help=what)
    parser.add_argument("--num-experts", type=_positive, metavar="E", help="experts per MoE layer (optional)")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="read the settings from a JSON or YAML file (world_size, gpus_per_node, nvlink_domain_size, "
        "tp_size / tensor_model_parallel_size, ep_size, expert_tp_size, ...); flags override it",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    add_limits(parser)
    parser.epilog = "exit codes:\n  0  accepted (warnings allowed)\n  1  rejected\n  2  usage error\n" + (
        "  3  the config file is unreadable or invalid"
    )


def layout_from_args(args: argparse.Namespace) -> Layout:
    fields: dict[str, int] = {}
    if args.config:
        text = read_text(args.config, "the config")
        fields = layout_fields_from_config(parse_config_text(text, args.config), args.config)
    for name in ("world_size", "gpus_per_node", "nvlink_domain", "dp", "tp", "pp", "cp", "ep", "etp", "num_experts"):
        value = getattr(args, name)
        if value is not None:
            fields[name] = value
    missing = [
        flag
        for flag, name in (("--world-size", "world_size"), ("--gpus-per-node", "gpus_per_node"))
        if name not in fields
    ]
    if missing:
        raise UsageError(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required (as flags or in --config)"
        )
    return Layout(**fields)


def run(args: argparse.Namespace) -> int:
    report = check_layout(layout_from_args(args))
    emit(json_text(report.to_json()) if args.json else layout_text(report))
    return exit_codes.OK if report.accepted else exit_codes.PROBLEM_FOUND
