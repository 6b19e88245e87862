"""spec.patches: JSON patches on rendered children, and loud failure when one does not apply."""

from typing import Any

import pytest

from tests.support.graphs import GraphBuilder, graph
from tests.support.prerequisites import need_schemas
from tests.support.requests import PD, controller, request_body
from tests.support.simulator import Metacontroller


def with_patches(*patches: dict[str, Any]) -> GraphBuilder:
    return graph().patches(*patches)


def child(answer: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    (found,) = [c for c in answer["children"] if c["kind"] == kind and c["metadata"]["name"] == name]
    return found


def test_patch_adds_fields_the_api_does_not_model(hooks) -> None:
    answer = hooks.sync(
        with_patches(
            {
                "target": {"kind": "Deployment", "name": "qwen-pd-decode"},
                "patch": [
                    {
                        "op": "add",
                        "path": "/spec/template/spec/nodeSelector",
                        "value": {"gpu.amd.com/family": "mi300x"},
                    },
                    {
                        "op": "replace",
                        "path": "/spec/template/spec/containers/0/image",
                        "value": "example.com/engine:v9",
                    },
                ],
            },
            {
                "target": {"kind": "Service", "name": "qwen-pd-server"},
                "patch": [{"op": "add", "path": "/metadata/annotations", "value": {"example.com/lb": "internal"}}],
            },
        ).obj()
    )
    decode = child(answer, "Deployment", "qwen-pd-decode")["spec"]["template"]["spec"]
    assert decode["nodeSelector"] == {"gpu.amd.com/family": "mi300x"}
    assert decode["containers"][0]["image"] == "example.com/engine:v9"
    assert child(answer, "Service", "qwen-pd-server")["metadata"]["annotations"] == {"example.com/lb": "internal"}
    assert "nodeSelector" not in child(answer, "Deployment", "qwen-pd-prefill")["spec"]["template"]["spec"]


def test_patches_give_lws_ranks_their_own_commands(hooks) -> None:
    """The documented vLLM path: a Ray head on the leader, Ray workers on the other ranks."""
    need_schemas()
    obj = (
        with_patches(
            {
                "target": {"kind": "LeaderWorkerSet", "name": "qwen-pd-decode"},
                "patch": [
                    {
                        "op": "replace",
                        "path": "/spec/leaderWorkerTemplate/workerTemplate/spec/containers/0/command",
                        "value": ["sh", "-c", "ray start --address=$(LWS_LEADER_ADDRESS):6379 --block"],
                    },
                    {"op": "remove", "path": "/spec/leaderWorkerTemplate/workerTemplate/spec/containers/0/args"},
                ],
            },
        )
        .vllm()
        .nodes(decode=2)
        .obj()
    )
    answer = hooks.hook("/sync", request_body(obj, composite=controller("lws")))
    template = child(answer, "LeaderWorkerSet", "qwen-pd-decode")["spec"]["leaderWorkerTemplate"]
    assert template["workerTemplate"]["spec"]["containers"][0]["command"][-1].startswith("ray start --address")
    assert "args" not in template["workerTemplate"]["spec"]["containers"][0]
    assert template["leaderTemplate"]["spec"]["containers"][0]["command"][2] == "infera.engine.vllm"


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (
            {"target": {"kind": "Deployment", "name": "qwen-pd-nope"}, "patch": [{"op": "remove", "path": "/spec"}]},
            "patches[0] (Deployment qwen-pd-nope): no such child is rendered; the children are: ServiceAccount qwen-pd-disc",
        ),
        (
            {
                "target": {"kind": "Deployment", "name": "qwen-pd-decode"},
                "patch": [{"op": "remove", "path": "/spec/template/spec/nodeSelector"}],
            },
            "patches[0] (Deployment qwen-pd-decode): operation 0 (remove /spec/template/spec/nodeSelector): "
            "can't remove a non-existent object 'nodeSelector'",
        ),
        (
            {
                "target": {"kind": "Deployment", "name": "qwen-pd-decode"},
                "patch": [
                    {"op": "add", "path": "/spec/replicas", "value": 2},
                    {"op": "add", "path": "/spec/x/y", "value": 1},
                ],
            },
            "patches[0] (Deployment qwen-pd-decode): operation 1 (add /spec/x/y): path not found",
        ),
        (
            {
                "target": {"kind": "Deployment", "name": "qwen-pd-decode"},
                "patch": [{"op": "test", "path": "/spec/replicas", "value": 7}],
            },
            "patches[0] (Deployment qwen-pd-decode): operation 0 (test /spec/replicas): ",
        ),
        (
            {
                "target": {"kind": "Deployment", "name": "qwen-pd-decode"},
                "patch": [{"op": "replace", "path": "/metadata/name", "value": "other"}],
            },
            "patches[0] (Deployment qwen-pd-decode): a patch must not change apiVersion, kind, metadata.name or the identity labels",
        ),
        (
            {
                "target": {"kind": "Deployment", "name": "qwen-pd-decode"},
                "patch": [{"op": "remove", "path": "/metadata/labels/infera.amd.com~1service"}],
            },
            "patches[0] (Deployment qwen-pd-decode): a patch must not change apiVersion, kind, metadata.name or the identity labels",
        ),
    ],
    ids=["missing-target", "missing-member", "missing-path", "failed-test", "renames", "drops-identity-label"],
)
def test_patch_that_does_not_apply_fails_and_keeps_children(hooks, patch: dict, message: str) -> None:
    mc = Metacontroller(hooks, PD)
    mc.converge()
    before = {key: c["metadata"]["resourceVersion"] for key, c in mc.children.items()}
    mc.edit(lambda spec: spec.update(patches=[patch]))
    assert mc.child_writes(mc.sync()) == []
    status = mc.parent["status"]
    assert status["state"] == "failed"
    assert status["message"].startswith(message), status["message"]
    assert {key: c["metadata"]["resourceVersion"] for key, c in mc.children.items()} == before


