import json

import pytest

from conftest import run_cli
from torchtriage.analysis.layout import (
    ExpressionError,
    Layout,
    check_layout,
    evaluate,
    layout_fields_from_config,
    load_rules,
    parse_expression,
)
from torchtriage.errors import InputError


def ids(layout: Layout) -> dict[str, str]:
    return {f.id: f.severity for f in check_layout(layout).findings}


# --- the rule that motivated this: racy expert-parallel dispatch groups -------------------------------


def test_ep4_on_one_nvlink_domain_of_8_is_rejected_with_the_three_fixes():
    report = check_layout(Layout(world_size=8, gpus_per_node=8, ep=4))
    assert not report.accepted
    (finding,) = [f for f in report.findings if f.id == "layout.ep_racy_dispatch_groups"]
    assert "2 expert-parallel dispatch groups" in finding.reason and "deadlock" in finding.reason
    assert "ep_size=2" in finding.fix and "ep_size=8" in finding.fix and "ep4 + etp2" in finding.fix


@pytest.mark.parametrize(
    "layout",
    [
        Layout(8, 8, ep=2),
        Layout(8, 8, ep=8),
        Layout(8, 8, ep=4, etp=2),
        Layout(4, 4, ep=4),
        Layout(4, 8, ep=4),  # half a node in use: one group in the domain
        Layout(16, 8, ep=2, tp=2),
    ],
)
def test_the_fixes_are_accepted(layout):
    assert check_layout(layout).accepted, check_layout(layout).findings


@pytest.mark.parametrize("layout", [Layout(8, 8, ep=4, tp=2), Layout(16, 8, ep=4), Layout(72, 72, ep=8)])
def test_other_racy_layouts_are_rejected(layout):
    assert "layout.ep_racy_dispatch_groups" in ids(layout)


def test_ep_equal_to_a_multi_node_nvlink_domain_is_accepted():
    assert check_layout(Layout(72, 4, nvlink_domain=72, ep=72)).accepted


# --- divisibility and products ------------------------------------------------------------------------


def test_dp_is_derived_when_omitted():
    report = check_layout(Layout(16, 8, tp=4, pp=2))
    assert report.accepted and report.layout["dp"] == 2 and report.layout["dp_derived"]


def test_products_and_divisibility():
    assert ids(Layout(8, 8, dp=3))["layout.product_mismatch"] == "reject"
    assert ids(Layout(12, 8))["layout.world_not_whole_nodes"] == "reject"
    assert ids(Layout(8, 8, tp=3))["layout.world_not_divisible"] == "reject"
    cp_tp = ids(Layout(8, 8, tp=4, cp=4))
    assert cp_tp["layout.model_parallel_exceeds_world"] == "reject"
    assert ids(Layout(8, 8, ep=3))["layout.expert_not_divisible"] == "reject"
    assert ids(Layout(8, 8, ep=2, num_experts=7))["layout.experts_not_divisible"] == "reject"
    assert ids(Layout(8, 6, nvlink_domain=4))["layout.domain_not_aligned"] == "reject"


def test_tp_beyond_a_node_or_domain_warns():
    assert ids(Layout(16, 8, tp=16)) == {"layout.tp_exceeds_domain": "warn"}
    assert ids(Layout(16, 8, nvlink_domain=16, tp=16)) == {"layout.tp_exceeds_node": "warn"}
    assert check_layout(Layout(16, 8, tp=16)).accepted


def test_expert_groups_across_domains_warn():
    assert ids(Layout(16, 8, ep=16)) == {"layout.dispatch_crosses_domains": "warn"}
    assert ids(Layout(24, 8, ep=12))["layout.dispatch_straddles_domains"] == "reject"


def test_non_positive_degree_is_bad_input():
    with pytest.raises(InputError, match="positive"):
        check_layout(Layout(8, 8, tp=0))


# --- the expression language is interpreted, never eval'd ---------------------------------------------


