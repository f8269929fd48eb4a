"""The one loader of the knowledge base: a user's rules join the built-in ones, and every malformed
knowledge file is refused with a message that names the file and what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchtriage import exit_codes
from torchtriage.cli import main
from torchtriage.knowledge.frames import load_stack_knowledge
from torchtriage.knowledge.kernels import load_kernel_table
from torchtriage.knowledge.loader import KNOWLEDGE_DIR, KnowledgeError
from torchtriage.knowledge.rules import default_rules, load_rules

LOG_LINE = "[rank2]: TeamStorage: shard /ckpt/step_900 is locked by another writer\n"
USER_RULE = """
[[rule]]
id = "team.locked_shard"
category = "environment"
title = "A checkpoint shard is locked by another writer"
role = "primary"
cause = "Two jobs write the same checkpoint folder."
source = "our storage client: ShardWriter.open"
patterns = ['TeamStorage: shard (?P<path>\\S+) is locked by another writer']
examples = ["TeamStorage: shard /ckpt/a is locked by another writer"]

[[rule.actions]]
title = "Give each job its own checkpoint folder"
"""


def _rules_dir(tmp_path: Path, name: str, text: str | bytes) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(text.encode() if isinstance(text, str) else text)
    return folder


def _triage(tmp_path: Path, rules: Path, capsys) -> tuple[int, str, str]:
    log = tmp_path / "job.log"
    log.write_text(LOG_LINE)
    code = main(["triage", str(log), "--rules-dir", str(rules), "--json"])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_users_rule_names_the_failure(tmp_path, capsys):
    code, out, _ = _triage(tmp_path, _rules_dir(tmp_path, "team.toml", USER_RULE), capsys)
    assert code == exit_codes.PROBLEM_FOUND
    assert '"category": "environment"' in out and '"culprit_ranks": [\n    2\n  ]' in out
    assert "team.locked_shard" in out and "Give each job its own checkpoint folder" in out


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("team.toml", USER_RULE.replace("patterns =", "pattern ="), "unknown key pattern"),
        ("team.toml", USER_RULE.replace('"team.locked_shard"', '"oom.cuda_allocator"'), "start with `team.`"),
        ("oom.toml", USER_RULE.replace('"team.locked_shard"', '"oom.cuda_allocator"'), "reuses the id of a built-in"),
        ("team.toml", USER_RULE.replace('category = "environment"', 'category = "disk"'), "unknown category 'disk'"),
        ("team.toml", USER_RULE.replace("examples = [", "#"), "shows the lines it matches"),
        ("team.toml", USER_RULE.replace('title = "Give', 'detail = "Give'), "missing `title`"),
        ("team.toml", USER_RULE.encode() + b"\n# caf\xe9\n", "not UTF-8"),
        ("team.toml", USER_RULE + "\n[[rule]\n", "not valid TOML"),
        ("team.toml", USER_RULE.replace("writer']", "writer ']"), "ends with a space"),
        ("team.toml", USER_RULE.replace("patterns =", 'anchors = [" -> 2"]\npatterns ='), "too common"),
    ],
)
def test_a_malformed_user_rule_is_refused_with_what_is_wrong(tmp_path, capsys, name, text, says):
    code, out, err = _triage(tmp_path, _rules_dir(tmp_path, name, text), capsys)
    assert code == exit_codes.BAD_INPUT
    assert not out and says in err and name in err
    assert "Traceback" not in err and "internal error" not in err


def test_a_rules_dir_that_does_not_exist_is_not_ignored(tmp_path, capsys):
    code, out, err = _triage(tmp_path, tmp_path / "nowhere", capsys)
    assert code == exit_codes.BAD_INPUT
    assert "no such folder of rules" in err and not out


def test_rules_live_in_the_file_of_their_prefix():
    for rule in default_rules():
        assert rule.file == rule.id.split(".", 1)[0] + ".toml", rule.id


def test_built_in_knowledge_files_reject_unknown_keys(tmp_path):
    frames = (KNOWLEDGE_DIR / "frames.toml").read_text()
    (tmp_path / "frames.toml").write_text(frames.replace("[dataloader]\n", "[dataloader]\nwaits = []\n"))
    with pytest.raises(KnowledgeError, match=r"frames.toml \[dataloader\]: unknown key waits"):
        load_stack_knowledge(tmp_path / "frames.toml")
    kernels = (KNOWLEDGE_DIR / "kernels.toml").read_text()
    (tmp_path / "kernels.toml").write_text(kernels.replace("[memory]\n", "[memory]\nprefixes = []\n"))
    with pytest.raises(KnowledgeError, match=r"kernels.toml \[memory\]: unknown key prefixes"):
        load_kernel_table(tmp_path / "kernels.toml")
    (tmp_path / "rules").mkdir()
    with pytest.raises(KnowledgeError, match="holds no rule files"):
        load_rules(tmp_path / "rules")


def _commands_in(value) -> list[str]:
    """Every `command` string anywhere in a knowledge file's tables."""
    if isinstance(value, dict):
        found = [value["command"]] if isinstance(value.get("command"), str) else []
        return found + [c for v in value.values() for c in _commands_in(v)]
    if isinstance(value, list):
        return [c for v in value for c in _commands_in(v)]
    return []


def test_every_torchtriage_command_the_knowledge_gives_parses():
    """A fix that tells the user (or an agent) to run a verb or an option the tool does not have is a dead end."""
    import re
    import shlex

    from torchtriage.cli import VERBS, build_parser
    from torchtriage.knowledge.loader import read_toml

    commands = [
        command
        for path in sorted(KNOWLEDGE_DIR.rglob("*.toml"))
        for command in _commands_in(read_toml(path))
        if command.startswith("torchtriage ")
    ]
    assert len(commands) > 50
    for command in commands:
        filled = re.sub(r"<[^>]*>|\{[^}]*\}", "1", command).replace("...", "")
        argv = shlex.split(filled)[1:]
        assert argv and argv[0] in VERBS, command
        if argv[0] == "run":
            argv = argv[: argv.index("--")] + ["--", "true"] if "--" in argv else argv
        try:
            build_parser(only=argv[0]).parse_args(argv)
        except SystemExit:
            pytest.fail(f"the knowledge gives a command the tool does not take: {command}")
