"""Shared fixtures: the real hook service on loopback, and Metacontroller-shaped requests.

Tests that need ../shared or kubectl skip with a reason when those are missing; with
INFERA_REQUIRE_ALL=1 (set by .ci/run) such a skip is a failure, so CI cannot pass by skipping.
"""

import contextlib
import copy
import datetime
import functools
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis
import jsonpatch
import jsonschema
import pytest
import yaml

from tests import schemas

# Every property test is bounded in time: 10 s per example at most, and no shrinking (it can
# take minutes on a failure; the blob printed with a failure replays the example, to shrink it
# at leisure). Function-scoped fixtures are fine here: the hook service is shared and stateless.
hypothesis.settings.register_profile(
    "infera",
    deadline=datetime.timedelta(seconds=10),
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.reuse, hypothesis.Phase.generate, hypothesis.Phase.target],
    print_blob=True,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture, hypothesis.HealthCheck.too_slow],
)
hypothesis.settings.load_profile("infera")

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("INFERA_SHARED_DIR", REPO.parent / "shared"))
SCHEMAS = Path(os.environ.get("INFERA_SCHEMAS_DIR", SHARED / "schemas"))
RESPONSE_FIELDS = {"status", "children", "resyncAfterSeconds", "finalized"}
# What Metacontroller's childResources `resource` names stand for.
RESOURCE_KINDS = {
    "deployments": "Deployment",
    "services": "Service",
    "statefulsets": "StatefulSet",
    "serviceaccounts": "ServiceAccount",
    "roles": "Role",
    "rolebindings": "RoleBinding",
    "leaderworkersets": "LeaderWorkerSet",
    "inferencepools": "InferencePool",
    "httproutes": "HTTPRoute",
}


def need(condition: bool, reason: str) -> None:
    """Skip (or, under INFERA_REQUIRE_ALL=1, fail) when a prerequisite is missing."""
    if condition:
        return
    if os.environ.get("INFERA_REQUIRE_ALL") == "1":
        pytest.fail(f"required prerequisite missing: {reason}")
    pytest.skip(reason)


def need_schemas() -> Path:
    need(
        SCHEMAS.is_dir(),
        f"the upstream CRD schemas (LeaderWorkerSet, InferencePool, HTTPRoute, CompositeController) are not at "
        f"{SCHEMAS}: put the files listed in ../shared/schemas/README.md there, or set INFERA_SCHEMAS_DIR",
    )
    return SCHEMAS


# Kinds only the upstream CRDs in SCHEMAS describe.
UPSTREAM_KINDS = ("LeaderWorkerSet", "InferencePool", "HTTPRoute", "CompositeController")


def need_kubectl() -> str:
    kubectl = shutil.which("kubectl")
    need(kubectl is not None, "kubectl is not on PATH")
    return kubectl


def validate_object(obj: dict[str, Any]) -> None:
    """Core kinds against Kubernetes' own schema; CRD kinds against their CRD (ours or upstream:
    without the upstream schemas, a test that emits those kinds is skipped)."""
    if obj.get("kind") in UPSTREAM_KINDS:
        need_schemas()
    dirs = [REPO / "crds"] + ([SCHEMAS] if SCHEMAS.is_dir() else [])
    schemas.validate(obj, dirs)


@functools.cache
def _status_schema() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((REPO / "crds" / "infera.amd.com_inferadeployments.yaml").read_text())
    return jsonschema.Draft7Validator(schemas.crd_schema(crd)["properties"]["status"])


def validate_status(status: dict[str, Any]) -> None:
    """The status must fit the CRD exactly: a field the API server prunes differs on every sync."""
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in _status_schema().iter_errors(status)]
    assert not errors, f"status does not fit the CRD: {errors}"


