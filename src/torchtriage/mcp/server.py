"""The MCP server: one tool per offline verb, each a bounded run of the CLI (the package docstring says why).

A tool's parameters are the verb's options under the same names; `commands.py` turns them into the CLI's
arguments, `runner.py` runs the CLI twice at once (`--json`, and the text), `results.py` answers. `diagnose`
runs once, its text written beside it by `--write-verdict`, so a live capture is never taken twice.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Literal

from mcp.server.fastmcp import FastMCP
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from torchtriage.mcp import commands
from torchtriage.mcp.commands import Command
from torchtriage.mcp.results import ToolOutput, refusal, tool_result
from torchtriage.mcp.roots import Refused, Roots
from torchtriage.mcp.runner import Bounds, Captured, run_cli
from torchtriage.model import CATEGORIES
from torchtriage.protocol import VERDICT_STEM

Result = Annotated[CallToolResult, ToolOutput]
Paths = Annotated[
    list[str], Field(description="files or folders (read recursively) inside the server's roots", min_length=1)
]
OptionalPaths = Annotated[list[str] | None, Field(description="files or folders inside the server's roots")]
Degree = Annotated[int | None, Field(ge=1)]
Category = Literal[tuple(CATEGORIES)]

INSTRUCTIONS = """torchtriage diagnoses failed or stuck PyTorch distributed jobs from the files they leave.
A hang: `diagnose` on the run folder (stack dumps, flight-recorder dumps, logs). A crash, timeout, OOM or NaN in
the logs: `triage`. Flight-recorder dumps alone: `fr`. Slow steps: `trace` on profiler traces. GPU memory:
`memory` on a snapshot. Paths must lie inside the server's roots (relative ones start from its working folder).
Every answer is the CLI's: the verdict JSON (schema-versioned), its text, and its exit code (0 nothing wrong,
1 problem diagnosed, 2 usage, 3 unreadable input, 4 environment). `explain` a rule id from a verdict for its
cause and fixes."""


@dataclass(frozen=True)
class ServerConfig:
    roots: Roots
    allow_live: bool
    bounds: Bounds


class Tools:
    """The tools; their docstrings are what an agent reads."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config

    async def triage(
        self,
        paths: Annotated[list[str], Field(description="log files, folders (read recursively), .gz logs", min_length=1)],
        rules_dir: Annotated[str | None, Field(description="add the rules in DIR/*.toml to the knowledge base")] = None,
    ) -> Result:
        """Diagnose failure logs: the primary failure, the rank that started it, the evidence and the fix."""
        return await self._call(lambda: commands.triage(self.config.roots, paths, rules_dir))

    async def diagnose(
        self,
        paths: OptionalPaths = None,
        fr: Annotated[list[str] | None, Field(description="more flight-recorder dumps or folders")] = None,
        logs: Annotated[list[str] | None, Field(description="more logs to read")] = None,
        live: Annotated[bool, Field(description="live: capture every torchrun job on this node")] = False,
        pid: Annotated[list[int] | None, Field(description="live: a rank's pid or its launcher's")] = None,
        native: Annotated[bool, Field(description="live: include native frames (slower)")] = False,
        timeout: Annotated[float | None, Field(description="live: per-rank py-spy timeout (s)", gt=0)] = None,
    ) -> Result:
        """A stuck or dead job: stacks, flight-recorder dumps and logs fused into one verdict (who stopped, where).

        Post-mortem from `paths`; live on this node (`live`, `pid`) only if the server was started with
        --allow-live."""
        config = self.config
        return await self._call(
            lambda: commands.diagnose(
                config.roots, config.allow_live, paths or (), fr or (), logs or (), live, pid or (), native, timeout
            ),
        )

    async def fr(
        self,
        paths: Annotated[list[str], Field(description="flight-recorder dumps or folders of them", min_length=1)],
        jobs: Annotated[int | None, Field(description="processes for loading (default: every core)", ge=1)] = None,
    ) -> Result:
        """Flight-recorder dumps: the first collective where ranks disagree, and the culprit rank."""
        return await self._call(lambda: commands.fr(self.config.roots, paths, jobs))

    async def trace(self, paths: Paths) -> Result:
        """torch.profiler traces of every rank: compute/comm/idle per step, collective skew, the straggler."""
        return await self._call(lambda: commands.trace(self.config.roots, paths))

    async def memory(
        self,
        paths: Annotated[
            list[str],
            Field(
                description="a CUDA memory snapshot; or two of one job, earlier then later", min_length=1, max_length=2
            ),
        ],
    ) -> Result:
        """A CUDA memory snapshot: peak, fragmentation, the OOM, the sites that hold memory (two: what grew)."""
        return await self._call(lambda: commands.memory(self.config.roots, paths))

    async def rules(self, category: Category | None = None) -> Result:
        """The knowledge base: every failure mode torchtriage can name (optionally one category)."""
        return await self._call(lambda: commands.rules(category))

    async def explain(
        self, rule: Annotated[str, Field(description="a rule id, as a verdict or `rules` names it")]
    ) -> Result:
        """One rule: its cause, the messages it matches, the fixes."""
        return await self._call(lambda: commands.explain(rule))

    async def doctor(
        self, no_torch: Annotated[bool, Field(description="do not import torch (faster; skips its checks)")] = False
    ) -> Result:
        """Check the environment this server runs in for what breaks distributed jobs."""
        return await self._call(lambda: commands.doctor(no_torch))

    async def check_layout(
        self,
        world_size: Degree = None,
        gpus_per_node: Degree = None,
        nvlink_domain: Degree = None,
        dp: Degree = None,
        tp: Degree = None,
        pp: Degree = None,
        cp: Degree = None,
        ep: Degree = None,
        etp: Degree = None,
        num_experts: Degree = None,
        config: Annotated[str | None, Field(description="a JSON or YAML file of the settings")] = None,
    ) -> Result:
        """Validate a parallel layout (dp/tp/pp/cp/ep/etp) before launch; world_size and gpus_per_node are needed
        (as values or in config)."""
        degrees = dict(world_size=world_size, gpus_per_node=gpus_per_node, nvlink_domain=nvlink_domain, dp=dp)
        degrees.update(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, num_experts=num_experts)
        return await self._call(lambda: commands.check_layout(self.config.roots, config, **degrees))

    async def _call(self, build: Callable[[], Command]) -> CallToolResult:
        try:
            command = build()
        except Refused as err:
            return refusal(str(err))
        return await run_command(command, self.config.bounds)


