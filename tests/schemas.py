"""Strict schema validation of Kubernetes objects, as the API server would see them.

Core kinds go through kubernetes-validate (strict: unknown fields are errors). Custom kinds go
through the openAPIV3Schema of their CRD, turned into JSON Schema that also rejects the fields a
real API server would silently prune, so a typo in an emitted object fails a test instead of
vanishing on the cluster.
"""

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

KUBERNETES_VERSION = "1.33.0"


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
    served = next(v for v in versions if v["name"] == version) if version else next(v for v in versions if v.get("storage"))
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


def definition(name: str, version: str) -> dict[str, Any]:
    """One type's JSON schema as kubernetes-validate ships it, e.g. podspec-v1."""
    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{version}-local-strict"
    return json.loads((root / f"{name}.json").read_text())


def validate(obj: dict[str, Any], crd_dirs: list[Path]) -> None:
    """Raise AssertionError naming the object and every problem with it."""
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    label = f"{kind} {obj.get('metadata', {}).get('name')}"
    for directory in crd_dirs:
        validator = _crds_in(str(directory)).get((api_version, kind))
        if validator is not None:
            errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
            assert not errors, f"{label}: " + "; ".join(
                f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors
            )
            return
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        raise AssertionError(f"{label}: {error}") from None
    except kubernetes_validate.SchemaNotFoundError as error:
        raise AssertionError(f"{label}: no schema for {api_version} {kind}: {error}") from None
