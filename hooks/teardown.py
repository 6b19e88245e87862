"""Ordered, drain-aware teardown: the finalize and customize hooks as pure functions.

While the InferaDeployment is being deleted, Metacontroller calls /finalize instead of /sync,
applies the children the answer lists, deletes the rest, and drops its finalizer as soon as an
answer says `finalized: true` (without applying that answer's children). So each answer keeps
exactly the observed children of the stages still to come, and `finalized` waits for nothing
to be observed. Every answer is a function of what is observed (the parent's status included:
it records when the wait for pods began), so a repeated or late call gives the same next step,
and a child already let go is never handed back.

1. ingress: servers, their Services, the EPP, InferencePool and HTTPRoute stop new traffic, and
   the autoscalers and disruption budgets go (no autoscaler scales a draining pool back up);
2. workers: once no ingress object is left, worker Deployments and LeaderWorkerSets go and
   their pods drain (preStop, then the engine's drain timeout). Which workload is a worker
   pool the spec's componentType says, not the workload's own labels;
3. plane: NATS, the model cache (its claim let go instead with retainStorage) and the
   pods' accounts go once no worker pod is left, since a draining worker still publishes
   KV events and still patches its own Pod. A worker pod is one a worker pool's controller
   owns, or one labelled a worker that is being deleted (a copy made to debug one holds
   nothing until then). The wait is bounded (`drain_bound`, counted from when it began): past
   it, or a minute past its own grace period (stuck on a lost node), a pod holds nothing, and
   the message names the pods left behind. Without the customize hook (no pods visible), the
   plane waits out the bound.
"""

from datetime import UTC, datetime, timedelta
from typing import Any

from hooks import conditions
from hooks.api.fields import SpecError
from hooks.api.graph import InferaDeployment
from hooks.api.status import TIME_FORMAT, Clock, Condition, ConditionStatus, utc_now
from hooks.contract import HookRequest, as_kept, as_last_applied, child_key, field_at
from hooks.observed import as_int, service_of
from hooks.renderers.pods import pod_template as workload_template
from hooks.status import as_wire, terminating
from hooks.vocabulary import (
    BY_KIND,
    COMPONENT_LABEL,
    DEPLOYMENT_LABEL,
    EPP_SUFFIX,
    GENERATION_LABEL,
    MODELS_SUFFIX,
    NATS_SUFFIX,
    SERVICE_LABEL,
)

# Metacontroller calls back after this long while the teardown waits (pods draining, deletions
# propagating), even if no watch event arrives.
RESYNC_SECONDS = 5
# Past its deletion deadline by this much, a pod is stuck (lost node) rather than draining.
STUCK_POD_SLACK = timedelta(seconds=60)
# From a workload's deletion to its pods': the garbage collector's steps through the ReplicaSets
# and StatefulSets in between, and kubelet's report that a pod has gone.
STAGE_SLACK = timedelta(seconds=30)
# The drain window assumed when the spec cannot be read.
FALLBACK_GRACE_SECONDS = 600
# The pods a message names; the rest are counted.
NAMED_PODS = 3
# Set on its pods by the Deployment controller (its ReplicaSet is `<deployment>-<hash>`) and by the
# LeaderWorkerSet controller (group i's StatefulSet is `<lws>-<i>`), each in its selector.
POD_TEMPLATE_HASH_LABEL = "pod-template-hash"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"


def _labels(obj: Any) -> dict[str, str]:
    labels = field_at(obj, "metadata", "labels")
    return labels if isinstance(labels, dict) else {}


def component_types(parent: dict[str, Any]) -> dict[str, str]:
    """Each service's componentType, read from the raw spec: an invalid spec must not stop the
    teardown. What cannot be read is left out."""
    services = field_at(parent, "spec", "services")
    if not isinstance(services, dict):
        return {}
    return {
        service: kind for service, svc in services.items() if isinstance(kind := field_at(svc, "componentType"), str)
    }


def _pool_stage(service: str | None, components: dict[str, str]) -> str:
    """When a service's workload goes: a pool is what the spec's componentType says it is, never
    what its pod template's labels say (an older build let a patch relabel them). A service the
    spec does not name (any more), or names unreadably, is taken for a worker pool: deleted after
    the ingress, so no new request reaches it, and before the plane, which waits for its pods. That
    order is safe whichever it is; taking a worker for a server would delete it with the ingress
    and let the plane go while it drains."""
    return "ingress" if components.get(service or "") == "server" else "workers"


def stage(child: dict[str, Any], components: dict[str, str]) -> str:
    """ingress, workers or plane; `components` as `component_types` reads them."""
    service = service_of(child)
    step = BY_KIND[child["kind"]].teardown if child["kind"] in BY_KIND else "plane"
    if step == "ingress" or service == EPP_SUFFIX:
        return "ingress"
    if step == "plane" or service == NATS_SUFFIX:
        return "plane"
    if child["kind"] == "Service":
        return "ingress"  # only servers have a Service of their own
    return _pool_stage(service, components)


