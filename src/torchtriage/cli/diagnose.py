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
    number,
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
    parser.add_argument(
        "--store",
        metavar="HOST:PORT",
        help="live, every node: the job's store (MASTER_ADDR:MASTER_PORT); each rank's PyTorch debug server "
        "registered there is asked for its stack and flight recorder",
    )
    parser.add_argument(
        "--slurm",
        metavar="JOBID",
        help="live, every node: capture each node of this SLURM job as one extra job step "
        "(srun --overlap) into --out, a folder the nodes share (default: one in the working directory)",
    )
    parser.add_argument(
        "--pods",
        metavar="SELECTOR",
        help="live, every pod: capture each running pod matching this label selector with kubectl exec "
        "(e.g. training.kubeflow.org/job-name=myjob), merged into --out",
    )
    parser.add_argument("--namespace", metavar="NS", help="with --pods: the pods' namespace")
    parser.add_argument("--container", metavar="NAME", help="with --pods: the training container of each pod")
    parser.add_argument(
        "--world-size",
        type=number(int, 1, 1 << 24, "a number of ranks"),
        metavar="N",
        help="with --store: the job's ranks (default: as registered)",
    )
    parser.add_argument("--out", metavar="DIR", help="live: where the captured stacks go")
    parser.add_argument("--native", action="store_true", help="live: include native frames (slower)")
    parser.add_argument(
        "--timeout",
        type=SECONDS,
        default=10.0,
        metavar="S",
        help="live: per-rank py-spy timeout; with --store, what the store may take and then every rank's answers "
        "(one deadline for all of them)",
    )
    add_json(parser)
    parser.add_argument(
        "--write-verdict",
        metavar="DIR",
        help="also write the verdict to DIR/verdict.json and DIR/verdict.txt (what the hang watchdog leaves)",
    )


def run(args: argparse.Namespace) -> int:
    if sum(map(bool, (args.paths, args.pid, args.store, args.slurm, args.pods))) > 1:
        raise UsageError(
            "give one of PATHs (post-mortem), --pid (live, this node), --store, --slurm or --pods (live, every node)."
        )
    if (args.namespace or args.container) and not args.pods:
        raise UsageError("--namespace and --container go with --pods.")
    if args.world_size and not args.store:
        raise UsageError("--world-size goes with --store.")
    check_paths(list(args.paths) + args.fr + args.logs)
    if args.pods:
        from torchtriage.collect.live import diagnose_pods

        verdict = diagnose_pods(
            args.pods,
            Path(args.out) if args.out else None,
            namespace=args.namespace,
            container=args.container,
            timeout_s=args.timeout,
            extra_paths=args.fr,
            logs=args.logs,
        )
    elif args.slurm:
        from torchtriage.collect.live import diagnose_slurm

        verdict = diagnose_slurm(
            args.slurm,
            Path(args.out) if args.out else None,
            native=args.native,
            timeout_s=args.timeout,
            extra_paths=args.fr,
            logs=args.logs,
        )
    elif args.store:
        from torchtriage.collect.live import diagnose_from_store

        verdict = diagnose_from_store(
            args.store,
            Path(args.out) if args.out else None,
            world_size=args.world_size,
            timeout_s=args.timeout,
            extra_paths=args.fr,
            logs=args.logs,
        )
    elif args.paths:
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
