"""Graphs on the real control plane: the bundle installed with `kubectl apply -k`, every
example converging on kwok GPU nodes, zero writes at steady state counted from the API server's
audit log, changes, and deletion through the finalize hook and the real garbage collector.

Every program is the real one: Metacontroller v4.17.2 (tests/support/metacontroller.py),
kube-apiserver, kube-controller-manager, kube-scheduler, kwok, the LeaderWorkerSet controller
and `infera-hooks serve`.
"""

import asyncio
import copy
import importlib
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args
from urllib.parse import urlsplit

import jsonpatch
import pytest
import yaml

from hooks import teardown
from hooks.api.status import State
from hooks.contract import LAST_APPLIED_ANNOTATION, parse_request
from hooks.vocabulary import CHILD_KINDS
from tests.support import kubelet
from tests.support.cluster import NODE_NAMES, Cluster, accepted_status, graph_namespace, versions_of
from tests.support.e2e import sandbox
from tests.support.e2e.graphs import mixed
from tests.support.e2e.tokenizer import build_tokenizer
from tests.support.localcluster import COMPONENTS, CONTROLLER, Installed
from tests.support.metacontroller import RESYNC_SECONDS
from tests.support.metacontroller import USER as METACONTROLLER_USER
from tests.support.metrics_api import running_metrics_api
from tests.support.prerequisites import REPO, SHARED, need_runtime
from tests.support.requests import KIND_RESOURCES, RESOURCE_KINDS, controller, load_yaml, request_body
from tests.support.service import HookClient
from tests.support.simulator import Metacontroller

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
GPU = ("amd.com/gpu", "nvidia.com/gpu")


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


def wait_graph_ready(installed: Installed, namespace: str, name: str, seconds: int = 180) -> None:
    """`kubectl wait --for=condition=Ready` on a graph; what holds it back, if it times out."""
    cluster = installed.cluster
    waited = cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", f"idep/{name}", f"--timeout={seconds}s", timeout=seconds + 20
    )
    assert waited.returncode == 0, (
        waited.stderr,
        get(cluster, "-n", namespace, "idep", name).get("status"),
        cluster.unready_pods(namespace),
        installed.metacontroller.errors(),
    )


def children(cluster: Cluster, namespace: str, uid: str) -> list[dict[str, Any]]:
    """Every object of a registered child kind labelled with the graph's uid."""
    kinds = ",".join(sorted(RESOURCE_KINDS))
    return get(cluster, "-n", namespace, kinds, "-l", f"controller-uid={uid}")["items"]


def accept_gateway_routes(cluster: Cluster, namespace: str, only_new: bool = False) -> None:
    """The Gateway controller's part: it reports each InferencePool and HTTPRoute Accepted (with
    `only_new`, each it has not reported on yet)."""
    for resource in ("inferencepools", "httproutes"):
        for item in get(cluster, "-n", namespace, resource)["items"]:
            if only_new and (item.get("status") or {}).get("parents"):
                continue
            status = accepted_status(resource, item["metadata"]["generation"])
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
    assert [c["resource"] for c in composite["spec"]["childResources"]] == [kind.resource for kind in CHILD_KINDS]
    # Discovery and OpenAPI publish an established CRD a moment later.
    eventually(lambda: cluster.kubectl("explain", "idep.spec.services").returncode == 0, "kubectl explain", 60)
    # The API server type-checks each policy's CEL against the schemas of what it matches.
    for name in ("infera-scaling-api-replicas-only", "infera-registration-own-pod-only"):
        policy = eventually(
            lambda name=name: (
                "typeChecking" in (p := get(cluster, "validatingadmissionpolicy", name)).get("status", {}) and p
            ),
            f"{name}'s type check",
        )
        assert policy["status"]["typeChecking"] == {}, name


def columns(cluster: Cluster, namespace: str, name: str, output: str = "") -> dict[str, str]:
    """`kubectl get idep` as a person reads it: each column's value (AGE left out)."""
    listed = cluster.kubectl("get", "-n", namespace, "idep", name, *(["-o", output] if output else []))
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    titles = list(re.finditer(r"\S+", header))  # by position: AGE is also within MESSAGE
    starts = [title.start() for title in titles] + [len(row) + 1]
    return {
        title.group(): row[start:end].strip()
        for title, start, end in zip(titles, starts, starts[1:], strict=False)
        if title.group() != "AGE"
    }


