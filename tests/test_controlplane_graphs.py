"""Graphs on the real control plane: the bundle installed with `kubectl apply -k`, every
example converging on kwok GPU nodes, zero writes at steady state counted from the API server's
audit log, changes, and deletion through the finalize hook and the real garbage collector.

Metacontroller's part is played by tests/support/composite_driver.py (the module proxy does
not serve Metacontroller); everything else is the real program: kube-apiserver,
kube-controller-manager, kube-scheduler, kwok, the LeaderWorkerSet controller and
`infera-hooks serve`.
"""

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cluster import NODE_NAMES, Cluster, running_cluster_with_nodes, running_lws
from tests.support.composite_driver import CompositeDriver
from tests.support.prerequisites import REPO, need_schemas
from tests.support.requests import RESOURCE_KINDS, load_yaml
from tests.support.service import running_server

CONTROLLER = "inferadeployment-controller"
METACONTROLLER_USER = "system:serviceaccount:metacontroller:metacontroller"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
GPU = ("amd.com/gpu", "nvidia.com/gpu")


@dataclass
class Installed:
    cluster: Cluster
    driver: CompositeDriver
    hooks_url: str


def overlay(directory: Path, hooks_url: str) -> Path:
    """The test overlay: the bundle with the lws and gaie components, whose only change is the
    CompositeController's hook URLs, pointed at the loopback `infera-hooks serve`."""
    directory.mkdir()
    bundle = os.path.relpath(REPO, directory)
    patch = [
        {"op": "replace", "path": f"/spec/hooks/{hook}/webhook/url", "value": f"{hooks_url}/{hook}"}
        for hook in ("sync", "finalize", "customize")
    ]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [bundle],
        "components": [f"{bundle}/metacontroller/components/{name}" for name in ("lws", "gaie")],
        "patches": [{"target": {"kind": "CompositeController", "name": CONTROLLER}, "patch": json.dumps(patch)}],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return directory


def metacontroller_identity() -> list[dict[str, Any]]:
    """Metacontroller's namespace, ServiceAccount and cluster-wide role, as its own manifests
    install them: it reads and writes every kind a controller registers."""
    meta = {"name": "metacontroller"}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": meta},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "namespace": "metacontroller"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": meta,
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "metacontroller"},
            "subjects": [{"kind": "ServiceAccount", "name": "metacontroller", "namespace": "metacontroller"}],
        },
    ]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    workdir = tmp_path_factory.mktemp("graphs")
    schemas = need_schemas()
    with running_cluster_with_nodes(workdir) as cluster, running_lws(cluster, workdir), running_server(workdir) as hooks:
        for crd in ("metacontroller-crds.yaml", "inferencepool.yaml", "httproute.yaml"):
            applied = cluster.kubectl("apply", "--server-side", "-f", str(schemas / crd))
            assert applied.returncode == 0, applied.stderr
        cluster.apply(*metacontroller_identity())
        installed = cluster.kubectl("apply", "-k", str(overlay(workdir / "overlay", hooks.url)))
        assert installed.returncode == 0, installed.stderr
        waited = cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        assert waited.returncode == 0, waited.stderr
        driver = CompositeDriver(cluster.as_token(cluster.token("metacontroller", "metacontroller")), CONTROLLER)
        driver.start(interval=1.0)
        try:
            yield Installed(cluster, driver, hooks.url)
        finally:
            driver.stop()
        assert driver.errors == []


def eventually(check: Callable[[], Any], what: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return result


def get(cluster: Cluster, *arguments: str) -> Any:
    got = cluster.kubectl("get", *arguments, "-o", "json")
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)


def children(cluster: Cluster, namespace: str, uid: str) -> list[dict[str, Any]]:
    """Every object of a registered child kind labelled with the graph's uid."""
    kinds = ",".join(sorted(RESOURCE_KINDS))
    return get(cluster, "-n", namespace, kinds, "-l", f"controller-uid={uid}")["items"]


