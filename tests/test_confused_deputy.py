"""Metacontroller applies whatever the hook answers with its own broad permissions, so the hook
decides what anyone who may create an InferaDeployment gets: a patch must not move a child out
of the parent's namespace or from Metacontroller's hold, widen what the graph's Roles grant,
expose its Services, or get around a rule the spec's own fields are held to. Every reproduction
here fails as a spec error: status `failed`, nothing written, every child kept."""

from collections.abc import Callable
from typing import Any

import pytest

from tests.support.requests import PD, parent
from tests.support.service import HookClient
from tests.support.simulator import LAST_APPLIED, Metacontroller

Change = Callable[[dict[str, Any]], None]
NAMESPACE = "ml"
UID = parent(PD)["metadata"]["uid"]
RBAC = "rbac.authorization.k8s.io"


@pytest.fixture(scope="module")
def converged(hooks: HookClient) -> Metacontroller:
    mc = Metacontroller(hooks, parent(PD, namespace=NAMESPACE))
    mc.converge()
    return mc


def patch(kind: str, name: str, *operations: dict[str, Any]) -> Change:
    return lambda spec: spec.setdefault("patches", []).append(
        {"target": {"kind": kind, "name": name}, "patch": list(operations)}
    )


def named(mc: Metacontroller, kind: str) -> list[str]:
    """The children of a kind, by name: which accounts and Roles there are is the renderers' business."""
    names = sorted(name for child_kind, name in mc.children if child_kind == kind)
    assert names, f"no {kind} rendered"
    return names


# Where a child lives and who holds it: Metacontroller's and the API server's, never a patch's.
HELD = {
    "namespace": (
        {"op": "add", "path": "/metadata/namespace", "value": "kube-system"},
        "metadata.namespace is set by Metacontroller (every child is in the InferaDeployment's namespace)",
    ),
    "controlling owner": (
        {
            "op": "add",
            "path": "/metadata/ownerReferences",
            "value": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "mine", "uid": "u-1", "controller": True}],
        },
        "metadata.ownerReferences is set by Metacontroller (the InferaDeployment owns every child)",
    ),
    "finalizer": (
        {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/hold"]},
        "metadata.finalizers is set by the controllers that act on them (one that no controller removes would hold "
        "the child, and the InferaDeployment's deletion, forever)",
    ),
    "resourceVersion": (
        {"op": "add", "path": "/metadata/resourceVersion", "value": "1"},
        "metadata.resourceVersion is set by the API server",
    ),
    "controller-uid label": (
        {"op": "add", "path": "/metadata/labels/controller-uid", "value": "another-parent"},
        "metadata.labels.controller-uid is set by Metacontroller (its generated selector)",
    ),
    "its own controller-uid": (
        {"op": "add", "path": "/metadata/labels/controller-uid", "value": UID},
        "metadata.labels.controller-uid is set by Metacontroller (its generated selector)",
    ),
    "last-applied record": (
        {"op": "add", "path": "/metadata/annotations", "value": {LAST_APPLIED: "{}"}},
        "metadata.annotations.metacontroller.k8s.io/last-applied-configuration is set by Metacontroller (its "
        "record of what it applied)",
    ),
}


@pytest.mark.parametrize("kind", ["RoleBinding", "Deployment", "Service"])
@pytest.mark.parametrize("case", HELD)
def test_a_child_stays_in_the_namespace_and_in_metacontrollers_hold(
    converged: Metacontroller, kind: str, case: str
) -> None:
    operation, owner = HELD[case]
    for name in named(converged, kind):
        assert converged.refusal(patch(kind, name, operation)) == f"patches[0] ({kind} {name}): {owner}, not by a patch"


OWNER = "the hook (the graph's processes get the permissions they need, and no more)"
EVERYTHING = {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}
GRANTS = {
    "a rule granting everything": ("Role", {"op": "add", "path": "/rules/-", "value": EVERYTHING}, "rules"),
    "rules replaced": ("Role", {"op": "replace", "path": "/rules", "value": [EVERYTHING]}, "rules"),
    "cluster-admin": (
        "RoleBinding",
        {
            "op": "replace",
            "path": "/roleRef",
            "value": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "cluster-admin"},
        },
        "roleRef",
    ),
    "every authenticated user": (
        "RoleBinding",
        {
            "op": "add",
            "path": "/subjects/-",
            "value": {"kind": "Group", "name": "system:authenticated", "apiGroup": RBAC},
        },
        "subjects",
    ),
    "another account": (
        "RoleBinding",
        {"op": "replace", "path": "/subjects/0/name", "value": "default"},
        "subjects",
    ),
}


