"""The finalize and customize hooks: ordered, drain-aware teardown through the simulator."""

from typing import Any

from tests.conftest import REPO, controller, need_schemas, parent, request_body
from tests.simulator import Metacontroller

GAIE = {"enabled": True, "tokenizerPath": "Qwen/Qwen3-0.6B", "gatewayName": "inference-gateway"}
INGRESS = {
    ("Deployment", "qwen-pd-server"), ("Service", "qwen-pd-server"),
    ("Deployment", "qwen-pd-epp"), ("Service", "qwen-pd-epp"),
    ("InferencePool", "qwen-pd-pool"), ("HTTPRoute", "qwen-pd-route"),
}
WORKERS = {("Deployment", "qwen-pd-prefill"), ("LeaderWorkerSet", "qwen-pd-decode")}
PLANE = {
    ("StatefulSet", "qwen-pd-nats"), ("Service", "qwen-pd-nats"),
    ("ServiceAccount", "qwen-pd-disc"), ("Role", "qwen-pd-disc"), ("RoleBinding", "qwen-pd-disc"),
}


def full_graph(hooks) -> Metacontroller:
    """A converged graph with GAIE, NATS and a multi-node pool, its pods running."""
    need_schemas()
    obj = parent(REPO / "examples" / "pd-disaggregated.yaml")
    obj["spec"]["gaie"] = GAIE
    obj["spec"]["services"]["decode"]["numberOfNodes"] = 2
    mc = Metacontroller(hooks, obj)
    mc.converge()
    mc.mark_ready()
    mc.gateway_accepts()
    mc.converge()
    assert set(mc.children) == INGRESS | WORKERS | PLANE
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
    assert mc.parent["status"]["message"] == "stopping traffic: removing 6 ingress objects"
    assert mc.last_answer["resyncAfterSeconds"] == 5
    assert set(mc.children) == WORKERS | PLANE

    # 2. Drain the workers; their pods are still running the preStop drain.
    assert deleted(mc.finalize()) == WORKERS
    assert mc.parent["status"]["message"] == "draining 2 worker pools"
    assert set(mc.children) == PLANE

    # 3. NATS and the discovery identity outlive every draining worker pod.
    assert mc.finalize() == [("status", "InferaDeployment", "qwen-pd")]
    assert mc.parent["status"]["message"] == "waiting for 3 worker pods to finish draining"
    assert mc.finalize() == [] and mc.finalize() == []  # still draining: nothing changes
    assert set(mc.children) == PLANE and not mc.finalized
    mc.pods_finish_draining()
    assert worker_pod_count(mc) == 0
    assert deleted(mc.finalize()) == PLANE
    assert mc.parent["status"]["message"] == "removing the NATS broker and discovery identity (5 objects)"

    # 4. Finalized only once nothing is observed.
    assert mc.children == {} and not mc.finalized
    assert mc.finalize() == [("finalized", "InferaDeployment", "qwen-pd")]
    assert mc.finalize_calls == 7  # ingress, workers, three while pods drain, plane, finalized


def test_every_stage_is_idempotent(hooks) -> None:
    """A repeated call at any stage gives the same answer and changes nothing."""
    mc = full_graph(hooks)
    stages = 0
    while not mc.finalized:
        body = mc.body(finalizing=True)
        first = hooks.hook("/finalize", body)
        assert hooks.hook("/finalize", body) == first
        writes = mc.finalize()
        if not writes:
            mc.pods_finish_draining()
        stages += 1
        assert stages < 10
    assert stages == 6  # ingress, workers, wait, (pods exit) plane, finalized; one quiet wait


def test_children_are_never_handed_back(hooks) -> None:
    mc = full_graph(hooks)
    mc.finalize()
    # A late call with the pre-deletion world still answers only with observed children; the
    # simulator asserts that nothing already released is listed.
    body = mc.body(finalizing=True)
    answer = hooks.hook("/finalize", body)
    observed = {(c["kind"], c["metadata"]["name"]) for c in mc.children.values()}
    assert {(c["kind"], c["metadata"]["name"]) for c in answer["children"]} <= observed


def test_without_the_customize_hook_plane_goes_after_the_workers(hooks) -> None:
    obj = parent(REPO / "examples" / "pd-disaggregated.yaml")
    composite = controller()
    del composite["spec"]["hooks"]["customize"]
    mc = Metacontroller(hooks, obj, composite=composite)
    mc.converge()
    mc.run_pods()
    assert deleted(mc.finalize()) == {("Deployment", "qwen-pd-server"), ("Service", "qwen-pd-server")}
    assert deleted(mc.finalize()) == {("Deployment", "qwen-pd-prefill"), ("Deployment", "qwen-pd-decode")}
    assert deleted(mc.finalize()) == PLANE  # no pod visibility: nothing to wait on
    assert mc.finalize() == [("finalized", "InferaDeployment", "qwen-pd")]


def test_parent_with_no_children_finalizes_at_once(hooks) -> None:
    obj = parent(REPO / "examples" / "pd-disaggregated.yaml")
    answer = hooks.hook("/finalize", request_body(obj, [], finalizing=True))
    assert answer == {"status": {"state": "terminating", "message": "all children deleted"}, "children": [], "finalized": True}


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
