"""The finalize and customize hooks: ordered, drain-aware teardown through the simulator."""

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from hooks import teardown
from hooks.contract import LAST_APPLIED_ANNOTATION, parse_request
from tests.support.apply import record
from tests.support.graphs import graph
from tests.support.prerequisites import REPO, need_schemas
from tests.support.requests import controller, parent, request_body
from tests.support.simulator import Metacontroller

TIME = "%Y-%m-%dT%H:%M:%SZ"
GAIE = {"enabled": True, "tokenizerPath": "Qwen/Qwen3-0.6B", "gatewayName": "inference-gateway"}
QUEUE_DEPTH = {
    "type": "Pods",
    "pods": {"metric": {"name": "sglang_num_queue_reqs"}, "target": {"type": "AverageValue", "averageValue": "8"}},
}
INGRESS = {
    ("Deployment", "qwen-pd-server"),
    ("Service", "qwen-pd-server"),
    ("Deployment", "qwen-pd-epp"),
    ("Service", "qwen-pd-epp"),
    ("InferencePool", "qwen-pd-pool"),
    ("HTTPRoute", "qwen-pd-route"),
    # No autoscaler may scale a draining pool back up.
    ("HorizontalPodAutoscaler", "qwen-pd-decode"),
    ("PodDisruptionBudget", "qwen-pd-decode"),
    ("PodDisruptionBudget", "qwen-pd-prefill"),
}
WORKERS = {("Deployment", "qwen-pd-prefill"), ("LeaderWorkerSet", "qwen-pd-decode")}
PLANE = {
    ("StatefulSet", "qwen-pd-nats"),
    ("Service", "qwen-pd-nats"),
    # It admits the graph's pods to the broker while the workers drain.
    ("NetworkPolicy", "qwen-pd-nats"),
    *(
        (kind, f"qwen-pd-{account}")
        for kind in ("ServiceAccount", "Role", "RoleBinding")
        for account in ("disc", "register")
    ),
}
# examples/pd-disaggregated.yaml's first two steps: its router with the budgets, then its pools.
PD_SERVERS = {
    ("Deployment", "qwen-pd-server"),
    ("Service", "qwen-pd-server"),
    ("PodDisruptionBudget", "qwen-pd-prefill"),
    ("PodDisruptionBudget", "qwen-pd-decode"),
}
PD_POOLS = {("Deployment", "qwen-pd-prefill"), ("Deployment", "qwen-pd-decode")}
# With the gateway, the Endpoint Picker's identity is part of the plane too.
GATEWAY_PLANE = PLANE | {(kind, "qwen-pd-epp") for kind in ("ServiceAccount", "Role", "RoleBinding")}


def full_graph(hooks) -> Metacontroller:
    """A converged graph with GAIE, NATS and an autoscaled multi-node pool, its pods running."""
    need_schemas()
    obj = graph().gaie(**GAIE).nodes(decode=2).autoscaling("decode", maxReplicas=2, metrics=[QUEUE_DEPTH]).obj()
    mc = Metacontroller(hooks, obj)
    mc.converge()
    mc.mark_ready()
    mc.gateway_accepts()
    mc.converge()
    assert set(mc.children) == INGRESS | WORKERS | GATEWAY_PLANE
    mc.run_pods()
    return mc


def deleted(writes: list[tuple[str, str, str]]) -> set[tuple[str, str]]:
    assert all(write[0] in ("delete", "status") for write in writes), writes
    return {(kind, name) for op, kind, name in writes if op == "delete"}


def draining(mc: Metacontroller) -> str:
    """The worker pods of full_graph, as a message names them: the decode group's leader and its
    other rank, and prefill's (its ReplicaSet's: `<deployment>-<pod-template-hash>-<suffix>`)."""
    (prefill,) = [name for name in mc.pods if name.startswith("qwen-pd-prefill-")]
    return f"qwen-pd-decode-0, qwen-pd-decode-0-1, {prefill}"


def worker_pod_count(mc: Metacontroller) -> int:
    return sum(1 for pod in mc.pods.values() if pod["metadata"]["labels"].get("infera.amd.com/component") == "worker")


