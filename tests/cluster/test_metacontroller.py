"""What Metacontroller itself does with the bundle, on the real control plane: a restart of it
mid-rollout changes nothing (docs/rollouts.md: nothing is remembered but what the cluster
holds), and each child kind is updated as the bundle's CompositeController declares it, so an
edit by hand of what the hook set is put back on the same object. Who wrote what is read from
the API server's audit log, every status of the graph from a watch of its versions.
"""

import json
from collections.abc import Iterable
from typing import Any

import jsonpatch
import pytest
import yaml

from hooks.contract import LAST_APPLIED_ANNOTATION
from tests.cluster.test_blue_green import (
    NAME,
    NEW_IMAGE,
    SERVICES,
    Rollout,
    audited,
    cordoned,
    deployments_of,
    front_door,
    generation_pods,
    patch_image,
    rolled_out,
    settled,
    stable_graph,
    stalled,
    watched,
    writes_to,
)
from tests.cluster.test_graphs import (
    accept_gateway_routes,
    children,
    eventually,
    get,
    metacontroller_writes,
    quiet,
    synced,
    wait_graph_ready,
)
from tests.support.cluster import Cluster
from tests.support.localcluster import COMPONENTS, CONTROLLER, Installed
from tests.support.metacontroller import USER as METACONTROLLER_USER
from tests.support.prerequisites import REPO
from tests.support.requests import KIND_RESOURCES, RESOURCE_KINDS, load_yaml

BUNDLE_COMPONENTS = REPO / "metacontroller" / "components"
KINDS_GRAPH = "qwen-kinds"
# A hook-set label of every child, which nothing but the hook and the person editing it reads.
EDITED_LABEL = "app.kubernetes.io/managed-by"
# What Metacontroller writes to put a child the hook answers differently back, by the
# updateStrategy method its kind declares: InPlace updates the object itself, which keeps its
# uid. Another method (Recreate deletes it and creates it again; OnDelete writes nothing) is
# no method this bundle is meant to declare, so this test says so rather than guess.
RESTORED_BY = {"InPlace": "update"}


def uids(cluster: Cluster, namespace: str, names: set[str]) -> dict[str, str]:
    """The uid of each of those Deployments that exists."""
    return {
        d["metadata"]["name"]: d["metadata"]["uid"]
        for d in get(cluster, "-n", namespace, "deployments")["items"]
        if d["metadata"]["name"] in names
    }


