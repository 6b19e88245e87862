"""The fake Kubernetes API server of the e2e sandbox (tests/support/e2e/kube_api.py), proven against the
runtime's own Kubernetes code where it can be: the router's KubernetesRegistry, the worker's
K8sRegistrationClient and the scaling API's DeploymentScaler, run in-process against it. What
the runtime cannot show (error Statuses, selector edge cases, history expiry on a raw stream) is
checked on the wire, against the shapes the real API server gives."""

import asyncio
import contextlib
import importlib
import json
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.support.e2e.kube_api import KubeAPI
from tests.support.prerequisites import RUNTIME, need_runtime

NS = "ml"
DEPLOYMENT_LABEL = "infera.amd.com/deployment"
SELECTOR = f"{DEPLOYMENT_LABEL}=demo"
WORKER_INFO = "infera.amd.com/worker-info"
MERGE = {"Content-Type": "application/merge-patch+json"}
HISTORY = 8

# The runtime's make_client passes its CA file as `verify=<path>`, which httpx 0.28 deprecates;
# that is the runtime's to change, not something these tests can act on.
pytestmark = pytest.mark.filterwarnings("ignore:`verify=<str>` is deprecated:DeprecationWarning")


def pod(name: str, ip: str, labels: dict[str, str] | None = None, **status: Any) -> dict[str, Any]:
    """A scheduled, running Pod of the `demo` deployment, as the sandbox builds one."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {DEPLOYMENT_LABEL: "demo"} if labels is None else labels,
            "annotations": {},
        },
        "spec": {"containers": [{"name": "main", "image": "rocm/infera"}], "terminationGracePeriodSeconds": 60},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], **status},
    }


@pytest.fixture
def kube() -> Iterator[KubeAPI]:
    with KubeAPI("127.0.0.1", history=HISTORY) as api:
        yield api


@pytest.fixture
def client(kube: KubeAPI) -> Iterator[httpx.Client]:
    """A client as the runtime's: the mounted CA and token. Its read timeout turns a watch event
    that never comes into a failure instead of a hang."""
    context = ssl.create_default_context(cadata=kube.ca_pem)
    with httpx.Client(
        base_url=kube.url, verify=context, timeout=5, headers={"Authorization": f"Bearer {kube.token}"}
    ) as http:
        yield http


@pytest.fixture
def runtime(kube: KubeAPI, tmp_path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """The runtime's Kubernetes modules, in-cluster configuration pointed at `kube`: its fixed
    service-account paths moved to a directory of ours, the service variables set as kubelet
    sets them."""
    need_runtime()
    monkeypatch.syspath_prepend(str(RUNTIME))
    k8s_client = importlib.import_module("infera.common.k8s_client")
    account = kube.write_service_account(tmp_path / "serviceaccount", namespace=NS)
    monkeypatch.setattr(k8s_client, "_TOKEN_PATH", str(account / "token"))
    monkeypatch.setattr(k8s_client, "_CA_PATH", str(account / "ca.crt"))
    monkeypatch.setattr(k8s_client, "_NAMESPACE_PATH", str(account / "namespace"))
    for name, value in kube.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("POD_NAME", raising=False)
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    return SimpleNamespace(
        discovery=importlib.import_module("infera.common.discovery_k8s"),
        registration=importlib.import_module("infera.common.registration_k8s"),
        scaling=importlib.import_module("infera.server.scaling"),
        worker_pool=importlib.import_module("infera.common.worker_pool"),
        EngineConfig=importlib.import_module("infera.engine.base").EngineConfig,
    )


async def eventually(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class Fleet:
    """A router's registry and the workers registering with it, all through the fake."""

    def __init__(self, runtime: SimpleNamespace) -> None:
        self.runtime = runtime
        self.added: list[str] = []
        self.removed: list[str] = []
        self.workers: dict[str, Any] = {}
        # No namespace given: the registry reads the mounted one, as the rendered router does.
        self.registry = runtime.discovery.KubernetesRegistry(
            SELECTOR,
            on_worker_added=lambda info: self.added.append(info.worker_id),
            on_worker_removed=self.removed.append,
        )

    async def register(self, pod_name: str, ip: str) -> None:
        """Register (again, for a pod that has: what the heartbeat does) as the worker in that pod."""
        if pod_name not in self.workers:
            self.workers[pod_name] = self.runtime.registration.K8sRegistrationClient(pod_name=pod_name)
        await self.workers[pod_name].register(
            self.runtime.EngineConfig(model_name="Qwen/Qwen3-0.6B", host=ip, port=8000)
        )

    async def deregister(self, pod_name: str) -> bool:
        return await self.workers.pop(pod_name).deregister()

    async def stop(self) -> None:
        """The workers shut down (deregistering, which also closes their clients), then the router."""
        for pod_name in list(self.workers):
            await self.deregister(pod_name)
        await self.registry.stop()

    def active(self) -> set[str]:
        return {w.worker_id for w in self.registry.pool.list_active()}

    def known(self) -> set[str]:
        return {w.worker_id for w in self.registry.list_all()}


