"""Reading children, rendered or as observed: where a workload keeps its pod templates and
group size (the one reader of a workload's shape; renderers/workloads.py writes it), which
service a child is of, and what the observed children say of the graph (which workload serves a
service and how much of it is ready, where the model download is, what the autoscalers set).
Observed objects are read defensively: another controller, or a user, may have written anything."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hooks.api.graph import InferaDeployment
from hooks.api.status import ModelPhase
from hooks.contract import field_at
from hooks.vocabulary import (
    MODEL_VOLUME,
    SERVICE_LABEL,
    WORKLOAD_KINDS,
    child_name,
    download_job_name,
    generation_name,
    workload_kind,
)

# Where each workload kind keeps its pod templates.
POD_TEMPLATE_PATHS: dict[str, list[tuple[str, ...]]] = {
    "Deployment": [("spec", "template")],
    "StatefulSet": [("spec", "template")],
    "LeaderWorkerSet": [
        ("spec", "leaderWorkerTemplate", "leaderTemplate"),
        ("spec", "leaderWorkerTemplate", "workerTemplate"),
    ],
}

# Where a LeaderWorkerSet keeps the number of pods of each group.
GROUP_SIZE_PATH = ("spec", "leaderWorkerTemplate", "size")


def pod_templates(child: dict[str, Any]) -> list[tuple[dict[str, Any], bool]]:
    """The pod templates of a workload, rendered or observed, each with whether it is rank 0 of
    its group (a LeaderWorkerSet without a leader template starts its leaders from the worker
    template). What is not an object is passed over."""
    kind = child.get("kind")
    paths = POD_TEMPLATE_PATHS.get(kind, []) if isinstance(kind, str) else []
    templates = [field_at(child, *path) for path in paths]
    if len(templates) == 2:  # a LeaderWorkerSet's leader and worker templates
        leader, worker = templates
        ranked = [(leader or worker, True), (worker, False)]
    else:
        ranked = [(template, True) for template in templates]
    return [(template, leader) for template, leader in ranked if isinstance(template, dict)]


def as_object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def service_of(child: dict[str, Any]) -> str | None:
    """The graph's service a child belongs to, by its label."""
    service = field_at(child, "metadata", "labels", SERVICE_LABEL)
    return service if isinstance(service, str) else None


# What another controller writes in a condition can be long (an autoscaler quotes the metrics
# API's error): quoted in the message, it is cut to this.
MAX_QUOTED_MESSAGE = 200


def quoted(text: str) -> str:
    """Another controller's words as one line of at most MAX_QUOTED_MESSAGE characters, ending
    in an ellipsis where they were cut (so a cut is not read as what it said)."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_QUOTED_MESSAGE else line[: MAX_QUOTED_MESSAGE - 1].rstrip() + "…"


# Names a message lists before it counts the rest.
LISTED = 5


def listed_briefly(names: Sequence[str]) -> str:
    """Names as a message lists them: the first few, and how many more."""
    more = len(names) - LISTED
    return ", ".join(names[:LISTED]) + (f" and {more} more" if more > 0 else "")


Observed = dict[tuple[str, str], dict]  # observed children by (kind, name)


def observed_workload(idep: InferaDeployment, service: str, observed: Observed) -> dict | None:
    """The service's observed workload of the generation `idep` renders: of the kind the spec
    asks for, else of the other kind, which still serves during a switch or while the wanted kind
    is not registered."""
    name = generation_name(idep, service)
    wanted = observed.get((workload_kind(idep.spec.services[service]), name))
    if wanted is not None:
        return wanted
    return next((observed[(kind, name)] for kind in WORKLOAD_KINDS if (kind, name) in observed), None)


def current_ready(workload: dict | None) -> int:
    """Ready replicas (pods or groups) that run the current template: a rollout in progress,
    or a spec change its controller has not seen yet, is not ready."""
    if workload is None:
        return 0
    status = workload.get("status") or {}
    if as_int(status.get("observedGeneration")) < as_int(workload["metadata"].get("generation")):
        return 0
    return min(as_int(status.get("readyReplicas")), as_int(status.get("updatedReplicas")))


@dataclass(frozen=True)
class Download:
    """The model cache as observed: the current source's download Job, and the cache directories
    (source digests) the observed worker workloads mount."""

    phase: ModelPhase
    job: dict | None
    reason: str
    mounted: dict[str, str]  # workload name -> the digest that worker workload mounts


def _mounted_digests(idep: InferaDeployment, observed: Observed) -> dict[str, str]:
    """The digest each observed worker workload mounts (of any generation), by workload name."""
    workers = {service for service, svc in idep.spec.services.items() if svc.is_worker}
    digests = {}
    for (kind, name), child in observed.items():
        if kind not in WORKLOAD_KINDS or service_of(child) not in workers:
            continue
        for template, _ in pod_templates(child):
            for container in field_at(template, "spec", "containers") or []:
                for mount in (container.get("volumeMounts") if isinstance(container, dict) else None) or []:
                    if (
                        isinstance(mount, dict)
                        and mount.get("name") == MODEL_VOLUME
                        and isinstance(mount.get("subPath"), str)
                    ):
                        digests[name] = mount["subPath"]
    return digests


def _job_condition(job: dict | None, kind: str) -> dict | None:
    conditions = field_at(job, "status", "conditions")
    return (
        next(
            (c for c in conditions if isinstance(c, dict) and c.get("type") == kind and c.get("status") == "True"),
            None,
        )
        if isinstance(conditions, list)
        else None
    )


def model_download(idep: InferaDeployment, observed: Observed) -> Download | None:
    """Where the model cache's download is, as its Job reports (None without a model cache)."""
    cache = idep.spec.model_cache
    if cache is None:
        return None
    job = observed.get(("Job", download_job_name(idep, cache.digest)))
    mounted = _mounted_digests(idep, observed)
    if _job_condition(job, "Complete"):
        return Download("Ready", job, "", mounted)
    failed = _job_condition(job, "Failed")
    if failed:
        reason = quoted(f"{failed.get('reason')}: {failed.get('message')}")
        return Download("Failed", job, reason, mounted)
    return Download("Downloading", job, "", mounted)


def live_replicas(idep: InferaDeployment, by_key: Observed) -> dict[str, int]:
    """The replicas each autoscaled service's workload (of the generation `idep` renders, which
    the autoscaler scales) has now, as its autoscaler set them. Only a workload of the kind the
    spec renders counts: pods and groups are different units, so a switch between one and
    several nodes starts the new workload afresh."""
    live = {}
    for service, svc in idep.spec.services.items():
        if svc.autoscaling is None:
            continue
        replicas = field_at(by_key.get((workload_kind(svc), generation_name(idep, service))), "spec", "replicas")
        if isinstance(replicas, int) and not isinstance(replicas, bool):
            live[service] = replicas
    return live


def observed_autoscaler(idep: InferaDeployment, service: str, by_key: Observed) -> dict[str, Any]:
    return by_key.get(("HorizontalPodAutoscaler", child_name(idep, service))) or {}
