"""The generated CRD: committed copy in sync, structural, small, and rejecting bad input."""

import copy
import json
import subprocess
import sys
from typing import Any

import jsonschema
import pytest
import yaml

from hooks.crd import CRD_PATH
from tests.support.prerequisites import REPO, UPSTREAM, need_upstream
from tests.support.requests import load_yaml, upstream_corpus
from tests.support.schemas import crd_schema, validate

CRD_FILE = REPO / CRD_PATH


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_FILE.read_text())


@pytest.fixture(scope="module")
def admission(crd: dict[str, Any]) -> jsonschema.Draft7Validator:
    """The CRD's schema as the API server applies it, unknown fields rejected (kubectl's strict
    field validation)."""
    return jsonschema.Draft7Validator(crd_schema(crd))


def test_committed_crd_is_what_the_generator_prints() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "hooks", "crd"], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    assert printed == CRD_FILE.read_text(), f"run `infera-hooks crd > {CRD_PATH}` and commit the result"


def test_crd_is_a_valid_customresourcedefinition(crd: dict[str, Any]) -> None:
    validate(crd, [])


def test_crd_fits_client_side_apply(crd: dict[str, Any]) -> None:
    # kubectl's client-side apply stores the object in an annotation capped at 256 KiB.
    assert len(json.dumps(crd, separators=(",", ":"))) < 256 * 1024


def test_crd_names_and_columns(crd: dict[str, Any]) -> None:
    spec = crd["spec"]
    assert spec["group"] == "infera.amd.com" and spec["scope"] == "Namespaced"
    assert spec["names"]["shortNames"] == ["idep"] and spec["names"]["kind"] == "InferaDeployment"
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert [c["name"] for c in version["additionalPrinterColumns"] if "priority" not in c] == [
        "Backend",
        "State",
        "Rollout",
        "Age",
    ]
    assert columns["Ready"]["priority"] == 1 and columns["Ready"]["jsonPath"] == ".status.readyServices"
    assert columns["Rollout"]["jsonPath"] == ".status.rollout.phase"
    assert columns["Serving"]["jsonPath"] == ".status.rollout.servingGeneration"


def _walk(node: Any, path: str = ""):
    if isinstance(node, dict):
        yield path, node
        for key in ("properties",):
            for name, sub in node.get(key, {}).items():
                yield from _walk(sub, f"{path}.{name}")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")


def test_crd_schema_is_structural_with_descriptions(crd: dict[str, Any]) -> None:
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    open_fields = []
    for path, node in _walk(root):
        assert "$ref" not in node and "title" not in node, path
        # Optional fields are absent, never null; only a JSON patch value may be null.
        assert "nullable" not in node or path == ".spec.patches[].patch[].value", path
        assert (
            "type" in node or node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        ), f"{path} has no type"
        assert node.get("additionalProperties") is not False, path
        if node.get("x-kubernetes-preserve-unknown-fields"):
            open_fields.append(path)
        if path.startswith((".spec.", ".status.")) and not path.endswith(("[]", "{}")):
            assert node.get("description"), f"{path} has no description for kubectl explain"
    # Only embedded Kubernetes types stay open; spec and status themselves are fully typed.
    assert sorted(open_fields) == [
        ".spec.patches[].patch[].value",
        ".spec.services{}.autoscaling.behavior",
        ".spec.services{}.autoscaling.metrics[]",
        ".spec.services{}.extraPodSpec",
    ]


def test_crd_defaults(crd: dict[str, Any]) -> None:
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    service = spec["services"]["additionalProperties"]["properties"]
    assert spec["backendFramework"]["default"] == "sglang"
    assert spec["discoveryBackend"]["default"] == "kubernetes"
    assert spec["nats"]["properties"]["deploy"]["default"] is True
    assert spec["nats"]["properties"]["storageSize"]["default"] == "4Gi"
    assert service["replicas"] == {**service["replicas"], "default": 1, "minimum": 0}
    assert service["numberOfNodes"] == {**service["numberOfNodes"], "default": 1, "minimum": 1}
    assert service["role"]["enum"] == ["mixed", "prefill", "decode"]
    assert service["resources"]["properties"]["gpuType"]["default"] == "amd.com/gpu"


def _example_idep() -> dict[str, Any]:
    return load_yaml(REPO / "examples" / "pd-disaggregated.yaml")[0]


