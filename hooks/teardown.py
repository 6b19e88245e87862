"""Ordered, drain-aware teardown: the finalize and customize hooks as pure functions.

While the InferaDeployment is being deleted, Metacontroller calls /finalize instead of /sync,
applies the children the answer lists, deletes the rest, and drops its finalizer as soon as an
answer says `finalized: true` (without applying that answer's children). So each answer keeps
exactly the observed children of the stages still to come, and `finalized` waits for nothing
to be observed. Every answer is a function of what is observed, so a repeated or late call
gives the same next step, and a child already let go is never handed back.

1. ingress: servers, their Services, the EPP, InferencePool and HTTPRoute stop new traffic, and
   the autoscalers and disruption budgets go (no autoscaler scales a draining pool back up);
2. workers: once no ingress object is left, worker Deployments and LeaderWorkerSets go and
   their pods drain (preStop, then the engine's drain timeout);
3. plane: NATS, the model cache (its claim let go instead with retainStorage) and the
   pods' accounts go once no worker pod is left, since a draining worker still publishes
   KV events and still patches its own Pod. Without the customize hook
   (no pods visible), they go once the longest worker grace period since the deletion began
   has passed; a pod long past its own deletion deadline (a lost node) no longer holds them.
"""

from datetime import UTC, datetime, timedelta
from typing import Any

from hooks.api.fields import SpecError
from hooks.api.graph import InferaDeployment
from hooks.contract import HookRequest, as_kept, as_last_applied, child_key, field_at
from hooks.observed import pod_templates, service_of
from hooks.renderers.pods import pod_template as workload_template
from hooks.status import Clock, as_wire, terminating, utc_now
from hooks.vocabulary import (
    BY_KIND,
    COMPONENT_LABEL,
    DEPLOYMENT_LABEL,
    EPP_SUFFIX,
    MODELS_SUFFIX,
    NATS_SUFFIX,
)

# Metacontroller calls back after this long while the teardown waits (pods draining, deletions
# propagating), even if no watch event arrives.
RESYNC_SECONDS = 5
# Past its deletion deadline by this much, a pod is stuck (lost node) rather than draining.
STUCK_POD_SLACK = timedelta(seconds=60)
# Between the deletion request and the worker workloads' deletion (the ingress step).
STAGE_SLACK = timedelta(seconds=30)
# The drain window assumed when the spec cannot be read.
FALLBACK_GRACE_SECONDS = 600


def _labels(obj: Any) -> dict[str, str]:
    labels = field_at(obj, "metadata", "labels")
    return labels if isinstance(labels, dict) else {}


def _component(workload: dict[str, Any]) -> str | None:
    """server or worker, from the pod template the hook rendered."""
    templates = pod_templates(workload)
    return _labels(templates[0][0]).get(COMPONENT_LABEL) if templates else None


def stage(child: dict[str, Any]) -> str:
    """ingress, workers or plane."""
    service = service_of(child)
    step = BY_KIND[child["kind"]].teardown if child["kind"] in BY_KIND else "plane"
    if step == "ingress" or service == EPP_SUFFIX:
        return "ingress"
    if step == "plane" or service == NATS_SUFFIX:
        return "plane"
    if child["kind"] == "Service":
        return "ingress"  # only servers have a Service of their own
    return "workers" if _component(child) == "worker" else "ingress"


def _time(value: Any) -> datetime | None:
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) if isinstance(value, str) else None
    except ValueError:
        return None


def draining_worker_pods(request: HookRequest, now: datetime) -> list[dict[str, Any]] | None:
    """This graph's worker pods that may still be draining, or None when the customize hook is
    not registered (the pods are not visible)."""
    if "Pod.v1" not in request.related_kinds:
        return None
    name = request.parent["metadata"]["name"]
    pods = []
    for pod in request.related:
        labels = _labels(pod)
        if pod.get("kind") != "Pod" or labels.get(DEPLOYMENT_LABEL) != name or labels.get(COMPONENT_LABEL) != "worker":
            continue
        # A pod's deletionTimestamp is when its grace period ends. Long past it, the pod is stuck
        # on a lost node and runs nothing: it must not hold the teardown forever.
        deadline = _time(pod["metadata"].get("deletionTimestamp"))
        if deadline is None or now < deadline + STUCK_POD_SLACK:
            pods.append(pod)
    return pods


