"""The monitoring component: its PrometheusRule (valid, accepted by promtool, its alerts fire
exactly when tests/monitoring/alerts.test.yaml says), its Grafana dashboard, and that both read
only series something exports: the runtime, the engines or kube-state-metrics."""

import json
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.support.prerequisites import REPO, RUNTIME, need, need_kubectl, need_schemas
from tests.support.prometheus import (
    DASHBOARD,
    RULE,
    dashboard,
    dashboard_queries,
    engine_metric_names,
    kube_state_metrics_names,
    metric_names,
    programs,
    recorded_names,
    rule_expressions,
    rule_groups,
    runtime_metric_names,
    write_rules_file,
)
from tests.support.schemas import validate, validate_object

ALERT_TESTS = REPO / "tests" / "monitoring" / "alerts.test.yaml"
RUNTIME_METRICS = RUNTIME / "infera" / "server" / "metrics.py"
ENGINE_METRICS = RUNTIME / "infera" / "common" / "engine_metrics.py"
KUBE_STATE_METRICS = REPO / "metacontroller" / "components" / "kube-state-metrics" / "custom-resource-state.yaml"
ALERTS = [
    "InferaGraphNotReady",
    "InferaPoolReplicasNotReady",
    "InferaWorkerBreakerOpen",
    "InferaPDBootstrapFailures",
    "InferaLatencyBudgetBurnFast",
    "InferaLatencyBudgetBurnSlow",
]


def test_the_prometheus_rule_fits_the_prometheus_operators_crd() -> None:
    schemas = need_schemas()
    need(
        (schemas / "prometheusrule.yaml").is_file(),
        f"the Prometheus Operator's PrometheusRule CRD is not at {schemas}/prometheusrule.yaml",
    )
    rule = yaml.safe_load(RULE.read_text())
    validate(rule, [schemas])
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"] == {
        "name": "infera-graphs",
        "namespace": "infera-system",
        "labels": {"app.kubernetes.io/name": "infera", "app.kubernetes.io/component": "alerts"},
    }