@pytest.mark.parametrize("namespace", ["restart-mid-rollout"], indirect=True)
def test_a_metacontroller_restart_mid_rollout_changes_nothing_and_the_rollout_finishes_as_uninterrupted(
    installed: Installed, namespace: str
) -> None:
    """A pod of Metacontroller is stopped and started again whenever its node is drained or its
    image upgraded; the hook keeps no memory of a rollout, only what the cluster holds. So a
    new process finding a rollout half done must go on with it, not start it over: the same
    phases, the same writes, as test_blue_green's uninterrupted rollout, and the incoming
    generation's Deployments created once, by the first process."""
    cluster, metacontroller = installed.cluster, installed.metacontroller
    parent = stable_graph(installed, namespace)
    old = parent["status"]["rollout"]["servingGeneration"]
    service = front_door(cluster, namespace)
    since_metacontroller = len(cluster.audit_writes(METACONTROLLER_USER))
    since = len(audited(cluster, namespace))

    with watched(cluster, namespace, parent["metadata"]["resourceVersion"]) as seen:
        with cordoned(cluster):
            changed = patch_image(cluster, namespace, NEW_IMAGE)
            rolling = stalled(cluster, namespace)
            new = rolling["status"]["rollout"]["incomingGeneration"]
            assert new != old and rolling["status"]["rollout"]["servingGeneration"] == old
            created = uids(cluster, namespace, deployments_of(new))
            assert set(created) == deployments_of(new)
            # The first process has said all it has to say about the stalled rollout.
            eventually(lambda: quiet(installed, namespace), "the stalled rollout's syncs to write nothing", 180)
            before_restart = len(cluster.audit_writes(METACONTROLLER_USER))
            before_restart_graph = get(cluster, "-n", namespace, "idep", NAME)
            assert settled(cluster, namespace, "Progressing")

            stopped = metacontroller.process.pid
            # The quiet first process's calls are answered 304, which the hooks' log does not
            # name the graph in.
            answered = len(installed.hooks.calls("sync"))
            exit_status = metacontroller.restart()
            # SIGTERM is a clean stop: it exits by itself, well before the SIGKILL.
            assert exit_status == 0, metacontroller.log.read_text()[-4000:]
            assert metacontroller.process.pid != stopped and metacontroller.process.poll() is None
            # The new process knows no ETag (its cache was the old one's memory), so its first
            # sync of the graph is a whole request, which the hooks' log names; two more of
            # every graph, and it has read the half-done rollout and answered it.
            eventually(
                lambda: any(
                    (call.get("namespace"), call.get("name")) == (namespace, NAME)
                    for call in installed.hooks.calls("sync")[answered:]
                ),
                "the new process's sync of the graph",
            )
            synced(installed, 2)
            # It wrote nothing: the rollout it found is the one the hook answers, and the
            # status the hook computes from it is the status stored, which is the graph as
            # the first process left it.
            assert metacontroller_writes(cluster, namespace, before_restart) == []
            assert get(cluster, "-n", namespace, "idep", NAME) == before_restart_graph
            assert uids(cluster, namespace, deployments_of(new)) == created

        # Room again: the new generation becomes ready under the new process.
        done = eventually(
            lambda: (
                (idep := settled(cluster, namespace, "Stable"))
                and idep["status"]["rollout"]["servingGeneration"] != old
                and idep
            ),
            "the new generation to serve, Stable",
            180,
        )
        eventually(
            lambda: any(idep["metadata"]["resourceVersion"] == done["metadata"]["resourceVersion"] for idep in seen),
            "the watch to catch up",
            30,
        )

    assert done["status"]["rollout"]["servingGeneration"] == new
    # As the uninterrupted rollout: the restart added no phase, none went back, and both
    # processes together wrote what one does (docs/rollouts.md's table).
    rolled_out(cluster, namespace, Rollout(seen, done, changed, old, new, service), since, since_metacontroller)
    # The new generation's Deployments are the objects the first process created, once each,
    # and Metacontroller wrote nothing else to them.
    events = audited(cluster, namespace)[since:]
    assert sorted(w for w in writes_to(events, "deployments", deployments_of(new)) if w[0] == METACONTROLLER_USER) == [
        (METACONTROLLER_USER, "create", "deployments", name) for name in sorted(deployments_of(new))
    ]
    assert uids(cluster, namespace, deployments_of(new) | deployments_of(old)) == created

    # The real controllers follow: only the new generation's pods are left, running.
    eventually(
        lambda: generation_pods(cluster, namespace) == {s: (new, "Running") for s in SERVICES},
        "only the new generation's pods, running",
    )