async def run_command(command: Command, bounds: Bounds) -> CallToolResult:
    """The CLI's JSON and text for `command`, each run bounded, in a private folder removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="torchtriage-mcp-") as work:
        if command.verb == "diagnose":
            folder = os.path.join(work, VERDICT_STEM)
            run = await run_cli(command.with_options(f"--write-verdict={folder}").argv(True), bounds, work)
            return tool_result(
                command.argv(True), run, _read_capped(os.path.join(folder, f"{VERDICT_STEM}.txt"), bounds), bounds
            )
        run, text_run = await asyncio.gather(
            run_cli(command.argv(True), bounds, work), run_cli(command.argv(False), bounds, work)
        )
        return tool_result(command.argv(True), run, text_run.stdout, bounds, text_stopped=text_run.timed_out)


def _read_capped(path: str, bounds: Bounds) -> Captured:
    captured = Captured(bounds.max_output_bytes)
    try:
        with open(path, "rb") as file:
            captured.take(file.read(bounds.max_output_bytes))
            captured.total = os.fstat(file.fileno()).st_size
    except OSError:
        pass  # no verdict was written: the CLI refused, and said why on stderr
    return captured


TOOL_NAMES = ("triage", "diagnose", "fr", "trace", "memory", "rules", "explain", "doctor", "check_layout")


def build_server(config: ServerConfig) -> FastMCP:
    app = FastMCP("torchtriage", instructions=INSTRUCTIONS, log_level="WARNING")
    tools = Tools(config)
    read_only = ToolAnnotations(readOnlyHint=True, openWorldHint=False)
    for name in TOOL_NAMES:
        app.add_tool(getattr(tools, name), name=name, annotations=read_only)
    return app


def serve(config: ServerConfig) -> None:
    """Serve on stdin/stdout until the client closes them."""
    build_server(config).run("stdio")