def test_removing_a_patch_reverts_the_child(hooks) -> None:
    mc = Metacontroller(
        hooks,
        with_patches(
            {
                "target": {"kind": "Deployment", "name": "qwen-pd-decode"},
                "patch": [{"op": "add", "path": "/spec/template/spec/nodeSelector", "value": {"pool": "a"}}],
            },
        ).obj(),
    )
    mc.converge()
    mc.edit(lambda spec: spec.pop("patches"))
    assert mc.child_writes(mc.sync()) == [("update", "Deployment", "qwen-pd-decode")]
    assert "nodeSelector" not in mc.children[("Deployment", "qwen-pd-decode")]["spec"]["template"]["spec"]
    mc.converge()
    assert mc.sync() == []


def test_patch_that_removes_a_groups_worker_template_fails_and_keeps_children(hooks) -> None:
    """The LeaderWorkerSet CRD requires a worker template: without it every apply would fail
    where only events show it, and teardown would find no pods to drain."""
    need_schemas()
    obj = graph().nodes(decode=2).obj()
    mc = Metacontroller(hooks, obj)
    mc.converge()
    before = {key: c["metadata"]["resourceVersion"] for key, c in mc.children.items()}
    removal = {"op": "remove", "path": "/spec/leaderWorkerTemplate/workerTemplate"}
    mc.edit(
        lambda spec: spec.update(
            patches=[{"target": {"kind": "LeaderWorkerSet", "name": "qwen-pd-decode"}, "patch": [removal]}]
        )
    )
    assert mc.child_writes(mc.sync()) == []
    status = mc.parent["status"]
    assert status["state"] == "failed"
    assert status["message"] == (
        "patches[0] (LeaderWorkerSet qwen-pd-decode): the API server would refuse the patched LeaderWorkerSet: "
        "spec.leaderWorkerTemplate.workerTemplate: is required: the LeaderWorkerSet CRD refuses a group without it"
    )
    assert {key: c["metadata"]["resourceVersion"] for key, c in mc.children.items()} == before


POD_IDENTITY_OWNER = (
    "the hook (the routers, the InferencePool, the network policies and the teardown select pods by it)"
)


def label(key: str) -> str:
    return f"infera.amd.com~1{key}"


