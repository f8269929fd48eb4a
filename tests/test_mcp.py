"""`torchtriage mcp`: the SDK's own stdio client starts the server as an agent would, and gets the CLI's verdicts;
paths outside the roots, hostile files, long output and slow calls are answered cleanly."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from torchtriage import exit_codes

FIXTURES = (Path(__file__).parent / "fixtures").resolve()
DEMO_LOG = FIXTURES / "logs" / "gloo_skip_allreduce" / "run.log"

needs_sdk = pytest.mark.skipif(importlib.util.find_spec("mcp") is None, reason="the mcp extra is not installed")


def cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchtriage", *map(str, args)], capture_output=True, text=True, timeout=120
    )


@asynccontextmanager
async def server(*options: str | Path, cwd: Path = FIXTURES):
    """An initialised client session of `torchtriage mcp OPTIONS`, started by the SDK's stdio client."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "torchtriage", "mcp", *map(str, options)],
        env=dict(os.environ),
        cwd=str(cwd),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def calls(options: list, requests: list[tuple[str, dict]], cwd: Path = FIXTURES) -> list:
    """The results of `requests` (tool, arguments), made in order to one server."""

    async def scenario():
        async with server(*options, cwd=cwd) as session:
            return [await session.call_tool(tool, arguments) for tool, arguments in requests]

    return asyncio.run(scenario())


def text_of(result) -> str:
    return "\n".join(block.text for block in result.content)


