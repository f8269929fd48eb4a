"""A CLI run as a tool result: the JSON it printed (parsed), the text it renders, its exit code and what the
server had to cut or stop, as structured content and as text an agent reads.

A call is an error (`isError`) exactly when the CLI's exit code is not 0 (nothing wrong) or 1 (a problem
diagnosed), or when the server refused or stopped it: the verdict a refusing CLI still printed is kept.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, Field

from torchtriage import exit_codes
from torchtriage.mcp.runner import Bounds, Captured, CliRun


class ToolOutput(BaseModel):
    command: list[str] = Field(description="the torchtriage command line that ran (after `torchtriage`)")
    exit_code: int | None = Field(description="the CLI's exit code; null when the server stopped it at its deadline")
    exit_meaning: str
    verdict: Any = Field(
        description="what the CLI printed with --json: the schema-versioned verdict (for rules, explain, doctor "
        "and check_layout, their JSON report); null when it printed none or it was cut"
    )
    text: str = Field(description="the verdict rendered as text, as the CLI prints it without --json")
    stderr: str = Field(description="the CLI's messages: a refusal says what is wrong and what to do")
    truncated: bool = Field(description="some output was cut at the server's --max-output-bytes")
    timed_out: bool = Field(description="the call ran past the server's --timeout and was stopped")
    notes: list[str] = Field(description="what the server cut or stopped, and how to avoid it")


def _exit_meanings() -> dict[int, str]:
    """From the exit codes' one documentation (`torchtriage --help`)."""
    meanings = {}
    for line in exit_codes.HELP.splitlines()[1:]:
        code, _, meaning = line.strip().partition(" ")
        meanings[int(code)] = meaning.strip()
    return meanings


EXIT_MEANINGS = _exit_meanings()
SUCCESS = (exit_codes.OK, exit_codes.PROBLEM_FOUND)


def refusal(message: str) -> CallToolResult:
    """The server refused the call before running anything: a usage error."""
    output = ToolOutput(
        command=[],
        exit_code=exit_codes.USAGE,
        exit_meaning=EXIT_MEANINGS[exit_codes.USAGE],
        verdict=None,
        text="",
        stderr=f"torchtriage mcp: refused: {message}",
        truncated=False,
        timed_out=False,
        notes=[],
    )
    return _as_result(output)


def tool_result(
    command: list[str], run: CliRun, text: Captured, bounds: Bounds, text_stopped: bool = False
) -> CallToolResult:
    """`run` is the `--json` run of `command`; `text` what the same command rendered (`text_stopped`: its run
    timed out)."""
    notes = []
    if run.timed_out or text_stopped:
        notes.append(
            f"stopped at the server's deadline of {bounds.timeout_s:g} s (torchtriage mcp --timeout): give fewer "
            "or smaller inputs, or start the server with a longer --timeout."
        )
    verdict, note = _parsed_json(run.stdout, bounds)
    notes += [note] if note else []
    shown = text.text()
    if text.truncated:
        notes.append(_cut_note("the text", text, bounds))
        shown += f"\n[... cut here: {text.total - len(text.data):,} more bytes ...]"
    if run.stderr.truncated:
        notes.append(_cut_note("the messages on stderr", run.stderr, bounds))
    output = ToolOutput(
        command=command,
        exit_code=run.exit_code,
        exit_meaning="stopped at the deadline" if run.exit_code is None else EXIT_MEANINGS.get(run.exit_code, "?"),
        verdict=verdict,
        text=shown,
        stderr=run.stderr.text(),
        truncated=run.stdout.truncated or text.truncated or run.stderr.truncated,
        timed_out=run.timed_out or text_stopped,
        notes=notes,
    )
    return _as_result(output, run.stdout.text() if verdict is not None else None)


def _parsed_json(stdout: Captured, bounds: Bounds) -> tuple[Any, str | None]:
    if stdout.truncated:
        return None, _cut_note("the JSON", stdout, bounds) + " No verdict object is given; the text shows its start."
    if not stdout.data.strip():
        return None, None
    try:
        return json.loads(stdout.data), None
    except ValueError as err:
        return None, f"the JSON the CLI printed could not be parsed ({err}); the text shows the verdict."


def _cut_note(what: str, captured: Captured, bounds: Bounds) -> str:
    return (
        f"{what} was cut at {bounds.max_output_bytes:,} of its {captured.total:,} bytes (torchtriage mcp "
        "--max-output-bytes): narrow the input, or start the server with a larger cap."
    )


def _as_result(output: ToolOutput, json_text: str | None = None) -> CallToolResult:
    """Structured content for clients that read it; the same as text for those that read only text."""
    ran = f"$ torchtriage {shlex.join(output.command)}" if output.command else "nothing ran"
    head = f"{ran}\nexit code {output.exit_code}: {output.exit_meaning}"
    parts = [head, output.text.rstrip("\n"), output.stderr.rstrip("\n"), *output.notes]
    content = [TextContent(type="text", text="\n\n".join(part for part in parts if part))]
    if json_text is not None:
        content.append(TextContent(type="text", text=json_text))
    return CallToolResult(
        content=content,
        structuredContent=output.model_dump(mode="json"),
        isError=output.exit_code not in SUCCESS,
    )
