"""Metacontroller applies whatever the hook answers with its own broad permissions, so the hook
decides what anyone who may create an InferaDeployment gets: a patch must not move a child out
of the parent's namespace or from Metacontroller's hold, widen what the graph's Roles grant,
expose its Services, or get around a rule the spec's own fields are held to. Every reproduction
here fails as a spec error: status `failed`, nothing written, every child kept."""

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from hooks.contract import LAST_APPLIED_ANNOTATION
from tests.support.graphs import graph
from tests.support.requests import EXAMPLES, PD, load_yaml, parent, upstream_corpus
from tests.support.service import HookClient
from tests.support.simulator import Metacontroller

Change = Callable[[dict[str, Any]], None]
NAMESPACE = "ml"
UID = parent(PD)["metadata"]["uid"]
# The API server's bound on all of an object's annotations together (keys and values).
MAX_ANNOTATIONS = 262_144
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
        {"op": "add", "path": "/metadata/annotations", "value": {LAST_APPLIED_ANNOTATION: "{}"}},
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
    operation = {"op": "add", "path": "/spec/template/metadata/annotations", "value": nested(900)}
    assert converged.refusal(patch("Deployment", "qwen-pd-decode", operation)) == (
        "patches[0] (Deployment qwen-pd-decode): operation 0 (add /spec/template/metadata/annotations): would nest "
        "the child more than 64 levels deep (Kubernetes objects nest about 15)"
    )


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


AUTOSCALING = {"minReplicas": 1, "maxReplicas": 3, "metrics": [{"type": "Pods", "pods": {}}]}
OPEN_OBJECTS = {
    "spec.services.decode.extraPodSpec": lambda svc: svc.update(extraPodSpec={"nodeSelector": nested(900)}),
    "spec.services.decode.autoscaling.metrics.0": lambda svc: svc.update(
        autoscaling={**AUTOSCALING, "metrics": [{"type": "Pods", "pods": nested(900)}]}
    ),
    "spec.services.decode.autoscaling.behavior": lambda svc: svc.update(
        autoscaling={**AUTOSCALING, "behavior": {"scaleUp": nested(900)}}
    ),
}


@pytest.mark.parametrize("field", OPEN_OBJECTS)
def test_a_deeply_nested_open_object_is_named(converged: Metacontroller, field: str) -> None:
    def change(spec: dict[str, Any]) -> None:
        decode = spec["services"]["decode"]
        decode.pop("replicas", None)
        OPEN_OBJECTS[field](decode)

    assert converged.refusal(change) == (
        f"invalid spec: {field}: nests 901 levels deep, past 32 (Kubernetes objects nest about 15)"
    )


EVICTABLE = (
    "no pod could ever be evicted and every node drain would wait forever; "
    "spec.services.decode.disruptionBudget sets how many pods may go at once"
)
BUDGET = "patches[0] (PodDisruptionBudget qwen-pd-decode): "
BUDGETS = {
    "maxUnavailable 0": (
        [{"op": "replace", "path": "/spec/maxUnavailable", "value": 0}],
        BUDGET
        + "spec.maxUnavailable: 0 is not a positive integer or a percentage from 1% to 100%: with 0 "
        + EVICTABLE,
    ),
    "maxUnavailable 0%": (
        [{"op": "replace", "path": "/spec/maxUnavailable", "value": "0%"}],
        BUDGET
        + "spec.maxUnavailable: '0%' is not a positive integer or a percentage from 1% to 100%: with 0 "
        + EVICTABLE,
    ),
    "minAvailable 100%": (
        [
            {"op": "remove", "path": "/spec/maxUnavailable"},
            {"op": "add", "path": "/spec/minAvailable", "value": "100%"},
        ],
        BUDGET + "spec.minAvailable: '100%': with the pool at its fewest (1 pod) " + EVICTABLE,
    ),
    "minAvailable of every pod": (
        [
            {"op": "remove", "path": "/spec/maxUnavailable"},
            {"op": "add", "path": "/spec/minAvailable", "value": 1},
        ],
        BUDGET + "spec.minAvailable: 1: with the pool at its fewest (1 pod) " + EVICTABLE,
    ),
    "both bounds": (
        [{"op": "add", "path": "/spec/minAvailable", "value": 1}],
        BUDGET + "the API server would refuse the patched PodDisruptionBudget: spec.minAvailable: may not be set "
        "together with maxUnavailable: remove maxUnavailable with the same patch",
    ),
}