def test_expressions():
    assert evaluate("a % (b * 2) != 0 and max(a, b) > 3", {"a": 9, "b": 2}) is True
    assert evaluate("1 < a <= 3", {"a": 3}) is True
    assert evaluate("not a", {"a": 0}) is True


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "a.__class__",
        "[x for x in a]",
        "a ** 1000000",
        "'text'",
        "open('/etc/passwd')",
        "lambda: 1",
        "a / 2",
    ],
)
def test_expressions_outside_the_whitelist_are_refused(text):
    with pytest.raises(ExpressionError):
        parse_expression(text)


def test_unknown_names_and_division_by_zero_are_errors():
    with pytest.raises(ExpressionError, match="unknown name"):
        evaluate("zz > 1", {})
    with pytest.raises(ExpressionError, match="division by zero"):
        evaluate("1 % a", {"a": 0})


def test_rules_file_loads_and_every_rule_evaluates_on_a_plain_layout():
    rules = load_rules()
    assert len(rules.rules) >= 10 and len({r.id for r in rules.rules}) == len(rules.rules)
    assert check_layout(Layout(8, 8), rules).findings == []


# --- config files and the CLI ---------------------------------------------------------------------------


def test_config_keys_and_aliases():
    data = {"world_size": 8, "parallelism": {"tensor_model_parallel_size": 2, "ep_size": 4, "expert_tp_size": 2}}
    assert layout_fields_from_config(data, "x") == {"world_size": 8, "tp": 2, "ep": 4, "etp": 2}
    with pytest.raises(InputError, match="ep_size must be a positive integer"):
        layout_fields_from_config({"ep_size": "four"}, "x")
    with pytest.raises(InputError, match="mapping"):
        layout_fields_from_config([1, 2], "x")


def test_cli_rejects_ep4_and_accepts_ep4_etp2():
    done = run_cli("check-layout", "--world-size", 8, "--gpus-per-node", 8, "--ep", 4)
    assert done.returncode == 1 and b"REJECTED" in done.stdout and b"layout.ep_racy_dispatch_groups" in done.stdout
    done = run_cli("check-layout", "--world-size", 8, "--gpus-per-node", 8, "--ep", 4, "--etp", 2)
    assert done.returncode == 0 and b"ACCEPTED" in done.stdout


def test_cli_json_config_and_flag_override(tmp_path):
    config = tmp_path / "layout.json"
    config.write_text(json.dumps({"world_size": 8, "gpus_per_node": 8, "ep_size": 4}))
    done = run_cli("check-layout", "--config", config, "--json")
    data = json.loads(done.stdout)
    assert done.returncode == 1 and data["schema"] == "torchtriage.layout/1" and not data["accepted"]
    done = run_cli("check-layout", "--config", config, "--ep", 2, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["layout"]["ep"] == 2


def test_cli_yaml_config(tmp_path):
    pytest.importorskip("yaml")
    config = tmp_path / "layout.yaml"
    config.write_text("world_size: 8\ngpus_per_node: 8\nexpert_parallel_size: 4\nexpert_tp_size: 2\n")
    assert run_cli("check-layout", "--config", config).returncode == 0


def test_cli_bad_input_and_usage(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    done = run_cli("check-layout", "--config", broken)
    assert done.returncode == 3 and b"not valid JSON" in done.stderr and b"Traceback" not in done.stderr
    done = run_cli("check-layout", "--config", tmp_path / "missing.json")
    assert done.returncode == 3 and b"cannot read" in done.stderr
    yaml_file = tmp_path / "layout.yaml"
    yaml_file.write_text("world_size: [8\n")
    done = run_cli("check-layout", "--config", yaml_file)
    assert done.returncode == 3 and b"Traceback" not in done.stderr
    assert run_cli("check-layout", "--gpus-per-node", 8).returncode == 2
    assert run_cli("check-layout", "--world-size", 8, "--gpus-per-node", 8, "--tp", 0).returncode == 2
