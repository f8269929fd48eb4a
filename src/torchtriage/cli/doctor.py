"""`torchtriage doctor [--json] [--ranks]`: one screen of what breaks distributed jobs before they start."""

from __future__ import annotations

import argparse
import os

from torchtriage import exit_codes
from torchtriage.cli.common import emit
from torchtriage.errors import EnvironmentProblem, UsageError
from torchtriage.report.json_report import json_text
from torchtriage.report.tables import doctor_text


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the checks and the facts as one JSON object")
    parser.add_argument(
        "--ranks",
        action="store_true",
        help="inside a torchrun job (RANK and WORLD_SIZE set): gather every rank's facts over gloo and name the "
        "ranks that differ; rank 0 prints the report",
    )
    parser.add_argument("--no-torch", action="store_true", help="do not import torch (faster; skips its checks)")
    parser.epilog = (
        "exit codes:\n  0  every check ok or warn\n  1  a check failed (or, with --ranks, ranks disagree)\n"
        "  2  usage error (--ranks outside a launcher)\n  4  --ranks could not form the process group"
    )


def run(args: argparse.Namespace) -> int:
    from torchtriage.collect import doctor

    if args.ranks and not (os.environ.get("RANK") and os.environ.get("WORLD_SIZE")):
        raise UsageError(
            "--ranks runs inside a launched job: `torchrun --nproc_per_node N -m torchtriage doctor --ranks` "
            "(RANK and WORLD_SIZE are not set here)"
        )
    facts = doctor.gather_facts(with_torch=not args.no_torch)
    checks = doctor.run_checks(facts)
    differences = None
    if args.ranks:
        try:
            everyone = doctor.gather_across_ranks(facts)
        except Exception as err:  # noqa: BLE001 - rendezvous failures come in many types
            raise EnvironmentProblem(
                f"could not gather the ranks' facts over gloo: {type(err).__name__}: {err}. Check MASTER_ADDR/"
                "MASTER_PORT and that every rank runs `torchtriage doctor --ranks`"
            ) from None
        differences = doctor.compare_ranks(everyone)
        checks += doctor.check_ranks(differences, len(everyone))
        if int(os.environ["RANK"]) != 0:
            return exit_codes.PROBLEM_FOUND if doctor.overall(checks) == "fail" else exit_codes.OK
    out = doctor.report(checks, facts, differences)
    emit(json_text(out) if args.json else doctor_text(checks))
    return exit_codes.PROBLEM_FOUND if out["status"] == "fail" else exit_codes.OK
