"""What the control plane tier puts in a running loopback cluster: kwok nodes with GPUs,
volumes for the claims, the LeaderWorkerSet controller with its webhooks, ServiceAccount tokens
and the API server's audit log of writes.
"""

import json
import os
import signal
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.controlplane import programs, running_cluster
from tests.support.loopback import controller_configuration, free_port, loopback_certificate, wait_ready
from tests.support.prerequisites import go_module

LWS_MODULE = "sigs.k8s.io/lws@v0.9.0"
# The writes the audit log records, at the Metadata level (no bodies); reads are not logged.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "verbs": ["create", "update", "patch", "delete", "deletecollection"]},
        {"level": "None"},
    ],
}
# Enough for every example at once: multinode-tp asks 8 GPUs and 1Ti of memory per pod.
NODE_CAPACITY = {
    "cpu": "256",
    "memory": "4Ti",
    "pods": "110",
    "ephemeral-storage": "10Ti",
    "amd.com/gpu": "8",
    "nvidia.com/gpu": "8",
}
# The scheduler spreads pods, so one-GPU pods soon touch every node: enough nodes stay whole for
# the 8-GPU pods of multi-node pools.
NODE_NAMES = ["gpu-node-a", "gpu-node-b", *(f"gpu-node-{index}" for index in range(1, 31))]
# The fabric domain label of examples/pd-1p1d-mooncake.yaml's placement: four nodes a domain.
FABRIC_DOMAIN_LABEL = "infera.amd.com/fabric-domain"
NODES_PER_DOMAIN = 4


@dataclass
class Cluster:
    kubeconfig: Path
    audit_log: Path
    config: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.config = yaml.safe_load(self.kubeconfig.read_text())

    @property
    def server(self) -> str:
        return str(self.config["clusters"][0]["cluster"]["server"])

    @property
    def ca(self) -> str:
        return str(self.config["clusters"][0]["cluster"]["certificate-authority"])

    def kubectl(
        self, *arguments: str, stdin: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        command = [str(programs()["kubectl"]), "--kubeconfig", str(self.kubeconfig), *arguments]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=timeout)

    def admin(self, timeout: float = 30) -> httpx.Client:
        """A client with the kubeconfig's identity (system:masters)."""
        user = self.config["users"][0]["user"]
        tls = ssl.create_default_context(cafile=self.ca)
        tls.load_cert_chain(user["client-certificate"], user["client-key"])
        return httpx.Client(base_url=self.server, verify=tls, timeout=timeout)

    def as_token(self, token: str) -> httpx.Client:
        tls = ssl.create_default_context(cafile=self.ca)
        return httpx.Client(base_url=self.server, verify=tls, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def token(self, namespace: str, service_account: str, hours: int = 1, pod: dict[str, Any] | None = None) -> str:
        """A token of the ServiceAccount, from its TokenRequest subresource; bound to `pod`, it
        is what a kubelet mounts into that pod, with its pod-name and pod-uid claims (kubelet's,
        an hour, is renewed; this one is not)."""
        spec: dict[str, Any] = {"expirationSeconds": hours * 3600}
        if pod is not None:
            metadata = pod["metadata"]
            spec["boundObjectRef"] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": metadata["name"],
                "uid": metadata["uid"],
            }
        reply = self.admin().post(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        reply.raise_for_status()
        return str(reply.json()["status"]["token"])

    def kubeconfig_for(self, path: Path, namespace: str, service_account: str, hours: int = 1) -> Path:
        """A kubeconfig at `path` whose identity is the ServiceAccount, as its pod would have."""
        token = self.token(namespace, service_account, hours=hours)
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "local", "cluster": {"server": self.server, "certificate-authority": self.ca}}
                    ],
                    "users": [{"name": service_account, "user": {"token": token}}],
                    "contexts": [{"name": "local", "context": {"cluster": "local", "user": service_account}}],
                    "current-context": "local",
                }
            )
        )
        return path

    def apply(self, *documents: dict[str, Any]) -> None:
        applied = self.kubectl(
            "apply",
            "--server-side",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(documents)}),
        )
        assert applied.returncode == 0, applied.stderr

    def unready_pods(self, namespace: str) -> list[str]:
        """Each pod of the namespace that does not run, with why (for a failure's message)."""
        listed = self.kubectl("get", "pods", "-n", namespace, "-o", "json")
        pods = json.loads(listed.stdout)["items"] if listed.returncode == 0 else []
        return [
            f"{pod['metadata']['name']}: {pod['status'].get('phase')} "
            + "; ".join(c.get("message", "") for c in pod["status"].get("conditions", []) if c.get("status") != "True")
            for pod in pods
            if pod["status"].get("phase") != "Running"
        ]

    def audit_writes(self, user: str) -> list[dict[str, Any]]:
        """Every completed write the audit log holds by `user`."""
        return [event for event in self.completed_writes() if event["user"]["username"] == user]

    def audit_writes_by_accounts_of(self, namespace: str) -> list[dict[str, Any]]:
        """Every completed write the audit log holds by a ServiceAccount of `namespace`."""
        prefix = f"system:serviceaccount:{namespace}:"
        return [event for event in self.completed_writes() if event["user"]["username"].startswith(prefix)]

    def audit_writes_to(self, namespace: str, resource: str, name: str) -> list[dict[str, Any]]:
        """Every completed write the audit log holds to one object (its subresources included)."""
        return [
            event
            for event in self.completed_writes()
            if (event["objectRef"].get("namespace"), event["objectRef"].get("resource"), event["objectRef"].get("name"))
            == (namespace, resource, name)
        ]

    def completed_writes(self) -> list[dict[str, Any]]:
        """Every completed write the audit log holds, in order. The API server may be writing
        its last line as it is read: a line not ended yet is left for a later read."""
        complete = self.audit_log.read_text().split("\n")[:-1]
        events = [json.loads(line) for line in complete if line]
        return [event for event in events if event["stage"] == "ResponseComplete"]