def longest_worker_grace(parent: dict[str, Any]) -> timedelta:
    """The longest termination grace period a worker pod of this graph gets."""
    try:
        idep = InferaDeployment.from_parent(parent)
        templates = [
            workload_template(idep, service, svc) for service, svc in idep.spec.services.items() if svc.is_worker
        ]
        seconds = max((t["spec"].get("terminationGracePeriodSeconds", 0) for t in templates), default=0)
    except SpecError:  # an invalid spec must not stop the teardown
        seconds = FALLBACK_GRACE_SECONDS
    return timedelta(seconds=seconds)


def finalize(request: HookRequest, now: Clock = utc_now) -> dict[str, Any]:
    by_stage: dict[str, list[dict[str, Any]]] = {"ingress": [], "workers": [], "plane": []}
    for child in request.children:
        by_stage[stage(child)].append(child)
    if not request.children:
        return {
            "status": as_wire(terminating("all children deleted")),
            "children": [],
            "finalized": True,
        }

    moment = now()
    if by_stage["ingress"]:
        kept, message = (
            by_stage["workers"] + by_stage["plane"],
            f"stopping traffic: removing {len(by_stage['ingress'])} ingress objects",
        )
    elif by_stage["workers"]:
        kept, message = by_stage["plane"], f"draining {len(by_stage['workers'])} worker pools"
    elif (pods := draining_worker_pods(request, moment)) is None and _blind_drain_pending(request, moment):
        # Without pod visibility, wait as long as a worker could take to drain.
        kept, message = by_stage["plane"], "waiting for worker pods to finish draining (their grace period)"
    elif pods:
        kept, message = by_stage["plane"], f"waiting for {len(pods)} worker pods to finish draining"
    else:
        released = _released_claim(request)
        kept, message = [], f"removing the NATS broker and the pods' accounts ({len(by_stage['plane'])} objects)"
        if released:
            message += f"; releasing the model cache's claim {released['metadata']['name']} (retainStorage)"
        return {
            "status": as_wire(terminating(message)),
            "children": [released] if released else [],
            "finalized": False,
            "resyncAfterSeconds": RESYNC_SECONDS,
        }
    return {
        "status": as_wire(terminating(message)),
        "children": as_kept(kept, request.children),
        "finalized": False,
        "resyncAfterSeconds": RESYNC_SECONDS,
    }


def _released_claim(request: HookRequest) -> dict[str, Any] | None:
    """With modelCache.retainStorage, the claim is let go instead of deleted: garbage collection
    deletes what the InferaDeployment owns once it is gone, so the claim's owner reference is
    removed, in two answers since Metacontroller's merge removes only what it applied: first it
    is applied (recorded), then left out. A claim with no owner is not adopted by a parent
    being deleted, so it is not observed again, and it stays. Read from the raw spec: an invalid
    spec must not cost the weights."""
    if field_at(request.parent, "spec", "modelCache", "retainStorage") is not True:
        return None
    name = f"{request.parent['metadata']['name']}-{MODELS_SUFFIX}"
    claim = next((c for c in request.children if child_key(c) == ("PersistentVolumeClaim", name)), None)
    if claim is None:
        return None
    applied = as_last_applied(claim)
    metadata = applied.setdefault("metadata", {})
    # Only this InferaDeployment's reference: the merge then removes that one and no other.
    uid = request.parent["metadata"].get("uid")
    ours = [ref for ref in claim["metadata"].get("ownerReferences") or [] if ref.get("uid") == uid]
    metadata["ownerReferences"] = [] if metadata.get("ownerReferences") else ours
    return applied


def _blind_drain_pending(request: HookRequest, now: datetime) -> bool:
    """Without the customize hook: whether worker pods could still be draining, counting from
    the moment the InferaDeployment's deletion began."""
    started = _time(request.parent["metadata"].get("deletionTimestamp")) or now
    return now < started + longest_worker_grace(request.parent) + STAGE_SLACK


def customize(request: HookRequest) -> dict[str, Any]:
    """Ask Metacontroller for the graph's Pods, so finalize sees workers still draining."""
    metadata = request.parent["metadata"]
    return {
        "relatedResources": [
            {
                "apiVersion": "v1",
                "resource": "pods",
                "namespace": metadata.get("namespace", "default"),
                "labelSelector": {"matchLabels": {DEPLOYMENT_LABEL: metadata["name"]}},
            }
        ]
    }