def test_teardown_order_and_idempotence(hooks) -> None:
    mc = full_graph(hooks)
    assert worker_pod_count(mc) == 3  # prefill, and the decode group's leader and worker

    # 1. Stop new traffic.
    assert deleted(mc.finalize()) == INGRESS
    assert mc.parent["status"]["state"] == "terminating"
    assert mc.parent["status"]["message"] == "stopping traffic: removing 9 ingress objects"
    assert mc.last_answer["resyncAfterSeconds"] == 5
    assert set(mc.children) == WORKERS | GATEWAY_PLANE

    # 2. Drain the workers; their pods are still running the preStop drain.
    assert deleted(mc.finalize()) == WORKERS
    assert mc.parent["status"]["message"] == "draining 2 worker pools"
    assert set(mc.children) == GATEWAY_PLANE

    # 3. NATS and the discovery identity outlive every draining worker pod, named; the group's
    # other pod is not deleted yet (its StatefulSet is its leader pod's), but its owner says it
    # is a worker's.
    assert mc.finalize() == [("status", "InferaDeployment", "qwen-pd")]
    assert mc.parent["status"]["message"] == f"waiting for 3 worker pods to finish draining: {draining(mc)}"
    assert "deletionTimestamp" not in mc.pods["qwen-pd-decode-0-1"]["metadata"]
    (drained,) = mc.parent["status"]["conditions"]
    assert drained == {
        "type": "Drained",
        "status": "False",
        "reason": "PodsDraining",
        "message": f"waiting for 3 worker pods to finish draining: {draining(mc)}",
        "observedGeneration": 1,
        "lastTransitionTime": drained["lastTransitionTime"],
    }
    assert mc.finalize() == [] and mc.finalize() == []  # still draining: nothing changes
    assert set(mc.children) == GATEWAY_PLANE and not mc.finalized
    mc.pods_finish_draining()
    assert worker_pod_count(mc) == 0
    assert deleted(mc.finalize()) == GATEWAY_PLANE
    assert mc.parent["status"]["message"] == "removing the NATS broker and the pods' accounts (12 objects)"
    assert [(c["status"], c["reason"]) for c in mc.parent["status"]["conditions"]] == [("True", "PodsGone")]

    # 4. Finalized only once nothing is observed.
    assert mc.children == {} and not mc.finalized
    assert mc.finalize() == [("finalized", "InferaDeployment", "qwen-pd")]
    assert mc.finalize_calls == 7  # ingress, workers, three while pods drain, plane, finalized