@pytest.mark.parametrize("case", BUDGETS)
def test_a_patched_budget_still_lets_a_drain_through(converged: Metacontroller, case: str) -> None:
    operations, message = BUDGETS[case]
    assert converged.refusal(patch("PodDisruptionBudget", "qwen-pd-decode", *operations)) == message


def test_a_percentage_minimum_counts_the_pool_at_its_fewest(converged: Metacontroller) -> None:
    """Rounded up, as the disruption controller counts it: 67% of 3 pods keeps all 3."""

    def three_pods_at_least(spec: dict[str, Any]) -> None:
        queue = {"metric": {"name": "queue"}, "target": {"type": "AverageValue", "averageValue": 4}}
        autoscaling = {"minReplicas": 3, "maxReplicas": 6, "metrics": [{"type": "Pods", "pods": queue}]}
        spec["services"]["decode"].update(replicas=5, autoscaling=autoscaling)
        patch(
            "PodDisruptionBudget",
            "qwen-pd-decode",
            {"op": "remove", "path": "/spec/maxUnavailable"},
            {"op": "add", "path": "/spec/minAvailable", "value": "67%"},
        )(spec)

    assert converged.refusal(three_pods_at_least) == (
        BUDGET + "spec.minAvailable: '67%': with the pool at its fewest (3 pods) " + EVICTABLE
    )


SERVICE = "patches[0] (Service qwen-pd-server): "
OWN_SERVICE = (
    "the graph is reachable inside the cluster only, since whoever may create an InferaDeployment may not be "
    "allowed more; a Service of your own can select the pods (infera.amd.com/deployment=qwen-pd,"
    "infera.amd.com/service=server)"
)
EXPOSED = {
    "external IPs": (
        {"op": "add", "path": "/spec/externalIPs", "value": ["203.0.113.7"]},
        SERVICE + "spec.externalIPs: may not be set: a Service with external IPs takes the cluster's traffic to "
        "those addresses (CVE-2020-8554)",
    ),
    "LoadBalancer": (
        {"op": "replace", "path": "/spec/type", "value": "LoadBalancer"},
        SERVICE + "spec.type: may only be ClusterIP (not 'LoadBalancer'): " + OWN_SERVICE,
    ),
    "NodePort": (
        {"op": "replace", "path": "/spec/type", "value": "NodePort"},
        SERVICE + "spec.type: may only be ClusterIP (not 'NodePort'): " + OWN_SERVICE,
    ),
}


@pytest.mark.parametrize("case", EXPOSED)
def test_a_patch_does_not_expose_the_graph(converged: Metacontroller, case: str) -> None:
    operation, message = EXPOSED[case]
    assert converged.refusal(patch("Service", "qwen-pd-server", operation)) == message


def test_a_patched_claim_template_still_asks_for_storage(converged: Metacontroller) -> None:
    zero = {"op": "replace", "path": "/spec/volumeClaimTemplates/0/spec/resources/requests/storage", "value": "0"}
    assert converged.refusal(patch("StatefulSet", "qwen-pd-nats", zero)) == (
        "patches[0] (StatefulSet qwen-pd-nats): spec.volumeClaimTemplates[0].spec.resources.requests.storage: "
        "must be more than 0 (not '0')"
    )


READY = (
    "INFERA_ENGINE_READY_TIMEOUT must be a positive, finite number of seconds such as 7200 (not {!r}): each worker "
    "gives up on its engine after that long, at once for 0, a negative number or nan, and after its default 1800 s "
    "for a value it cannot read"
)
READY_VAR = "INFERA_ENGINE_READY_TIMEOUT"