@contextlib.asynccontextmanager
async def two_workers(runtime: SimpleNamespace, kube: KubeAPI) -> AsyncIterator[Fleet]:
    """A router's registry that sees two registered workers, demo-worker-0 and demo-worker-1."""
    for index in range(2):
        kube.add_pod(pod(f"demo-worker-{index}", f"10.42.0.{10 + index}"))
    fleet = Fleet(runtime)
    await fleet.registry.start()
    try:
        for index in range(2):
            await fleet.register(f"demo-worker-{index}", f"10.42.0.{10 + index}")
        await eventually(lambda: len(fleet.active()) == 2, "both workers")
        yield fleet
    finally:
        await fleet.stop()


def lists(kube: KubeAPI) -> int:
    """How many times the pods were listed (not watched): 1 per start, 1 per re-list."""
    return sum(1 for c in kube.events if c.path.endswith("/pods") and "watch" not in c.query and c.status == 200)


# -- the runtime against the fake ------------------------------------------------------------


def test_a_worker_registers_and_deregisters_through_its_pod(runtime: SimpleNamespace, kube: KubeAPI) -> None:
    kube.add_pod(pod("demo-worker-0", "10.42.0.10"))
    kube.add_pod(pod("demo-server-0", "10.42.0.2"))
    stranger = pod("other-worker-0", "10.42.0.30", labels={DEPLOYMENT_LABEL: "other"})
    stranger["metadata"]["annotations"][WORKER_INFO] = json.dumps(
        {"worker_id": "10.42.0.30:8000", "url": "http://10.42.0.30:8000", "model_name": "Qwen/Qwen3-0.6B"}
    )
    kube.add_pod(stranger)

    async def scenario() -> None:
        fleet = Fleet(runtime)
        await fleet.registry.start()
        try:
            assert fleet.known() == set()
            await fleet.register("demo-worker-0", "10.42.0.10")
            await eventually(lambda: fleet.active() == {"10.42.0.10:8000"}, "the worker to be routable")
            assert fleet.added == ["10.42.0.10:8000"]

            stored = kube.pod(NS, "demo-worker-0")
            assert json.loads(stored["metadata"]["annotations"][WORKER_INFO])["url"] == "http://10.42.0.10:8000"
            (patch,) = [c for c in kube.events if c.method == "PATCH"]
            assert patch.path == f"/api/v1/namespaces/{NS}/pods/demo-worker-0"
            assert set(patch.body["metadata"]["annotations"]) == {WORKER_INFO}

            # The heartbeat re-asserts an unchanged record: stored as nothing, as the real
            # server does, so it costs the router no event.
            await fleet.register("demo-worker-0", "10.42.0.10")
            assert kube.pod(NS, "demo-worker-0")["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]

            assert await fleet.deregister("demo-worker-0") is True
            await eventually(lambda: fleet.known() == set(), "the deregistered worker to leave")
            assert fleet.removed == ["10.42.0.10:8000"]
            assert "annotations" not in kube.pod(NS, "demo-worker-0")["metadata"]  # null removed it; {} is omitted
        finally:
            await fleet.stop()

    asyncio.run(scenario())


def test_a_pod_marked_for_deletion_leaves_routing_before_it_goes(runtime: SimpleNamespace, kube: KubeAPI) -> None:
    async def scenario() -> None:
        async with two_workers(runtime, kube) as fleet:
            condemned = kube.mark_deleting(NS, "demo-worker-0")
            assert condemned["metadata"]["deletionGracePeriodSeconds"] == 60  # the pod's own grace period
            await eventually(lambda: fleet.active() == {"10.42.0.11:8000"}, "the condemned worker to leave routing")
            draining = runtime.worker_pool.WorkerStatus.DRAINING
            assert fleet.registry.pool.get("10.42.0.10:8000").status is draining  # still listed, as draining
            assert fleet.removed == ["10.42.0.10:8000"]

            kube.remove_pod(NS, "demo-worker-0")
            await eventually(lambda: fleet.known() == {"10.42.0.11:8000"}, "the deleted pod's worker to go")
            assert fleet.removed == ["10.42.0.10:8000"]  # announced once

    asyncio.run(scenario())


def test_a_watch_cut_short_resumes_from_its_resource_version(runtime: SimpleNamespace, kube: KubeAPI) -> None:
    async def scenario() -> None:
        async with two_workers(runtime, kube) as fleet:
            with kube.pause_watches():
                kube.remove_pod(NS, "demo-worker-1")
            await eventually(lambda: fleet.known() == {"10.42.0.10:8000"}, "the missed deletion to arrive")
            assert lists(kube) == 1  # replayed from the history, no re-list

    asyncio.run(scenario())


def test_an_expired_watch_makes_the_registry_relist(runtime: SimpleNamespace, kube: KubeAPI) -> None:
    async def scenario() -> None:
        async with two_workers(runtime, kube) as fleet:
            with kube.pause_watches():
                kube.remove_pod(NS, "demo-worker-1")  # an event the registry will never be sent
                for index in range(HISTORY):
                    kube.add_pod(pod(f"demo-nats-{index}", f"10.42.0.{50 + index}"))
            await eventually(lambda: lists(kube) == 2, "the registry to re-list")
            await eventually(lambda: fleet.known() == {"10.42.0.10:8000"}, "the re-list to drop the deleted pod")
            assert fleet.removed == ["10.42.0.11:8000"]

    asyncio.run(scenario())


def test_the_scaling_api_reads_and_patches_its_deployment(runtime: SimpleNamespace, kube: KubeAPI) -> None:
    router = pod("demo-server-0", "10.42.0.2")
    router["metadata"]["labels"][runtime.scaling.LABEL_SERVICE] = "server"
    kube.add_pod(router)
    pending = pod(
        "demo-decode-0",
        "",
        labels={DEPLOYMENT_LABEL: "demo", runtime.scaling.LABEL_SERVICE: "decode"},
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient amd.com/gpu.",
            }
        ],
    )
    kube.add_pod(pending)
    status = {
        "state": "Progressing",
        "services": {
            "prefill": {"kind": "Deployment", "replicas": 1, "readyReplicas": 1},
            "decode": {"kind": "Deployment", "replicas": 1, "readyReplicas": 0},
        },
    }
    kube.add_object(
        {
            "apiVersion": "infera.amd.com/v1alpha1",
            "kind": "InferaDeployment",
            "metadata": {"name": "demo", "namespace": NS},
            "spec": {
                "services": {"prefill": {"role": "prefill", "replicas": 1}, "decode": {"role": "decode", "replicas": 1}}
            },
            "status": status,
        }
    )

    async def scenario() -> None:
        scaler = runtime.scaling.DeploymentScaler(pod_name="demo-server-0")
        snapshot = await scaler.snapshot()
        assert snapshot["deployment"] == "demo" and snapshot["namespace"] == NS
        assert snapshot["services"]["decode"]["blocked"].startswith("Unschedulable: 0/3 nodes")
        assert "blocked" not in snapshot["services"]["prefill"]

        with pytest.raises(runtime.scaling.ScalingError):
            await scaler.scale({"encode": 2})
        assert not [c for c in kube.events if c.method == "PATCH"]

        scaled = await scaler.scale({"decode": 2})
        assert scaled["services"]["decode"]["replicas"] == 2

    asyncio.run(scenario())
    stored = kube.object("InferaDeployment", NS, "demo")
    assert stored["spec"]["services"]["decode"] == {"role": "decode", "replicas": 2}
    assert stored["metadata"]["generation"] == 2 and stored["status"] == status
    (patch,) = [c for c in kube.events if c.method == "PATCH"]
    assert patch.path == f"/apis/infera.amd.com/v1alpha1/namespaces/{NS}/inferadeployments/demo"
    assert patch.body == {"spec": {"services": {"decode": {"replicas": 2}}}}


