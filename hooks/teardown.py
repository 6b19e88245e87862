"""Ordered, drain-aware teardown: the finalize and customize hooks as pure functions.

While the InferaDeployment is being deleted, Metacontroller calls /finalize instead of /sync,
applies the children the answer lists, deletes the rest, and drops its finalizer as soon as an
answer says `finalized: true` (without applying that answer's children). So each answer keeps
exactly the observed children of the stages still to come, and `finalized` waits for nothing
to be observed. Every answer is a function of what is observed, so a repeated or late call
gives the same next step, and a child already let go is never handed back.

1. ingress: servers, their Services, the EPP, InferencePool and HTTPRoute stop new traffic;
2. workers: once no ingress object is left, worker Deployments and LeaderWorkerSets go and
   their pods drain (preStop, then the engine's drain timeout);
3. plane: NATS and the discovery identity go once no worker pod is left, since a draining
   worker still publishes KV events and still patches its own Pod.
"""

from typing import Any

from hooks.contract import HookRequest, as_last_applied
from hooks.renderers.common import COMPONENT_LABEL, DEPLOYMENT_LABEL, EPP_SUFFIX, NATS_SUFFIX, SERVICE_LABEL

# Metacontroller calls back after this long while the teardown waits (pods draining, deletions
# propagating), even if no watch event arrives.
RESYNC_SECONDS = 5
INGRESS_KINDS = ("InferencePool", "HTTPRoute")
WORKLOAD_KINDS = ("Deployment", "LeaderWorkerSet")


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _component(workload: dict[str, Any]) -> str | None:
    """server or worker, from the pod template the hook rendered."""
    spec = workload.get("spec") or {}
    template = spec.get("template") or (spec.get("leaderWorkerTemplate") or {}).get("leaderTemplate") or {}
    return _labels(template).get(COMPONENT_LABEL)


def stage(child: dict[str, Any]) -> str:
    """ingress, workers or plane."""
    service = _labels(child).get(SERVICE_LABEL)
    if child["kind"] in INGRESS_KINDS or service == EPP_SUFFIX:
        return "ingress"
    if child["kind"] == "Service" and service != NATS_SUFFIX:
        return "ingress"  # only servers have a Service of their own
    if child["kind"] in WORKLOAD_KINDS:
        return "workers" if _component(child) == "worker" else "ingress"
    return "plane"


def worker_pods(request: HookRequest) -> list[dict[str, Any]] | None:
    """This graph's worker pods, or None when the customize hook is not registered."""
    if request.related is None:
        return None
    name = request.parent["metadata"]["name"]
    return [
        pod for pod in request.related
        if pod.get("kind") == "Pod"
        and _labels(pod).get(DEPLOYMENT_LABEL) == name
        and _labels(pod).get(COMPONENT_LABEL) == "worker"
    ]


def finalize(request: HookRequest) -> dict[str, Any]:
    by_stage: dict[str, list[dict[str, Any]]] = {"ingress": [], "workers": [], "plane": []}
    for child in request.children:
        by_stage[stage(child)].append(child)
    if not request.children:
        return {"status": {"state": "terminating", "message": "all children deleted"}, "children": [], "finalized": True}

    pods = worker_pods(request) or []
    if by_stage["ingress"]:
        kept, message = by_stage["workers"] + by_stage["plane"], f"stopping traffic: removing {len(by_stage['ingress'])} ingress objects"
    elif by_stage["workers"]:
        kept, message = by_stage["plane"], f"draining {len(by_stage['workers'])} worker pools"
    elif pods:
        kept, message = by_stage["plane"], f"waiting for {len(pods)} worker pods to finish draining"
    else:
        kept, message = [], f"removing the NATS broker and discovery identity ({len(by_stage['plane'])} objects)"
    return {
        "status": {"state": "terminating", "message": message},
        "children": [as_last_applied(child) for child in kept],
        "finalized": False,
        "resyncAfterSeconds": RESYNC_SECONDS,
    }


def customize(parent: dict[str, Any]) -> dict[str, Any]:
    """Ask Metacontroller for the graph's Pods, so finalize sees workers still draining."""
    metadata = parent["metadata"]
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
