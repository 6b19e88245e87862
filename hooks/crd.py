"""Generate the InferaDeployment CRD from the pydantic API model (`infera-hooks crd`).

Pydantic's JSON Schema is turned into a Kubernetes structural schema: references inlined,
optional fields as plain types (never nullable), no titles, and no `additionalProperties: false`
(the API server prunes unknown fields instead).
"""

from typing import Any

import yaml
from pydantic import BaseModel

from hooks.api.graph import GROUP, KIND, PLURAL, VERSION, InferaDeploymentSpec
from hooks.api.rules import ROOT_VALIDATIONS
from hooks.api.status import InferaDeploymentStatus

CRD_PATH = "crds/infera.amd.com_inferadeployments.yaml"

PRINTER_COLUMNS = [
    {"name": "Backend", "type": "string", "jsonPath": ".spec.backendFramework"},
    {"name": "State", "type": "string", "jsonPath": ".status.state"},
    {
        "name": "Ready",
        "type": "string",
        "priority": 1,
        "jsonPath": ".status.readyServices",
        "description": "Ready services out of all services",
    },
    {"name": "GAIE", "type": "boolean", "priority": 1, "jsonPath": ".status.gaie.ready"},
    {
        "name": "Rollout",
        "type": "string",
        "jsonPath": ".status.rollout.phase",
        "description": "Under BlueGreen: Stable, Progressing, Stalled, Switching or Draining",
    },
    {"name": "Serving", "type": "string", "priority": 1, "jsonPath": ".status.rollout.servingGeneration"},
    {
        "name": "Nodes",
        "type": "string",
        "priority": 1,
        "jsonPath": ".status.placement.summary",
        "description": "With spec.placement: the nodes each worker service's pods run on",
    },
    {"name": "Message", "type": "string", "priority": 1, "jsonPath": ".status.message"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _structural(node: Any, definitions: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    options = node.get("anyOf")
    if options is not None:
        non_null = [option for option in options if option.get("type") != "null"]
        if len(non_null) < len(options):  # Optional[X]: absent, never null
            node.pop("anyOf")
            node = {**non_null[0], **node} if len(non_null) == 1 else {**node, "anyOf": non_null}
    if "$ref" in node:
        referenced = definitions[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**referenced, **node}  # the field's own description wins over the model's
    for dropped in ("title", "$defs"):
        node.pop(dropped, None)
    if node.get("additionalProperties") is False:
        node.pop("additionalProperties")
    if "default" in node and node["default"] is None:
        node.pop("default")
    if isinstance(node.get("description"), str):
        # Docstrings wrap lines; `kubectl explain` wraps them itself.
        node["description"] = " ".join(node["description"].split())
    return {key: _structural(value, definitions) for key, value in node.items()}


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True)
    return _structural(schema, schema.get("$defs", {}))


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["idep"],
                "categories": ["infera"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "InferaDeployment is one LLM inference graph: a router "
                            "server, GPU worker pools and their plumbing.",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": structural_schema(InferaDeploymentSpec),
                                "status": structural_schema(InferaDeploymentStatus),
                            },
                            "required": ["spec"],
                            "x-kubernetes-validations": ROOT_VALIDATIONS,
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated from hooks/api/ by `infera-hooks crd`; do not edit by hand.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100)