@pytest.mark.parametrize("value", ["-100", "0", "nan", "inf", "soon", ""])
@pytest.mark.parametrize("where", ["service env", "envs"])
def test_the_engines_load_timeout_is_a_positive_number_of_seconds(
    converged: Metacontroller, where: str, value: str
) -> None:
    def change(spec: dict[str, Any]) -> None:
        variables = [{"name": "OTHER", "value": "1"}, {"name": READY_VAR, "value": value}]
        if where == "envs":
            spec["envs"] = variables
        else:
            spec["services"]["decode"]["env"] = variables

    field = "spec.envs.1.value" if where == "envs" else "spec.services.decode.env.1.value"
    assert converged.refusal(change) == f"invalid spec: {field}: {READY.format(value)}"


def test_the_load_timeout_is_held_to_the_same_rule_in_a_template_and_a_patch(converged: Metacontroller) -> None:
    def template(spec: dict[str, Any]) -> None:
        container = {"name": "infera", "env": [{"name": READY_VAR, "value": "0"}]}
        spec["services"]["decode"]["extraPodSpec"] = {"containers": [container]}

    assert converged.refusal(template) == (
        "spec.services.decode.extraPodSpec (Deployment qwen-pd-decode): spec.template.spec.containers[0].env[0].value: "
        + READY.format("0")
    )
    added = {"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": {"name": READY_VAR, "value": "-1"}}
    assert converged.refusal(patch("Deployment", "qwen-pd-decode", added)) == (
        "patches[0] (Deployment qwen-pd-decode): spec.template.spec.containers[0].env[5].value: " + READY.format("-1")
    )
    # Named without a value, the variable is set to "": the wrapper waits its default.
    unset = dict(added, value={"name": READY_VAR})
    assert converged.refusal(patch("Deployment", "qwen-pd-decode", unset)) == (
        "patches[0] (Deployment qwen-pd-decode): spec.template.spec.containers[0].env[5].value: " + READY.format("")
    )


def test_a_load_timeout_named_without_a_value_is_refused(converged: Metacontroller) -> None:
    def change(spec: dict[str, Any]) -> None:
        spec["envs"] = [{"name": READY_VAR}]

    assert converged.refusal(change) == f"invalid spec: spec.envs.0: {READY.format('')}"


MOUNT_PATH = (
    "invalid spec: spec.modelCache.mountPath: modelCache.mountPath must be an absolute path without . or .. segments, "
    "neither in nor above a directory the engine needs from its image and node (/dev, /proc, /sys, /etc, /boot, /usr, "
    "/bin, /sbin, /lib, /lib64, /run, /var/run, /tmp, /opt/rocm): e.g. /models"
)
CACHE = {"source": "hf://Qwen/Qwen3-0.6B", "size": "20Gi"}


@pytest.mark.parametrize("path", ["/var/run", "/tmp", "/tmp/models", "/opt/rocm", "/opt/rocm/lib", "/opt", "/var"])
def test_the_model_cache_hides_nothing_the_engine_needs(converged: Metacontroller, path: str) -> None:
    assert converged.refusal(lambda spec: spec.update(modelCache={**CACHE, "mountPath": path})) == MOUNT_PATH


@pytest.mark.parametrize("path", ["/models", "/opt/models", "/var/cache/models", "/tmpfs", "/data/rocm"])
def test_a_model_cache_beside_the_system_paths_is_accepted(hooks: HookClient, path: str) -> None:
    obj = graph().model_cache(**CACHE, mountPath=path).obj()
    assert hooks.sync(obj)["status"]["state"] == "initializing"


@pytest.mark.parametrize("size", ["0", 0, "0Gi", "0.0"])
def test_a_broker_without_storage_is_refused(converged: Metacontroller, size: str | int) -> None:
    assert converged.refusal(lambda spec: spec.update(nats={"deploy": True, "storageSize": size})) == (
        "invalid spec: spec.nats.storageSize: nats.storageSize must be more than 0: JetStream keeps its streams in "
        "a claim of that size"
    )


