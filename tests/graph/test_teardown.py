"""The finalize and customize hooks: ordered, drain-aware teardown through the simulator."""

from typing import Any

from hooks import teardown
from hooks.contract import parse_request
from tests.support.prerequisites import REPO, need_schemas
from tests.support.requests import controller, parent, request_body
from tests.support.simulator import Metacontroller

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
# With the gateway, the Endpoint Picker's identity is part of the plane too.
GATEWAY_PLANE = PLANE | {(kind, "qwen-pd-epp") for kind in ("ServiceAccount", "Role", "RoleBinding")}


def full_graph(hooks) -> Metacontroller:
    """A converged graph with GAIE, NATS and an autoscaled multi-node pool, its pods running."""
    need_schemas()
    obj = parent(REPO / "examples" / "pd-disaggregated.yaml")
    obj["spec"]["gaie"] = GAIE
    obj["spec"]["services"]["decode"]["numberOfNodes"] = 2
    obj["spec"]["services"]["decode"]["autoscaling"] = {"maxReplicas": 2, "metrics": [QUEUE_DEPTH]}
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

    # 3. NATS and the discovery identity outlive every draining worker pod.
    assert mc.finalize() == [("status", "InferaDeployment", "qwen-pd")]
    assert mc.parent["status"]["message"] == "waiting for 3 worker pods to finish draining"
    assert mc.finalize() == [] and mc.finalize() == []  # still draining: nothing changes
    assert set(mc.children) == GATEWAY_PLANE and not mc.finalized
    mc.pods_finish_draining()
    assert worker_pod_count(mc) == 0
    assert deleted(mc.finalize()) == GATEWAY_PLANE
    assert mc.parent["status"]["message"] == "removing the NATS broker and the pods' accounts (12 objects)"

    # 4. Finalized only once nothing is observed.
    assert mc.children == {} and not mc.finalized
    assert mc.finalize() == [("finalized", "InferaDeployment", "qwen-pd")]
    assert mc.finalize_calls == 7  # ingress, workers, three while pods drain, plane, finalized


def test_every_stage_is_idempotent(hooks) -> None:
    """A repeated call at any stage gives the same answer and changes nothing."""
    mc = full_graph(hooks)
    stages = 0
    while not mc.finalized:
        request = parse_request(mc.body(finalizing=True))
        # The function itself, twice, and through the app.
        assert (
            teardown.finalize(request)
            == teardown.finalize(request)
            == hooks.hook("/finalize", mc.body(finalizing=True))
        )
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


def test_without_the_customize_hook_the_plane_waits_out_the_grace_period(hooks) -> None:
    obj = parent(REPO / "examples" / "pd-disaggregated.yaml")
    composite = controller()
    del composite["spec"]["hooks"]["customize"]
    mc = Metacontroller(hooks, obj, composite=composite)
    mc.converge()
    mc.run_pods()
    assert deleted(mc.finalize()) == {
        ("Deployment", "qwen-pd-server"),
        ("Service", "qwen-pd-server"),
        ("PodDisruptionBudget", "qwen-pd-prefill"),
        ("PodDisruptionBudget", "qwen-pd-decode"),
    }
    assert deleted(mc.finalize()) == {("Deployment", "qwen-pd-prefill"), ("Deployment", "qwen-pd-decode")}
    # Pods are not visible: the plane stays for the longest worker grace period (60 s here).
    assert mc.finalize() == [("status", "InferaDeployment", "qwen-pd")]
    assert mc.parent["status"]["message"] == "waiting for worker pods to finish draining (their grace period)"
    assert set(mc.children) == PLANE
    mc.parent["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # long ago
    assert deleted(mc.finalize()) == PLANE
    assert mc.finalize() == [("finalized", "InferaDeployment", "qwen-pd")]


def test_a_pod_stuck_on_a_lost_node_does_not_hold_the_plane(hooks) -> None:
    mc = full_graph(hooks)
    mc.finalize()
    mc.finalize()
    assert mc.parent["status"]["message"].startswith("draining")
    mc.finalize()
    assert mc.parent["status"]["message"] == "waiting for 3 worker pods to finish draining"
    stuck = next(
        pod for pod in mc.pods.values() if pod["metadata"]["labels"].get("infera.amd.com/component") == "worker"
    )
    mc.pods = {name: pod for name, pod in mc.pods.items() if pod is stuck}
    stuck["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # its grace period ended long ago
    assert deleted(mc.finalize()) == GATEWAY_PLANE


def test_parent_with_no_children_finalizes_at_once(hooks) -> None:
    obj = parent(REPO / "examples" / "pd-disaggregated.yaml")
    answer = hooks.hook("/finalize", request_body(obj, [], finalizing=True))
    assert answer == {
        "status": {"state": "terminating", "message": "all children deleted"},
        "children": [],
        "finalized": True,
    }


def test_invalid_spec_still_tears_down(hooks) -> None:
    mc = Metacontroller(hooks, REPO / "examples" / "pd-disaggregated.yaml")
    mc.converge()
    mc.edit(lambda spec: spec.update(backendFramework="tensorrt"))
    calls = 0
    while not mc.finalized:
        mc.finalize()
        calls += 1
    assert calls == 4 and mc.children == {}


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

    obj = parent(REPO / "examples" / "pd-disaggregated.yaml")
    assert policy(obj) == {"whenDeleted": "Delete", "whenScaled": "Retain"}
    obj["spec"]["nats"]["retainStorage"] = True
    assert policy(obj) == {"whenDeleted": "Retain", "whenScaled": "Retain"}