def every_kind_graph(namespace: str) -> dict[str, Any]:
    """One graph whose children are of every kind the bundle registers: the discovery identity
    (ServiceAccount, Role, RoleBinding), NATS (StatefulSet, Service), a model cache
    (PersistentVolumeClaim, Job), GAIE (InferencePool, HTTPRoute, the picker's Deployment),
    monitoring (PodMonitor), an isolated graph (NetworkPolicy), a multi-node prefill pool
    (LeaderWorkerSet), an autoscaled decode pool (HorizontalPodAutoscaler) with a disruption
    budget (PodDisruptionBudget), and a server (Deployment, Service)."""
    return {
        "apiVersion": "infera.amd.com/v1alpha1",
        "kind": "InferaDeployment",
        "metadata": {"name": KINDS_GRAPH, "namespace": namespace},
        "spec": {
            "image": "rocm/infera:sglang-v0.1.1",
            "discoveryBackend": "kubernetes",
            "networkPolicy": {"isolate": "graph"},
            "monitoring": {"labels": {"release": "kube-prometheus-stack"}},
            "gaie": {
                "enabled": True,
                "tokenizerPath": "Qwen/Qwen3-0.6B",
                "gatewayName": "inference-gateway",
                "gatewayNamespace": "gateways",
            },
            "modelCache": {"source": "hf://Qwen/Qwen3-0.6B", "size": "20Gi"},
            "services": {
                "server": {
                    "componentType": "server",
                    "replicas": 2,
                    "args": ["--router-tokenizer-path", "Qwen/Qwen3-0.6B"],
                },
                "prefill": {
                    "componentType": "worker",
                    "role": "prefill",
                    "numberOfNodes": 2,
                    "resources": {"gpu": 1, "memory": "64Gi", "sharedMemory": "32Gi"},
                    "args": ["--model-path", "/models/Qwen3-0.6B", "--disaggregation-transfer-backend", "mori"],
                },
                "decode": {
                    "componentType": "worker",
                    "role": "decode",
                    "replicas": 2,
                    "resources": {"gpu": 1, "memory": "64Gi", "sharedMemory": "32Gi"},
                    "args": ["--model-path", "/models/Qwen3-0.6B", "--disaggregation-transfer-backend", "mori"],
                    "autoscaling": {
                        "minReplicas": 1,
                        "maxReplicas": 6,
                        "metrics": [
                            {
                                "type": "Resource",
                                "resource": {
                                    "name": "cpu",
                                    "target": {"type": "Utilization", "averageUtilization": 80},
                                },
                            }
                        ],
                    },
                    "disruptionBudget": {"maxUnavailable": 1},
                },
            },
        },
    }


def declared_methods(components: Iterable[str]) -> dict[str, str]:
    """Each child kind the bundle's CompositeController registers with the kustomize
    `components` on, by the method of the updateStrategy it declares (none is Metacontroller's
    OnDelete)."""
    (composite,) = load_yaml(REPO / "metacontroller" / "compositecontroller.yaml")
    for component in components:
        (kustomization,) = load_yaml(BUNDLE_COMPONENTS / component / "kustomization.yaml")
        for patch in kustomization.get("patches", []):
            if patch["target"].get("kind") == "CompositeController":
                composite = jsonpatch.apply_patch(composite, yaml.safe_load(patch["patch"]))
    return {
        RESOURCE_KINDS[child["resource"]]: (child.get("updateStrategy") or {}).get("method", "OnDelete")
        for child in composite["spec"]["childResources"]
    }


def kubectl_resource(child: dict[str, Any]) -> str:
    """How kubectl names the child's resource unambiguously (resource.group)."""
    group, _, _ = child["apiVersion"].rpartition("/")
    resource = KIND_RESOURCES[child["kind"]]
    return f"{resource}.{group}" if group else resource


def main_writes(events: list[dict[str, Any]], child: dict[str, Any]) -> list[tuple[str, str]]:
    """(user, verb) of each successful write to the child itself (its status left out: the
    controllers that run it write that)."""
    resource = kubectl_resource(child).partition(".")[0]
    return [
        (user, verb)
        for user, verb, written, _ in writes_to(events, resource, {child["metadata"]["name"]})
        if written == resource
    ]