# -- the API's semantics on the wire ----------------------------------------------------------


def test_errors_are_statuses_with_the_real_codes(kube: KubeAPI, client: httpx.Client) -> None:
    kube.add_pod(pod("demo-worker-0", "10.42.0.10"))
    path = f"/api/v1/namespaces/{NS}/pods/demo-worker-0"

    anonymous = httpx.get(kube.url + path, verify=ssl.create_default_context(cadata=kube.ca_pem))
    wrong = client.get(path, headers={"Authorization": "Bearer not-the-token"})
    for reply in (anonymous, wrong):
        assert reply.status_code == 401
        assert reply.json() == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "Unauthorized",
            "reason": "Unauthorized",
            "code": 401,
        }

    missing = client.get(f"/api/v1/namespaces/{NS}/pods/nope")
    assert missing.status_code == 404
    assert missing.json()["details"] == {"name": "nope", "kind": "pods"}
    assert missing.json()["message"] == 'pods "nope" not found'
    missing = client.get(f"/apis/infera.amd.com/v1alpha1/namespaces/{NS}/inferadeployments/nope")
    assert missing.json()["message"] == 'inferadeployments.infera.amd.com "nope" not found'
    assert client.get(f"/api/v1/namespaces/{NS}/services").status_code == 404
    assert client.post(f"/api/v1/namespaces/{NS}/pods", json={}).status_code == 405

    patch = json.dumps({"metadata": {"labels": {"a": "b"}}})
    for content_type in ("application/strategic-merge-patch+json", "application/json-patch+json", "application/json"):
        reply = client.patch(path, content=patch, headers={"Content-Type": content_type})
        assert (reply.status_code, reply.json()["reason"]) == (415, "UnsupportedMediaType")
    assert client.patch(f"/api/v1/namespaces/{NS}/pods/nope", content=patch, headers=MERGE).status_code == 404
    assert client.patch(path, content="{", headers=MERGE).status_code == 400
    assert (
        client.patch(path, content=json.dumps({"metadata": {"annotations": {"a": 1}}}), headers=MERGE).status_code
        == 400
    )
    too_big = {"metadata": {"annotations": {WORKER_INFO: "x" * 256 * 1024}}}
    reply = client.patch(path, content=json.dumps(too_big), headers=MERGE)
    assert (reply.status_code, reply.json()["reason"]) == (422, "Invalid")
    stale = {"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}}
    assert client.patch(path, content=json.dumps(stale), headers=MERGE).status_code == 409
    assert "a" not in client.get(path).json()["metadata"]["labels"]


def test_merge_patch_is_rfc_7386_with_the_servers_rules(kube: KubeAPI, client: httpx.Client) -> None:
    created = kube.add_pod(pod("demo-worker-0", "10.42.0.10"))
    path = f"/api/v1/namespaces/{NS}/pods/demo-worker-0"

    def merge(body: dict[str, Any]) -> dict[str, Any]:
        reply = client.patch(
            path, content=json.dumps(body), headers={"Content-Type": f"{MERGE['Content-Type']}; charset=utf-8"}
        )
        assert reply.status_code == 200, reply.text
        return reply.json()

    first = merge(
        {
            "metadata": {"annotations": {"a": "1", "b": "2"}, "labels": {"x": "y"}},
            "status": {"phase": "Failed"},
            "spec": {"nodeName": "gpu-node-1"},
        }
    )
    assert first["metadata"]["annotations"] == {"a": "1", "b": "2"}
    assert first["metadata"]["labels"] == {DEPLOYMENT_LABEL: "demo", "x": "y"}
    assert first["status"]["phase"] == "Running"  # only the status subresource writes status
    assert first["metadata"]["uid"] == created["metadata"]["uid"]
    assert int(first["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert first["metadata"]["generation"] == 2  # a spec change

    second = merge({"metadata": {"annotations": {"a": None}, "uid": "forged"}})
    assert second["metadata"]["annotations"] == {"b": "2"}
    assert second["metadata"]["uid"] == created["metadata"]["uid"]
    assert second["metadata"]["generation"] == 2
    unchanged = merge({"metadata": {"annotations": {"b": "2", "gone": None}}})
    assert unchanged == second  # a no-op write: same resourceVersion, and no event
    last = merge({"metadata": {"annotations": {"b": None}}})
    assert "annotations" not in last["metadata"]  # {} is omitted, as ObjectMeta's omitempty does
    current = {"metadata": {"resourceVersion": last["metadata"]["resourceVersion"], "labels": {"x": "z"}}}
    assert merge(current)["metadata"]["labels"]["x"] == "z"  # a matching precondition passes


def test_label_selectors(kube: KubeAPI, client: httpx.Client) -> None:
    kube.add_pod(pod("a", "10.42.0.10", labels={"app": "infera", "role": "decode"}))
    kube.add_pod(pod("b", "10.42.0.11", labels={"app": "infera", "role": "prefill"}))
    kube.add_pod(pod("c", "10.42.0.12", labels={"app": "nats"}))
    cases = {
        "": ["a", "b", "c"],
        "app=infera": ["a", "b"],
        "app==infera,role=decode": ["a"],
        " app = infera , role != decode ": ["b"],
        "role!=decode": ["b", "c"],  # != matches a pod without the label
        "role": ["a", "b"],
        "!role": ["c"],
        "app=nope": [],
    }
    for selector, names in cases.items():
        reply = client.get(f"/api/v1/namespaces/{NS}/pods", params={"labelSelector": selector})
        body = reply.json()
        assert [item["metadata"]["name"] for item in body["items"]] == names, selector
        assert body["kind"] == "PodList" and body["apiVersion"] == "v1"
        assert body["metadata"]["resourceVersion"] == str(int(kube.pod(NS, "c")["metadata"]["resourceVersion"]))
        assert all("kind" not in item and "apiVersion" not in item for item in body["items"])
    assert client.get(f"/api/v1/namespaces/{NS}/pods").json()["items"]
    assert client.get("/api/v1/namespaces/elsewhere/pods").json()["items"] == []
    for bad in ("app in (infera)", "a=b,", "!role=decode", "bad key=x", "app=has space", "app=-x"):
        reply = client.get(f"/api/v1/namespaces/{NS}/pods", params={"labelSelector": bad})
        assert (reply.status_code, reply.json()["reason"]) == (400, "BadRequest"), bad


def read_events(client: httpx.Client, count: int, **params: str) -> list[dict[str, Any]]:
    """The first `count` events of a watch of the namespace's pods."""
    events = []
    with client.stream("GET", f"/api/v1/namespaces/{NS}/pods", params={"watch": "true", **params}) as stream:
        assert stream.status_code == 200 and stream.headers["transfer-encoding"] == "chunked"
        for line in stream.iter_lines():
            events.append(json.loads(line))
            if len(events) == count:
                return events
    raise AssertionError(f"the stream ended after {events}")


def test_a_watch_follows_its_selector_and_expires(kube: KubeAPI, client: httpx.Client) -> None:
    start = kube.add_pod(pod("demo-worker-0", "10.42.0.10"))["metadata"]["resourceVersion"]
    path = f"/api/v1/namespaces/{NS}/pods/demo-worker-0"
    for labels in ({"moved": "yes", DEPLOYMENT_LABEL: None}, {DEPLOYMENT_LABEL: "demo"}):
        assert (
            client.patch(path, content=json.dumps({"metadata": {"labels": labels}}), headers=MERGE).status_code == 200
        )
    kube.mark_deleting(NS, "demo-worker-0")
    kube.remove_pod(NS, "demo-worker-0")

    events = read_events(client, 4, resourceVersion=start, labelSelector=SELECTOR)
    assert [e["type"] for e in events] == ["DELETED", "ADDED", "MODIFIED", "DELETED"]
    assert events[0]["object"]["metadata"]["labels"] == {DEPLOYMENT_LABEL: "demo"}  # its state before it left
    assert events[2]["object"]["metadata"]["deletionTimestamp"]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(start)
    assert all(e["object"]["kind"] == "Pod" for e in events)

    for index in range(HISTORY):
        kube.add_pod(pod(f"filler-{index}", f"10.42.0.{50 + index}", labels={}))
    (expired,) = read_events(client, 1, resourceVersion=start, labelSelector=SELECTOR)
    assert expired["type"] == "ERROR"
    assert expired["object"]["code"] == 410 and expired["object"]["reason"] == "Expired"

    current = read_events(client, 2, labelSelector="")  # no resourceVersion: the current state first
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in current] == [
        ("ADDED", "filler-0"),
        ("ADDED", "filler-1"),
    ]


def test_stop_ends_open_watches_promptly(kube: KubeAPI, client: httpx.Client) -> None:
    kube.add_pod(pod("demo-worker-0", "10.42.0.10"))
    ended = threading.Semaphore(0)

    def watch() -> None:
        # A stream cut by the server's shutdown may end mid-chunk; ending is what is tested.
        with contextlib.suppress(httpx.HTTPError):
            with client.stream("GET", f"/api/v1/namespaces/{NS}/pods", params={"watch": "true"}) as stream:
                for _ in stream.iter_lines():
                    pass
        ended.release()

    watchers = [threading.Thread(target=watch) for _ in range(3)]
    for watcher in watchers:
        watcher.start()
    deadline = time.monotonic() + 5
    while sum(1 for c in kube.events if c.query.get("watch")) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    began = time.monotonic()
    kube.stop()
    for watcher in watchers:
        watcher.join(timeout=5)
    assert not any(w.is_alive() for w in watchers)
    assert all(ended.acquire(blocking=False) for _ in watchers)
    assert time.monotonic() - began < 1.0


def test_the_certificate_names_the_service_and_the_address(kube: KubeAPI) -> None:
    context = ssl.create_default_context(cadata=kube.ca_pem)
    for name in ("kubernetes", "kubernetes.default", "kubernetes.default.svc", "127.0.0.1"):
        with socket.create_connection(("127.0.0.1", kube.port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname=name) as tls:
                assert tls.version()
    with socket.create_connection(("127.0.0.1", kube.port), timeout=5) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            context.wrap_socket(raw, server_hostname="example.com")
