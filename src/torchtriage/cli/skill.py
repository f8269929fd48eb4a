"""`torchtriage skill [--out DIR [--force]]`: the agent skill, printed or written as DIR/torchtriage/SKILL.md.

The text is generated from this installation's command line and knowledge base (`torchtriage.skill`), so
an agent that follows it runs only commands, options and helpers that exist here. Exit codes: 0 printed or
written; 2 usage (SKILL.md already there without --force); 3 the folder cannot be written.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from torchtriage import exit_codes
from torchtriage.cli.common import emit
from torchtriage.errors import InputError, UsageError

SKILL_FILE = "SKILL.md"


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="write DIR/torchtriage/SKILL.md instead of printing it (DIR: the agent's skills folder, "
        "e.g. .claude/skills)",
    )
    parser.add_argument("--force", action="store_true", help="with --out: replace a SKILL.md already there")
    parser.epilog = (
        "exit codes:\n  0  printed or written\n  2  usage error (a SKILL.md already there without --force)\n"
        "  3  the folder cannot be written"
    )


def write_skill(out: Path, text: str, force: bool) -> Path:
    """DIR/torchtriage/SKILL.md holding `text`, its folders made; an existing file only with `force`."""
    from torchtriage.skill.branches import NAME

    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: not a folder; give the folder the skill goes in.")
    folder = out / NAME
    target = folder / SKILL_FILE
    if os.path.lexists(target) and not force:
        raise UsageError(f"{target} already exists; pass --force to replace it.")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _write_whole(target, text)
    except OSError as err:
        raise InputError(f"--out {out}: cannot write {target} ({err.strerror or err}).") from None
    return target


def _write_whole(target: Path, text: str) -> None:
    """Written under another name, then renamed: an agent reading the folder never sees half a skill, and a
    symlink at the name is replaced, never written through."""
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    partial.unlink(missing_ok=True)  # left by an earlier process of this pid that did not finish
    with open(partial, "x", encoding="utf-8") as file:
        file.write(text)
    os.replace(partial, target)


def verb_parser(verb: str) -> argparse.ArgumentParser | None:
    """The parser `torchtriage VERB` uses (None for a verb the tool lacks), built alone: the skill is checked
    against it."""
    from torchtriage.cli import VERBS, build_parser

    if verb not in VERBS:
        return None
    parser = build_parser(only=verb)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[verb]


def run(args: argparse.Namespace) -> int:
    if args.force and not args.out:
        raise UsageError("--force goes with --out.")
    from torchtriage.skill import skill_text

    text = skill_text(verb_parser)
    if not args.out:
        emit(text.rstrip("\n"))
        return exit_codes.OK
    target = write_skill(Path(args.out), text, args.force)
    emit(f"wrote {target}")
    return exit_codes.OK