@pytest.mark.parametrize("namespace", ["in-place"], indirect=True)
def test_each_child_kind_edited_by_hand_is_put_back_as_its_declared_update_strategy_says(
    installed: Installed, namespace: str
) -> None:
    """Without an updateStrategy Metacontroller never updates a child, and with Recreate it would
    delete a workload to change it: what the bundle declares per kind decides whether a drifted
    child is put back, and how. A label the hook sets, edited by hand on every child, must come
    back on the same object (InPlace), by one update of Metacontroller's."""
    cluster = installed.cluster
    # Every declaration, with each component on (one at a time: they patch the same object).
    declared: dict[str, str] = {}
    for component in sorted(path.name for path in BUNDLE_COMPONENTS.iterdir() if path.is_dir()):
        declared |= declared_methods([component])
    undecided = {kind: method for kind, method in declared.items() if method not in RESTORED_BY}
    assert not undecided, f"only {sorted(RESTORED_BY)} is tested here; the bundle declares {undecided}"
    # The kinds this cluster serves, those of the components the test overlay enables:
    # Metacontroller runs what the bundle declares for them.
    methods = declared_methods(COMPONENTS)
    installed_children = get(cluster, "compositecontroller", CONTROLLER)["spec"]["childResources"]
    assert {RESOURCE_KINDS[c["resource"]]: c["updateStrategy"]["method"] for c in installed_children} == methods

    applied = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(every_kind_graph(namespace)))
    assert applied.returncode == 0, applied.stderr
    eventually(
        lambda: all(get(cluster, "-n", namespace, kind)["items"] for kind in ("inferencepools", "httproutes")),
        "the InferencePool and the HTTPRoute",
    )
    accept_gateway_routes(cluster, namespace)
    wait_graph_ready(installed, namespace, KINDS_GRAPH, 240)
    # The baseline: the graph once its syncs write nothing more, so what Metacontroller writes
    # next is the edits' doing.
    eventually(lambda: quiet(installed, namespace), "the graph's syncs to write nothing", 180)

    uid = get(cluster, "-n", namespace, "idep", KINDS_GRAPH)["metadata"]["uid"]
    owned = [
        child
        for child in children(cluster, namespace, uid)
        if any(ref.get("controller") and ref["uid"] == uid for ref in child["metadata"].get("ownerReferences") or [])
    ]
    assert {child["kind"] for child in owned} == set(methods)
    before = {(child["kind"], child["metadata"]["name"]): child for child in owned}
    hook_values = {}
    for key, child in before.items():
        asked = json.loads(child["metadata"]["annotations"][LAST_APPLIED_ANNOTATION])
        hook_values[key] = asked["metadata"]["labels"][EDITED_LABEL]
        assert child["metadata"]["labels"][EDITED_LABEL] == hook_values[key], key

    # The person's identity (kwok's admin, which kwok's controllers share: their writes to a
    # child's own object would show, and fail the exact list below, as well).
    whoami = json.loads(cluster.kubectl("auth", "whoami", "-o", "json").stdout)["status"]["userInfo"]["username"]
    assert whoami != METACONTROLLER_USER
    since = len(audited(cluster, namespace))
    for (_, name), child in before.items():
        edit = {"metadata": {"labels": {EDITED_LABEL: "edited-by-hand"}}}
        patched = cluster.kubectl(
            "patch", "-n", namespace, kubectl_resource(child), name, "--type=merge", "-p", json.dumps(edit)
        )
        assert patched.returncode == 0, patched.stderr

    def now() -> dict[tuple[str, str], dict[str, Any]]:
        return {(c["kind"], c["metadata"]["name"]): c for c in children(cluster, namespace, uid)}

    def still_edited() -> list[tuple[str, str]]:
        current = now()
        return [
            key for key in sorted(before) if current[key]["metadata"]["labels"].get(EDITED_LABEL) != hook_values[key]
        ]

    try:
        eventually(lambda: not still_edited(), "every child's label put back")
    except AssertionError:
        assert still_edited() == [], "Metacontroller left these children as edited by hand"
        raise
    after = now()
    # Put back once and for all: the next syncs write nothing.
    assert quiet(installed, namespace)

    events = audited(cluster, namespace)[since:]
    expected = {key: [(whoami, "patch"), (METACONTROLLER_USER, RESTORED_BY[methods[key[0]]])] for key in sorted(before)}
    assert {key: main_writes(events, child) for key, child in sorted(before.items())} == expected
    assert {key: after[key]["metadata"]["uid"] for key in before} == {
        key: child["metadata"]["uid"] for key, child in before.items()
    }
    assert {key: after[key]["metadata"]["labels"][EDITED_LABEL] for key in before} == hook_values
    # The restore is the label alone: the rest of each child's labels and annotations (the
    # hook's last-applied answer among them) are as they were, and no child came or went.
    for key, child in before.items():
        assert after[key]["metadata"]["labels"] == child["metadata"]["labels"], key
        assert after[key]["metadata"]["annotations"] == child["metadata"]["annotations"], key
    assert set(after) == set(before)
