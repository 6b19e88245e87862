"""What the observed children say of each part of the graph, for its status: each service's
workload and autoscaler, the NATS broker, the model download."""

from collections.abc import Collection

from hooks.api.graph import InferaDeployment
from hooks.api.status import AutoscalingStatus, ModelCacheStatus, ServiceStatus
from hooks.contract import field_at
from hooks.observed import (
    Download,
    Observed,
    as_int,
    current_ready,
    observed_autoscaler,
    observed_workload,
    quoted,
)
from hooks.vocabulary import NATS_SUFFIX, child_name, download_job_name, workload_kind


def autoscaler_notices(
    idep: InferaDeployment, live: dict[str, int], answered: Collection[tuple[str, str]]
) -> list[str]:
    """A replica count written in the spec (by a user, or by the router's scaling API) that the
    autoscaler of a service overrides: said, so nobody waits for it. Only for an autoscaler in
    the answer (`answered`, by kind and name): one withheld for its unregistered kind owns nothing."""
    notices = []
    for service, svc in sorted(idep.spec.services.items()):
        if service not in live or "replicas" not in svc.model_fields_set:
            continue
        count = svc.desired_replicas(live[service])
        if ("HorizontalPodAutoscaler", child_name(idep, service)) in answered and count != svc.replicas:
            notices.append(
                f"{service}: replicas {svc.replicas} in the spec is not applied while autoscaling owns the count "
                f"({count} now)"
            )
    return notices


AUTOSCALER_CONDITIONS = ("AbleToScale", "ScalingActive")


def _autoscaling_status(idep: InferaDeployment, service: str, by_key: Observed) -> AutoscalingStatus | None:
    scaling = idep.spec.services[service].autoscaling
    if scaling is None:
        return None
    reported = observed_autoscaler(idep, service, by_key).get("status") or {}
    return AutoscalingStatus(
        min_replicas=scaling.min_replicas,
        max_replicas=scaling.max_replicas,
        current_replicas=as_int(reported.get("currentReplicas")),
        desired_replicas=as_int(reported.get("desiredReplicas")),
    )


def autoscaler_trouble(idep: InferaDeployment, by_key: Observed) -> list[str]:
    """What keeps an autoscaler from scaling: its absence beside a running pool (the API server
    refused it, or it is still to be created), or what it says in its conditions."""
    trouble = []
    for service, svc in sorted(idep.spec.services.items()):
        if svc.autoscaling is None:
            continue
        autoscaler = observed_autoscaler(idep, service, by_key)
        if not autoscaler and observed_workload(idep, service, by_key) is not None:
            trouble.append(
                f"{service} autoscaler: HorizontalPodAutoscaler {child_name(idep, service)} does not exist yet (if it "
                "stays missing, the API server refused it: Metacontroller's log says why)"
            )
        conditions = field_at(autoscaler, "status", "conditions")
        for condition in conditions if isinstance(conditions, list) else []:
            if not isinstance(condition, dict) or condition.get("status") != "False":
                continue
            if condition.get("type") in AUTOSCALER_CONDITIONS:
                detail = quoted(f"{condition.get('reason')}: {condition.get('message')}")
                trouble.append(f"{service} autoscaler: {condition['type']} is False ({detail})")
    return trouble


def service_statuses(idep: InferaDeployment, by_key: Observed) -> dict[str, ServiceStatus]:
    """Each service's workload kind and counts as the workload reports them: the replicas it has
    now, not the ones asked for (the router's scaling API reads them as the current count)."""
    statuses = {}
    for service, svc in sorted(idep.spec.services.items()):
        workload = observed_workload(idep, service, by_key)
        reported = (workload or {}).get("status") or {}
        statuses[service] = ServiceStatus(
            kind=workload["kind"] if workload else workload_kind(svc),
            replicas=as_int(reported.get("replicas")),
            ready_replicas=as_int(reported.get("readyReplicas")),
            autoscaling=_autoscaling_status(idep, service, by_key),
        )
    return statuses


def broker_waiting(idep: InferaDeployment, by_key: Observed) -> str | None:
    """The NATS broker, when the graph deploys it and its StatefulSet exists: every process
    publishes KV events to it (and, by default, requests cross it)."""
    broker = by_key.get(("StatefulSet", child_name(idep, NATS_SUFFIX)))
    if not idep.spec.nats.deploy or broker is None or current_ready(broker) >= 1:
        return None
    return f"NATS broker {current_ready(broker)}/1 ready"


def model_cache_status(idep: InferaDeployment, download: Download | None) -> ModelCacheStatus | None:
    """The model cache as its download Job reports it (None without a model cache)."""
    cache = idep.spec.model_cache
    if cache is None or download is None:
        return None
    job = download_job_name(idep, cache.digest)
    message = {
        "Ready": f"{cache.source} is in the model cache",
        "Downloading": f"downloading {cache.source}",
        "Failed": (
            f"downloading {cache.source} failed ({download.reason}); running workers are kept; fix the spec, "
            f"or delete Job {job} to try again"
        ),
    }[download.phase]
    return ModelCacheStatus(phase=download.phase, source=cache.source, job=job, message=message)