@pytest.fixture
def example_namespace(installed: Installed, example: Path) -> Iterator[str]:
    """The example's own namespace, emptied once the test is done: an earlier example's 8-GPU
    pods would otherwise fill the nodes a later one needs."""
    with graph_namespace(installed.cluster, example.stem) as namespace:
        yield namespace


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_every_example_converges_on_kwok_nodes_and_then_writes_nothing(
    installed: Installed, example: Path, example_namespace: str
) -> None:
    cluster = installed.cluster
    namespace = example_namespace
    applied = cluster.kubectl("apply", "-n", namespace, "-f", str(example))
    assert applied.returncode == 0, applied.stderr
    (idep,) = load_yaml(example)
    name = idep["metadata"]["name"]
    if (idep["spec"].get("gaie") or {}).get("enabled"):
        eventually(lambda: get(cluster, "-n", namespace, "httproutes")["items"], "the HTTPRoute")
        accept_gateway_routes(cluster, namespace)
    wait_graph_ready(installed, namespace, name)

    blue_green = (idep["spec"].get("rollout") or {}).get("strategy") == "BlueGreen"
    assert columns(cluster, namespace, name) == {
        "NAME": name,
        "BACKEND": idep["spec"].get("backendFramework", "sglang"),
        "STATE": "ready",
        "ROLLOUT": "Stable" if blue_green else "",  # under RollingUpdate there is no status.rollout
    }
    services = len(idep["spec"]["services"])
    assert columns(cluster, namespace, name, "wide")["READY"] == f"{services}/{services}"

    parent = get(cluster, "-n", namespace, "idep", name)
    uid = parent["metadata"]["uid"]
    owned = children(cluster, namespace, uid)
    assert owned
    for child in owned:
        (owner,) = [ref for ref in child["metadata"]["ownerReferences"] if ref.get("controller")]
        assert (owner["kind"], owner["name"], owner["uid"], owner["blockOwnerDeletion"]) == (
            "InferaDeployment",
            name,
            uid,
            True,
        )
    created = {
        (resource, name) for verb, resource, name in metacontroller_writes(cluster, namespace, 0) if verb == "create"
    }
    assert {(KIND_RESOURCES[c["kind"]], c["metadata"]["name"]) for c in owned} <= created
    if "modelCache" in idep["spec"]:
        # The gate: worker pools appear only once the download Job has completed.
        (job,) = get(cluster, "-n", namespace, "jobs")["items"]
        workers = [
            f"{name}-{service}" for service, svc in idep["spec"]["services"].items() if svc["componentType"] == "worker"
        ]
        for worker in workers:
            deployment = get(cluster, "-n", namespace, "deployment", worker)
            assert deployment["metadata"]["creationTimestamp"] >= job["status"]["completionTime"]
    pods = get(cluster, "-n", namespace, "pods", "-l", f"infera.amd.com/deployment={name}")["items"]
    asking_gpus = [
        pod for pod in pods if any(set(GPU) & set(c["resources"].get("limits", {})) for c in pod["spec"]["containers"])
    ]
    assert asking_gpus and all(pod["spec"]["nodeName"] in NODE_NAMES for pod in pods)
    assert all(pod["status"]["phase"] in ("Running", "Succeeded") for pod in pods)
    # Teardown waits for the pods the worker pools' own controllers own (the Deployment's
    # ReplicaSet, the LeaderWorkerSet's StatefulSets), as those controllers name them: every worker
    # pod, and no other.
    workers = {service for service, svc in idep["spec"]["services"].items() if svc["componentType"] == "worker"}
    request = parse_request(
        request_body(parent, finalizing=True, related=[{**p, "kind": "Pod", "apiVersion": "v1"} for p in pods])
    )
    assert sorted(p["metadata"]["name"] for p in teardown.worker_pods(request) or []) == sorted(
        p["metadata"]["name"] for p in pods if p["metadata"]["labels"]["infera.amd.com/service"] in workers
    )
    # A front door spread across nodes (several routers or pickers) runs one replica per node:
    # the real scheduler reads the rendered constraints as meant.
    for deployment in get(cluster, "-n", namespace, "deployments")["items"]:
        if deployment["spec"]["template"]["spec"].get("topologySpreadConstraints"):
            selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
            nodes = [pod["spec"]["nodeName"] for pod in get(cluster, "-n", namespace, "pods", "-l", selector)["items"]]
            assert len(set(nodes)) == len(nodes) == deployment["spec"]["replicas"] > 1, (deployment, nodes)

    # An autoscaler reports on its first evaluation, up to 15 s after it was created, and the
    # graph's status quotes what keeps it from scaling: a change in the world, which the steady
    # state comes after.
    for autoscaler in get(cluster, "-n", namespace, "hpa")["items"]:
        hpa = autoscaler["metadata"]["name"]
        eventually(
            lambda hpa=hpa: get(cluster, "-n", namespace, "hpa", hpa).get("status", {}).get("conditions"),
            f"{hpa}'s first report",
            timeout=60,
        )
    synced(installed, 2)

    # Steady state: over two resyncs Metacontroller writes nothing to any object of this
    # namespace, and reuses answers it has: the hook answers 304 to a request it answered before.
    before = len(cluster.audit_writes(METACONTROLLER_USER))
    calls = synced(installed, 2)
    assert "not_modified" in {call["outcome"] for call in calls}, calls
    writes = [
        (
            event["verb"],
            event["objectRef"]["resource"],
            event["objectRef"].get("subresource"),
            event["objectRef"].get("name"),
        )
        for event in cluster.audit_writes(METACONTROLLER_USER)[before:]
        if event["objectRef"].get("namespace") == namespace
    ]
    assert writes == []