def _time(value: Any) -> datetime | None:
    try:
        return datetime.strptime(value, TIME_FORMAT).replace(tzinfo=UTC) if isinstance(value, str) else None
    except ValueError:
        return None


def _of_worker_pool(pod: dict[str, Any], graph: str, components: dict[str, str]) -> bool:
    """Whether the controller of one of the graph's worker pools owns the pod, named as the real
    controllers name it: a Deployment's pods are owned by its ReplicaSet `<deployment>-<pod
    template hash>`; a LeaderWorkerSet's leaders by its StatefulSet `<lws>`, and the other pods of
    group i by that group's StatefulSet `<lws>-<i>`. A pool is `<graph>-<service>`, and
    `<graph>-<service>-<generation>` under BlueGreen, read from the pod's own labels: those
    controllers keep them in their selectors, and release a pod relabelled out of them."""
    labels = _labels(pod)
    service = labels.get(SERVICE_LABEL)
    if service in (None, EPP_SUFFIX, NATS_SUFFIX) or _pool_stage(service, components) != "workers":
        return False
    references = field_at(pod, "metadata", "ownerReferences")
    references = references if isinstance(references, list) else []
    owner = next((ref for ref in references if isinstance(ref, dict) and ref.get("controller") is True), {})
    generation = labels.get(GENERATION_LABEL)
    pool = f"{graph}-{service}-{generation}" if generation else f"{graph}-{service}"
    pod_template_hash, group = labels.get(POD_TEMPLATE_HASH_LABEL), labels.get(LWS_GROUP_INDEX_LABEL)
    if owner.get("kind") == "ReplicaSet":
        return pod_template_hash is not None and owner.get("name") == f"{pool}-{pod_template_hash}"
    if owner.get("kind") == "StatefulSet":
        return owner.get("name") == pool or (group is not None and owner.get("name") == f"{pool}-{group}")
    return False


def worker_pods(request: HookRequest) -> list[dict[str, Any]] | None:
    """The graph's worker pods: owned by a worker pool's controller, or being deleted and labelled
    a worker (draining, whoever owns it: a pool's pod its owner let go, a copy made to debug one;
    the plane's own pods, the broker's and the download's, are deleted with it and hold nothing).
    None when the customize hook is not registered (the pods are not visible)."""
    if "Pod.v1" not in request.related_kinds:
        return None
    graph = request.parent["metadata"]["name"]
    components = component_types(request.parent)

    def is_worker(pod: dict[str, Any]) -> bool:
        labels = _labels(pod)
        if pod.get("kind") != "Pod" or labels.get(DEPLOYMENT_LABEL) != graph:
            return False
        deleted = field_at(pod, "metadata", "deletionTimestamp") is not None
        return _of_worker_pool(pod, graph, components) or (deleted and labels.get(COMPONENT_LABEL) == "worker")

    return [pod for pod in request.related if is_worker(pod)]


def _holds(pod: dict[str, Any], now: datetime, bound: datetime) -> bool:
    """Whether a worker pod still holds the plane: until the bound, and a pod being deleted until
    its deletionTimestamp, the end of its grace period; long past that, it is stuck on a lost node
    and runs nothing."""
    deadline = _time(field_at(pod, "metadata", "deletionTimestamp"))
    return now < bound and (deadline is None or now < deadline + STUCK_POD_SLACK)


def _worker_templates(idep: InferaDeployment) -> list[dict[str, Any]]:
    return [
        workload_template(idep, service, svc, leader=leader)
        for service, svc in idep.spec.services.items()
        if svc.is_worker
        for leader in ((True, False) if svc.number_of_nodes > 1 else (True,))
    ]


def drain_bound(parent: dict[str, Any]) -> timedelta:
    """How long after the wait for worker pods began the plane waits at most (without the pods
    visible, how long it waits). A drain is the garbage collector reaching the pods (STAGE_SLACK),
    then the longest grace period the hook gives a worker pod (preStop, the engine's drain and its
    exit; kubelet kills the pod when it ends). A pool that runs in groups drains twice over: the
    StatefulSet that owns a group's other pods is owned by its leader pod, so they are deleted
    only once the leader has gone. A patch that lengthens a pod's grace period is not counted
    (extraPodSpec's is)."""
    try:
        idep = InferaDeployment.from_parent(parent)
        templates = _worker_templates(idep)
        grace = max((t["spec"].get("terminationGracePeriodSeconds", 0) for t in templates), default=0)
        drains = 2 if any(svc.is_worker and svc.number_of_nodes > 1 for svc in idep.spec.services.values()) else 1
    except SpecError:  # an invalid spec must not stop the teardown: assume long drains, in groups
        grace, drains = FALLBACK_GRACE_SECONDS, 2
    return drains * (STAGE_SLACK + timedelta(seconds=grace))


