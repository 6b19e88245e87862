"""Prometheus and promtool, built from the Go module tests/prometheus/go.mod pins, and what the
tests read from the monitoring component: its rule groups and its dashboard's queries, and the
metric names a PromQL expression reads."""

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.support.gobuild import built
from tests.support.prerequisites import REPO

COMPONENT = REPO / "metacontroller" / "components" / "monitoring"
RULE = COMPONENT / "prometheusrule.yaml"
DASHBOARD = COMPONENT / "infera-graphs.json"


def programs() -> dict[str, Path]:
    """{"prometheus": path, "promtool": path}, built once per machine."""
    return built(
        "prometheus",
        {
            "prometheus": "github.com/prometheus/prometheus/cmd/prometheus",
            "promtool": "github.com/prometheus/prometheus/cmd/promtool",
        },
        cold_build=": about 6 minutes on two cores when Go's build cache is cold",
    )


def rule_groups() -> list[dict[str, Any]]:
    """The PrometheusRule's spec.groups: a Prometheus rules file's groups."""
    return yaml.safe_load(RULE.read_text())["spec"]["groups"]


def write_rules_file(path: Path) -> Path:
    """The component's rules as the rules file Prometheus (and promtool) reads."""
    path.write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False))
    return path


def rule_expressions() -> Iterator[tuple[str, str]]:
    """(the alert's or record's name, its expression) for every rule."""
    for group in rule_groups():
        for rule in group["rules"]:
            yield rule.get("alert") or rule["record"], rule["expr"]


def recorded_names() -> set[str]:
    return {rule["record"] for group in rule_groups() for rule in group["rules"] if "record" in rule}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable's metric selector."""
    board = dashboard()
    for panel in board["panels"]:
        for target in panel["targets"]:
            yield f"panel {panel['title']!r} target {target['refId']}", target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            values = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query, re.S)
            # label_values(selector, label): the label is not a series name.
            yield f"variable {variable['name']}", values[1] if values else query


# PromQL's words that are not series names when they stand without a following '('.
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left"}
PROMQL_KEYWORDS |= {"group_right", "inf", "nan", "atan2"}
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def metric_names(expression: str) -> set[str]:
    """The series names an expression reads: without its strings, label matchers, grouping
    labels, ranges, numbers, Grafana's $variables, functions and keywords."""
    text = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', " ", expression)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = GROUPING.sub(" ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\$\{[^}]*\}|\$\w+", " ", text)
    text = re.sub(r"\boffset\s+-?\w+|@\s*[\w.]+(?:\(\))?", " ", text)  # offset 5m, @ 1700000000, @ end()
    text = re.sub(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][\w:]*", text):
        following = text[match.end() :].lstrip()
        if following.startswith("(") or match[0].lower() in PROMQL_KEYWORDS:
            continue  # a function, an aggregation or a keyword
        names.add(match[0])
    return names


def runtime_metric_names(metrics_py: Path) -> set[str]:
    """The names the runtime's infera/server/metrics.py exposes: a Gauge's name, a Counter's
    with _total (prometheus_client adds it when missing), a Histogram's _bucket, _sum and _count."""
    names = set()
    for node in ast.walk(ast.parse(metrics_py.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
            continue
        first = node.args[0]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            continue
        name = first.value
        if node.func.id == "Gauge":
            names.add(name)
        elif node.func.id == "Counter":
            names.add(name if name.endswith("_total") else f"{name}_total")
        elif node.func.id == "Histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def engine_metric_names(engine_metrics_py: Path) -> set[str]:
    """Every exposition name infera/common/engine_metrics.py spells (sglang:..., vllm:...)."""
    return {
        node.value
        for node in ast.walk(ast.parse(engine_metrics_py.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"[a-z]+:\w+", node.value)
    }


def kube_state_metrics_names(custom_resource_state: Path) -> set[str]:
    """prefix_name of every metric the CustomResourceStateMetrics configuration defines."""
    config = yaml.safe_load(custom_resource_state.read_text())
    return {
        f"{resource['metricNamePrefix']}_{metric['name']}"
        for resource in config["spec"]["resources"]
        for metric in resource["metrics"]
    }