@pytest.mark.parametrize("case", GRANTS)
def test_what_the_graphs_roles_grant_is_the_hooks_alone(converged: Metacontroller, case: str) -> None:
    kind, operation, field = GRANTS[case]
    for name in named(converged, kind):
        message = converged.refusal(patch(kind, name, operation))
        assert message == f"patches[0] ({kind} {name}): {field} is set by {OWNER}, not by a patch"


def test_a_budget_covers_exactly_its_pool(converged: Metacontroller) -> None:
    everything = {"op": "replace", "path": "/spec/selector", "value": {}}
    assert converged.refusal(patch("PodDisruptionBudget", "qwen-pd-decode", everything)) == (
        "patches[0] (PodDisruptionBudget qwen-pd-decode): spec.selector is set by the hook (exactly the pool's pods: "
        "a pod under two budgets can never be evicted), not by a patch"
    )


def test_a_deeply_nested_patch_value_is_named(converged: Metacontroller) -> None:
    nested: Any = "x"
    for _ in range(900):
        nested = {"a": nested}
    operation = {"op": "add", "path": "/spec/template/metadata/annotations", "value": nested}
    assert converged.refusal(patch("Deployment", "qwen-pd-decode", operation)) == (
        "patches[0] (Deployment qwen-pd-decode): operation 0 (add /spec/template/metadata/annotations): would nest "
        "the child more than 64 levels deep (Kubernetes objects nest about 15)"
    )


def test_what_is_legitimately_patchable_still_is(hooks: HookClient) -> None:
    """Labels and annotations of every child (the RBAC objects' too), a worker's nodeSelector, a
    budget that lets pods go, an explicit ClusterIP, a longer load timeout: applied, and converged."""
    mc = Metacontroller(hooks, parent(PD, namespace=NAMESPACE))
    mc.converge()
    metadata = [
        {"op": "add", "path": "/metadata/labels/example.com~1team", "value": "search"},
        {"op": "add", "path": "/metadata/annotations", "value": {"example.com/owner": "ml-platform"}},
    ]
    patches = [
        {"target": {"kind": kind, "name": name}, "patch": metadata}
        for kind in ("ServiceAccount", "Role", "RoleBinding")
        for name in named(mc, kind)
    ]
    patches += [
        {
            "target": {"kind": "Deployment", "name": "qwen-pd-decode"},
            "patch": [
                {"op": "add", "path": "/spec/template/spec/nodeSelector", "value": {"gpu.amd.com/family": "mi300x"}}
            ],
        },
        {
            "target": {"kind": "PodDisruptionBudget", "name": "qwen-pd-prefill"},
            "patch": [{"op": "replace", "path": "/spec/maxUnavailable", "value": "50%"}],
        },
        {
            "target": {"kind": "Service", "name": "qwen-pd-server"},
            "patch": [{"op": "replace", "path": "/spec/type", "value": "ClusterIP"}, *metadata],
        },
        {
            "target": {"kind": "Deployment", "name": "qwen-pd-prefill"},
            "patch": [
                {
                    "op": "test",
                    "path": "/spec/template/spec/containers/0/env/0/name",
                    "value": "INFERA_ENGINE_READY_TIMEOUT",
                },
                {"op": "replace", "path": "/spec/template/spec/containers/0/env/0/value", "value": "14400"},
            ],
        },
    ]
    mc.edit(lambda spec: spec.update(patches=patches))
    mc.converge()
    assert mc.parent["status"]["state"] != "failed", mc.parent["status"]["message"]
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        for name in named(mc, kind):
            child = mc.children[(kind, name)]
            assert child["metadata"]["labels"]["example.com/team"] == "search"
            assert child["metadata"]["annotations"]["example.com/owner"] == "ml-platform"
            assert child["metadata"]["namespace"] == NAMESPACE
    decode = mc.children[("Deployment", "qwen-pd-decode")]["spec"]["template"]["spec"]
    assert decode["nodeSelector"] == {"gpu.amd.com/family": "mi300x"}
    assert mc.children[("PodDisruptionBudget", "qwen-pd-prefill")]["spec"]["maxUnavailable"] == "50%"