def synced(installed: Installed, more: int) -> list[dict[str, Any]]:
    """Until Metacontroller has synced every graph `more` times more than now, through as many
    of its informers' resyncs (every RESYNC_SECONDS): a burst of events right after a graph turns
    ready (its children's controllers still reporting) makes as many calls in a second, and
    counting those alone would end the wait before the world has settled. The calls meanwhile."""
    graphs = len(get(installed.cluster, "idep", "--all-namespaces")["items"])
    start, started = len(installed.hooks.calls("sync")), time.monotonic()
    eventually(
        lambda: (
            len(installed.hooks.calls("sync")) >= start + more * graphs
            and time.monotonic() - started >= more * RESYNC_SECONDS
        ),
        f"{more} syncs of {graphs} graphs",
        timeout=more * RESYNC_SECONDS + 60,
    )
    return installed.hooks.calls("sync")[start:]


def quiet(installed: Installed, *namespaces: str) -> bool:
    """Whether Metacontroller writes nothing in `namespaces` while it makes two syncs' worth of
    hook calls for every graph (calls answered 304 name no graph, so they are counted across
    all graphs, not graph by graph). A graph's status still moves after it is Ready (the HPA
    controller's first look at an autoscaler, 15 s after its creation, is in the status
    message), and what Metacontroller writes after a baseline taken too early is not what the
    test did."""
    mark = len(installed.cluster.audit_writes(METACONTROLLER_USER))
    synced(installed, 2)
    return all(metacontroller_writes(installed.cluster, namespace, mark) == [] for namespace in namespaces)


def metacontroller_writes(cluster: Cluster, namespace: str, since: int) -> list[tuple[str, str, str]]:
    """(verb, resource, name) of Metacontroller's identity's writes in `namespace`, in order,
    from the audit log entry `since` on; its Events (reports of what it did) left out."""
    return [
        (event["verb"], event["objectRef"]["resource"] + ("/" + event["objectRef"]["subresource"] if event["objectRef"].get("subresource") else ""), event["objectRef"].get("name", ""))
        for event in cluster.audit_writes(METACONTROLLER_USER)[since:]
        if event["objectRef"].get("namespace") == namespace and event["responseStatus"]["code"] < 300
        and event["objectRef"]["resource"] != "events"
    ]  # fmt: skip


def ready_graph(
    installed: Installed, namespace: str, example: Path = REPO / "examples" / "pd-disaggregated.yaml"
) -> dict[str, Any]:
    cluster = installed.cluster
    assert cluster.kubectl("create", "namespace", namespace).returncode == 0
    applied = cluster.kubectl("apply", "-n", namespace, "-f", str(example))
    assert applied.returncode == 0, applied.stderr
    (idep,) = load_yaml(example)
    name = idep["metadata"]["name"]
    wait_graph_ready(installed, namespace, name)
    return get(cluster, "-n", namespace, "idep", name)


def test_scaling_one_pool_writes_only_its_workload_and_the_status(installed: Installed) -> None:
    cluster = installed.cluster
    parent = ready_graph(installed, "scale")
    since = len(cluster.audit_writes(METACONTROLLER_USER))
    patched = cluster.kubectl(
        "patch",
        "-n",
        "scale",
        "idep",
        "qwen-pd",
        "--type=merge",
        "-p",
        '{"spec":{"services":{"decode":{"replicas":2}}}}',
    )
    assert patched.returncode == 0, patched.stderr
    eventually(
        lambda: get(cluster, "-n", "scale", "deployment", "qwen-pd-decode")["status"].get("readyReplicas") == 2,
        "two decode pods",
    )
    waited = cluster.kubectl("wait", "-n", "scale", "--for=condition=Ready", "idep/qwen-pd", "--timeout=60s")
    assert waited.returncode == 0, waited.stderr
    synced(installed, 2)
    writes = metacontroller_writes(cluster, "scale", since)
    assert {write for write in writes if write[1] != "inferadeployments/status"} == {
        ("update", "deployments", "qwen-pd-decode")
    }
    assert (
        get(cluster, "-n", "scale", "idep", "qwen-pd")["status"]["observedGeneration"]
        == parent["metadata"]["generation"] + 1
    )


def test_a_spec_the_hook_refuses_fails_in_status_and_keeps_every_child(installed: Installed) -> None:
    cluster = installed.cluster
    parent = ready_graph(installed, "refused")
    before = {
        (c["kind"], c["metadata"]["name"]): c["metadata"]["resourceVersion"]
        for c in children(cluster, "refused", parent["metadata"]["uid"])
    }
    since = len(cluster.audit_writes(METACONTROLLER_USER))
    # The CRD admits any pod spec here; the hook knows the mount names no volume.
    mount = {"name": "models", "mountPath": "/models"}
    patch = {
        "spec": {"services": {"decode": {"extraPodSpec": {"containers": [{"name": "main", "volumeMounts": [mount]}]}}}}
    }
    patched = cluster.kubectl("patch", "-n", "refused", "idep", "qwen-pd", "--type=merge", "-p", json.dumps(patch))
    assert patched.returncode == 0, patched.stderr
    status = eventually(
        lambda: (s := get(cluster, "-n", "refused", "idep", "qwen-pd")["status"])["state"] == "failed" and s,
        "state failed",
    )
    assert status["message"].endswith(
        "spec.services.decode.extraPodSpec: the API server would refuse Deployment qwen-pd-decode made from it: "
        "spec.template.spec.containers[0].volumeMounts[0].name: no volume named 'models' in the pod"
    )
    synced(installed, 2)
    assert {w for w in metacontroller_writes(cluster, "refused", since)} == {
        ("update", "inferadeployments/status", "qwen-pd")
    }
    after = {
        (c["kind"], c["metadata"]["name"]): c["metadata"]["resourceVersion"]
        for c in children(cluster, "refused", parent["metadata"]["uid"])
    }
    assert after.keys() == before.keys()


