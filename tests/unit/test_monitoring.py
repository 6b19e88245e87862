"""spec.monitoring and the front door's resilience, renderer by renderer: the PodMonitor, the NATS
exporter, the Endpoint Pickers' replicas and budget, and the spread of routers across nodes.
Every emitted object is validated against its schema (the PodMonitor against the Prometheus
Operator's CRD)."""

from typing import Any

import pytest

from hooks.render import render_children
from hooks.renderers import gaie, monitoring, nats, network, pods
from tests.support.inline_specs import GAIE, SERVER, WORKER, build, labels, selector, valid
from tests.support.pod_security import RESTRICTED_CONTAINER
from tests.support.prerequisites import need_schemas

PD = {
    "router": SERVER,
    "prefill": {**WORKER, "role": "prefill"},
    "decode": {**WORKER, "role": "decode", "numberOfNodes": 2},
}
SERVICE = "__meta_kubernetes_pod_label_infera_amd_com_service"
GENERATION_FROM_POD = {
    "action": "replace",
    "sourceLabels": ["__meta_kubernetes_pod_label_infera_amd_com_generation"],
    "targetLabel": "infera_generation",
}
SERVICE_FROM_POD = {"action": "replace", "sourceLabels": [SERVICE], "targetLabel": "infera_service"}
QUEUE = {"type": "Pods", "pods": {"metric": {"name": "q"}, "target": {"type": "AverageValue", "averageValue": 2}}}
SPREAD = {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}


def set_label(label: str, value: str) -> dict[str, Any]:
    return {"action": "replace", "targetLabel": label, "replacement": value}


def role_of(service: str, role: str) -> dict[str, Any]:
    return {"action": "replace", "sourceLabels": [SERVICE], "regex": service, **set_label("infera_role", role)}


def endpoint(port: str, relabelings: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "port": port,
        "path": "/metrics",
        "interval": "15s",
        "relabelings": [set_label("infera_graph", "g"), *relabelings, GENERATION_FROM_POD],
    }


def test_pod_monitor_scrapes_every_router_engine_sidecar_and_the_broker_exporter() -> None:
    need_schemas()
    idep = build(
        PD,
        gaie=GAIE,
        monitoring={"interval": "15s", "labels": {"release": "kps"}, "natsExporter": {"enabled": True}},
    )
    assert monitoring.pod_monitor(idep) == {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "g-metrics", "labels": {"release": "kps", **labels("metrics")}},
        "spec": {
            "selector": {"matchLabels": {"infera.amd.com/deployment": "g"}},
            # One endpoint a port name: Metacontroller merges the list by `port`.
            "podMetricsEndpoints": [
                endpoint(
                    "http",
                    [
                        # Only rank 0 of a multi-node group serves HTTP.
                        {
                            "action": "keep",
                            "sourceLabels": ["__meta_kubernetes_pod_label_leaderworkerset_sigs_k8s_io_worker_index"],
                            "regex": "|0",
                        },
                        SERVICE_FROM_POD,
                        role_of("decode", "decode"),
                        role_of("prefill", "prefill"),
                        role_of("router", "server"),
                    ],
                ),
                endpoint("frontend", [SERVICE_FROM_POD, set_label("infera_role", "frontend")]),
                endpoint(
                    "metrics",
                    [
                        {"action": "keep", "sourceLabels": [SERVICE], "regex": "nats"},
                        set_label("infera_service", "nats"),
                        set_label("infera_role", "broker"),
                    ],
                ),
            ],
        },
    }
    valid(monitoring.pod_monitor(idep))


def test_the_operator_labels_win_over_the_users_on_the_pod_monitor() -> None:
    idep = build(monitoring={"labels": {"infera.amd.com/deployment": "other", "team": "ml"}})
    assert monitoring.pod_monitor(idep)["metadata"]["labels"] == {"team": "ml", **labels("metrics")}


def test_without_monitoring_nothing_changes() -> None:
    idep = build(PD, gaie=GAIE)
    children = render_children(idep)
    assert "PodMonitor" not in {child["kind"] for child in children}
    statefulset = next(child for child in children if child["kind"] == "StatefulSet")
    assert [c["name"] for c in statefulset["spec"]["template"]["spec"]["containers"]] == ["nats"]
    # Asked for without the exporter: the broker's pod is left as it is too.
    with_monitoring = render_children(build(PD, gaie=GAIE, monitoring={}))
    assert [child for child in with_monitoring if child["kind"] != "PodMonitor"] == children
    assert [child["metadata"]["name"] for child in with_monitoring if child["kind"] == "PodMonitor"] == ["g-metrics"]