def accept_gateway_routes(cluster: Cluster, namespace: str) -> None:
    """The Gateway controller's part: it reports each InferencePool and HTTPRoute Accepted."""
    for resource in ("inferencepools", "httproutes"):
        for item in get(cluster, "-n", namespace, resource)["items"]:
            status = {
                "parents": [
                    {
                        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway"},
                        "controllerName": "example.com/gateway",
                        "conditions": [
                            {
                                "type": "Accepted",
                                "status": "True",
                                "reason": "Accepted",
                                "message": "",
                                "lastTransitionTime": "2026-12-01T00:00:00Z",
                                "observedGeneration": item["metadata"]["generation"],
                            }
                        ],
                    }
                ]
            }
            if resource == "httproutes":
                status["parents"][0]["parentRef"].pop("group")
                status["parents"][0]["parentRef"].pop("kind")
            patched = cluster.kubectl(
                "patch", "-n", namespace, resource, item["metadata"]["name"], "--subresource=status",
                "--type=merge", "-p", json.dumps({"status": status}),
            )  # fmt: skip
            assert patched.returncode == 0, patched.stderr


def test_the_bundle_installs_with_its_hooks_pointed_at_loopback(installed: Installed) -> None:
    cluster = installed.cluster
    composite = get(cluster, "compositecontroller", CONTROLLER)
    assert {name: hook["webhook"]["url"] for name, hook in composite["spec"]["hooks"].items()} == {
        name: f"{installed.hooks_url}/{name}" for name in ("sync", "finalize", "customize")
    }
    assert [c["resource"] for c in composite["spec"]["childResources"]][-3:] == [
        "leaderworkersets",
        "inferencepools",
        "httproutes",
    ]
    # Discovery and OpenAPI publish an established CRD a moment later.
    eventually(lambda: cluster.kubectl("explain", "idep.spec.services").returncode == 0, "kubectl explain", 60)
    # The API server type-checks the scaling policy's CEL against the CRD's schema.
    policy = eventually(
        lambda: "typeChecking" in (p := get(cluster, "validatingadmissionpolicy", "infera-scaling-api-replicas-only")).get("status", {}) and p,
        "the scaling policy's type check",
    )
    assert policy["status"]["typeChecking"] == {}


def columns(cluster: Cluster, namespace: str, name: str, output: str = "") -> dict[str, str]:
    """`kubectl get idep` as a person reads it: each column's value (AGE left out)."""
    listed = cluster.kubectl("get", "-n", namespace, "idep", name, *(["-o", output] if output else []))
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    starts = [header.index(title) for title in header.split()] + [len(row) + 1]
    return {
        title: row[start:end].strip()
        for title, start, end in zip(header.split(), starts, starts[1:], strict=False)
        if title != "AGE"
    }


def namespace_for(example: Path) -> str:
    return example.stem


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_every_example_converges_on_kwok_nodes_and_then_writes_nothing(installed: Installed, example: Path) -> None:
    cluster, driver = installed.cluster, installed.driver
    namespace = namespace_for(example)
    created = cluster.kubectl("create", "namespace", namespace)
    assert created.returncode == 0, created.stderr
    applied = cluster.kubectl("apply", "-n", namespace, "-f", str(example))
    assert applied.returncode == 0, applied.stderr
    (idep,) = load_yaml(example)
    name = idep["metadata"]["name"]
    if (idep["spec"].get("gaie") or {}).get("enabled"):
        eventually(lambda: get(cluster, "-n", namespace, "httproutes")["items"], "the HTTPRoute")
        accept_gateway_routes(cluster, namespace)
    waited = cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", f"idep/{name}", "--timeout=180s", timeout=200)
    assert waited.returncode == 0, (waited.stderr, get(cluster, "-n", namespace, "idep", name).get("status"), driver.errors)

    assert columns(cluster, namespace, name) == {"NAME": name, "BACKEND": idep["spec"].get("backendFramework", "sglang"), "STATE": "ready"}
    services = len(idep["spec"]["services"])
    assert columns(cluster, namespace, name, "wide")["READY"] == f"{services}/{services}"

    parent = get(cluster, "-n", namespace, "idep", name)
    uid = parent["metadata"]["uid"]
    owned = children(cluster, namespace, uid)
    assert owned
    for child in owned:
        (owner,) = [ref for ref in child["metadata"]["ownerReferences"] if ref.get("controller")]
        assert (owner["kind"], owner["name"], owner["uid"], owner["blockOwnerDeletion"]) == ("InferaDeployment", name, uid, True)
    pods = get(cluster, "-n", namespace, "pods", "-l", f"infera.amd.com/deployment={name}")["items"]
    asking_gpus = [pod for pod in pods if any(set(GPU) & set(c["resources"].get("limits", {})) for c in pod["spec"]["containers"])]
    assert asking_gpus and all(pod["spec"]["nodeName"] in NODE_NAMES for pod in pods)
    assert all(pod["status"]["phase"] in ("Running", "Succeeded") for pod in pods)

    # Steady state: the driver syncs every graph each second; over ten seconds Metacontroller's
    # identity writes nothing to any object of this namespace.
    before = len(cluster.audit_writes(METACONTROLLER_USER))
    time.sleep(10)
    writes = [
        (event["verb"], event["objectRef"]["resource"], event["objectRef"].get("name"))
        for event in cluster.audit_writes(METACONTROLLER_USER)[before:]
        if event["objectRef"].get("namespace") == namespace
    ]
    assert writes == []


