"""`torchtriage skill`: the SKILL.md an agent follows names only commands, options, rules, helpers and environment
variables the tool has, and covers every category of the knowledge base.

The text is read back as an agent would take it: each backticked `torchtriage ...` is a command line it runs,
each backticked `NAME=value` an environment variable it sets, each backticked dotted id a rule it explains.
"""

import re
import shlex
import subprocess
import sys
from dataclasses import asdict, fields

import pytest

import torchtriage
from conftest import run_cli
from torchtriage import exit_codes, protocol
from torchtriage.cli import VERBS, build_parser
from torchtriage.knowledge.rules import default_rules
from torchtriage.model import CATEGORIES, ROLES, Action, Confidence, Evidence, Finding, Machine, Verdict
from torchtriage.runtime import env as runtime_env
from torchtriage.skill import branches
from torchtriage.skill.inventory import SkillError

# What the user fills in (DIR, PID, HOST:PORT), and the launcher's own arguments after `--`.
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9]*(?::[A-Z][A-Z0-9]*)?|\.\.\.)$")
RULE_ID = re.compile(r"^[a-z][a-z0-9_]*\.[a-z0-9_]+$")
ENV_SETTING = re.compile(r"^([A-Z][A-Za-z0-9_]*)=")
BARE_ENV = re.compile(r"^[A-Z][A-Z0-9]*_[A-Z0-9_]+$")
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@pytest.fixture(scope="module")
def skill_md() -> str:
    done = run_cli("skill")
    assert done.returncode == exit_codes.OK, done.stderr.decode()
    assert b"Traceback" not in done.stderr
    return done.stdout.decode()


def spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def commands(text: str) -> list[str]:
    return [span for span in spans(text) if span.startswith("torchtriage ")]


def verb_parser(verb: str):
    parser = build_parser(only=verb)
    return parser, parser._subparsers._group_actions[0].choices[verb]


def test_front_matter_names_the_skill_and_says_when_to_use_it(skill_md):
    head, sep, body = skill_md.removeprefix("---\n").partition("\n---\n")
    assert skill_md.startswith("---\n") and sep, "SKILL.md opens with YAML front matter between --- lines"
    fields_ = dict(line.split(": ", 1) for line in head.splitlines())
    assert set(fields_) == {"name", "description"}
    assert fields_["name"] == "torchtriage"
    assert re.fullmatch(r"[a-z0-9-]{1,64}", fields_["name"])
    description = fields_["description"]
    assert 0 < len(description) <= 1024
    assert ": " not in description and not description.startswith(("'", '"', "[", "{", "&", "*", "!", "|", ">"))
    for symptom in ("hangs", "timeout", "memory", "NaN", "DeepEP", "slower"):
        assert symptom in description
    assert body.lstrip().startswith("# ")


def test_front_matter_is_yaml(skill_md):
    yaml = pytest.importorskip("yaml")
    head = skill_md.removeprefix("---\n").partition("\n---\n")[0]
    assert yaml.safe_load(head) == {"name": "torchtriage", "description": branches.DESCRIPTION}


def test_every_command_line_parses_with_its_verbs_real_parser(skill_md):
    lines = commands(skill_md)
    assert len(lines) >= 30
    for line in lines:
        tokens = shlex.split(line)[1:]
        verb, rest = tokens[0], tokens[1:]
        assert verb in VERBS, f"`{line}`: no verb {verb}"
        parser, sub = verb_parser(verb)
        before_launcher = rest[: rest.index("--")] if "--" in rest else rest
        for token in before_launcher:
            if token.startswith("-") and token != "-":
                assert token in sub._option_string_actions, f"`{line}`: torchtriage {verb} has no {token}"
        filled = [verb] + ["1" if PLACEHOLDER.match(t) else t for t in rest]
        try:
            parser.parse_args(filled)
        except SystemExit:
            pytest.fail(f"`{line}` does not parse: torchtriage {' '.join(filled)}")


def test_each_symptom_leads_to_the_command_that_reads_its_evidence(skill_md):
    lines = set(commands(skill_md))
    for expected in (
        "torchtriage triage LOGS --json",
        "torchtriage diagnose --pid PID --json",
        "torchtriage diagnose DIR --json",
        "torchtriage fr DUMPS --json",
        "torchtriage memory SNAPSHOT --json",
        "torchtriage trace TRACES --json",
        "torchtriage run --out DIR -- torchrun ...",
    ):
        assert expected in lines
    for title in ("Hang", "NCCL or collective timeout", "Out of memory", "NaN or Inf", "DeepEP", "Slow", "Crash"):
        assert re.search(rf"^## {re.escape(title)}", skill_md, re.MULTILINE), title


def test_every_rule_id_named_exists(skill_md):
    known = {rule.id for rule in default_rules()}
    named = [span for span in spans(skill_md) if RULE_ID.match(span)]
    assert len(named) >= len({rule.category for rule in default_rules()})
    assert [rule_id for rule_id in named if rule_id not in known] == []


def test_an_id_the_skill_names_is_one_explain_knows(skill_md):
    first = next(span for span in spans(skill_md) if RULE_ID.match(span))
    done = run_cli("explain", first)
    assert done.returncode == exit_codes.OK, done.stderr.decode()
    assert done.stdout.decode().startswith(first)


def _documented_env() -> set[str]:
    """What the rules' actions set, and the variables torchtriage's own runtime reads (protocol, runtime.env)."""
    names = {name for rule in default_rules() for action in rule.actions for name in action.env}
    for module in (protocol, runtime_env):
        names |= {value for key, value in vars(module).items() if key.endswith("_ENV") and isinstance(value, str)}
    return names