def at_any_time(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer without the times its conditions changed: a wait that begins now says so."""
    answer = copy.deepcopy(answer)
    for condition in answer["status"].get("conditions", []):
        condition["lastTransitionTime"] = "now"
    return answer


def test_every_stage_is_idempotent(hooks) -> None:
    """A repeated call at any stage gives the same answer and changes nothing."""
    mc = full_graph(hooks)
    stages = 0
    while not mc.finalized:
        request = parse_request(mc.body(finalizing=True))
        # The function itself, twice at one moment, and through the app.
        moment = datetime.now(UTC)
        answer = teardown.finalize(request, lambda: moment)
        assert teardown.finalize(request, lambda: moment) == answer
        assert at_any_time(hooks.hook("/finalize", mc.body(finalizing=True))) == at_any_time(answer)
        writes = mc.finalize()
        if not writes:
            mc.pods_finish_draining()
        stages += 1
        assert stages < 10
    assert stages == 6  # ingress, workers, wait, (pods exit) plane, finalized; one quiet wait


def test_children_are_never_handed_back(hooks) -> None:
    """Every answer lists only children that are observed: one already let go never returns,
    even when a later call still sees part of the old world."""
    mc = full_graph(hooks)
    while not mc.finalized:
        observed = set(mc.children)
        answer = hooks.hook("/finalize", mc.body(finalizing=True))
        assert {(c["kind"], c["metadata"]["name"]) for c in answer["children"]} <= observed
        if not mc.finalize():
            mc.pods_finish_draining()


def test_without_the_customize_hook_the_plane_waits_out_the_drain_bound(hooks) -> None:
    obj = parent(REPO / "examples" / "pd-disaggregated.yaml")
    composite = controller()
    del composite["spec"]["hooks"]["customize"]
    mc = Metacontroller(hooks, obj, composite=composite)
    mc.converge()
    mc.run_pods()
    # The hooks were down for long: the bound counts from when the wait for pods begins.
    mc.parent["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert deleted(mc.finalize()) == PD_SERVERS
    assert deleted(mc.finalize()) == PD_POOLS
    # Pods are not visible: the plane stays for the drain bound, a worker's grace period (120 s
    # here) and the garbage collector's 30 s.
    waiting = "the pods are not visible (no customize hook), so the plane waits 2m30s"
    for _ in range(2):
        assert mc.finalize() in ([("status", "InferaDeployment", "qwen-pd")], [])
        assert mc.parent["status"]["message"] == f"waiting for worker pods to finish draining: {waiting}"
        assert set(mc.children) == PLANE
    (drained,) = mc.parent["status"]["conditions"]
    assert (drained["status"], drained["reason"], drained["message"]) == ("False", "PodsNotVisible", waiting)
    began = datetime.strptime(drained["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert datetime.now(UTC) - began < timedelta(minutes=1)

    drained["lastTransitionTime"] = (began - timedelta(seconds=150)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert deleted(mc.finalize()) == PLANE
    (drained,) = mc.parent["status"]["conditions"]
    assert (drained["status"], drained["reason"], drained["message"]) == ("True", "DrainBoundPassed", "waited 2m30s")
    assert mc.finalize() == [("finalized", "InferaDeployment", "qwen-pd")]


def to_the_plane(mc: Metacontroller) -> None:
    """Ingress and workers deleted: the plane waits for the worker pods."""
    assert deleted(mc.finalize()) == INGRESS
    assert deleted(mc.finalize()) == WORKERS
    assert mc.finalize() == [("status", "InferaDeployment", "qwen-pd")]
    assert set(mc.children) == GATEWAY_PLANE


def worker_copy(mc: Metacontroller, name: str) -> dict[str, Any]:
    """A copy of a worker pod made to debug it (`kubectl debug --copy-to` keeps its labels, not its
    owner), or any pod a user labels as the graph's worker."""
    (original,) = [pod for pod_name, pod in mc.pods.items() if pod_name.startswith("qwen-pd-prefill-")]
    pod = copy.deepcopy(original)
    pod["metadata"]["name"] = name
    del pod["metadata"]["ownerReferences"]
    pod["metadata"].pop("deletionTimestamp", None)
    return pod


def test_a_copy_of_a_worker_pod_does_not_hold_the_plane(hooks) -> None:
    mc = full_graph(hooks)
    mc.pods["debug-qwen-pd-prefill"] = worker_copy(mc, "debug-qwen-pd-prefill")
    to_the_plane(mc)
    assert mc.parent["status"]["message"] == f"waiting for 3 worker pods to finish draining: {draining(mc)}"
    mc.pods_finish_draining()
    assert "debug-qwen-pd-prefill" in mc.pods
    assert deleted(mc.finalize()) == GATEWAY_PLANE
    assert mc.parent["status"]["message"] == "removing the NATS broker and the pods' accounts (12 objects)"


def test_an_unowned_worker_pod_being_deleted_holds_the_plane_until_it_has_gone(hooks) -> None:
    """Being deleted, a pod is draining, whoever owns it."""
    mc = full_graph(hooks)
    debug = worker_copy(mc, "debug-qwen-pd-prefill")
    to_the_plane(mc)
    mc.pods_finish_draining()
    mc.pods["debug-qwen-pd-prefill"] = debug
    debug["metadata"]["deletionTimestamp"] = (datetime.now(UTC) + timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert mc.finalize() == [("status", "InferaDeployment", "qwen-pd")]
    assert mc.parent["status"]["message"] == "waiting for 1 worker pods to finish draining: debug-qwen-pd-prefill"
    assert set(mc.children) == GATEWAY_PLANE
    mc.pods_finish_draining()
    assert deleted(mc.finalize()) == GATEWAY_PLANE


def test_the_message_names_a_few_pods_and_counts_the_rest(hooks) -> None:
    need_schemas()
    obj = graph().replicas(prefill=5).obj()
    mc = Metacontroller(hooks, obj)
    mc.converge()
    mc.run_pods()
    mc.finalize()
    mc.finalize()
    mc.finalize()
    pods = sorted(name for name in mc.pods if not name.startswith(("qwen-pd-server-", "qwen-pd-nats-")))
    assert len(pods) == 6
    assert mc.parent["status"]["message"] == (
        f"waiting for 6 worker pods to finish draining: {', '.join(pods[:3])} and 3 more"
    )


def test_the_wait_for_pods_is_bounded(hooks) -> None:
    """A pod that does not go holds the plane until the drain bound at most: twice a worker's grace
    period (120 s) and the garbage collector's 30 s each time, since a group's other pods are
    deleted only once their leader has gone. Counted from when the wait began, not from the
    deletion."""
    mc = full_graph(hooks)
    mc.parent["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # the hooks were down for long
    to_the_plane(mc)
    # A pod of a ReplicaSet the garbage collector does not delete (orphaned: `kubectl delete rs
    # --cascade=orphan`), and a copy being deleted with a grace period of a day.
    (kept,) = [copy.deepcopy(pod) for name, pod in mc.pods.items() if name.startswith("qwen-pd-prefill-")]
    del kept["metadata"]["deletionTimestamp"]
    kept["metadata"]["name"] = f"{kept['metadata']['name'][:-5]}4bx7q"  # one the ReplicaSet made since
    debug = worker_copy(mc, "debug-qwen-pd-prefill")
    debug["metadata"]["deletionTimestamp"] = (datetime.now(UTC) + timedelta(days=1)).strftime(TIME)
    mc.pods_finish_draining()
    mc.pods.update({kept["metadata"]["name"]: kept, "debug-qwen-pd-prefill": debug})
    assert mc.finalize() == [("status", "InferaDeployment", "qwen-pd")]
    left = f"debug-qwen-pd-prefill, {kept['metadata']['name']}"
    assert mc.parent["status"]["message"] == f"waiting for 2 worker pods to finish draining: {left}"

    assert teardown.drain_bound(mc.parent) == timedelta(minutes=5)
    (drained,) = mc.parent["status"]["conditions"]
    began = datetime.strptime(drained["lastTransitionTime"], TIME).replace(tzinfo=UTC)
    request = parse_request(mc.body(finalizing=True))
    waiting = teardown.finalize(request, lambda: began + timedelta(minutes=5) - timedelta(seconds=1))
    assert waiting["status"] == {
        key: value for key, value in mc.parent["status"].items() if key != "observedGeneration"
    }
    assert {(c["kind"], c["metadata"]["name"]) for c in waiting["children"]} == GATEWAY_PLANE
    let_go = teardown.finalize(request, lambda: began + timedelta(minutes=5))
    message = f"2 worker pods did not finish draining in time and are left behind: {left}"
    assert let_go["children"] == []
    assert let_go["status"] == {
        "state": "terminating",
        "message": f"removing the NATS broker and the pods' accounts (12 objects); {message}",
        "conditions": [
            {
                "type": "Drained",
                "status": "True",
                "reason": "DrainBoundPassed",
                "message": message,
                "observedGeneration": 1,
                "lastTransitionTime": (began + timedelta(minutes=5)).strftime(TIME),
            }
        ],
    }

    # Through the simulator: the wait began five minutes ago. Once let go, the plane is never
    # handed back, though the pods are still there.
    drained["lastTransitionTime"] = (began - timedelta(minutes=5)).strftime(TIME)
    assert deleted(mc.finalize()) == GATEWAY_PLANE
    assert mc.parent["status"]["conditions"][0]["reason"] == "DrainBoundPassed"
    assert mc.finalize() == [("finalized", "InferaDeployment", "qwen-pd")]
    assert {kept["metadata"]["name"], "debug-qwen-pd-prefill"} <= set(mc.pods)


def test_the_plane_once_let_go_is_never_handed_back(hooks) -> None:
    """A later call that still sees the plane (its deletion propagating) and a worker pod (a copy
    deleted meanwhile) lets it go again."""
    mc = full_graph(hooks)
    debug = worker_copy(mc, "debug-qwen-pd-prefill")
    to_the_plane(mc)
    mc.pods_finish_draining()
    request_children = parse_request(mc.body(finalizing=True)).children
    assert deleted(mc.finalize()) == GATEWAY_PLANE
    debug["metadata"]["deletionTimestamp"] = datetime.now(UTC).strftime(TIME)
    mc.pods["debug-qwen-pd-prefill"] = debug
    body = mc.body(finalizing=True)
    body["children"] = request_body(mc.parent, request_children, finalizing=True)["children"]
    answer = hooks.hook("/finalize", body)
    assert answer["children"] == []
    assert answer["status"]["message"] == "removing the NATS broker and the pods' accounts (12 objects)"


def test_a_pod_stuck_on_a_lost_node_does_not_hold_the_plane(hooks) -> None:
    mc = full_graph(hooks)
    to_the_plane(mc)
    assert mc.parent["status"]["message"] == f"waiting for 3 worker pods to finish draining: {draining(mc)}"
    stuck = mc.pods["qwen-pd-decode-0"]
    mc.pods = {"qwen-pd-decode-0": stuck}
    stuck["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # its grace period ended long ago
    assert deleted(mc.finalize()) == GATEWAY_PLANE
    assert mc.parent["status"]["message"] == (
        "removing the NATS broker and the pods' accounts (12 objects); "
        "1 worker pods did not finish draining in time and are left behind: qwen-pd-decode-0"
    )


def test_parent_with_no_children_finalizes_at_once(hooks) -> None:
    obj = parent(REPO / "examples" / "pd-disaggregated.yaml")
    answer = hooks.hook("/finalize", request_body(obj, [], finalizing=True))
    assert answer == {
        "status": {"state": "terminating", "message": "all children deleted"},
        "children": [],
        "finalized": True,
    }


UNREADABLE = {
    "an invalid spec": lambda spec: spec.update(backendFramework="tensorrt"),
    # Taken for a worker pool: the safe order for either kind.
    "a pool the spec no longer names": lambda spec: spec["services"].pop("prefill"),
    "a service that is not an object": lambda spec: spec["services"].update(prefill="prefill"),
}


@pytest.mark.parametrize("case", UNREADABLE)
def test_an_unreadable_spec_still_tears_down_in_order(hooks, case: str) -> None:
    mc = Metacontroller(hooks, REPO / "examples" / "pd-disaggregated.yaml")
    mc.converge()
    mc.edit(UNREADABLE[case])
    assert deleted(mc.finalize()) == PD_SERVERS
    assert deleted(mc.finalize()) == PD_POOLS
    assert deleted(mc.finalize()) == PLANE
    assert mc.finalize() == [("finalized", "InferaDeployment", "qwen-pd")]


def test_services_that_are_not_readable_go_after_the_ingress(hooks) -> None:
    """Without a readable componentType every workload is taken for a worker pool: each goes once
    the Services no longer send it traffic, and the plane waits for their pods."""
    mc = Metacontroller(hooks, REPO / "examples" / "pd-disaggregated.yaml")
    mc.converge()
    mc.run_pods()
    mc.edit(lambda spec: spec.update(services=[]))
    assert deleted(mc.finalize()) == {
        ("Service", "qwen-pd-server"),
        ("PodDisruptionBudget", "qwen-pd-prefill"),
        ("PodDisruptionBudget", "qwen-pd-decode"),
    }
    assert deleted(mc.finalize()) == {
        ("Deployment", "qwen-pd-server"),
        ("Deployment", "qwen-pd-prefill"),
        ("Deployment", "qwen-pd-decode"),
    }
    assert mc.finalize() == [("status", "InferaDeployment", "qwen-pd")]
    assert mc.parent["status"]["message"].startswith("waiting for 3 worker pods to finish draining: qwen-pd-decode-")
    mc.pods_finish_draining()
    assert deleted(mc.finalize()) == PLANE


def test_pools_go_by_their_component_type_not_their_template_labels(hooks) -> None:
    """A worker pool whose template an older build let a patch relabel `server` still goes after
    the ingress, and the plane waits for its pods, labelled `server` as they are."""
    mc = full_graph(hooks)
    prefill = mc.children[("Deployment", "qwen-pd-prefill")]
    prefill["spec"]["template"]["metadata"]["labels"]["infera.amd.com/component"] = "server"
    applied = json.loads(prefill["metadata"]["annotations"][LAST_APPLIED_ANNOTATION])
    applied["spec"]["template"]["metadata"]["labels"]["infera.amd.com/component"] = "server"
    record(prefill, applied)
    for name, pod in mc.pods.items():
        if name.startswith("qwen-pd-prefill-"):
            pod["metadata"]["labels"]["infera.amd.com/component"] = "server"
    assert deleted(mc.finalize()) == INGRESS
    assert deleted(mc.finalize()) == WORKERS
    assert mc.finalize() == [("status", "InferaDeployment", "qwen-pd")]
    assert mc.parent["status"]["message"] == f"waiting for 3 worker pods to finish draining: {draining(mc)}"
    mc.pods_finish_draining()
    assert deleted(mc.finalize()) == GATEWAY_PLANE


def test_customize_asks_for_the_graphs_pods(hooks) -> None:
    mc = Metacontroller(hooks, REPO / "examples" / "pd-disaggregated.yaml")
    assert mc.customize() == {
        "relatedResources": [
            {
                "apiVersion": "v1",
                "resource": "pods",
                "namespace": "ml",
                "labelSelector": {"matchLabels": {"infera.amd.com/deployment": "qwen-pd"}},
            }
        ]
    }


def test_nats_claim_follows_the_graph_unless_retained(hooks) -> None:
    def policy(obj: dict[str, Any]) -> dict[str, str]:
        (statefulset,) = [c for c in hooks.sync(obj)["children"] if c["kind"] == "StatefulSet"]
        return statefulset["spec"]["persistentVolumeClaimRetentionPolicy"]

    assert policy(graph().obj()) == {"whenDeleted": "Delete", "whenScaled": "Retain"}
    assert policy(graph().retain_nats_storage().obj()) == {"whenDeleted": "Retain", "whenScaled": "Retain"}