def set_hook_urls(cluster: Cluster, base: str) -> None:
    patch = [
        {"op": "replace", "path": f"/spec/hooks/{hook}/webhook/url", "value": f"{base}/{hook}"}
        for hook in ("sync", "finalize", "customize")
    ]
    patched = cluster.kubectl("patch", "compositecontroller", CONTROLLER, "--type=json", "-p", json.dumps(patch))
    assert patched.returncode == 0, patched.stderr


def test_deleting_a_graph_tears_it_down_in_order_and_waits_for_the_hooks(installed: Installed) -> None:
    cluster, metacontroller = installed.cluster, installed.metacontroller
    parent = ready_graph(installed, "teardown")
    uid = parent["metadata"]["uid"]
    assert parent["metadata"]["finalizers"] == [f"metacontroller.io/compositecontroller-{CONTROLLER}"]
    # A copy of a worker pod made to debug it: the graph's labels (not its ReplicaSet's, which
    # would adopt it), no owner. It holds nothing.
    (prefill,) = get(cluster, "-n", "teardown", "pods", "-l", "infera.amd.com/service=prefill")["items"]
    labels = {key: value for key, value in prefill["metadata"]["labels"].items() if key.startswith("infera.amd.com/")}
    assert labels["infera.amd.com/component"] == "worker"
    debug = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "debug-qwen-pd-prefill", "labels": labels},
        "spec": {"containers": [{"name": "debug", "image": "busybox"}]},
    }
    created = cluster.kubectl("create", "-n", "teardown", "-f", "-", stdin=json.dumps(debug))
    assert created.returncode == 0, created.stderr

    # With the hooks unreachable the graph stays Terminating and keeps every child.
    with metacontroller.erring():
        set_hook_urls(cluster, "http://127.0.0.1:9")
        errors = len(metacontroller.errors())
        try:
            deleted = cluster.kubectl("delete", "-n", "teardown", "idep", "qwen-pd", "--wait=false")
            assert deleted.returncode == 0, deleted.stderr
            since = len(cluster.audit_writes(METACONTROLLER_USER))
            eventually(lambda: len(metacontroller.errors()) >= errors + 3, "three failed calls")
            assert "deletionTimestamp" in get(cluster, "-n", "teardown", "idep", "qwen-pd")["metadata"]
            assert len(children(cluster, "teardown", uid)) == 15
            assert metacontroller_writes(cluster, "teardown", since) == []
            # What `kubectl describe idep` shows: Metacontroller's warning naming the hook it
            # cannot call (among others: the controller restarted by the URLs' change cancels a call).
            eventually(
                lambda: any(
                    e["type"] == "Warning" and "http://127.0.0.1:9/" in e["message"]
                    for e in get(
                        cluster,
                        "-n",
                        "teardown",
                        "events",
                        "--field-selector",
                        "involvedObject.name=qwen-pd,reason=SyncError",
                    )["items"]
                ),
                "Metacontroller's SyncError event naming the hook",
            )
        finally:
            # The errors are over once a finalize call reaches the hooks again.
            finalized = len(installed.hooks.calls("finalize"))
            set_hook_urls(cluster, installed.hooks_url)
            eventually(lambda: len(installed.hooks.calls("finalize")) > finalized, "a finalize call")

    waited = cluster.kubectl("wait", "-n", "teardown", "--for=delete", "idep/qwen-pd", "--timeout=120s", timeout=150)
    assert waited.returncode == 0, waited.stderr
    eventually(lambda: not children(cluster, "teardown", uid), "the garbage collector")
    pods = get(cluster, "-n", "teardown", "pods")["items"]
    assert [pod["metadata"]["name"] for pod in pods] == ["debug-qwen-pd-prefill"]
    assert cluster.kubectl("delete", "-n", "teardown", "pod", "debug-qwen-pd-prefill").returncode == 0
    deletes = [
        (resource, name)
        for verb, resource, name in metacontroller_writes(cluster, "teardown", since)
        if verb == "delete"
    ]
    stages = [
        {("deployments", "qwen-pd-server"), ("services", "qwen-pd-server"), ("poddisruptionbudgets", "qwen-pd-decode"), ("poddisruptionbudgets", "qwen-pd-prefill")},
        {("deployments", "qwen-pd-decode"), ("deployments", "qwen-pd-prefill")},
        {("statefulsets", "qwen-pd-nats"), ("services", "qwen-pd-nats"), ("networkpolicies", "qwen-pd-nats")}
        | {(kind, f"qwen-pd-{account}") for kind in ("serviceaccounts", "roles", "rolebindings") for account in ("disc", "register")},
    ]  # fmt: skip
    assert sorted(deletes) == sorted(set().union(*stages))
    positions = [[deletes.index(item) for item in stage] for stage in stages]
    assert max(positions[0]) < min(positions[1]) and max(positions[1]) < min(positions[2])