def test_every_environment_variable_named_exists(skill_md):
    known = _documented_env()
    named = []
    for span in spans(skill_md):
        setting = ENV_SETTING.match(span)
        if setting:
            named.append(setting.group(1))
        elif BARE_ENV.match(span):
            named.append(span)
    assert len(named) >= 20
    assert [name for name in named if name not in known] == []


def test_every_env_value_shown_is_one_a_rule_sets(skill_md):
    settings = {(n, v) for rule in default_rules() for action in rule.actions for n, v in action.env.items()}
    shown = [tuple(span.split("=", 1)) for span in spans(skill_md) if ENV_SETTING.match(span)]
    assert [pair for pair in shown if pair not in settings] == []


def test_every_name_in_backticks_is_a_helper_verb_key_or_value_of_the_tool(skill_md):
    verdict = Verdict(category="unknown", culprit_ranks=[0], summary="")
    keys = set(verdict.to_json()) | set(asdict(Finding(kind="", ranks=[], message="")))
    for model in (Evidence, Action, Machine):
        keys |= {f.name for f in fields(model)}
    vocabulary = set(CATEGORIES) | set(ROLES) | {c.value for c in Confidence}
    known = set(torchtriage.__all__) | set(VERBS) | keys | vocabulary
    names = [span for span in spans(skill_md) if IDENTIFIER.match(span) and not BARE_ENV.match(span)]
    assert [name for name in names if name not in known] == []


def test_helpers_to_add_are_public_names_of_torchtriage(skill_md):
    helpers = re.findall(r"^  - `(\w+)`: ", skill_md, re.MULTILINE)
    assert {"HangWatchdog", "NonFiniteGuard", "cuda_memory_history", "StepMonitor"} <= set(helpers)
    assert [name for name in helpers if name not in torchtriage.__all__] == []


def test_every_category_with_rules_has_a_branch(skill_md):
    """A category the knowledge base gains must get a branch in skill/branches.py before the skill ships."""
    with_rules = {rule.category for rule in default_rules()}
    table = skill_md.split("## Which branch", 1)[1].split("\n## ", 1)[0]
    routed = set(re.findall(r"`([a-z_]+)`", table))
    assert with_rules - routed == set(), "categories with rules but no branch"
    listed = set(re.findall(r"^Rules of `([a-z_]+)`", skill_md, re.MULTILINE))
    assert listed == with_rules


def test_the_verdict_section_states_the_schema_roles_and_exit_codes(skill_md):
    section = skill_md.split("## Reading the verdict", 1)[1]
    assert f"`{torchtriage.model.SCHEMA}`" in section
    for key in Verdict(category="unknown", culprit_ranks=[], summary="").to_json():
        assert f"- `{key}`" in section
    for role in ROLES:
        assert f"- `{role}`: " in section
    for level in Confidence:
        assert f"- `{level.value}`: " in section
    for code in (exit_codes.OK, exit_codes.PROBLEM_FOUND, exit_codes.USAGE, exit_codes.BAD_INPUT):
        assert f"\n- {code}: " in section


def test_an_agent_can_read_it_whole(skill_md):
    assert len(skill_md.splitlines()) <= 400


def test_out_writes_the_skill_folder_and_refuses_to_overwrite(tmp_path, skill_md):
    target = tmp_path / "skills" / "torchtriage" / "SKILL.md"
    done = run_cli("skill", "--out", tmp_path / "skills")
    assert done.returncode == exit_codes.OK, done.stderr.decode()
    assert target.read_text(encoding="utf-8") == skill_md

    target.write_text("the user's own skill\n", encoding="utf-8")
    again = run_cli("skill", "--out", tmp_path / "skills")
    assert again.returncode == exit_codes.USAGE
    assert "--force" in again.stderr.decode() and b"Traceback" not in again.stderr
    assert target.read_text(encoding="utf-8") == "the user's own skill\n"

    forced = run_cli("skill", "--out", tmp_path / "skills", "--force")
    assert forced.returncode == exit_codes.OK, forced.stderr.decode()
    assert target.read_text(encoding="utf-8") == skill_md
    assert [p.name for p in target.parent.iterdir()] == ["SKILL.md"]


def test_out_refuses_a_file_and_force_alone(tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    done = run_cli("skill", "--out", a_file)
    assert done.returncode == exit_codes.USAGE and b"not a folder" in done.stderr
    alone = run_cli("skill", "--force")
    assert alone.returncode == exit_codes.USAGE and b"--out" in alone.stderr


def test_generating_the_skill_never_imports_torch():
    program = (
        "import contextlib, io, sys\n"
        "from torchtriage.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    code = main(['skill'])\n"
        "print(code, sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["0", "[]"], done.stderr


def test_a_branch_naming_a_missing_option_or_helper_stops_the_generation(monkeypatch):
    from torchtriage.cli.skill import verb_parser
    from torchtriage.skill import generate

    bad_option = branches.Branch("x", "x", ("hang",), (branches.Command("triage LOGS --no-such-option", "x"),), "x")
    monkeypatch.setattr(branches, "BRANCHES", (bad_option,))
    with pytest.raises(SkillError, match="--no-such-option"):
        generate.skill_text(verb_parser)

    bad_verb = branches.Branch("x", "x", ("hang",), (branches.Command("stacks LOGS", "x"),), "x")
    monkeypatch.setattr(branches, "BRANCHES", (bad_verb,))
    with pytest.raises(SkillError, match="stacks"):
        generate.skill_text(verb_parser)

    bad_helper = branches.Branch("x", "x", ("hang",), (), "x", helpers=("DeadlockDetector",))
    monkeypatch.setattr(branches, "BRANCHES", (bad_helper,))
    with pytest.raises(SkillError, match="DeadlockDetector"):
        generate.skill_text(verb_parser)