def test_every_alert_says_how_bad_what_and_what_to_do() -> None:
    alerts = [rule for group in rule_groups() for rule in group["rules"] if "alert" in rule]
    assert [alert["alert"] for alert in alerts] == ALERTS
    for alert in alerts:
        assert alert["labels"]["severity"] in ("critical", "warning"), alert["alert"]
        assert set(alert["annotations"]) == {"summary", "description", "runbook"}, alert["alert"]
        assert "$labels.infera_graph" in alert["annotations"]["description"], alert["alert"]
        assert "\n" not in alert["annotations"]["runbook"].strip(), alert["alert"]
    by_name = {alert["alert"]: alert for alert in alerts}
    assert by_name["InferaLatencyBudgetBurnFast"]["labels"]["severity"] == "critical"  # pages
    assert by_name["InferaLatencyBudgetBurnSlow"]["labels"]["severity"] == "warning"  # a ticket


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    promtool = programs()["promtool"]
    rules = write_rules_file(tmp_path / "infera-graphs.rules.yaml")
    checked = subprocess.run([promtool, "check", "rules", rules], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {sum(len(group['rules']) for group in rule_groups())} rules found" in checked.stdout


def test_every_dashboard_query_is_promql_promtool_parses(tmp_path: Path) -> None:
    """Each panel's query, its Grafana variables given values, checked as a recording rule's expression."""
    promtool = programs()["promtool"]
    values = {"$__rate_interval": "5m", "$namespace": "team-a", "$graph": "chat"}
    rules = []
    for index, (_, query) in enumerate(dashboard_queries()):
        for variable, value in values.items():
            query = query.replace(variable, value)
        rules.append({"record": f"dashboard:query_{index}", "expr": query})
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    """What makes the check above worth something."""
    promtool = programs()["promtool"]
    rules = tmp_path / "broken.rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "sum by (x ("}]}]}))
    checked = subprocess.run([promtool, "check", "rules", rules], capture_output=True, text=True)
    assert checked.returncode == 1, checked.stdout + checked.stderr


def test_the_alerts_fire_exactly_as_their_unit_tests_say(tmp_path: Path) -> None:
    """Every alert fires on its synthetic series with exactly its labels and annotations, and
    stays quiet on its look-alikes (terminating graph, half-open breaker, recovered pool...)."""
    promtool = programs()["promtool"]
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    assert tests["rule_files"] == ["infera-graphs.rules.yaml"]
    fired = {
        check["alertname"]
        for test in tests["tests"]
        for check in test.get("alert_rule_test", [])
        if check["exp_alerts"]
    }
    quiet = {
        check["alertname"]
        for test in tests["tests"]
        for check in test.get("alert_rule_test", [])
        if not check["exp_alerts"]
    }
    assert fired == set(ALERTS)
    assert quiet >= set(ALERTS) - {"InferaLatencyBudgetBurnSlow"}  # its quiet cases sit beside its firing ones
    write_rules_file(tmp_path / "infera-graphs.rules.yaml")
    shutil.copy(ALERT_TESTS, tmp_path / "alerts.test.yaml")
    ran = subprocess.run([promtool, "test", "rules", "alerts.test.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "SUCCESS" in ran.stdout


def known_names() -> set[str]:
    need(
        RUNTIME_METRICS.is_file() and ENGINE_METRICS.is_file(),
        f"the Infera runtime's metrics.py and engine_metrics.py are not under {RUNTIME}: the shared folder is missing",
    )
    return (
        runtime_metric_names(RUNTIME_METRICS)
        | engine_metric_names(ENGINE_METRICS)
        | kube_state_metrics_names(KUBE_STATE_METRICS)
        | recorded_names()
    )


def unknown_names(queries: list[tuple[str, str]], known: set[str]) -> list[str]:
    return [f"{where}: {name}" for where, query in queries for name in sorted(metric_names(query) - known)]


def test_the_runtimes_names_are_read_as_it_exposes_them() -> None:
    known = known_names()
    assert {"infera_request_duration_seconds_bucket", "infera_request_inflight", "infera_router_picks_total"} <= known
    assert "infera_request_inflight_bucket" not in known  # a Gauge has no buckets
    assert "infera_request_duration_seconds" not in known  # a Histogram is read by its series
    assert {"sglang:num_queue_reqs", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} <= known
    assert {"infera_inferadeployment_state", "infera_inferadeployment_service_ready_replicas"} <= known


def test_the_name_reader_skips_functions_labels_strings_and_variables() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (le, leg) (rate(a_bucket{namespace="$namespace", x=~"y|z"}[$__rate_interval])))'
    ) == {"a_bucket"}
    assert metric_names(
        'label_replace(b unless on (namespace, name) (c{s="t"} == 1), "g", "$1", "name", "(.*)") > 1e-3'
    ) == {"b", "c"}
    assert metric_names("sum(rate(vllm:x[5m])) without (pod) / ignoring (le) group_left (foo) d offset 5m") == {
        "vllm:x",
        "d",
    }
    assert metric_names("a @ 100 + b @ end() - c offset -1h30m") == {"a", "b", "c"}


def test_every_rule_and_panel_reads_only_series_something_exports() -> None:
    known = known_names()
    queries = [*rule_expressions(), *dashboard_queries()]
    assert len(queries) > 20
    assert unknown_names(queries, known) == []
    # A misspelt name is caught: the check above can fail.
    bogus = [*queries, ("panel 'typo'", 'sum(rate(infera_request_duration_second_count{namespace="$namespace"}[5m]))')]
    assert unknown_names(bogus, known) == ["panel 'typo': infera_request_duration_second_count"]


def test_the_dashboard_is_one_graphs_view_on_a_chosen_prometheus() -> None:
    text = DASHBOARD.read_text()
    board = json.loads(text)
    assert text == json.dumps(board, indent=2, ensure_ascii=False) + "\n"  # as generated: deterministic
    assert board["uid"] == "infera-graphs"
    assert board["schemaVersion"] >= 39
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "graph"]
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    for name in ("namespace", "graph"):
        assert variables[name]["type"] == "query"
        assert variables[name]["query"]["query"].startswith("label_values(")
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    panels = board["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    for panel in panels:
        assert panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert "$namespace" in target["expr"] and "$graph" in target["expr"], panel["title"]
    names = {name for panel in panels for target in panel["targets"] for name in metric_names(target["expr"])}
    # The panels the on-call person opens it for.
    assert {
        "infera_request_duration_seconds_count",  # throughput
        "infera_request_duration_seconds_bucket",  # latency quantiles
        "infera_request_inflight",
        "sglang:num_queue_reqs",
        "vllm:num_requests_waiting",
        "sglang:token_usage",
        "vllm:kv_cache_usage_perc",
        "infera_router_pick_cache_hits_sum",
        "infera_router_pick_request_blocks_sum",
        "infera_inferadeployment_service_replicas",
        "infera_inferadeployment_service_ready_replicas",
        "infera_router_worker_breaker_state",
        "infera_pd_dispatch_duration_seconds_bucket",
    } <= names


def test_the_component_installs_the_rule_and_the_dashboard(tmp_path: Path) -> None:
    kubectl = need_kubectl()
    need_schemas()
    (tmp_path / "infera-hooks").symlink_to(REPO, target_is_directory=True)
    overlay = tmp_path / "my-install"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../infera-hooks\n"
        "components:\n  - ../infera-hooks/metacontroller/components/monitoring\n"
    )
    rendered = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, check=True).stdout
    objects = {(obj["kind"], obj["metadata"]["name"]): obj for obj in yaml.safe_load_all(rendered) if obj}
    for obj in objects.values():
        validate_object(obj)
    assert objects[("PrometheusRule", "infera-graphs")] == yaml.safe_load(RULE.read_text())
    configmap = objects[("ConfigMap", "infera-dashboard")]
    assert configmap["metadata"]["namespace"] == "infera-system"
    assert configmap["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert configmap["data"] == {"infera-graphs.json": DASHBOARD.read_text()}
    assert json.loads(configmap["data"]["infera-graphs.json"]) == dashboard()
    children = objects[("CompositeController", "inferadeployment-controller")]["spec"]["childResources"]
    assert children[-1] == {
        "apiVersion": "monitoring.coreos.com/v1",
        "resource": "podmonitors",
        "updateStrategy": {"method": "InPlace"},
    }