def load_yaml(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def controller(*components: str) -> dict[str, Any]:
    """The CompositeController of our bundle with the named kustomize components applied
    (their JSON patches), as Metacontroller puts it in every request."""
    (composite,) = load_yaml(REPO / "metacontroller" / "compositecontroller.yaml")
    for component in components:
        (kustomization,) = load_yaml(REPO / "metacontroller" / "components" / component / "kustomization.yaml")
        for patch in kustomization["patches"]:
            composite = jsonpatch.apply_patch(composite, yaml.safe_load(patch["patch"]))
    return composite


# Plausible values for the <PLACEHOLDERS> of the upstream operator's examples.
PLACEHOLDERS = {
    "NAMESPACE": "infera",
    "ENGINE_IMAGE": "rocm/infera:sglang-v0.1.1",
    "IMAGE_PULL_SECRET": "regcred",
    "MODEL_PVC": "models",
    "MODEL_PATH": "/models/Qwen3-0.6B",
    "MODEL_DIR": "/mnt/models",
    "MODEL_HF_ID": "Qwen/Qwen3-0.6B",
    "RDMA_IB_DEVICE": "rdma0",
    "RDMA_HCA_LIST": "rdma0,rdma1",
    "ROCE_V2_GID_INDEX": "3",
    "GATEWAY_CLASS": "kgateway",
    "PREFILL_NODE": "node-a",
    "DECODE_NODE": "node-b",
    "CSI_DRIVER": "csi.example.com",
    "CSI_SECRET_NAME": "csi-secret",
    "CSI_SECRET_NAMESPACE": "infera",
    "CSI_VOLUME_HANDLE": "models-volume",
}


def upstream_corpus() -> list[tuple[str, dict[str, Any]]]:
    """(file name, InferaDeployment) of the upstream examples, placeholders filled in; empty
    when the corpus is missing (tests check for it with need())."""
    examples = SHARED / "upstream" / "examples"
    found = []
    for path in sorted(examples.glob("*.yaml")) if examples.is_dir() else []:
        text = re.sub(r"<([A-Z0-9_]+)>", lambda m: PLACEHOLDERS.get(m.group(1), m.group(0)), path.read_text())
        for doc in yaml.safe_load_all(text):
            if doc and doc.get("kind") == "InferaDeployment":
                assert not re.search(r"<[A-Z0-9_]+>", json.dumps(doc)), f"{path.name}: an unfilled placeholder"
                found.append((path.name, doc))
    return found


def controller_for(idep: dict[str, Any]) -> dict[str, Any]:
    """The CompositeController a user of this InferaDeployment runs: with the lws and gaie
    components when the spec needs them."""
    spec = idep["spec"]
    components = []
    if any(svc.get("numberOfNodes", 1) > 1 for svc in spec["services"].values()):
        components.append("lws")
    if (spec.get("gaie") or {}).get("enabled"):
        components.append("gaie")
    return controller(*components)


def parent(source: Path | dict[str, Any], namespace: str = "ml", generation: int = 1) -> dict[str, Any]:
    """An InferaDeployment as the API server hands it to Metacontroller."""
    obj = copy.deepcopy(source) if isinstance(source, dict) else load_yaml(source)[0]
    metadata = obj.setdefault("metadata", {})
    metadata.setdefault("namespace", namespace)
    metadata.setdefault("uid", "7b1c2d3e-4f50-4a61-8b72-9c83d4e5f601")
    metadata.setdefault("generation", generation)
    metadata.setdefault("resourceVersion", "1000")
    return obj


def request_body(
    parent_obj: dict[str, Any],
    observed: list[dict[str, Any]] = (),
    version: str = "v2",
    finalizing: bool = False,
    composite: dict[str, Any] | None = None,
    related: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A hook request: every registered child type present, keyed by name (v1) or ns/name (v2);
    `related` objects (the Pods the customize hook asks for) keyed the same way."""
    composite = composite or controller()
    children: dict[str, dict[str, Any]] = {}
    for resource in composite["spec"]["childResources"]:
        children[f"{RESOURCE_KINDS[resource['resource']]}.{resource['apiVersion']}"] = {}
    namespace = parent_obj["metadata"]["namespace"]
    for child in observed:
        key = child["metadata"]["name"] if version == "v1" else f"{namespace}/{child['metadata']['name']}"
        children[f"{child['kind']}.{child['apiVersion']}"][key] = child
    # With a customize hook, Metacontroller sends every related kind it asked for, even empty.
    related_map: dict[str, dict[str, Any]] = {} if related is None else {"Pod.v1": {}}
    for obj in related or []:
        key = obj["metadata"]["name"] if version == "v1" else f"{namespace}/{obj['metadata']['name']}"
        related_map.setdefault(f"{obj['kind']}.{obj['apiVersion']}", {})[key] = obj
    return {
        "controller": composite,
        "parent": parent_obj,
        "children": children,
        "related": related_map,
        "finalizing": finalizing,
    }


def vllm_worker_args(role: str) -> list[str]:
    """What a vLLM worker needs from its args: the model and, for PD, the kv_role of its role."""
    args = ["--model", "Qwen/Qwen3-0.6B", "--tensor-parallel-size", "1"]
    kv_role = {"prefill": "kv_producer", "decode": "kv_consumer"}.get(role)
    if kv_role:
        args += ["--kv-transfer-config", json.dumps({"kv_connector": "MooncakeConnector", "kv_role": kv_role})]
    return args


def as_vllm(obj: dict[str, Any]) -> dict[str, Any]:
    """The same graph on vLLM: the backend, and vLLM's own args for every worker."""
    obj["spec"]["backendFramework"] = "vllm"
    for svc in obj["spec"]["services"].values():
        if svc["componentType"] == "worker":
            svc["args"] = vllm_worker_args(svc.get("role", "mixed"))
    return obj


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class HookClient:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def request(
        self, method: str, path: str, data: bytes | None = None, content_type: str | None = "application/json"
    ) -> Reply:
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        if content_type:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=30) as response:
                return Reply(response.status, dict(response.headers), response.read())
        except urllib.error.HTTPError as error:
            return Reply(error.code, dict(error.headers), error.read())

    def post(self, path: str, body: Any) -> Reply:
        return self.request("POST", path, json.dumps(body).encode())

    def hook(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a hook request; assert a well-formed answer whose children all validate."""
        reply = self.post(path, body)
        assert reply.status == 200, reply.body
        answer = reply.json
        assert set(answer) <= RESPONSE_FIELDS, f"unexpected top-level fields {set(answer) - RESPONSE_FIELDS}"
        assert isinstance(answer["children"], list)
        for child in answer["children"]:
            validate_object(child)
        validate_status(answer["status"])
        return answer

    def hook_raw(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST any hook request and return its JSON answer (200 required)."""
        reply = self.post(path, body)
        assert reply.status == 200, reply.body
        return reply.json

    def sync(
        self, parent_obj: dict[str, Any], observed: list[dict[str, Any]] = (), version: str = "v2"
    ) -> dict[str, Any]:
        """A sync as the controller that this parent needs (base bundle plus components) sends it."""
        return self.hook("/sync", request_body(parent_obj, observed, version, composite=controller_for(parent_obj)))


def scrape(client: HookClient) -> dict[str, float]:
    samples = {}
    for line in client.request("GET", "/metrics").body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def read_reply(connection: socket.socket) -> bytes:
    """One HTTP/1.1 response from a raw socket, its body read by Content-Length; what arrived
    before the server closed (b"" if nothing did)."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = connection.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        declared = re.search(rb"(?im)^content-length: *(\d+)", head)
        while declared and len(body) < int(declared.group(1)):
            chunk = connection.recv(65536)
            if not chunk:
                break
            body += chunk
        return head + b"\r\n\r\n" + body
    except (ConnectionResetError, TimeoutError):
        return data


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RunningServer:
    """`infera-hooks serve` as a test started it."""

    url: str
    process: subprocess.Popen
    log: Path

    def workers(self) -> list[int]:
        """The gunicorn worker processes (the master's children)."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(pid) for pid in children.read_text().split()] if children.exists() else []


@contextlib.contextmanager
def running_server(
    log_dir: Path, *options: str, scheme: str = "http", workers: int = 2, env: dict[str, str] | None = None
) -> Iterator[RunningServer]:
    """`infera-hooks serve` (gunicorn) on a free loopback port, ready; stopped by PID after.
    `env` adds to the environment it inherits."""
    port = _free_port()
    log_path = log_dir / f"server-{port}.log"
    executable = Path(sys.executable).with_name("infera-hooks")
    command = [str(executable)] if executable.exists() else [sys.executable, "-m", "hooks"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command + ["serve", "--bind", f"127.0.0.1:{port}", "--workers", str(workers), *options],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=os.environ | (env or {}),
        )
        url = f"{scheme}://127.0.0.1:{port}"
        unverified = ssl._create_unverified_context() if scheme == "https" else None  # only to see it is up
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(url + "/readyz", timeout=1, context=unverified):
                        break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"hook server did not start: {log_path.read_text()[-2000:]}") from None
                    time.sleep(0.1)
            server = RunningServer(url, process, log_path)
            # Ready means one worker answered; the others may still be forking.
            while len(server.workers()) < workers and time.monotonic() < deadline:
                time.sleep(0.05)
            yield server
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


@contextlib.contextmanager
def start_server(log_dir: Path, *options: str, scheme: str = "http") -> Iterator[str]:
    """`infera-hooks serve` (gunicorn, two workers) on a free loopback port; yields its URL."""
    with running_server(log_dir, *options, scheme=scheme) as server:
        yield server.url


@pytest.fixture(scope="session")
def hook_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with start_server(tmp_path_factory.mktemp("hooks")) as url:
        yield url


@pytest.fixture(scope="session")
def hooks(hook_url: str) -> HookClient:
    return HookClient(hook_url)