def finalize(request: HookRequest, now: Clock = utc_now) -> dict[str, Any]:
    if not request.children:
        return {
            "status": as_wire(terminating("all children deleted")),
            "children": [],
            "finalized": True,
        }
    by_stage: dict[str, list[dict[str, Any]]] = {"ingress": [], "workers": [], "plane": []}
    components = component_types(request.parent)
    for child in request.children:
        by_stage[stage(child, components)].append(child)
    if by_stage["ingress"]:
        kept = by_stage["workers"] + by_stage["plane"]
        return _waiting(request, kept, f"stopping traffic: removing {len(by_stage['ingress'])} ingress objects")
    if by_stage["workers"]:
        return _waiting(request, by_stage["plane"], f"draining {len(by_stage['workers'])} worker pools")
    return _plane_step(request, by_stage["plane"], now())


def _waiting(
    request: HookRequest, kept: list[dict[str, Any]], message: str, drained: Condition | None = None
) -> dict[str, Any]:
    return {
        "status": as_wire(terminating(message, drained)),
        "children": as_kept(kept, request.children),
        "finalized": False,
        "resyncAfterSeconds": RESYNC_SECONDS,
    }


def _plane_step(request: HookRequest, plane: list[dict[str, Any]], now: datetime) -> dict[str, Any]:
    """The plane waits for the worker pods, then goes. The Drained condition records the wait:
    False since it began (its lastTransitionTime, from which the drain bound counts), True once
    the plane is let go, for good: a later call that still sees a pod hands nothing back."""
    prior = _prior_drained(request.parent)
    if prior is not None and prior.status == "True":
        return _release(request, plane, prior, "")
    # Never later than now: a time to come would stretch the bound.
    began = min(_time(prior.last_transition_time) or now, now) if prior is not None else now
    bound = drain_bound(request.parent)
    pods = worker_pods(request)

    def drained(status: ConditionStatus, reason: str, message: str) -> Condition:
        generation = as_int(field_at(request.parent, "metadata", "generation"))
        return conditions.drained(generation, status, reason, message, began if status == "False" else now)

    if pods is None:  # without the customize hook, a drain is as long as the bound
        if now < began + bound:
            waiting = f"the pods are not visible (no customize hook), so the plane waits {_span(bound)}"
            return _waiting(
                request,
                plane,
                f"waiting for worker pods to finish draining: {waiting}",
                drained("False", "PodsNotVisible", waiting),
            )
        return _release(request, plane, drained("True", "DrainBoundPassed", f"waited {_span(bound)}"), "")
    holding = [pod for pod in pods if _holds(pod, now, began + bound)]
    if holding:
        draining = f"{len(holding)} worker pods to finish draining: {_named(holding)}"
        return _waiting(
            request, plane, f"waiting for {draining}", drained("False", "PodsDraining", f"waiting for {draining}")
        )
    if not pods:
        return _release(request, plane, drained("True", "PodsGone", "no worker pod left"), "")
    left = f"{len(pods)} worker pods did not finish draining in time and are left behind: {_named(pods)}"
    return _release(request, plane, drained("True", "DrainBoundPassed", left), f"; {left}")


def _prior_drained(parent: dict[str, Any]) -> Condition | None:
    """The Drained condition this teardown last wrote, if it still reads as one."""
    status = parent.get("status")
    return next(iter(conditions.carried_over(status if isinstance(status, dict) else {}, conditions.DRAINED)), None)


def _named(pods: list[dict[str, Any]]) -> str:
    """A few of the pods by name, the others counted."""
    names = sorted(str(field_at(pod, "metadata", "name")) for pod in pods)
    named = ", ".join(names[:NAMED_PODS])
    return f"{named} and {len(names) - NAMED_PODS} more" if len(names) > NAMED_PODS else named


def _span(span: timedelta) -> str:
    """A span as kubectl shows one: 90s as 1m30s."""
    minutes, seconds = divmod(int(span.total_seconds()), 60)
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


def _release(request: HookRequest, plane: list[dict[str, Any]], drained: Condition, note: str) -> dict[str, Any]:
    """The answer that lets the plane go: none of it is kept but the model cache's claim, let go
    (retainStorage)."""
    released = _released_claim(request)
    message = f"removing the NATS broker and the pods' accounts ({len(plane)} objects){note}"
    if released:
        message += f"; releasing the model cache's claim {released['metadata']['name']} (retainStorage)"
    return {
        "status": as_wire(terminating(message, drained)),
        "children": [released] if released else [],
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
