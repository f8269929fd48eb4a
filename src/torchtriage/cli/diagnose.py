"""`torchtriage diagnose`: "my job is stuck" — stacks, flight recorder and logs fused into one verdict.

Live (no PATH): captures every rank's stack on this node with py-spy (the same discovery, preflight
and care as `torchtriage dump`); when the job was started with `torchtriage run`, also asks its
ranks for a fresh flight-recorder dump; reads `--fr` dumps and `--logs` when given; fuses.
Post-mortem (PATH...): the same fused verdict from the folders and files a dead job left behind.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from torchtriage.analysis.postmortem import diagnose_paths
from torchtriage.cli.common import (
    PID,
    SECONDS,
    add_json,
    add_paths,
    check_paths,
    print_verdict,
    verdict_exit,
    write_verdict,
)
from torchtriage.errors import UsageError


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    add_paths(parser, "post-mortem: folders/files of stack dumps, flight-recorder dumps and logs", required=False)
    parser.add_argument(
        "--pid",
        type=PID,
        action="append",
        metavar="PID",
        help="live: a rank's pid or its launcher's (repeatable); default: every torchrun job here",
    )
    parser.add_argument("--fr", action="append", metavar="DIR", default=[], help="flight-recorder dumps to read")
    parser.add_argument("--logs", action="append", metavar="PATH", default=[], help="logs to read")
    parser.add_argument("--out", metavar="DIR", help="live: where the captured stacks go")
    parser.add_argument("--native", action="store_true", help="live: include native frames (slower)")
    parser.add_argument("--timeout", type=SECONDS, default=10.0, metavar="S", help="live: per-rank py-spy timeout")
    add_json(parser)
    parser.add_argument(
        "--write-verdict",
        metavar="DIR",
        help="also write the verdict to DIR/verdict.json and DIR/verdict.txt (what the hang watchdog leaves)",
    )


def run(args: argparse.Namespace) -> int:
    if args.paths and args.pid:
        raise UsageError("give PATHs (post-mortem) or --pid (live), not both.")
    check_paths(list(args.paths) + args.fr + args.logs)
    if args.paths:
        verdict = diagnose_paths(list(args.paths) + args.fr, extra_logs=args.logs)
    else:
        from torchtriage.collect.live import diagnose_live

        verdict = diagnose_live(
            args.pid,
            Path(args.out) if args.out else None,
            native=args.native,
            timeout_s=args.timeout,
            extra_paths=args.fr,
            logs=args.logs,
        )
    if args.write_verdict:
        write_verdict(verdict, Path(args.write_verdict))
    print_verdict(verdict, args.json)
    return verdict_exit(verdict)