def _errors(admission: jsonschema.Draft7Validator, obj: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in admission.iter_errors(obj)]


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        (
            ("spec", "backendFramework"),
            "tensorrt",
            "spec.backendFramework: 'tensorrt' is not one of ['sglang', 'vllm']",
        ),
        (
            ("spec", "services", "decode", "replicas"),
            -1,
            "spec.services.decode.replicas: -1 is less than the minimum of 0",
        ),
        (
            ("spec", "services", "decode", "numberOfNodes"),
            0,
            "spec.services.decode.numberOfNodes: 0 is less than the minimum of 1",
        ),
        (
            ("spec", "services", "decode", "role"),
            "both",
            "spec.services.decode.role: 'both' is not one of ['mixed', 'prefill', 'decode']",
        ),
        (
            ("spec", "services", "decode", "replica"),
            2,
            "spec.services.decode: Additional properties are not allowed ('replica' was unexpected)",
        ),
        (("spec", "natsDeploy"), False, "spec: Additional properties are not allowed ('natsDeploy' was unexpected)"),
        (
            ("spec", "services", "decode", "resources", "memory"),
            "64 GB",
            "spec.services.decode.resources.memory: '64 GB' does not match",
        ),
        (("spec", "etcdEndpoint"), "", "spec.etcdEndpoint: '' should be non-empty"),
        (("spec", "image"), "", "spec.image: '' should be non-empty"),
    ],
)
def test_admission_rejects_bad_input(admission, path: tuple, value: Any, error: str) -> None:
    obj = _example_idep()
    assert _errors(admission, obj) == []
    target = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    errors = _errors(admission, obj)
    assert len(errors) == 1 and errors[0].startswith(error), errors


def test_admission_requires_component_type_and_services(admission) -> None:
    obj = _example_idep()
    del obj["spec"]["services"]["decode"]["componentType"]
    assert _errors(admission, obj) == ["spec.services.decode: 'componentType' is a required property"]
    assert _errors(admission, {"apiVersion": "infera.amd.com/v1alpha1", "kind": "InferaDeployment", "spec": {}}) == [
        "spec: 'services' is a required property"
    ]


def test_admission_accepts_unquoted_quantities(admission) -> None:
    obj = _example_idep()
    obj["spec"]["services"]["server"]["resources"] = {"cpu": 4, "memory": "8Gi"}
    assert _errors(admission, obj) == []


def test_every_example_passes_admission(admission) -> None:
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for doc in load_yaml(path):
            assert _errors(admission, doc) == [], path.name


def test_upstream_corpus_passes_admission(admission) -> None:
    """Our API is a superset of the upstream operator's: everything written for it is accepted."""
    need_upstream()
    corpus = upstream_corpus()
    assert len(corpus) >= 10
    for name, doc in corpus:
        assert _errors(admission, doc) == [], name


def test_upstream_fields_are_all_accepted(crd: dict[str, Any]) -> None:
    """Every property path of the upstream CRD's spec exists in ours (extraPodSpec aside, open here)."""
    need_upstream()
    upstream = yaml.safe_load((UPSTREAM / "infera.amd.com_inferadeployments.yaml").read_text())
    ours_root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    theirs_root = upstream["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    ours = {path for path, _ in _walk(ours_root)}
    missing = []
    for path, _node in _walk(theirs_root):
        if ".extraPodSpec" in path or ".valueFrom." in path:
            continue  # open objects in our schema: any content is accepted
        if path not in ours:
            missing.append(path)
    assert missing == []


def test_upstream_printer_columns_are_kept(crd: dict[str, Any]) -> None:
    need_upstream()
    upstream = yaml.safe_load((UPSTREAM / "infera.amd.com_inferadeployments.yaml").read_text())
    ours = {c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    for column in upstream["spec"]["versions"][0]["additionalPrinterColumns"]:
        assert ours[column["name"]] == column["jsonPath"]


def test_hook_rejects_what_admission_rejects() -> None:
    """The hook's own validation agrees with admission on the same bad input."""
    from hooks.api.graph import InferaDeploymentSpec

    spec = copy.deepcopy(_example_idep()["spec"])
    spec["services"]["decode"]["numberOfNodes"] = 0
    with pytest.raises(ValueError, match="numberOfNodes"):
        InferaDeploymentSpec.model_validate(spec)