def test_the_cli_never_imports_the_sdk():
    """`torchtriage --help` and every offline verb start without the server or the SDK."""
    probe = (
        "import sys\n"
        "from torchtriage.cli import build_parser, main\n"
        "build_parser()\n"
        "build_parser(only='mcp')\n"
        f"code = main(['triage', '--json', {str(DEMO_LOG)!r}])\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'mcp' or m.startswith('torchtriage.mcp'))\n"
        "print(loaded, code, file=sys.stderr)\n"
        "sys.exit(1 if loaded else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == f"[] {exit_codes.PROBLEM_FOUND}"


def test_without_the_sdk_one_message_says_how_to_install_it():
    probe = "import sys\nsys.modules['mcp'] = None\nfrom torchtriage.cli import main\nsys.exit(main(['mcp']))\n"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == exit_codes.ENVIRONMENT
    assert "Traceback" not in done.stderr
    (message,) = done.stderr.strip().splitlines()
    assert message.startswith("torchtriage mcp: the Model Context Protocol SDK is not installed")
    assert message.endswith(": pip install 'torchtriage[mcp]'")
    assert done.stdout == ""


def test_a_root_that_is_not_a_folder_is_a_usage_error(tmp_path):
    done = cli("mcp", "--root", tmp_path / "missing")
    assert done.returncode == exit_codes.USAGE
    assert "not a folder" in done.stderr and "Traceback" not in done.stderr


@needs_sdk
def test_the_tools_are_the_offline_verbs():
    async def scenario():
        async with server("--root", FIXTURES) as session:
            return (await session.list_tools()).tools

    tools = {tool.name: tool for tool in asyncio.run(scenario())}
    assert set(tools) == {"triage", "diagnose", "fr", "trace", "memory", "rules", "explain", "doctor", "check_layout"}
    assert tools["triage"].inputSchema["required"] == ["paths"]
    assert {"paths", "fr", "logs", "live", "pid"} <= set(tools["diagnose"].inputSchema["properties"])
    assert {"world_size", "gpus_per_node", "tp", "config"} <= set(tools["check_layout"].inputSchema["properties"])
    assert all(tool.annotations.readOnlyHint for tool in tools.values())


RECORDED = [
    ("triage", DEMO_LOG),
    ("triage", FIXTURES / "h200x2" / "oom.log"),
    # Every recorded 2xH200 case: the NCCL failures (skip, op, size, nan) and the hangs under `torchtriage run`.
    *[("diagnose", FIXTURES / "h200x2" / case) for case in ("skip", "op", "size", "nan")],
    *[
        ("diagnose", FIXTURES / "h200x2_hangs" / case)
        for case in ("rank0_skip", "barrier", "dataloader", "subgroup", "oom")
    ],
    ("fr", FIXTURES / "h200x2" / "skip"),
    ("trace", FIXTURES / "h200x2" / "trace"),
    ("memory", FIXTURES / "h200x2" / "oom_snapshot.pickle"),
]


@needs_sdk
def test_the_verdicts_are_the_clis():
    """The demo's recording and the 2xH200 fixtures: the same verdict JSON, text and exit code as the CLI."""
    results = calls(["--root", FIXTURES], [(verb, {"paths": [str(path)]}) for verb, path in RECORDED])
    for (verb, path), result in zip(RECORDED, results, strict=True):
        as_json, as_text = cli(verb, "--json", path), cli(verb, path)
        output = result.structuredContent
        assert output["exit_code"] == as_json.returncode == exit_codes.PROBLEM_FOUND, (verb, output["stderr"])
        assert output["verdict"] == json.loads(as_json.stdout), verb
        assert output["verdict"]["schema"].startswith("torchtriage.verdict/")
        assert output["text"] == as_text.stdout, verb
        assert output["command"] == [verb, "--json", "--", str(path)]
        assert not result.isError and not output["truncated"] and not output["timed_out"]
        assert as_text.stdout.strip() in text_of(result)


@needs_sdk
def test_rules_explain_and_layout_are_the_clis():
    rule = json.loads(cli("rules", "--json").stdout)[0]["id"]
    results = calls(
        ["--root", FIXTURES],
        [
            ("rules", {"category": "oom"}),
            ("explain", {"rule": rule}),
            ("check_layout", {"world_size": 16, "gpus_per_node": 8, "tp": 3}),
        ],
    )
    expected = [
        cli("rules", "--json", "--category", "oom"),
        cli("explain", "--json", rule),
        cli("check-layout", "--json", "--world-size", "16", "--gpus-per-node", "8", "--tp", "3"),
    ]
    for result, done in zip(results, expected, strict=True):
        assert result.structuredContent["verdict"] == json.loads(done.stdout)
        assert result.structuredContent["exit_code"] == done.returncode
    assert results[2].structuredContent["exit_code"] == exit_codes.PROBLEM_FOUND  # tp 3 does not divide 8


@needs_sdk
def test_paths_outside_the_roots_are_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside.log"
    shutil.copy(DEMO_LOG, outside)
    (root / "link.log").symlink_to(outside)
    (root / "linked").symlink_to(tmp_path)
    results = calls(
        ["--root", root],
        [
            ("triage", {"paths": [str(outside)]}),
            ("triage", {"paths": ["link.log"]}),
            ("triage", {"paths": ["linked/outside.log"]}),
            ("diagnose", {"paths": [str(root)], "logs": ["../outside.log"]}),
            ("triage", {"paths": ["../outside.log"]}),
        ],
        cwd=root,
    )
    for result in results:
        output = result.structuredContent
        assert result.isError and output["exit_code"] == exit_codes.USAGE
        assert output["command"] == [] and output["verdict"] is None
        assert f"resolves to {outside}, outside the folders this server may read ({root})" in output["stderr"]


@needs_sdk
def test_a_path_never_becomes_an_option(tmp_path):
    shutil.copy(DEMO_LOG, tmp_path / "--version")
    (result,) = calls(["--root", tmp_path], [("triage", {"paths": ["--version"]})], cwd=tmp_path)
    assert result.structuredContent["verdict"] == json.loads(cli("triage", "--json", tmp_path / "--version").stdout)
    assert result.structuredContent["command"][-2:] == ["--", str(tmp_path / "--version")]


@needs_sdk
def test_live_diagnosis_needs_allow_live():
    (live, pid, nothing) = calls(
        ["--root", FIXTURES], [("diagnose", {"live": True}), ("diagnose", {"pid": [os.getpid()]}), ("diagnose", {})]
    )
    for result in (live, pid):
        assert result.isError and result.structuredContent["exit_code"] == exit_codes.USAGE
        assert "started without --allow-live" in result.structuredContent["stderr"]
    # No paths is the CLI's live mode: the server never lets an empty call become one.
    assert nothing.isError and "give paths" in nothing.structuredContent["stderr"]
    (both,) = calls(["--root", FIXTURES, "--allow-live"], [("diagnose", {"paths": [str(FIXTURES)], "live": True})])
    assert both.isError and "not both" in both.structuredContent["stderr"]


@needs_sdk
def test_hostile_files_get_the_clis_refusal_and_the_server_carries_on(tmp_path):
    (tmp_path / "garbage.log").write_bytes(bytes(range(256)) * 4096)
    nesting = 100_000
    (tmp_path / "deep.pickle").write_bytes(b"\x80\x02" + b"(" * nesting + b"l" * nesting + b".")
    shutil.copy(DEMO_LOG, tmp_path / "run.log")
    garbage, deep, after = calls(
        ["--root", tmp_path],
        [
            ("triage", {"paths": ["garbage.log"]}),
            ("memory", {"paths": ["deep.pickle"]}),
            ("triage", {"paths": ["run.log"]}),
        ],
        cwd=tmp_path,
    )
    for result, (verb, name) in ((garbage, ("triage", "garbage.log")), (deep, ("memory", "deep.pickle"))):
        expected = cli(verb, "--json", tmp_path / name)
        assert expected.returncode == exit_codes.BAD_INPUT
        assert result.isError and result.structuredContent["exit_code"] == exit_codes.BAD_INPUT
        assert result.structuredContent["stderr"] == expected.stderr
        assert "Traceback" not in expected.stderr
    assert "binary data" in garbage.structuredContent["stderr"]
    assert "more than 200 deep" in deep.structuredContent["stderr"]
    assert after.structuredContent["exit_code"] == exit_codes.PROBLEM_FOUND
    assert after.structuredContent["verdict"]["category"] == "nccl_timeout"


@needs_sdk
def test_long_output_is_cut_with_a_note():
    (result,) = calls(["--root", FIXTURES, "--max-output-bytes", "2000"], [("rules", {})])
    output = result.structuredContent
    whole = cli("rules").stdout.encode()
    assert len(whole) > 2000
    assert output["truncated"] and output["verdict"] is None and output["exit_code"] == exit_codes.OK
    assert output["text"].startswith(whole[:1000].decode())
    assert output["text"].endswith(f"[... cut here: {len(whole) - 2000:,} more bytes ...]")
    assert any("cut at 2,000 of its" in note and "--max-output-bytes" in note for note in output["notes"])
    assert "--max-output-bytes" in text_of(result)


@needs_sdk
def test_a_call_past_the_deadline_is_stopped_with_a_note():
    # No Python process starts, let alone reads a log, within a millisecond.
    (result,) = calls(["--root", FIXTURES, "--timeout", "0.001"], [("triage", {"paths": [str(DEMO_LOG)]})])
    output = result.structuredContent
    assert result.isError and output["timed_out"] and output["exit_code"] is None
    assert output["verdict"] is None
    assert any("deadline of 0.001 s" in note and "--timeout" in note for note in output["notes"])