def accepted_status(resource: str, generation: int) -> dict[str, Any]:
    """The Gateway controller's part: the status by which it reports an InferencePool or an
    HTTPRoute (`resource`) at `generation` Accepted by the graph's Gateway."""
    parent_ref = {"name": "inference-gateway"}
    if resource == "inferencepools":
        parent_ref = {"group": "gateway.networking.k8s.io", "kind": "Gateway", **parent_ref}
    condition = {
        "type": "Accepted",
        "status": "True",
        "reason": "Accepted",
        "message": "",
        "lastTransitionTime": "2026-12-01T00:00:00Z",
        "observedGeneration": generation,
    }
    return {"parents": [{"parentRef": parent_ref, "controllerName": "example.com/gateway", "conditions": [condition]}]}


@contextmanager
def graph_namespace(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A namespace of its own for a test's graphs, emptied when it is done: the graphs first,
    through the finalize hook (a namespace deleted under them would have the syncs meanwhile
    recreate what the namespace controller removed, and the API server refuse them), then the
    namespace, so the nodes are left as they were found."""
    created = cluster.kubectl("create", "namespace", namespace)
    assert created.returncode == 0, created.stderr
    yield namespace
    graphs = cluster.kubectl("delete", "-n", namespace, "idep", "--all", "--timeout=150s", timeout=180)
    assert graphs.returncode == 0, (graphs.stderr, cluster.unready_pods(namespace))
    emptied = cluster.kubectl("delete", "namespace", namespace, "--timeout=150s", timeout=180)
    assert emptied.returncode == 0, (emptied.stderr, cluster.unready_pods(namespace))


@contextmanager
def versions_of(cluster: Cluster, collection: str, name: str, resource_version: str) -> Iterator[list[dict[str, Any]]]:
    """Every version of the object `name` of the API path `collection` the API server stores from
    `resource_version` on, as a watch delivers them (`kubectl get -w`): none is missed, however
    brief. The watch ends every two seconds on the server's side and resumes from the last
    version seen, until the block ends."""
    seen: list[dict[str, Any]] = []
    errors: list[str] = []
    stop = threading.Event()

    def run() -> None:
        version = resource_version
        with cluster.admin() as client:
            while not stop.is_set():
                params = {
                    "watch": "true",
                    "fieldSelector": f"metadata.name={name}",
                    "resourceVersion": version,
                    "timeoutSeconds": "2",
                }
                try:
                    with client.stream("GET", collection, params=params) as reply:
                        reply.raise_for_status()
                        for line in reply.iter_lines():
                            if not line:
                                continue
                            event = json.loads(line)
                            if event["type"] not in ("ADDED", "MODIFIED"):
                                errors.append(json.dumps(event))
                                return
                            seen.append(event["object"])
                            version = event["object"]["metadata"]["resourceVersion"]
                except httpx.HTTPError as error:
                    errors.append(repr(error))
                    return

    thread = threading.Thread(target=run, name=f"watch-{name}", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive(), "the watch did not end"
    assert errors == []


def kwok_node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A node kwok keeps Ready, running its pods without containers."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **(labels or {}),
            },
        },
        "status": {"capacity": NODE_CAPACITY, "allocatable": NODE_CAPACITY},
    }


def volume(name: str, storage_class: str = "") -> dict[str, Any]:
    """A volume any claim of the class can bind (the class's provisioner's part)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "10Ti"},
            "accessModes": ["ReadWriteOnce", "ReadWriteMany", "ReadOnlyMany"],
            "storageClassName": storage_class,
            "persistentVolumeReclaimPolicy": "Delete",
            "hostPath": {"path": f"/tmp/{name}"},
        },
    }


