"""Elastic, disruption-safe pools: a service's HorizontalPodAutoscaler and PodDisruptionBudget, and
the spread of a front door's replicas (servers, Endpoint Pickers) across nodes.

While an autoscaler owns a pool's count, the workload renderer emits the live replicas it set
(ServiceSpec.desired_replicas): leaving `replicas` out is not an option, since Metacontroller's
3-way merge would delete the field and the API server would reset the pool to one replica.
"""

from typing import Any

from hooks.api.fields import SpecError
from hooks.api.graph import InferaDeployment
from hooks.api.services import DisruptionBudgetSpec, ServiceSpec
from hooks.quantity import canonical_quantity
from hooks.vocabulary import BY_KIND, generation_name, object_metadata, selector_labels, workload_kind

# A new worker takes minutes to load its model. Scaling up is Kubernetes' own default (at once,
# up to double or four pods every 15 s). Scaling down waits for ten quiet minutes and sheds one
# replica a minute: a replica removed during a lull is minutes away when the load comes back.
DEFAULT_BEHAVIOR: dict[str, Any] = {
    "scaleUp": {
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [
            {"type": "Pods", "value": 4, "periodSeconds": 15},
            {"type": "Percent", "value": 100, "periodSeconds": 15},
        ],
    },
    "scaleDown": {
        "stabilizationWindowSeconds": 600,
        "selectPolicy": "Max",
        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
    },
}
# The quantities of a MetricTarget, which the API server stores in canonical form.
TARGET_QUANTITIES = ("value", "averageValue")
# A service's budget when its spec has none (a frozen model, shared).
DEFAULT_BUDGET = DisruptionBudgetSpec()


def _without_nulls(node: Any) -> Any:
    """A copy without null fields, which the API server drops (and Metacontroller would set
    again on every sync)."""
    if isinstance(node, dict):
        return {key: _without_nulls(value) for key, value in node.items() if value is not None}
    if isinstance(node, list):
        return [_without_nulls(item) for item in node]
    return node


def _canonical_metric(metric: dict[str, Any], where: str) -> dict[str, Any]:
    """The metric as the API server stores it (`averageValue: 1000m` is stored as "1", 0.5 as
    "500m", a null field not at all): anything else would be re-applied on every sync."""
    metric = _without_nulls(metric)
    for source, spec in metric.items():
        target = spec.get("target") if isinstance(spec, dict) else None
        if not isinstance(target, dict):
            continue
        for field in TARGET_QUANTITIES:
            value = target.get(field)
            if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                try:
                    target[field] = canonical_quantity(str(value))
                except ValueError as error:
                    raise SpecError(f"{where}.{source}.target.{field}: {error}") from None
    return metric


def horizontal_pod_autoscaler(idep: InferaDeployment, service: str, svc: ServiceSpec) -> dict[str, Any]:
    """Scales the service's workload through its /scale subresource: a Deployment's pods, or a
    LeaderWorkerSet's groups. It targets the kind the pool renders as, so a switch between one
    and several nodes moves it along; under BlueGreen, `idep` is at the serving generation, whose
    workload it scales."""
    assert svc.autoscaling is not None
    scaling = svc.autoscaling
    kind = workload_kind(svc)
    where = f"spec.services.{service}.autoscaling.metrics"
    return {
        "apiVersion": BY_KIND["HorizontalPodAutoscaler"].api_version,
        "kind": "HorizontalPodAutoscaler",
        "metadata": object_metadata(idep, service),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": BY_KIND[kind].api_version,
                "kind": kind,
                "name": generation_name(idep, service),
            },
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": [_canonical_metric(metric, f"{where}[{index}]") for index, metric in enumerate(scaling.metrics)],
            "behavior": _without_nulls(scaling.behavior if scaling.behavior is not None else DEFAULT_BEHAVIOR),
        },
    }


def budget_max_unavailable(svc: ServiceSpec) -> int | str | None:
    """The disruption budget's maxUnavailable, or None for no budget: a worker pool has one
    unless disabled; a server only when it always keeps more than one replica (a budget over a
    single router would only say what a drain does anyway)."""
    budget = svc.disruption_budget or DEFAULT_BUDGET
    if not budget.enabled or (not svc.is_worker and svc.fewest_replicas <= 1):
        return None
    return budget.max_unavailable


def pod_disruption_budget(metadata: dict[str, Any], pods: dict[str, str], max_unavailable: int | str) -> dict[str, Any]:
    """Every pod `pods` selects (a LeaderWorkerSet's ranks included): a node drain takes at most
    `max_unavailable` of them (one group at a time, by default) while the rest keep serving."""
    return {
        "apiVersion": BY_KIND["PodDisruptionBudget"].api_version,
        "kind": "PodDisruptionBudget",
        "metadata": metadata,
        "spec": {
            "maxUnavailable": max_unavailable,
            "selector": {"matchLabels": pods},
            # A pod that is not ready (a crash loop, or a model still loading) can always be
            # evicted: otherwise it would hold every drain of its node until it turned ready.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def render(idep: InferaDeployment, service: str, svc: ServiceSpec) -> list[dict[str, Any]]:
    children = [] if svc.autoscaling is None else [horizontal_pod_autoscaler(idep, service, svc)]
    if (max_unavailable := budget_max_unavailable(svc)) is not None:
        children.append(
            pod_disruption_budget(object_metadata(idep, service), selector_labels(idep, service), max_unavailable)
        )
    return children


def spread_over_nodes(pods: dict[str, str]) -> list[dict[str, Any]]:
    """The topologySpreadConstraints of a front door's replicas (`pods`): one node's loss takes
    as few of them as the nodes allow. A preference, not a rule: where nodes are short, replicas
    still start, side by side."""
    return [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": pods},
        }
    ]