def driver_writes(cluster: Cluster, namespace: str, since: int) -> list[tuple[str, str, str]]:
    """(verb, resource, name) of Metacontroller's identity's writes in `namespace`, in order,
    from the audit log entry `since` on."""
    return [
        (event["verb"], event["objectRef"]["resource"] + ("/" + event["objectRef"]["subresource"] if event["objectRef"].get("subresource") else ""), event["objectRef"].get("name", ""))
        for event in cluster.audit_writes(METACONTROLLER_USER)[since:]
        if event["objectRef"].get("namespace") == namespace and event["responseStatus"]["code"] < 300
    ]  # fmt: skip


def ready_graph(installed: Installed, namespace: str, example: Path = REPO / "examples" / "pd-disaggregated.yaml") -> dict[str, Any]:
    cluster = installed.cluster
    assert cluster.kubectl("create", "namespace", namespace).returncode == 0
    applied = cluster.kubectl("apply", "-n", namespace, "-f", str(example))
    assert applied.returncode == 0, applied.stderr
    (idep,) = load_yaml(example)
    name = idep["metadata"]["name"]
    waited = cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", f"idep/{name}", "--timeout=180s", timeout=200)
    assert waited.returncode == 0, waited.stderr
    return get(cluster, "-n", namespace, "idep", name)


def test_scaling_one_pool_writes_only_its_workload_and_the_status(installed: Installed) -> None:
    cluster = installed.cluster
    parent = ready_graph(installed, "scale")
    since = len(cluster.audit_writes(METACONTROLLER_USER))
    patched = cluster.kubectl("patch", "-n", "scale", "idep", "qwen-pd", "--type=merge", "-p", '{"spec":{"services":{"decode":{"replicas":2}}}}')
    assert patched.returncode == 0, patched.stderr
    eventually(lambda: get(cluster, "-n", "scale", "deployment", "qwen-pd-decode")["status"].get("readyReplicas") == 2, "two decode pods")
    waited = cluster.kubectl("wait", "-n", "scale", "--for=condition=Ready", "idep/qwen-pd", "--timeout=60s")
    assert waited.returncode == 0, waited.stderr
    time.sleep(3)
    writes = driver_writes(cluster, "scale", since)
    assert {write for write in writes if write[1] != "inferadeployments/status"} == {("update", "deployments", "qwen-pd-decode")}
    assert get(cluster, "-n", "scale", "idep", "qwen-pd")["status"]["observedGeneration"] == parent["metadata"]["generation"] + 1


