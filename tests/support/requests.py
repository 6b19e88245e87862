"""Hook requests shaped as Metacontroller sends them, and the parents and controllers in them."""

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from hooks import reconcile
from hooks.contract import LAST_APPLIED_ANNOTATION, parse_request
from hooks.vocabulary import CHILD_KINDS
from tests.support.prerequisites import REPO, SHARED

RESPONSE_FIELDS = {"status", "children", "resyncAfterSeconds", "finalized"}
EXAMPLES = REPO / "examples"
# The graph most tests start from: a router, one prefill and one decode worker.
PD = EXAMPLES / "pd-disaggregated.yaml"
# What Metacontroller's childResources `resource` names stand for.
RESOURCE_KINDS = {child.resource: child.kind for child in CHILD_KINDS}
# And the other way, with the parent's: the resource an audit event names for a kind.
KIND_RESOURCES = {kind: resource for resource, kind in RESOURCE_KINDS.items()} | {
    "InferaDeployment": "inferadeployments"
}


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
    """The CompositeController a user of this InferaDeployment runs: with the lws, gaie and
    monitoring components when the spec needs them."""
    spec = idep["spec"]
    components = []
    if any(svc.get("numberOfNodes", 1) > 1 for svc in spec["services"].values()):
        components.append("lws")
    if (spec.get("gaie") or {}).get("enabled"):
        components.append("gaie")
    if "monitoring" in spec:
        components.append("monitoring")
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


def children_by_key(answer: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """An answer's children by (kind, name); two children with one key fail the test."""
    keyed = {(c["kind"], c["metadata"]["name"]): c for c in answer["children"]}
    assert len(keyed) == len(answer["children"]), "duplicate children"
    return keyed


def big_graph(services: int) -> dict[str, Any]:
    """The PD example's parent with `services` decode pools: a large but valid request."""
    obj = parent(PD)
    workers = {
        f"w{i}": {
            "componentType": "worker",
            "role": "decode",
            "resources": {"gpu": 1, "memory": "64Gi"},
            "args": ["--model-path", "Qwen/Qwen3-0.6B"],
        }
        for i in range(services)
    }
    obj["spec"]["services"] = {"server": obj["spec"]["services"]["server"], **workers}
    return obj


def observed_as_applied(children: list[dict[str, Any]], status: dict[str, Any], version: int) -> list[dict[str, Any]]:
    """The children as the API server returns them once applied, each with `status`."""
    observed = []
    for child in children:
        stored = copy.deepcopy(child)
        stored["metadata"] |= {
            "namespace": "ml",
            "uid": f"uid-{child['metadata']['name']}",
            "resourceVersion": str(version),
            "generation": 1,
            "annotations": {**child["metadata"].get("annotations", {}), LAST_APPLIED_ANNOTATION: json.dumps(child)},
        }
        stored["status"] = copy.deepcopy(status)
        observed.append(stored)
    return observed


def converged_bodies(count: int) -> list[bytes]:
    """Distinct requests of one converged PD graph: only resourceVersions and a ready count move."""
    obj = parent(PD)
    children = reconcile.sync(parse_request(request_body(obj)))["children"]
    bodies = []
    for version in range(2, 2 + count):
        ready = version % 2
        observed = observed_as_applied(
            children, {"replicas": 1, "readyReplicas": ready, "updatedReplicas": 1, "observedGeneration": 1}, version
        )
        world = copy.deepcopy(obj)
        world["metadata"]["resourceVersion"] = str(version)
        world["status"] = reconcile.sync(parse_request(request_body(world, observed)))["status"]
        bodies.append(json.dumps(request_body(world, observed)).encode())
    return bodies
