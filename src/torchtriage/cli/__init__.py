"""The `torchtriage` command: one verb per job, thin wrappers over the library.

Verbs are imported only when chosen, so `torchtriage --help` and offline verbs start fast and never
import torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from torchtriage import __version__, exit_codes
from torchtriage.errors import TriageError

# verb -> (module under torchtriage.cli, one-line help)
VERBS = {
    "triage": ("triage", "diagnose failure logs (files, folders, gzip, or - for stdin)"),
    "fr": ("fr", "analyse flight-recorder dumps: the first collective where ranks disagree, and the culprit"),
    "trace": ("trace", "profiler traces of every rank: compute/comm/idle per step, collective skew, stragglers"),
    "memory": ("memory", "a CUDA memory snapshot: peak, fragmentation, the OOM, and the sites that hold memory"),
    "report": ("report", "one self-contained HTML page of everything a run folder holds, to attach to a bug report"),
    "dump": ("dump", "capture every rank's Python stack on this node at once (py-spy), one file per rank"),
    "record": ("record", "record flame graphs (SVG, speedscope) of every rank on this node over one window"),
    "diagnose": ("diagnose", "my job is stuck: stacks, flight recorder and logs fused into one verdict"),
    "run": ("run", "run a launcher with diagnostics armed: flight recorder and a hang watchdog in every rank"),
    "history": ("history", "the attempts of a job (restarts, requeues): does its failure follow a machine or the code"),
    "nvlink": ("nvlink", "NVLink, GPU-memory and Xid health of this node, safe beside a running job"),
    "doctor": ("doctor", "check this environment for what breaks distributed jobs (--ranks: compare ranks)"),
    "check-layout": ("check_layout", "validate a parallel layout (dp/tp/pp/cp/ep/etp) before launch"),
    "rules": ("rules", "list the knowledge base: the known failure modes"),
    "explain": ("rules", "show one rule: its cause, the messages it matches, the fixes"),
    "demo": ("demo", "run a small CPU job in which one rank skips a collective, then diagnose its log"),
    "mcp": ("mcp", "serve the offline verbs to coding agents over the Model Context Protocol (stdio)"),
    "skill": ("skill", "print the agent skill (SKILL.md) that routes a symptom to its command, or write it in DIR"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line parser; with `only`, just that verb's, so no other verb's module is imported."""
    parser = argparse.ArgumentParser(
        prog="torchtriage",
        description="Diagnose failures of PyTorch distributed training and route each to the exact fix.",
        epilog=exit_codes.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"torchtriage {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, (module_name, help_text) in VERBS.items():
        if only is not None and verb != only:
            continue
        verb_parser = sub.add_parser(
            verb,
            help=help_text,
            description=help_text,
            epilog=exit_codes.HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module = importlib.import_module(f"torchtriage.cli.{module_name}")
        module.add_arguments(verb, verb_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Start-up time matters (offline verbs run in a fraction of a second): build only the verb asked for.
    parser = build_parser(only=argv[0] if argv and argv[0] in VERBS else None)
    args = parser.parse_args(argv)
    if not args.verb:
        parser.print_help()
        return exit_codes.USAGE
    module = importlib.import_module(f"torchtriage.cli.{VERBS[args.verb][0]}")
    try:
        if getattr(args, "limit", None):
            from torchtriage.cli.common import apply_limits

            apply_limits(args.limit)
        return module.run(args)
    except TriageError as err:
        from torchtriage.report.safe_text import visible_lines

        print(f"torchtriage {args.verb}: {visible_lines(str(err))}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"torchtriage {args.verb}: interrupted.", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): not an error of ours, and nothing more to say.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exit_codes.OK
    except Exception as err:  # noqa: BLE001 - the user gets one line, never a traceback
        if os.environ.get("TORCHTRIAGE_DEBUG"):
            raise
        from torchtriage.report.safe_text import visible

        print(
            f"torchtriage {args.verb}: internal error: {type(err).__name__}: {visible(str(err))}. "
            "This is a bug in torchtriage; rerun with TORCHTRIAGE_DEBUG=1 for the traceback and report it.",
            file=sys.stderr,
        )
        return exit_codes.BAD_INPUT