# The runtime's make_client passes its CA file as `verify=<path>`, which httpx 0.28 deprecates.
@pytest.mark.filterwarnings("ignore:`verify=<str>` is deprecated:DeprecationWarning")
def test_the_runtimes_worker_registers_and_its_router_discovers_it_under_the_rendered_accounts(
    installed: Installed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime's own Kubernetes clients (the worker's K8sRegistrationClient, the router's
    KubernetesRegistry), each with a TokenRequest token of the account its pod runs as, bound to
    its pod as kubelet's is, against the real API server, its RBAC authorizer and the bundle's
    registration policy."""
    monkeypatch.syspath_prepend(str(need_runtime()))
    cluster = installed.cluster
    ready_graph(installed, "runtime")
    k8s_client = importlib.import_module("infera.common.k8s_client")
    registration = importlib.import_module("infera.common.registration_k8s")
    discovery = importlib.import_module("infera.common.discovery_k8s")
    engine_config = importlib.import_module("infera.engine.base").EngineConfig
    address = urlsplit(cluster.server)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", str(address.hostname))
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(address.port))

    def mount(pod: dict[str, Any]) -> None:
        """What the kubelet mounts into `pod`: a token of its account, bound to it."""
        directory = tmp_path / pod["metadata"]["name"]
        directory.mkdir()
        (directory / "token").write_text(cluster.token("runtime", pod["spec"]["serviceAccountName"], pod=pod))
        (directory / "ca.crt").write_text(Path(cluster.ca).read_text())
        (directory / "namespace").write_text("runtime")
        for name in ("token", "ca.crt", "namespace"):
            monkeypatch.setattr(k8s_client, f"_{name.split('.')[0].upper()}_PATH", str(directory / name))

    pods = get(cluster, "-n", "runtime", "pods", "-l", "infera.amd.com/deployment=qwen-pd")["items"]
    by_service = {pod["metadata"]["labels"]["infera.amd.com/service"]: pod for pod in pods}
    workers = [by_service["prefill"], by_service["decode"]]
    assert [pod["spec"]["serviceAccountName"] for pod in (*workers, by_service["server"])] == [
        "qwen-pd-register",
        "qwen-pd-register",
        "qwen-pd-disc",
    ]
    server = get(cluster, "-n", "runtime", "deployment", "qwen-pd-server")["spec"]["template"]["spec"]["containers"][0]
    selector = server["command"][server["command"].index("--k8s-label-selector") + 1]

    async def scenario() -> None:
        clients = []
        for pod in workers:
            mount(pod)
            clients.append(registration.K8sRegistrationClient(pod_name=pod["metadata"]["name"]))
        for client, pod in zip(clients, workers, strict=True):
            await client.register(engine_config(model_name="Qwen/Qwen3-0.6B", host=pod["status"]["podIP"], port=8000))
        mount(by_service["server"])
        registry = discovery.KubernetesRegistry(selector)
        await registry.start()
        try:
            urls = [f"http://{pod['status']['podIP']}:8000" for pod in workers]
            active = lambda: {w.url for w in registry.pool.list_active()}  # noqa: E731
            await wait_for(lambda: active() == set(urls), "both workers")
            assert await clients[0].deregister()  # a drain begins: the watch takes it out of routing
            await wait_for(lambda: active() == {urls[1]}, "the decode worker alone")
        finally:
            await registry.stop()
            await clients[1].deregister()

    asyncio.run(scenario())
    # And no more than that, in the real authorizer's words.
    can_i = lambda account, *request: cluster.kubectl(  # noqa: E731
        "auth", "can-i", f"--as=system:serviceaccount:runtime:{account}", "-n", "runtime", *request
    ).stdout.strip()
    assert [can_i("qwen-pd-register", "patch", "pods"), can_i("qwen-pd-register", "list", "pods")] == ["yes", "no"]
    assert [can_i("qwen-pd-disc", "watch", "pods"), can_i("qwen-pd-disc", "patch", "pods")] == ["yes", "no"]
    assert can_i("qwen-pd-disc", "get", "secrets") == "no"


REGISTRATION_POLICY = "infera-registration-own-pod-only"
WORKER_INFO = "infera.amd.com/worker-info"


def test_a_workers_token_may_patch_only_its_own_pods_registration(installed: Installed) -> None:
    """RBAC lets a graph's worker account patch every Pod of the namespace; the bundle's
    ValidatingAdmissionPolicy holds it to what the runtime does. A token bound to the decode
    worker's Pod (what kubelet mounts there) registers and deregisters it, and the real API
    server refuses the rest: another Pod, a token bound to no Pod, another annotation, a label
    that would move the Pod into another selector, a new image."""
    cluster = installed.cluster
    ready_graph(installed, "attack")
    pods = get(cluster, "-n", "attack", "pods", "-l", "infera.amd.com/deployment=qwen-pd")["items"]
    by_service = {pod["metadata"]["labels"]["infera.amd.com/service"]: pod for pod in pods}
    decode, prefill, server = by_service["decode"], by_service["prefill"], by_service["server"]
    bound = cluster.as_token(cluster.token("attack", "qwen-pd-register", pod=decode))
    unbound = cluster.as_token(cluster.token("attack", "qwen-pd-register"))

    def patch(client: Any, pod: dict[str, Any], body: Any, kind: str = "merge-patch+json") -> tuple[int, str]:
        name = pod["metadata"]["name"]
        reply = client.patch(
            f"/api/v1/namespaces/attack/pods/{name}",
            content=json.dumps(body),
            headers={"Content-Type": f"application/{kind}"},
        )
        denied = f'pods "{name}" is forbidden: ValidatingAdmissionPolicy {REGISTRATION_POLICY!r} with binding '
        denied += f"{REGISTRATION_POLICY!r} denied request: "
        return reply.status_code, reply.json().get("message", "").removeprefix(denied)

    record = {"metadata": {"annotations": {WORKER_INFO: json.dumps({"url": "http://10.0.0.99:8000"})}}}
    own_pod = "a graph's worker may patch only the Pod its token is bound to"
    annotation = "a graph's worker may change only its Pod's infera.amd.com/worker-info annotation"
    the_rest = "a graph's worker may not change its Pod's labels, finalizers, owners or spec"
    image = [{"op": "replace", "path": "/spec/containers/0/image", "value": "attacker/engine:latest"}]
    assert [
        patch(bound, decode, record),
        patch(bound, decode, {"metadata": {"annotations": {WORKER_INFO: None}}}),
        patch(bound, prefill, record),
        patch(bound, server, record),
        patch(unbound, decode, record),
        patch(bound, decode, {"metadata": {"annotations": {"infera.amd.com/other": "x"}}}),
        patch(bound, decode, {"metadata": {"labels": {"infera.amd.com/service": "prefill"}}}),
        patch(bound, decode, image, "json-patch+json"),
    ] == [(200, ""), (200, ""), (403, own_pod), (403, own_pod), (403, own_pod), (403, annotation)] + [
        (403, the_rest)
    ] * 2
    after = {pod["metadata"]["name"]: pod for pod in get(cluster, "-n", "attack", "pods")["items"]}
    for pod in (decode, prefill, server):
        now = after[pod["metadata"]["name"]]
        assert (now["metadata"].get("annotations"), now["metadata"]["labels"], now["spec"]) == (
            pod["metadata"].get("annotations"),
            pod["metadata"]["labels"],
            pod["spec"],
        )


def pods_by_workload(cluster: Cluster, namespace: str) -> dict[str, list[str]]:
    """The names of each workload's pods (by kind/name, a Deployment's through its ReplicaSets),
    as its controller made them."""
    deployment_of = {
        rs["metadata"]["name"]: rs["metadata"]["ownerReferences"][0]["name"]
        for rs in get(cluster, "-n", namespace, "replicasets")["items"]
    }
    named: dict[str, list[str]] = {}
    for pod in get(cluster, "-n", namespace, "pods")["items"]:
        owner = pod["metadata"]["ownerReferences"][0]
        workload = (
            f"Deployment/{deployment_of[owner['name']]}"
            if owner["kind"] == "ReplicaSet"
            else f"{owner['kind']}/{owner['name']}"
        )
        named.setdefault(workload, []).append(pod["metadata"]["name"])
    return {workload: sorted(names) for workload, names in named.items()}


def test_the_rendered_graph_serves_a_chat_completion_with_discovery_through_the_real_api_server(
    installed: Installed,
) -> None:
    """The data-plane sandbox (tests/support/e2e/sandbox.py: the runtime's real router and worker
    wrapper, a real NATS, the stand-in engine) runs the graph the controllers made here: its
    pods under the names the real Pods have, each container holding a TokenRequest token of its
    pod's ServiceAccount bound to that Pod, the API server reached through a relay that passes TLS through. The
    worker registers by patching its own Pod, the router finds it with a watch and serves a
    chat completion; the audit log shows what the graph's accounts wrote, and the Pod keeps the
    record."""
    sandbox.need_sandbox()
    cluster, namespace = installed.cluster, "dataplane"
    assert cluster.kubectl("create", "namespace", namespace).returncode == 0
    with sandbox.workdir() as workdir:
        idep = {
            "apiVersion": "infera.amd.com/v1alpha1",
            "kind": "InferaDeployment",
            "metadata": {"name": "e2e", "namespace": namespace},
            "spec": {"image": "rocm/infera:v0.2.10", **mixed(build_tokenizer(workdir / "model"))},
        }
        cluster.apply(idep)
        wait_graph_ready(installed, namespace, "e2e")
        live = get(cluster, "-n", namespace, "idep", "e2e")
        pods = get(cluster, "-n", namespace, "pods")["items"]
        owned = children(cluster, namespace, live["metadata"]["uid"])
        api_socket = workdir / "api.sock"
        address = urlsplit(cluster.server)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(api_socket))
        listener.listen()
        stop_relay = sandbox.serve_relay(listener, lambda: socket.create_connection((address.hostname, address.port)))
        try:
            (workdir / "graph.json").write_text(
                json.dumps(
                    {
                        "idep": live,
                        "children": owned,
                        "scenario": "serves_and_routes_by_prefix",
                        "shared": str(SHARED.resolve()),
                        "api": {
                            "socket": str(api_socket),
                            "ca": Path(cluster.ca).read_text(),
                            "tokens": {
                                pod["metadata"]["name"]: cluster.token(
                                    namespace, pod["spec"]["serviceAccountName"], pod=pod
                                )
                                for pod in pods
                            },
                            "pod_names": pods_by_workload(cluster, namespace),
                        },
                    }
                )
            )
            result = sandbox.run(workdir)
        finally:
            stop_relay()
    assert result.returncode == 0, f"{result.stdout[-20000:]}\n{result.stderr[-5000:]}"
    # The worker's record, on its real Pod: its address in the sandbox, as the sandbox gave it.
    (worker,) = [pod for pod in pods if pod["metadata"]["labels"]["infera.amd.com/service"] == "worker"]
    (planned,) = [pod for pod in kubelet.pods(owned, namespace) if pod.owner == "Deployment/e2e-worker"]
    port = planned.spec["containers"][0]["ports"][0]["containerPort"]
    annotations = get(cluster, "-n", namespace, "pod", worker["metadata"]["name"])["metadata"]["annotations"]
    assert json.loads(annotations["infera.amd.com/worker-info"])["url"] == f"http://{planned.facts.ip}:{port}"
    writes = {
        (event["user"]["username"], event["verb"], event["objectRef"]["resource"], event["objectRef"].get("name"))
        for event in cluster.audit_writes_by_accounts_of(namespace)
    }
    account = worker["spec"]["serviceAccountName"]
    assert writes == {(f"system:serviceaccount:{namespace}:{account}", "patch", "pods", worker["metadata"]["name"])}


async def wait_for(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def comparable(status: dict[str, Any]) -> dict[str, Any]:
    """A status without what differs by clock alone."""
    kept = {key: value for key, value in status.items() if key != "conditions"}
    kept["conditions"] = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions", [])
    ]
    return kept


def ready_at_its_generation(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    """The graph's status once it says ready about its current spec."""
    idep = get(cluster, "-n", namespace, "idep", name)
    status = idep.get("status") or {}
    current = status.get("observedGeneration") == idep["metadata"]["generation"]
    return status if current and status.get("state") == "ready" else None