# What tells the graph's pods apart: a worker relabelled `server` would be deleted with the
# ingress, and the broker and the accounts with it while it still drains; the other labels move a
# pod into or out of a router's, the InferencePool's, a network policy's or a budget's selection.
RELABELLINGS = {
    "a worker as a server": (
        "Deployment",
        "qwen-pd-prefill",
        {"op": "replace", "path": f"/spec/template/metadata/labels/{label('component')}", "value": "server"},
        "spec.template.metadata.labels.infera.amd.com/component",
    ),
    "a group's ranks as a server": (
        "LeaderWorkerSet",
        "qwen-pd-decode",
        {
            "op": "replace",
            "path": f"/spec/leaderWorkerTemplate/workerTemplate/metadata/labels/{label('component')}",
            "value": "server",
        },
        "spec.leaderWorkerTemplate.workerTemplate.metadata.labels.infera.amd.com/component",
    ),
    "a group's leader into another service": (
        "LeaderWorkerSet",
        "qwen-pd-decode",
        {
            "op": "replace",
            "path": f"/spec/leaderWorkerTemplate/leaderTemplate/metadata/labels/{label('service')}",
            "value": "prefill",
        },
        "spec.leaderWorkerTemplate.leaderTemplate.metadata.labels.infera.amd.com/service",
    ),
    "a server into another graph": (
        "Deployment",
        "qwen-pd-server",
        {"op": "replace", "path": f"/spec/template/metadata/labels/{label('deployment')}", "value": "other"},
        "spec.template.metadata.labels.infera.amd.com/deployment",
    ),
    "a generation outside BlueGreen": (
        "Deployment",
        "qwen-pd-prefill",
        {"op": "add", "path": f"/spec/template/metadata/labels/{label('generation')}", "value": "abc"},
        "spec.template.metadata.labels.infera.amd.com/generation",
    ),
    "a pod into the InferencePool": (
        "Deployment",
        "qwen-pd-prefill",
        {"op": "add", "path": f"/spec/template/metadata/labels/{label('gaie-frontend')}", "value": "true"},
        "spec.template.metadata.labels.infera.amd.com/gaie-frontend",
    ),
    "every label replaced": (
        "Deployment",
        "qwen-pd-prefill",
        {"op": "replace", "path": "/spec/template/metadata/labels", "value": {"example.com/team": "a"}},
        "spec.template.metadata.labels.infera.amd.com/deployment",
    ),
    "the broker as a worker": (
        "StatefulSet",
        "qwen-pd-nats",
        {"op": "replace", "path": f"/spec/template/metadata/labels/{label('component')}", "value": "worker"},
        "spec.template.metadata.labels.infera.amd.com/component",
    ),
}


@pytest.mark.parametrize("case", RELABELLINGS)
def test_a_patch_does_not_relabel_a_pod_template(hooks, case: str) -> None:
    need_schemas()
    kind, name, operation, field = RELABELLINGS[case]
    obj = with_patches({"target": {"kind": kind, "name": name}, "patch": [operation]}).nodes(decode=2).obj()
    mc = Metacontroller(hooks, obj)
    mc.converge()
    assert mc.children == {}
    assert mc.parent["status"]["state"] == "failed"
    assert mc.parent["status"]["message"] == (
        f"patches[0] ({kind} {name}): {field} is set by {POD_IDENTITY_OWNER}, not by a patch"
    )


def test_a_patch_adds_labels_of_its_own_to_a_pod_template(hooks) -> None:
    need_schemas()
    team = {"op": "add", "path": "/spec/template/metadata/labels/example.com~1team", "value": "a"}
    also = {
        "op": "add",
        "path": "/spec/leaderWorkerTemplate/workerTemplate/metadata/labels/example.com~1team",
        "value": "a",
    }
    obj = (
        with_patches(
            {"target": {"kind": "Deployment", "name": "qwen-pd-prefill"}, "patch": [team]},
            {"target": {"kind": "LeaderWorkerSet", "name": "qwen-pd-decode"}, "patch": [also]},
        )
        .nodes(decode=2)
        .obj()
    )
    answer = hooks.sync(obj)
    prefill = child(answer, "Deployment", "qwen-pd-prefill")["spec"]["template"]["metadata"]["labels"]
    ranks = child(answer, "LeaderWorkerSet", "qwen-pd-decode")["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert prefill["example.com/team"] == ranks["metadata"]["labels"]["example.com/team"] == "a"
    assert prefill["infera.amd.com/component"] == "worker"
