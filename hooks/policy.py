"""The admission policy that holds a graph's scaling API to replica counts, generated from the
API model: `python -m hooks.policy > metacontroller/scaling-policy.yaml` (a test fails while the
committed file differs).

Where a server serves the Infera router's scaling API, its account `<name>-disc` may patch its
own InferaDeployment, and RBAC cannot say which fields. The API server then refuses any change
that account makes beyond `spec.services.<service>.replicas`: a compromised router could resize
its pools, never rewrite the graph (its images, commands, patches) or its metadata.
"""

from typing import Any

import yaml

from hooks.api.graph import GROUP, PLURAL, InferaDeploymentSpec
from hooks.api.services import ServiceSpec
from hooks.vocabulary import DISCOVERY_SUFFIX

POLICY_PATH = "metacontroller/scaling-policy.yaml"
NAME = "infera-scaling-api-replicas-only"
SCALED_FIELD = "replicas"
# What of the metadata the scaling API has no business changing (the API server and
# Metacontroller write the rest).
METADATA_FIELDS = ("labels", "annotations", "finalizers", "ownerReferences")


def _fields(model: type[Any]) -> list[str]:
    """A model's fields by the names the CRD gives them."""
    return list(model.model_json_schema(by_alias=True)["properties"])


def _unchanged(path: str, field: str) -> str:
    """CEL: `field` under `path` is as it was, present or absent."""
    new, old = f"object.{path}.{field}", f"oldObject.{path}.{field}"
    return f"(has({new}) == has({old}) && (!has({new}) || {new} == {old}))"


def _all_unchanged(path: str, fields: list[str]) -> str:
    return " && ".join(_unchanged(path, field) for field in fields)


def policy() -> dict[str, Any]:
    spec_fields = [field for field in _fields(InferaDeploymentSpec) if field != "services"]
    service_fields = [field for field in _fields(ServiceSpec) if field != SCALED_FIELD]
    account = f"'system:serviceaccount:' + request.namespace + ':' + object.metadata.name + '-{DISCOVERY_SUFFIX}'"
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/name": "infera-hooks"}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": ["*"],
                        "operations": ["UPDATE"],
                        "resources": [PLURAL],
                    }
                ]
            },
            # Only the graph's own servers' account, the one RBAC lets patch it.
            "matchConditions": [
                {"name": "by-the-graphs-servers", "expression": f"request.userInfo.username == {account}"}
            ],
            "validations": [
                {
                    "expression": "object.spec.services.all(s, s in oldObject.spec.services) && "
                    "oldObject.spec.services.all(s, s in object.spec.services)",
                    "message": "the scaling API may change replica counts only, not add or remove services",
                },
                {
                    "expression": "oldObject.spec.services.all(s, !(s in object.spec.services) || "
                    + _all_unchanged("spec.services[s]", service_fields)
                    + ")",
                    "message": f"the scaling API may change only spec.services.<service>.{SCALED_FIELD}",
                },
                {
                    "expression": _all_unchanged("spec", spec_fields),
                    "message": "the scaling API may change replica counts only, not the rest of the spec",
                },
                {
                    "expression": _all_unchanged("metadata", list(METADATA_FIELDS)),
                    "message": "the scaling API may change replica counts only, not the metadata",
                },
            ],
        },
    }


def binding() -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/name": "infera-hooks"}},
        "spec": {"policyName": NAME, "validationActions": ["Deny"]},
    }


def policy_yaml() -> str:
    header = "# Generated from hooks/api/ by `python -m hooks.policy`; do not edit by hand.\n"
    return header + yaml.safe_dump_all([policy(), binding()], sort_keys=False, width=100)


if __name__ == "__main__":
    print(policy_yaml(), end="")
