"""What every verb shares: its options (declared once, one meaning each), checking paths, printing, exit codes."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from torchtriage import exit_codes
from torchtriage.errors import InputError, UsageError
from torchtriage.model import Verdict


def add_paths(parser: argparse.ArgumentParser, what: str, required: bool = True) -> None:
    """The PATH... every reading verb takes: files, folders (read recursively), `.gz`; the registry sorts them."""
    parser.add_argument("paths", nargs="+" if required else "*", metavar="PATH", help=what)
    add_limits(parser)


def add_limits(parser: argparse.ArgumentParser) -> None:
    """--limit NAME=VALUE, for every verb that reads files (sources.limits holds the defaults)."""
    parser.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="raise (or lower) what one input may cost to read: bytes=512M (a file read whole, after "
        "decompression), stream-bytes=64G (a log, trace or snapshot), items=200M, depth=200, rank=1048575, "
        "expansion=50M (shared references followed), memory=1G and seconds=20 (a pickle reader's child, per "
        "file), answers=4G (every rank's answers to diagnose --store together); repeatable (docs/security.md)",
    )


def apply_limits(specs: Iterable[str]) -> None:
    """Put the --limit values in force for this process; a malformed one is a usage error."""
    from torchtriage.sources import limits

    current = limits.active()
    for spec in specs:
        try:
            current = limits.parse_limit(spec, current)
        except ValueError as err:
            raise UsageError(f"{err}.") from None
    limits.activate(current)


def number(kind: type, low: float, high: float, what: str):
    """An argparse type: a finite `kind` (int or float) in [low, high], else a usage error saying so.

    NaN compares false with everything and infinity waits forever: neither is a number of seconds."""

    def parse(text: str):
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text[:40]!r}") from None
        if not (low <= value <= high):  # also false for NaN
            raise argparse.ArgumentTypeError(f"expected {what} between {low:g} and {high:g}, got {text[:40]}")
        return value

    return parse


SECONDS = number(float, 0.001, 7 * 86400, "a number of seconds")
PID = number(int, 1, 1 << 22, "a process id")


def add_json(parser: argparse.ArgumentParser, what: str = "the verdict") -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} as one JSON object")


def add_html(parser: argparse.ArgumentParser, what: str, required: bool = False) -> None:
    parser.add_argument(
        "--html", metavar="FILE", required=required, help=f"{'' if required else 'also '}write {what} to FILE"
    )


def check_paths(paths: Iterable[str]) -> None:
    """A path that does not exist is unreadable input (exit 3) in every verb."""
    missing = [p for p in paths if p != "-" and not os.path.lexists(p)]
    if missing:
        raise InputError(f"no such file or folder: {', '.join(missing)}; check the path.")


def check_html_target(path: str | None, example: str) -> None:
    if path and os.path.isdir(path):
        raise UsageError(f"--html {path}: a folder; give a file name (e.g. {example}).")


def emit(text: str, styled: bool = False) -> None:
    """Print the output, its control characters escaped (unless `styled`: already safe, and coloured); a
    reader that went away (`| head`) is not an error and changes no exit code."""
    from torchtriage.report.safe_text import encodable, visible_lines

    try:
        # Styled text keeps its colours, but never a lone surrogate (a name's byte that is not UTF-8): a strict
        # UTF-8 stdout could not write it.
        print(encodable(text) if styled else visible_lines(text))
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def print_verdict(verdict: Verdict, as_json: bool, tables: str = "") -> None:
    from torchtriage.report.json_report import render_json
    from torchtriage.report.safe_text import visible_lines
    from torchtriage.report.text import render_text

    if as_json:
        emit(render_json(verdict), styled=True)
    else:
        emit(render_text(verdict) + (f"\n{visible_lines(tables)}" if tables else ""), styled=True)


def write_verdict(verdict: Verdict, folder: Path) -> None:
    """DIR/verdict.json and DIR/verdict.txt, as the hang watchdog leaves them beside the evidence."""
    import io

    from torchtriage.protocol import VERDICT_STEM, make_private_folders, write_whole
    from torchtriage.report.json_report import render_json
    from torchtriage.report.text import render_text

    try:
        make_private_folders(folder)  # made private; a folder that exists is left as it is (its files are 0600)
        write_whole(folder / f"{VERDICT_STEM}.json", render_json(verdict) + "\n")
        write_whole(folder / f"{VERDICT_STEM}.txt", render_text(verdict, stream=io.StringIO()) + "\n")
    except OSError as err:
        raise InputError(f"--write-verdict {folder}: cannot write there ({err.strerror or err}).") from None


def verdict_exit(verdict: Verdict) -> int:
    """1 when the verdict diagnosed a problem, else 0."""
    return exit_codes.PROBLEM_FOUND if verdict.diagnosed_problem else exit_codes.OK