@contextmanager
def running_cluster_with_nodes(workdir: Path, name: str = "infera-test") -> Iterator[Cluster]:
    """A loopback cluster (tests/support/controlplane.py) that audits writes, with kwok GPU
    nodes and volumes in place."""
    policy = workdir / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    with running_cluster(workdir, name, audit_policy=policy) as kubeconfig:
        cluster = Cluster(kubeconfig, workdir / "kwok" / "clusters" / name / "logs" / "audit.log")
        cluster.apply(
            *(
                kwok_node(node, {FABRIC_DOMAIN_LABEL: f"fabric-{index // NODES_PER_DOMAIN}"})
                for index, node in enumerate(NODE_NAMES)
            )
        )
        cluster.apply(*(volume(f"plain-{index}") for index in range(40)))
        cluster.apply(*(volume(f"fast-rwx-{index}", "fast-rwx") for index in range(10)))
        yield cluster


def _webhook(
    name: str, path: str, port: int, ca_bundle: str, group: str, resource: str, verbs: list[str]
) -> dict[str, Any]:
    hook: dict[str, Any] = {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "rules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": verbs, "resources": [resource]}],
    }
    if resource == "pods":
        # As LWS's own manifests restrict its Pod webhooks: only pods of a LeaderWorkerSet.
        hook["objectSelector"] = {
            "matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]
        }
    return hook


@contextmanager
def running_lws(cluster: Cluster, workdir: Path) -> Iterator[None]:
    """The LeaderWorkerSet controller as a loopback process, its CRDs installed and its
    admission webhooks registered by URL (loopback_certificate)."""
    module = go_module(LWS_MODULE)
    for crd in ("leaderworkerset.x-k8s.io_leaderworkersets.yaml", "disaggregatedset.x-k8s.io_disaggregatedsets.yaml"):
        applied = cluster.kubectl("apply", "--server-side", "-f", str(module / "config" / "crd" / "bases" / crd))
        assert applied.returncode == 0, applied.stderr
    certs = workdir / "lws-certs"
    ca_bundle = loopback_certificate(certs)
    webhook_port, health_port = free_port(), free_port()
    config = workdir / "lws-config.yaml"
    config.write_text(
        yaml.safe_dump(controller_configuration("config.lws.x-k8s.io/v1alpha1", certs, webhook_port, health_port))
    )
    log = (workdir / "lws-controller.log").open("w")
    process = subprocess.Popen(
        [str(programs()["lws-controller"]), "--config", str(config), "--kubeconfig", str(cluster.kubeconfig)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "NAMESPACE": "lws-system"},
    )
    try:
        wait_ready(process, f"http://127.0.0.1:{health_port}/readyz", workdir / "lws-controller.log")
        lws = ("leaderworkerset.x-k8s.io", "leaderworkersets")
        cluster.apply(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": "lws-mutating"},
                "webhooks": [
                    _webhook("mleaderworkerset.kb.io", "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset", webhook_port, ca_bundle, *lws, ["CREATE", "UPDATE"]),
                    _webhook("mpod.kb.io", "/mutate--v1-pod", webhook_port, ca_bundle, "", "pods", ["CREATE"]),
                ],
            },
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": "lws-validating"},
                "webhooks": [
                    _webhook("vleaderworkerset.kb.io", "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset", webhook_port, ca_bundle, *lws, ["CREATE", "UPDATE"]),
                    _webhook("vpod.kb.io", "/validate--v1-pod", webhook_port, ca_bundle, "", "pods", ["CREATE", "UPDATE"]),
                ],
            },
        )  # fmt: skip
        yield
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        log.close()