def test_a_spec_the_hook_refuses_fails_in_status_and_keeps_every_child(installed: Installed) -> None:
    cluster = installed.cluster
    parent = ready_graph(installed, "refused")
    before = {(c["kind"], c["metadata"]["name"]): c["metadata"]["resourceVersion"] for c in children(cluster, "refused", parent["metadata"]["uid"])}
    since = len(cluster.audit_writes(METACONTROLLER_USER))
    # The CRD admits any pod spec here; the hook knows the mount names no volume.
    mount = {"name": "models", "mountPath": "/models"}
    patch = {"spec": {"services": {"decode": {"extraPodSpec": {"containers": [{"name": "main", "volumeMounts": [mount]}]}}}}}
    patched = cluster.kubectl("patch", "-n", "refused", "idep", "qwen-pd", "--type=merge", "-p", json.dumps(patch))
    assert patched.returncode == 0, patched.stderr
    status = eventually(lambda: (s := get(cluster, "-n", "refused", "idep", "qwen-pd")["status"])["state"] == "failed" and s, "state failed")
    assert status["message"].endswith(
        "spec.services.decode.extraPodSpec: the API server would refuse Deployment qwen-pd-decode made from it: "
        "spec.template.spec.containers[0].volumeMounts[0].name: no volume named 'models' in the pod"
    )
    time.sleep(3)
    assert {w for w in driver_writes(cluster, "refused", since)} == {("update", "inferadeployments/status", "qwen-pd")}
    after = {(c["kind"], c["metadata"]["name"]): c["metadata"]["resourceVersion"] for c in children(cluster, "refused", parent["metadata"]["uid"])}
    assert after.keys() == before.keys()


def set_hook_urls(cluster: Cluster, base: str) -> None:
    patch = [{"op": "replace", "path": f"/spec/hooks/{hook}/webhook/url", "value": f"{base}/{hook}"} for hook in ("sync", "finalize", "customize")]
    patched = cluster.kubectl("patch", "compositecontroller", CONTROLLER, "--type=json", "-p", json.dumps(patch))
    assert patched.returncode == 0, patched.stderr


def test_deleting_a_graph_tears_it_down_in_order_and_waits_for_the_hooks(installed: Installed) -> None:
    cluster, driver = installed.cluster, installed.driver
    parent = ready_graph(installed, "teardown")
    uid = parent["metadata"]["uid"]
    assert parent["metadata"]["finalizers"] == [f"metacontroller.io/compositecontroller-{CONTROLLER}"]

    # With the hooks unreachable the graph stays Terminating and keeps every child.
    set_hook_urls(cluster, "http://127.0.0.1:9")
    errors = len(driver.errors)
    try:
        deleted = cluster.kubectl("delete", "-n", "teardown", "idep", "qwen-pd", "--wait=false")
        assert deleted.returncode == 0, deleted.stderr
        since = len(cluster.audit_writes(METACONTROLLER_USER))
        eventually(lambda: len(driver.errors) >= errors + 3, "three failed calls")
        assert "deletionTimestamp" in get(cluster, "-n", "teardown", "idep", "qwen-pd")["metadata"]
        assert len(children(cluster, "teardown", uid)) == 14
        assert driver_writes(cluster, "teardown", since) == []
    finally:
        set_hook_urls(cluster, installed.hooks_url)
        del driver.errors[errors:]

    waited = cluster.kubectl("wait", "-n", "teardown", "--for=delete", "idep/qwen-pd", "--timeout=120s", timeout=150)
    assert waited.returncode == 0, waited.stderr
    eventually(lambda: not children(cluster, "teardown", uid), "the garbage collector")
    assert get(cluster, "-n", "teardown", "pods")["items"] == []
    deletes = [(resource, name) for verb, resource, name in driver_writes(cluster, "teardown", since) if verb == "delete"]
    stages = [
        {("deployments", "qwen-pd-server"), ("services", "qwen-pd-server"), ("poddisruptionbudgets", "qwen-pd-decode"), ("poddisruptionbudgets", "qwen-pd-prefill")},
        {("deployments", "qwen-pd-decode"), ("deployments", "qwen-pd-prefill")},
        {("statefulsets", "qwen-pd-nats"), ("services", "qwen-pd-nats")}
        | {(kind, f"qwen-pd-{account}") for kind in ("serviceaccounts", "roles", "rolebindings") for account in ("disc", "register")},
    ]  # fmt: skip
    assert sorted(deletes) == sorted(set().union(*stages))
    positions = [[deletes.index(item) for item in stage] for stage in stages]
    assert max(positions[0]) < min(positions[1]) and max(positions[1]) < min(positions[2])