def rendered_keys(spec: dict[str, Any], name: str) -> set[tuple[str, str]]:
    obj = {
        "apiVersion": "infera.amd.com/v1alpha1",
        "kind": "InferaDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }
    rendered = subprocess.run(
        [str(Path(sys.executable).with_name("infera-hooks")), "render", "-", "-n", "changes"],
        input=json.dumps(obj), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    return {(doc["kind"], doc["metadata"]["name"]) for doc in yaml.safe_load_all(rendered.stdout) if doc}


# Each step puts another example's spec under the same graph: PD to mixed, to multi-node on a
# LeaderWorkerSet, to PD with GAIE, and back to PD without it.
CHANGES = ["single-node-mixed.yaml", "multinode-tp.yaml", "gaie-pd.yaml", "pd-disaggregated.yaml"]


def test_switching_shapes_prunes_and_creates_what_the_hook_renders_as_the_simulator_says(installed: Installed) -> None:
    cluster = installed.cluster
    parent = ready_graph(installed, "changes")
    uid = parent["metadata"]["uid"]
    simulated = Metacontroller(HookClient(installed.hooks_url), {**parent, "status": {}}, controller(*COMPONENTS))
    simulated.parent["metadata"]["namespace"] = "changes"
    simulated.converge()
    simulated.mark_ready()
    simulated.converge()
    for example in CHANGES:
        (idep,) = load_yaml(REPO / "examples" / example)
        replaced = cluster.kubectl(
            "patch",
            "-n",
            "changes",
            "idep",
            "qwen-pd",
            "--type=json",
            "-p",
            json.dumps([{"op": "replace", "path": "/spec", "value": idep["spec"]}]),
        )
        assert replaced.returncode == 0, replaced.stderr
        expected = rendered_keys(idep["spec"], "qwen-pd")
        gaie = (idep["spec"].get("gaie") or {}).get("enabled")
        if gaie:
            eventually(lambda: get(cluster, "-n", "changes", "httproutes")["items"], "the HTTPRoute")
            accept_gateway_routes(cluster, "changes")
        eventually(
            lambda: {(c["kind"], c["metadata"]["name"]) for c in children(cluster, "changes", uid)} == expected,
            f"{example}'s children",
        )
        waited = cluster.kubectl(
            "wait", "-n", "changes", "--for=condition=Ready", "idep/qwen-pd", "--timeout=120s", timeout=150
        )
        assert waited.returncode == 0, (example, waited.stderr, cluster.unready_pods("changes"))

        simulated.edit(lambda spec, new=idep["spec"]: (spec.clear(), spec.update(copy.deepcopy(new))))
        simulated.converge()
        simulated.mark_ready()
        simulated.gateway_accepts(True) if gaie else None
        simulated.converge()
        assert set(simulated.children) == expected, example
        real = eventually(lambda: ready_at_its_generation(cluster, "changes", "qwen-pd"), f"{example} ready")
        assert comparable(real) == comparable(simulated.parent["status"]), example


def test_an_autoscaler_owns_replicas_and_nothing_fights_it(installed: Installed, tmp_path: Path) -> None:
    """The autoscaling example's decode pool under the real HorizontalPodAutoscaler controller,
    fed by a custom metrics API with 20 requests waiting over the decode pods (the target is
    4 a pod): it scales the pool from 2 to 5 and stays there. Every version of the Deployment
    the API server stores, from a watch: the autoscaler's resize is its only change of spec, and
    Metacontroller records it in the last-applied annotation (the hook emits the live count)."""
    cluster = installed.cluster
    namespace = "autoscaled"
    assert cluster.kubectl("create", "namespace", namespace).returncode == 0
    listed = get(cluster, "-n", namespace, "deployments")["metadata"]["resourceVersion"]
    deployments = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    with (
        running_metrics_api(cluster, tmp_path, {"sglang_num_queue_reqs": 20}),
        versions_of(cluster, deployments, "qwen-auto-decode", listed) as seen,
    ):
        since = len(cluster.audit_writes(METACONTROLLER_USER))
        applied = cluster.kubectl("apply", "-n", namespace, "-f", str(REPO / "examples" / "pd-autoscaling.yaml"))
        assert applied.returncode == 0, applied.stderr
        deployment = lambda: get(cluster, "-n", namespace, "deployment", "qwen-auto-decode")  # noqa: E731
        eventually(lambda: seen, "Metacontroller to create the decode Deployment")
        eventually(lambda: deployment()["spec"]["replicas"] == 5, "the autoscaler to scale decode to 5", 180)
        eventually(lambda: deployment()["status"].get("readyReplicas") == 5, "five decode pods")
        hpa = lambda: get(cluster, "-n", namespace, "hpa", "qwen-auto-decode")["status"]  # noqa: E731
        scaled = hpa()["lastScaleTime"]
        # Its next evaluation, on five pods (4 waiting each, the target), wants five: it stands.
        eventually(
            lambda: (
                [m["pods"]["current"]["averageValue"] for m in hpa().get("currentMetrics") or [{}] if "pods" in m]
                == ["4"]
            ),
            "the autoscaler to evaluate five pods",
            timeout=60,
        )
        synced(installed, 3)
        assert (deployment()["spec"]["replicas"], hpa()["desiredReplicas"], hpa()["lastScaleTime"]) == (5, 5, scaled)
        eventually(
            lambda: seen and seen[-1]["metadata"]["resourceVersion"] == deployment()["metadata"]["resourceVersion"],
            "the watch to catch up",
            30,
        )
    # Each version against the one before: what changed besides status and bookkeeping.
    changes = []
    for before, after in zip(seen, seen[1:], strict=False):
        spec = jsonpatch.make_patch(before["spec"], after["spec"]).patch
        recorded = [
            json.loads(v["metadata"]["annotations"][LAST_APPLIED_ANNOTATION])["spec"]["replicas"]
            for v in (before, after)
        ]
        if spec or recorded[0] != recorded[1]:
            changes.append((spec, recorded[1]))
    assert changes == [([{"op": "replace", "path": "/replicas", "value": 5}], 2), ([], 5)], changes
    updates = [
        w
        for w in metacontroller_writes(cluster, namespace, since)
        if w == ("update", "deployments", "qwen-auto-decode")
    ]
    assert updates, "Metacontroller never recorded the autoscaler's resize"


Series = tuple[str, tuple[tuple[str, str], ...]]  # a metric's name and its labels, sorted


def exported(url: str, namespace: str) -> dict[Series, float]:
    """kube-state-metrics' samples of the InferaDeployments in `namespace` (read with
    prometheus_client's parser of the text format)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    families = text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families
        for sample in family.samples
        if sample.labels.get("namespace") == namespace
    }


def series(metric: str, **labels: str) -> Series:
    """A series of the graph `exported/qwen-pd`, as kube-state-metrics labels a custom resource's."""
    identity = {
        "customresource_group": "infera.amd.com",
        "customresource_kind": "InferaDeployment",
        "customresource_version": "v1alpha1",
        "namespace": "exported",
        "name": "qwen-pd",
    }
    return f"infera_inferadeployment_{metric}", tuple(sorted({**identity, **labels}.items()))


def test_kube_state_metrics_exports_each_graphs_state_replicas_and_conditions(
    installed: Installed, tmp_path: Path
) -> None:
    """The kube-state-metrics component: the released program, with the component's identity,
    arguments and configuration, reads a converged graph's status from the real API server."""
    from tests.support.kube_state_metrics import running_kube_state_metrics

    with running_kube_state_metrics(installed.cluster, tmp_path) as url:
        parent = ready_graph(installed, "exported")
        status = parent["status"]
        samples = eventually(
            lambda: (s := exported(url, "exported")).get(series("state", state="ready")) == 1 and s,
            "the graph's series",
            60,
        )
    expected = {
        **{series("state", state=state): float(state == "ready") for state in get_args(State)},
        series("generation"): parent["metadata"]["generation"],
        series("observed_generation"): status["observedGeneration"],
        **{
            series("condition", type=c["type"], reason=c["reason"]): float(c["status"] == "True")
            for c in status["conditions"]
        },
    }
    for service, counts in status["services"].items():
        expected[series("service_replicas", service=service)] = counts["replicas"]
        expected[series("service_ready_replicas", service=service)] = counts["readyReplicas"]
    assert samples == expected
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Ready": "True",
        "ChildrenCreated": "True",
        "SpecValid": "True",
        "ChildKindsRegistered": "True",
    }
    assert all(counts["readyReplicas"] == counts["replicas"] > 0 for counts in status["services"].values())