# What Metacontroller adds to each child before recording it, and the annotation's key.
RECORD_OVERHEAD = len(f',"namespace":"{NAMESPACE}"') + len(f',"controller-uid":"{UID}"') + len(LAST_APPLIED_ANNOTATION)
RECORD = re.compile(
    r"Deployment qwen-pd-decode is ([\d,]+) bytes as JSON: Metacontroller records all of it in the annotation "
    r"metacontroller\.k8s\.io/last-applied-configuration, and with the child's other annotations that makes "
    r"([\d,]+) bytes, past the API server's bound of 262,144 bytes \(256 KiB\) of annotations per object, so the "
    r"child could never be created or updated: shorten what the spec puts in it \(envs, args, extraPodSpec, patches\)"
)


def recorded(message: str) -> tuple[int, int]:
    """The child's size and the annotation bytes it needs, as the message says them."""
    match = RECORD.fullmatch(message)
    assert match, message
    size, needed = (int(group.replace(",", "")) for group in match.groups())
    return size, needed


def test_a_child_metacontroller_could_not_record_is_refused(converged: Metacontroller) -> None:
    big = {"name": "BLOB", "value": "x" * 300_000}
    size, needed = recorded(converged.refusal(lambda spec: spec.update(envs=[big])))
    assert 300_000 < size < 310_000
    assert needed == size + RECORD_OVERHEAD


def test_the_record_counts_what_go_escapes_and_the_childs_own_annotations(converged: Metacontroller) -> None:
    """Go's JSON encoder writes each & as \\u0026: 50,000 of them take 300,000 bytes in the record."""
    ampersands = {"name": "SCRIPT", "value": "&" * 50_000}
    size, needed = recorded(converged.refusal(lambda spec: spec["services"]["decode"].update(env=[ampersands])))
    assert 50_000 < size < 60_000
    assert needed == size + 5 * 50_000 + RECORD_OVERHEAD
    # A patch's annotations count twice: in the record, and as themselves.
    note = {"op": "add", "path": "/metadata/annotations", "value": {"example.com/note": "n" * 130_000}}
    size, needed = recorded(converged.refusal(patch("Deployment", "qwen-pd-decode", note)))
    assert needed == size + len("example.com/note") + 130_000 + RECORD_OVERHEAD


def test_a_child_just_inside_the_record_bound_is_applied(hooks: HookClient) -> None:
    obj = graph().envs({"name": "BLOB", "value": "x" * 250_000}).obj()
    mc = Metacontroller(hooks, obj)
    mc.converge()
    assert mc.parent["status"]["state"] != "failed"
    assert (
        len(mc.children[("Deployment", "qwen-pd-decode")]["metadata"]["annotations"][LAST_APPLIED_ANNOTATION]) > 250_000
    )


def test_no_example_comes_near_the_record_bound(hooks: HookClient) -> None:
    """Every child of every example and of the upstream operator's corpus is recorded in under a
    tenth of the bound (the largest, a LeaderWorkerSet, in under 5 KB)."""
    documents = [doc for path in sorted(EXAMPLES.glob("*.yaml")) for doc in load_yaml(path)]
    documents += [doc for _, doc in upstream_corpus()]
    largest = 0
    for doc in documents:
        answer = hooks.sync(parent(doc, namespace=NAMESPACE))
        assert answer["status"]["state"] != "failed", doc["metadata"]["name"]
        for child in answer["children"]:
            text = json.dumps(child, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            escaped = 5 * sum(text.count(char) for char in "<>&")
            largest = max(largest, len(text.encode()) + escaped + RECORD_OVERHEAD)
    assert 0 < largest < MAX_ANNOTATIONS // 10


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


def test_a_minimum_that_lets_a_pod_go_is_patchable(hooks: HookClient) -> None:
    obj = (
        graph()
        .replicas(decode=3)
        .patch(
            "PodDisruptionBudget",
            "qwen-pd-decode",
            {"op": "remove", "path": "/spec/maxUnavailable"},
            {"op": "add", "path": "/spec/minAvailable", "value": "50%"},
        )
        .obj()
    )
    assert hooks.sync(obj)["status"]["state"] == "initializing"
