"""What Prometheus scrapes, for spec.monitoring: the graph's PodMonitor."""

from typing import Any

from hooks.api.graph import InferaDeployment
from hooks.renderers.gaie import FRONTEND_PORT_NAME
from hooks.renderers.nats import EXPORTER_PORT_NAME
from hooks.renderers.pods import PORT_NAME
from hooks.vocabulary import (
    BY_KIND,
    DEPLOYMENT_LABEL,
    GENERATION_LABEL,
    METRICS_SUFFIX,
    NATS_SUFFIX,
    SERVICE_LABEL,
    object_metadata,
)

# The target labels every scraped series carries, prefixed so that none shadows a label of the
# runtime's own series (infera_router_picks_total has a `role`).
GRAPH = "infera_graph"
SERVICE = "infera_service"
ROLE = "infera_role"
GENERATION = "infera_generation"
# The rank LeaderWorkerSet gives each pod of a group.
LEADER_RANK_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"


def _meta(pod_label: str) -> str:
    """What relabeling sees of a pod label: Prometheus's name for it."""
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in pod_label)


def _set(label: str, value: str) -> dict[str, Any]:
    return {"action": "replace", "targetLabel": label, "replacement": value}


def _copy(pod_label: str, label: str) -> dict[str, Any]:
    return {"action": "replace", "sourceLabels": [_meta(pod_label)], "targetLabel": label}


def _role_of(service: str, role: str) -> dict[str, Any]:
    """`role` for the pods of `service` (a DNS label: nothing in it is special to a regex)."""
    return {"action": "replace", "sourceLabels": [_meta(SERVICE_LABEL)], "regex": service, **_set(ROLE, role)}


def _endpoint(idep: InferaDeployment, port: str, relabelings: list[dict[str, Any]]) -> dict[str, Any]:
    assert idep.spec.monitoring is not None
    return {
        "port": port,
        "path": "/metrics",
        "interval": idep.spec.monitoring.interval,
        "relabelings": [
            _set(GRAPH, idep.name),
            *relabelings,
            # Under BlueGreen, which generation a series comes from; otherwise the label is empty,
            # which Prometheus drops.
            _copy(GENERATION_LABEL, GENERATION),
        ],
    }


def pod_monitor(idep: InferaDeployment) -> dict[str, Any]:
    """An endpoint per port name: `http` of every router and engine (an engine serves /metrics on
    its API port), `frontend` of the GAIE sidecars, `metrics` of the broker's exporter. Never two
    on one port: Metacontroller merges this list by `port`, and would fold them into one."""
    monitoring = idep.spec.monitoring
    assert monitoring is not None
    services = sorted(idep.spec.services.items())
    http = [_copy(SERVICE_LABEL, SERVICE)]
    http += [_role_of(service, svc.role if svc.is_worker else "server") for service, svc in services]
    if any(svc.number_of_nodes > 1 for _, svc in services):
        # Of a multi-node group only rank 0 serves HTTP; a single-node pod has no rank label.
        http.insert(0, {"action": "keep", "sourceLabels": [_meta(LEADER_RANK_LABEL)], "regex": "|0"})
    endpoints = [_endpoint(idep, PORT_NAME, http)]
    if idep.spec.gaie.enabled:
        # The sidecar's service is its pod's.
        endpoints.append(_endpoint(idep, FRONTEND_PORT_NAME, [_copy(SERVICE_LABEL, SERVICE), _set(ROLE, "frontend")]))
    if idep.spec.nats.deploy and monitoring.nats_exporter.enabled:
        # Only the broker's: a template may name a port of its own `metrics`.
        only_broker = {"action": "keep", "sourceLabels": [_meta(SERVICE_LABEL)], "regex": NATS_SUFFIX}
        exporter = [only_broker, _set(SERVICE, NATS_SUFFIX), _set(ROLE, "broker")]
        endpoints.append(_endpoint(idep, EXPORTER_PORT_NAME, exporter))
    metadata = object_metadata(idep, METRICS_SUFFIX)
    metadata["labels"] = (monitoring.labels or {}) | metadata["labels"]
    return {
        "apiVersion": BY_KIND["PodMonitor"].api_version,
        "kind": "PodMonitor",
        "metadata": metadata,
        # Every pod of the graph, of every generation; each endpoint scrapes the containers that
        # name its port.
        "spec": {"selector": {"matchLabels": {DEPLOYMENT_LABEL: idep.name}}, "podMetricsEndpoints": endpoints},
    }


def render(idep: InferaDeployment) -> list[dict[str, Any]]:
    return [] if idep.spec.monitoring is None else [pod_monitor(idep)]