def test_nats_exporter_sidecar_reads_the_monitoring_port_over_loopback() -> None:
    idep = build(
        monitoring={"natsExporter": {"enabled": True, "image": "registry.local/nats-exporter:1"}},
        networkPolicy={"metricsFrom": [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]},
    )
    (statefulset,) = [child for child in nats.render(idep) if child["kind"] == "StatefulSet"]
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    assert containers[1] == {
        "name": "nats-exporter",
        "image": "registry.local/nats-exporter:1",
        "args": ["-varz", "-connz", "-jsz=all", "-port=7777", "http://localhost:8222"],
        "ports": [{"name": "metrics", "containerPort": 7777, "protocol": "TCP"}],
        # Probes of its listener only: they never take the broker out of its Service.
        "readinessProbe": {
            "tcpSocket": {"port": "metrics"},
            "periodSeconds": 10,
            "timeoutSeconds": 1,
            "failureThreshold": 3,
            "successThreshold": 1,
        },
        "livenessProbe": {
            "tcpSocket": {"port": "metrics"},
            "periodSeconds": 30,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
            "successThreshold": 1,
        },
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
        "securityContext": RESTRICTED_CONTAINER,
    }
    valid(statefulset)
    # metricsFrom reaches the exporter as it reaches the monitoring port; nobody else does.
    (metrics_rule,) = network.broker_policy(idep)["spec"]["ingress"][1:]
    assert metrics_rule["ports"] == [{"port": 7777, "protocol": "TCP"}, {"port": 8222, "protocol": "TCP"}]
    assert nats.nats_exporter(build(monitoring={})) == []
    assert [c["image"] for c in nats.nats_exporter(build(monitoring={"natsExporter": {"enabled": True}}))] == [
        "natsio/prometheus-nats-exporter:0.20.1"
    ]


def test_no_exporter_endpoint_without_the_managed_broker() -> None:
    idep = build(nats={"deploy": False}, monitoring={"natsExporter": {"enabled": True}})
    ports = [e["port"] for e in monitoring.pod_monitor(idep)["spec"]["podMetricsEndpoints"]]
    assert ports == ["http"]


@pytest.mark.parametrize(
    ("replicas", "spread"),
    [(1, False), (2, True), (3, True)],
)
def test_endpoint_pickers_run_active_active_across_nodes(replicas: int, spread: bool) -> None:
    need_schemas()
    idep = build(gaie={**GAIE, "eppReplicas": replicas})
    deployment = gaie.epp_deployment(idep)
    assert deployment["spec"]["replicas"] == replicas
    constraints = deployment["spec"]["template"]["spec"].get("topologySpreadConstraints")
    assert constraints == ([{**SPREAD, "labelSelector": {"matchLabels": selector("epp")}}] if spread else None)
    budgets = [child for child in render_children(idep) if child["kind"] == "PodDisruptionBudget"]
    epp_budgets = [b for b in budgets if b["metadata"]["name"] == "g-epp"]
    expected = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "g-epp", "labels": labels("epp")},
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector("epp")},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
    assert epp_budgets == ([expected] if spread else [])
    valid(deployment, *epp_budgets)


@pytest.mark.parametrize(
    ("server", "spread"),
    [
        ({}, False),
        ({"replicas": 2}, True),
        # An autoscaler may add a second router at any time.
        ({"autoscaling": {"maxReplicas": 3, "metrics": [QUEUE]}}, True),
    ],
)
def test_routers_spread_across_nodes_when_there_may_be_more_than_one(server: dict[str, Any], spread: bool) -> None:
    idep = build({"router": {**SERVER, **server}, "worker": WORKER})
    template = pods.pod_template(idep, "router", idep.spec.services["router"])
    expected = [{**SPREAD, "labelSelector": {"matchLabels": selector("router")}}] if spread else None
    assert template["spec"].get("topologySpreadConstraints") == expected
    # Workers keep whatever the scheduler and their templates decide.
    worker = pods.pod_template(idep, "worker", idep.spec.services["worker"])
    assert "topologySpreadConstraints" not in worker["spec"]


def test_a_template_replaces_the_default_spread() -> None:
    zones = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}]
    router = {**SERVER, "replicas": 2, "extraPodSpec": {"topologySpreadConstraints": zones}}
    idep = build({"router": router, "worker": WORKER})
    template = pods.pod_template(idep, "router", idep.spec.services["router"])
    assert template["spec"]["topologySpreadConstraints"] == zones
