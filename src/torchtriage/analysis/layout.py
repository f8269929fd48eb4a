"""Validate a parallel layout (dp / tp / pp / cp / ep / etp on a world of GPUs) against rules kept as data.

The rules live in knowledge/layouts.toml. Their conditions are small expressions, parsed with `ast` and
interpreted by `evaluate` over a whitelist of node types: integer arithmetic, comparisons, boolean
logic, min and max. Nothing reaches `eval`, so a rules file (or a --rules file a user passes) cannot
run code.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from torchtriage.errors import InputError
from torchtriage.knowledge.loader import (
    KNOWLEDGE_DIR,
    STRING,
    STRING_TABLE,
    TABLES,
    KnowledgeError,
    check_table,
    read_toml,
)
from torchtriage.sources.fields import as_int, describe

RULES_FILE = KNOWLEDGE_DIR / "layouts.toml"
SCHEMA = "torchtriage.layout/1"
DEGREES = ("dp", "tp", "pp", "cp", "ep", "etp")
SEVERITIES = ("reject", "warn")


class ExpressionError(ValueError):
    pass


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_FUNCTIONS = {"min": min, "max": max}


@lru_cache(maxsize=512)
def parse_expression(text: str) -> ast.Expression:
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as err:
        raise ExpressionError(f"cannot parse {text!r}: {err.msg}") from None
    for node in ast.walk(tree):
        allowed = (
            ast.Expression,
            ast.BinOp,
            ast.UnaryOp,
            ast.BoolOp,
            ast.Compare,
            ast.Name,
            ast.Constant,
            ast.Call,
            ast.Load,
            ast.And,
            ast.Or,
            ast.Not,
            ast.USub,
            *_BINARY,
            *_COMPARE,
        )
        if not isinstance(node, allowed):
            raise ExpressionError(f"{text!r}: `{type(node).__name__}` is not allowed in a layout rule")
        if isinstance(node, ast.Constant) and not isinstance(node.value, int):
            raise ExpressionError(f"{text!r}: only integer constants are allowed")
        if isinstance(node, ast.Call) and (
            not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS or node.keywords
        ):
            raise ExpressionError(f"{text!r}: only min(...) and max(...) may be called")
    return tree


def evaluate(text: str, variables: dict[str, int]) -> int | bool:
    """The value of a rule expression. Raises ExpressionError for an unknown name or a division by 0."""

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in variables:
                raise ExpressionError(f"{text!r}: unknown name {node.id!r}")
            return variables[node.id]
        if isinstance(node, ast.BinOp):
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
                raise ExpressionError(f"{text!r}: division by zero")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp):
            value = walk(node.operand)
            return (not value) if isinstance(node.op, ast.Not) else -value
        if isinstance(node, ast.BoolOp):
            values = (walk(v) for v in node.values)
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.Compare):
            left = walk(node.left)
            for op, comparator in zip(node.ops, node.comparators, strict=True):
                right = walk(comparator)
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.Call):
            return _FUNCTIONS[node.func.id](*(walk(a) for a in node.args))
        raise ExpressionError(f"{text!r}: unsupported expression")  # pragma: no cover - parse_expression guards

    return walk(parse_expression(text))


_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


def render(template: str, variables: dict[str, int]) -> str:
    def one(match: re.Match) -> str:
        try:
            return str(evaluate(match.group(1), variables))
        except ExpressionError:
            return "?"

    return _PLACEHOLDER.sub(one, template)


@dataclass(frozen=True)
class LayoutRule:
    id: str
    severity: str
    when: str
    reason: str
    fix: str


@dataclass
class LayoutRules:
    derived: list[tuple[str, str]]
    rules: list[LayoutRule]


def load_rules(path: Path = RULES_FILE) -> LayoutRules:
    try:
        data = check_table(read_toml(path), path.name, {"rule": TABLES}, {"derived": STRING_TABLE})
        rules = []
        for index, raw in enumerate(data["rule"]):
            where = f"{path.name}: rule {raw.get('id', index + 1)}"
            check_table(raw, where, {"id": STRING, "severity": STRING, "when": STRING, "reason": STRING, "fix": STRING})
            rules.append(LayoutRule(raw["id"], raw["severity"], raw["when"], raw["reason"], raw["fix"]))
    except KnowledgeError as err:
        raise InputError(f"cannot read the layout rules: {err}") from None
    derived = [(str(k), str(v)) for k, v in (data.get("derived") or {}).items()]
    for rule in rules:
        if rule.severity not in SEVERITIES:
            raise InputError(f"{path}: rule {rule.id}: severity must be one of {', '.join(SEVERITIES)}")
        try:
            parse_expression(rule.when)
        except ExpressionError as err:
            raise InputError(f"{path}: rule {rule.id}: {err}") from None
    for name, expression in derived:
        try:
            parse_expression(expression)
        except ExpressionError as err:
            raise InputError(f"{path}: derived {name}: {err}") from None
    return LayoutRules(derived, rules)


@dataclass
class Layout:
    world_size: int
    gpus_per_node: int
    nvlink_domain: int | None = None
    dp: int | None = None
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    num_experts: int | None = None


@dataclass
class LayoutFinding:
    id: str
    severity: str
    reason: str
    fix: str


@dataclass
class LayoutReport:
    accepted: bool
    layout: dict[str, Any]
    findings: list[LayoutFinding] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "accepted": self.accepted,
            "layout": self.layout,
            "findings": [asdict(f) for f in self.findings],
        }


def variables_of(layout: Layout, derived: list[tuple[str, str]]) -> dict[str, int]:
    domain = layout.nvlink_domain or layout.gpus_per_node
    model_parallel = layout.tp * layout.cp * layout.pp
    variables = {
        "world_size": layout.world_size,
        "gpus_per_node": layout.gpus_per_node,
        "nvlink_domain": domain,
        "dp": layout.dp if layout.dp is not None else max(1, layout.world_size // model_parallel),
        "dp_given": int(layout.dp is not None),
        "tp": layout.tp,
        "pp": layout.pp,
        "cp": layout.cp,
        "ep": layout.ep,
        "etp": layout.etp,
        "num_experts": layout.num_experts or 0,
    }
    for name, expression in derived:
        try:
            variables[name] = int(evaluate(expression, variables))
        except ExpressionError:
            variables[name] = 0
    return variables


def check_layout(layout: Layout, rules: LayoutRules | None = None) -> LayoutReport:
    rules = rules or load_rules()
    values = {name: getattr(layout, name) for name in ("world_size", "gpus_per_node", *DEGREES[1:])}
    values |= {"nvlink_domain": layout.nvlink_domain, "dp": layout.dp}
    for name, value in values.items():
        if value is not None and value < 1:
            raise InputError(f"{name} must be a positive integer, got {value}")
    variables = variables_of(layout, rules.derived)
    findings = []
    for rule in rules.rules:
        try:
            hit = evaluate(rule.when, variables)
        except ExpressionError as err:
            raise InputError(f"layout rule {rule.id}: {err}") from None
        if hit:
            findings.append(
                LayoutFinding(rule.id, rule.severity, render(rule.reason, variables), render(rule.fix, variables))
            )
    findings.sort(key=lambda f: SEVERITIES.index(f.severity))
    shown = {k: variables[k] for k in ("world_size", "gpus_per_node", "nvlink_domain", *DEGREES)}
    shown["dp_derived"] = layout.dp is None
    if layout.num_experts:
        shown["num_experts"] = layout.num_experts
    return LayoutReport(not any(f.severity == "reject" for f in findings), shown, findings)


# Config-file keys -> Layout field (flags use the short names).
CONFIG_KEYS = {
    "world_size": "world_size",
    "gpus_per_node": "gpus_per_node",
    "nproc_per_node": "gpus_per_node",
    "nvlink_domain": "nvlink_domain",
    "nvlink_domain_size": "nvlink_domain",
    "dp": "dp",
    "dp_size": "dp",
    "data_parallel_size": "dp",
    "tp": "tp",
    "tp_size": "tp",
    "tensor_parallel_size": "tp",
    "tensor_model_parallel_size": "tp",
    "pp": "pp",
    "pp_size": "pp",
    "pipeline_parallel_size": "pp",
    "pipeline_model_parallel_size": "pp",
    "cp": "cp",
    "cp_size": "cp",
    "context_parallel_size": "cp",
    "ep": "ep",
    "ep_size": "ep",
    "expert_parallel_size": "ep",
    "expert_model_parallel_size": "ep",
    "etp": "etp",
    "etp_size": "etp",
    "expert_tp_size": "etp",
    "expert_tensor_parallel_size": "etp",
    "num_experts": "num_experts",
    "num_moe_experts": "num_experts",
    "n_routed_experts": "num_experts",
}


_LARGEST_SETTING = 1 << 31  # no world, node or parallel degree comes near


def layout_fields_from_config(data: Any, source: str) -> dict[str, int]:
    """The layout settings found in a parsed config: top-level keys, or under a `parallelism` table."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping of settings at the top level, found {type(data).__name__}")
    merged = dict(data)
    for table in ("parallelism", "parallel", "layout"):
        if isinstance(data.get(table), dict):
            merged |= data[table]
    fields: dict[str, int] = {}
    for key, value in merged.items():
        if not isinstance(key, str):
            continue  # a config's settings are named; YAML also allows lists and maps as keys
        name = CONFIG_KEYS.get(key.lower())
        if name is None or value is None:
            continue
        number = as_int(value.strip() if isinstance(value, str) else value, -1, 1, _LARGEST_SETTING)
        if number < 0:
            raise InputError(
                f"{source}: {key[:80]} must be a positive integer (at most {_LARGEST_SETTING:,}), got {describe(value)}"
            )
        value = number
        fields[name] = value
    return fields


def parse_config_text(text: str, source: str) -> Any:
    """JSON always; YAML when PyYAML is installed (a .json file, or text starting with `{`, is JSON)."""
    from torchtriage.sources.fields import strict_json

    if source.endswith(".json") or text.lstrip().startswith("{"):
        try:
            return strict_json(text)
        except ValueError as err:
            raise InputError(f"{source}: {err}") from None
    try:
        import yaml
    except ImportError:
        raise InputError(
            f"{source}: YAML needs PyYAML (`pip install pyyaml`), which is not installed; or pass the settings "
            "as flags or a JSON file"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise InputError(f"{source}: not valid YAML ({str(err).splitlines()[0]})") from None
    except RecursionError:
        raise InputError(f"{source}: its YAML is nested too deep to be a config") from None
    except ValueError:  # an integer of thousands of digits
        raise InputError(f"{source}: its YAML holds an integer of thousands of digits, which no config has") from None
