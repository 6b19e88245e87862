"""Strict schema validation of Kubernetes objects, as the API server would see them.

Core kinds go through kubernetes-validate (strict: unknown fields are errors). Custom kinds go
through the openAPIV3Schema of their CRD, turned into JSON Schema that also rejects the fields a
real API server would silently prune, so a typo in an emitted object fails a test instead of
vanishing on the cluster.
"""

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

from tests.support.prerequisites import REPO, SCHEMAS, go_module, need_schemas

KUBERNETES_VERSION = "1.33.0"
# The enums the API server knows are declared only in the Go definitions kube-openapi generates
# for it (`Enum: []interface{}{...}`): kubernetes-validate's schemas, like the openapi-spec files
# Kubernetes publishes, carry none. Read at generation time, never copied.
KUBERNETES_MODULE = f"k8s.io/kubernetes@v{KUBERNETES_VERSION}"
OPENAPI_PACKAGE = "pkg/generated/openapi"
OPENAPI_DEFINITIONS = f"{OPENAPI_PACKAGE}/zz_generated.openapi.go"


def strict_json_schema(node: Any, name: str = "") -> Any:
    if isinstance(node, list):
        return [strict_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    schema = {key: value for key, value in node.items() if not key.startswith("x-kubernetes-")}
    for key in ("properties", "patternProperties"):
        if key in schema:
            schema[key] = {prop: strict_json_schema(sub, prop) for prop, sub in schema[key].items()}
    for key in ("items", "not"):
        if key in schema:
            schema[key] = strict_json_schema(schema[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            schema[key] = [strict_json_schema(sub) for sub in schema[key]]
    if isinstance(schema.get("additionalProperties"), dict):
        schema["additionalProperties"] = strict_json_schema(schema["additionalProperties"])
    if node.get("x-kubernetes-int-or-string"):
        schema.pop("type", None)
        schema["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in schema:
        schema["type"] = [schema["type"], "null"]
    preserves = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-embedded-resource")
    # The API server validates metadata itself and prunes any other field its schema lacks.
    if schema.get("type") == "object" and "additionalProperties" not in schema and not preserves and name != "metadata":
        schema["additionalProperties"] = False
    return schema


def crd_schema(crd: dict[str, Any], version: str | None = None) -> dict[str, Any]:
    versions = crd["spec"]["versions"]
    served = (
        next(v for v in versions if v["name"] == version) if version else next(v for v in versions if v.get("storage"))
    )
    return strict_json_schema(served["schema"]["openAPIV3Schema"])


@cache
def _crds_in(directory: str) -> dict[tuple[str, str], Any]:
    """(apiVersion, kind) -> validator, for every CRD version in every YAML file of `directory`."""
    validators = {}
    for path in sorted(Path(directory).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = doc["spec"]["group"], doc["spec"]["names"]["kind"]
            for version in doc["spec"]["versions"]:
                schema = strict_json_schema(version["schema"]["openAPIV3Schema"])
                validators[(f"{group}/{version['name']}", kind)] = jsonschema.Draft7Validator(schema)
    return validators


def strict_schemas(version: str) -> Path:
    """kubernetes-validate's strict schemas of one Kubernetes version: a file per kind, and
    _definitions.json that they all reference."""
    return Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{version}-local-strict"


def definition(name: str, version: str) -> dict[str, Any]:
    """One type's JSON schema as kubernetes-validate ships it, e.g. podspec-v1."""
    return json.loads((strict_schemas(version) / f"{name}.json").read_text())


@cache
def _core_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator | None:
    """The validator kubernetes_validate.validate(strict=True) builds for one core kind, built once:
    the library reads and parses its definitions file on every call."""
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    path = strict_schemas(KUBERNETES_VERSION) / f"{kind.lower()}-{group_version}.json"
    if not path.is_file():
        return None
    schema = json.loads(path.read_text())
    registry = _core_definitions() @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


@cache
def _core_definitions() -> Resource:
    return Resource.from_contents(json.loads((strict_schemas(KUBERNETES_VERSION) / "_definitions.json").read_text()))


def validate(obj: dict[str, Any], crd_dirs: list[Path]) -> None:
    """Raise AssertionError naming the object and every problem with it."""
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    label = f"{kind} {obj.get('metadata', {}).get('name')}"
    validator = next(
        (found for d in crd_dirs if (found := _crds_in(str(d)).get((api_version, kind))) is not None),
        _core_validator(api_version, kind),
    )
    assert validator is not None, f"{label}: no schema for {api_version} {kind}"
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    assert not errors, f"{label}: " + "; ".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def load_schemas() -> None:
    """Read every schema the checks use, now rather than inside the first check."""
    for directory in [REPO / "crds"] + ([SCHEMAS] if SCHEMAS.is_dir() else []):
        _crds_in(str(directory))
    _status_schema()
    _core_definitions()


# Kinds only the upstream CRDs in SCHEMAS describe.
UPSTREAM_KINDS = ("LeaderWorkerSet", "InferencePool", "HTTPRoute", "CompositeController", "PodMonitor")


def validate_object(obj: dict[str, Any]) -> None:
    """Core kinds against Kubernetes' own schema; CRD kinds against their CRD (ours or upstream:
    without the upstream schemas, a test that emits those kinds is skipped)."""
    if obj.get("kind") in UPSTREAM_KINDS:
        need_schemas()
    dirs = [REPO / "crds"] + ([SCHEMAS] if SCHEMAS.is_dir() else [])
    validate(obj, dirs)


@cache
def _status_schema() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((REPO / "crds" / "infera.amd.com_inferadeployments.yaml").read_text())
    return jsonschema.Draft7Validator(crd_schema(crd)["properties"]["status"])


def validate_status(status: dict[str, Any]) -> None:
    """The status must fit the CRD exactly: a field the API server prunes differs on every sync."""
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in _status_schema().iter_errors(status)]
    assert not errors, f"status does not fit the CRD: {errors}"


# The kinds whose schemas the hook ships (hooks/kubernetes-schema.json), by the definition that
# describes them: every core kind it renders, and the pod template a LeaderWorkerSet embeds.
HOOK_SCHEMA_ROOTS = {
    "Deployment": "io.k8s.api.apps.v1.Deployment",
    "StatefulSet": "io.k8s.api.apps.v1.StatefulSet",
    "Service": "io.k8s.api.core.v1.Service",
    "ServiceAccount": "io.k8s.api.core.v1.ServiceAccount",
    "Role": "io.k8s.api.rbac.v1.Role",
    "RoleBinding": "io.k8s.api.rbac.v1.RoleBinding",
    "HorizontalPodAutoscaler": "io.k8s.api.autoscaling.v2.HorizontalPodAutoscaler",
    "PodDisruptionBudget": "io.k8s.api.policy.v1.PodDisruptionBudget",
    "PersistentVolumeClaim": "io.k8s.api.core.v1.PersistentVolumeClaim",
    "Job": "io.k8s.api.batch.v1.Job",
    "NetworkPolicy": "io.k8s.api.networking.v1.NetworkPolicy",
    "PodTemplateSpec": "io.k8s.api.core.v1.PodTemplateSpec",
}
INTEGER_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def _hook_definition(node: Any) -> Any:
    """A definition as the hook validates it: no descriptions; local references; integer
    formats as explicit ranges (a JSON Schema `format` says nothing about numbers); oneOf as
    anyOf (kubernetes-validate's quantity and int-or-string unions both admit null, which
    oneOf would then refuse)."""
    if isinstance(node, list):
        return [_hook_definition(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "description":
            continue
        if key == "$ref":
            out[key] = "#/definitions/" + value.rsplit("/", 1)[1]
        elif key == "oneOf":
            out["anyOf"] = _hook_definition(value)
        elif key in ("properties", "patternProperties", "$defs", "definitions"):
            out[key] = {name: _hook_definition(sub) for name, sub in value.items()}
        else:
            out[key] = _hook_definition(value)
    if node.get("format") in INTEGER_RANGES:
        out["minimum"], out["maximum"] = INTEGER_RANGES[node["format"]]
    return out


def _references(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value.rsplit("/", 1)[1]
            else:
                yield from _references(value)
    elif isinstance(node, list):
        for item in node:
            yield from _references(item)


# Go source as tokens: strings (raw or interpreted), runes, comments, words (identifiers,
# qualified names, numbers) and single characters.
GO_TOKEN = re.compile(r'"(?:\\.|[^"\\\n])*"|`[^`]*`|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/|[\w.]+|\S', re.S)
# An enum's place in a definition: the braces around it, below the definition's own schema
# (`Schema: spec.Schema{SchemaProps: spec.SchemaProps{...}}`), as JSON Schema keys.
DEFINITION_SCHEMA = [None, "Schema", "SchemaProps"]
NESTED_SCHEMAS = {"Items": "items", "AdditionalProperties": "additionalProperties"}
Location = tuple[str, ...]


def _go_string(token: str) -> str:
    if token.startswith("`"):
        return token[1:-1]
    if token.startswith('"'):
        return json.loads(token)
    return token


def _json_location(function: str, labels: list[str | None]) -> Location:
    """("properties", "ports", "items", "properties", "protocol") from the labels of the braces
    around an Enum: [None, "Schema", "SchemaProps", "Properties", "ports", "SchemaProps", "Items",
    "Schema", "SchemaProps", ...]."""
    unknown = ValueError(f"{OPENAPI_DEFINITIONS}: an Enum in {function} at {labels}, a place this reader does not know")
    if labels[: len(DEFINITION_SCHEMA)] != DEFINITION_SCHEMA:
        raise unknown
    location: list[str] = []
    rest = labels[len(DEFINITION_SCHEMA) :]
    while rest:
        (kind, *below), rest = rest[:3], rest[3:]
        if kind == "Properties" and len(below) == 2 and below[0] is not None and below[1] == "SchemaProps":
            location += ["properties", below[0]]  # "Properties": {"name": {SchemaProps: ...}}
        elif kind in NESTED_SCHEMAS and below == ["Schema", "SchemaProps"]:
            location.append(NESTED_SCHEMAS[kind])  # "Items": {Schema: {SchemaProps: ...}}
        else:
            raise unknown
    return tuple(location)


def openapi_enums(source: str) -> dict[str, dict[Location, list[str]]]:
    """OpenAPI definition name (io.k8s.api.core.v1.Container) -> the enums in its schema, from
    the text of zz_generated.openapi.go: functions (`func schema_k8sio_api_core_v1_Container`)
    returning composite literals, named in GetOpenAPIDefinitions' map
    ("k8s.io/api/core/v1.Container": schema_k8sio_api_core_v1_Container(ref))."""
    by_function: dict[str, dict[Location, list[str]]] = {}
    names: dict[str, str] = {}  # function -> Go type name
    labels: list[str | None] = []  # what each open brace is the value of: its element's key
    key: str | None = None  # the key of the element being read, once its ':' is seen
    function = previous = ""
    values: list[str] | None = None  # the strings of the Enum being read
    in_type = False  # between the braces of `interface{}`
    for match in GO_TOKEN.finditer(source):
        token = match[0]
        if token.startswith(("//", "/*")):
            continue
        if values is not None and token not in ("}", ","):
            if not token.startswith(('"', "`")):
                raise ValueError(f"{OPENAPI_DEFINITIONS}: an Enum in {function} holds {token}, not only strings")
            values.append(_go_string(token))
        elif token == "{" and previous == "interface":
            in_type = True
        elif token == "}" and in_type:
            in_type = False
        elif token == "{":
            labels.append(key if labels else f"func {function}")  # at the top, the body of a function
            if key == "Enum":
                values = []
            key = None
        elif token == "}":
            if values is not None:
                location = _json_location(function, labels[1:-1])
                by_function.setdefault(function, {})[location] = values
                values = None
            labels.pop()
            key = None
        elif token == ",":
            key = None
        elif token == ":":
            key = _go_string(previous)
        elif previous == "func" and not labels:
            function = token
        elif key is not None and labels == ["func GetOpenAPIDefinitions", None] and token.startswith("schema_"):
            names[token] = key
        previous = token
    declared = len(re.findall(r"^\s*Enum:\s", source, re.M))
    found = sum(len(enums) for enums in by_function.values())
    if not names or not found or found != declared:
        raise ValueError(
            f"{OPENAPI_DEFINITIONS}: read {len(names)} definition names and {found} of the {declared} Enums it "
            "declares: its shape is not what this reader expects"
        )
    unnamed = sorted(set(by_function) - set(names))
    if unnamed:
        raise ValueError(f"{OPENAPI_DEFINITIONS}: GetOpenAPIDefinitions names no type for {', '.join(unnamed)}")
    return {_openapi_name(name): by_function.get(function, {}) for function, name in names.items()}


def _openapi_name(go_name: str) -> str:
    """io.k8s.api.core.v1.Container for k8s.io/api/core/v1.Container, as kube-openapi names it:
    the domain reversed, '/' as '.'."""
    domain, _, rest = go_name.partition("/")
    return ".".join([*reversed(domain.split(".")), *rest.split("/")])


def kubernetes_enums() -> dict[str, dict[Location, list[str]]]:
    """openapi_enums of KUBERNETES_MODULE, read from the Go module cache."""
    source = go_module(KUBERNETES_MODULE) / OPENAPI_DEFINITIONS
    if not source.is_file():
        raise FileNotFoundError(f"{source}: the Go module {KUBERNETES_MODULE} is not downloaded, and Go could not")
    return openapi_enums(source.read_text())


def _with_enums(name: str, definition: dict[str, Any], enums: dict[Location, list[str]]) -> dict[str, Any]:
    for location, values in enums.items():
        node: Any = definition
        for step in location:
            node = node.get(step) if isinstance(node, dict) else None
        if not isinstance(node, dict) or "string" not in node.get("type", ()):
            raise ValueError(f"{name}: kubernetes-validate has no string at {'.'.join(location)} for the enum {values}")
        node["enum"] = values
    return definition


def hook_schema() -> str:
    """hooks/kubernetes-schema.json: the Kubernetes 1.33 definitions of HOOK_SCHEMA_ROOTS and
    everything they reference, generated from kubernetes-validate's strict schemas, with the
    enums of Kubernetes' generated OpenAPI definitions (KUBERNETES_MODULE)."""
    definitions = json.loads((strict_schemas(KUBERNETES_VERSION) / "_definitions.json").read_text())["$defs"]
    enums = kubernetes_enums()
    wanted: set[str] = set()
    pending = list(HOOK_SCHEMA_ROOTS.values())
    while pending:
        name = pending.pop()
        if name not in wanted:
            wanted.add(name)
            pending.extend(_references(definitions[name]))
    unknown = sorted(wanted - set(enums))
    if unknown:
        raise ValueError(f"{OPENAPI_DEFINITIONS} defines none of {', '.join(unknown)}")
    document = {
        "kubernetesVersion": KUBERNETES_VERSION,
        "enumsFrom": f"{KUBERNETES_MODULE} {OPENAPI_PACKAGE}",
        "roots": HOOK_SCHEMA_ROOTS,
        "definitions": {
            name: _with_enums(name, _hook_definition(definitions[name]), enums[name]) for name in sorted(wanted)
        },
    }
    return json.dumps(document, sort_keys=True, indent=1) + "\n"


if __name__ == "__main__":
    # Regenerate: python -m tests.support.schemas > hooks/kubernetes-schema.json
    print(hook_schema(), end="")
