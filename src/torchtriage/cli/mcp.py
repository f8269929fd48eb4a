"""`torchtriage mcp [--root DIR ...] [--allow-live]`: the offline verbs as tools for coding agents (MCP, stdio).

The server (`torchtriage.mcp.server`) and the `mcp` SDK are imported only here, when the verb runs: the other
verbs never pay for them, and without the optional extra this verb says how to install it.
"""

from __future__ import annotations

import argparse

from torchtriage.cli.common import SECONDS, number
from torchtriage.errors import EnvironmentProblem

INSTALL = "pip install 'torchtriage[mcp]'"


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder whose files the tools may read (repeatable; default: the working directory); "
        "paths outside every root are refused, symlinks resolved first",
    )
    parser.add_argument(
        "--allow-live",
        action="store_true",
        help="let `diagnose` capture this node's running jobs (live, pid: py-spy attaches to them)",
    )
    parser.add_argument(
        "--timeout",
        type=SECONDS,
        default=120.0,
        metavar="S",
        help="wall-clock limit of one tool call; the CLI run is killed past it (default: 120)",
    )
    parser.add_argument(
        "--max-output-bytes",
        type=number(int, 1, 1 << 30, "a number of bytes"),
        default=1 << 20,
        metavar="N",
        help="output kept of one tool call, per stream; the rest is cut with a note (default: 1 MiB)",
    )


def run(args: argparse.Namespace) -> int:
    from torchtriage.mcp.roots import Roots
    from torchtriage.mcp.runner import Bounds

    roots = Roots.of(args.root)  # checked before the SDK is imported: a wrong --root is a usage error anyway
    try:
        from torchtriage.mcp.server import ServerConfig, serve
    except ImportError as err:
        # Only the SDK (or the pydantic it brings) failing to import is this environment's; anything else is a bug.
        if (err.name or "").partition(".")[0] not in ("mcp", "pydantic"):
            raise
        from torchtriage.report.safe_text import visible

        raise EnvironmentProblem(
            f"the Model Context Protocol SDK is not installed, or not a release this server runs on "
            f"({visible(str(err))}): {INSTALL}"
        ) from None
    serve(ServerConfig(roots, args.allow_live, Bounds(args.timeout, args.max_output_bytes)))
    return 0
