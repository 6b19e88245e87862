"""The bundle's ValidatingAdmissionPolicy: a graph's servers, whose account may patch their
InferaDeployment when they serve the scaling API, may change its replica counts and nothing
else. Its CEL is evaluated here with cel-python on the requests the API server would pass it
(a real API server's evaluation comes with the control-plane tier)."""

import copy
from collections.abc import Callable
from typing import Any

import celpy
import pytest

from hooks import policy
from hooks.api.graph import InferaDeploymentSpec
from hooks.api.services import ServiceSpec
from hooks.crd import structural_schema
from tests.support.prerequisites import REPO
from tests.support.requests import PD, parent
from tests.support.schemas import validate_object

CEL = celpy.Environment()
SERVERS = "system:serviceaccount:ml:qwen-pd-disc"


def evaluate(expression: str, old: dict[str, Any], new: dict[str, Any], username: str) -> bool:
    activation = {
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel(
            {"namespace": new["metadata"]["namespace"], "userInfo": {"username": username}, "operation": "UPDATE"}
        ),
    }
    return bool(CEL.program(CEL.compile(expression)).evaluate(activation))


def refusals(change: Callable[[dict[str, Any]], None], username: str = SERVERS) -> list[str] | None:
    """The messages of the validations an update by `username` fails, or None when the policy
    does not apply to it."""
    old = parent(PD)
    new = copy.deepcopy(old)
    change(new)
    spec = policy.policy()["spec"]
    if not all(evaluate(c["expression"], old, new, username) for c in spec["matchConditions"]):
        return None
    return [v["message"] for v in spec["validations"] if not evaluate(v["expression"], old, new, username)]


def test_the_committed_policy_is_what_the_generator_prints() -> None:
    committed = (REPO / policy.POLICY_PATH).read_text()
    assert committed == policy.policy_yaml(), "regenerate: python -m hooks.policy > metacontroller/scaling-policy.yaml"


def test_the_policy_and_its_binding_validate() -> None:
    validate_object(policy.policy())
    validate_object(policy.binding())
    assert policy.binding()["spec"] == {"policyName": policy.NAME, "validationActions": ["Deny"]}


def set_replicas(obj: dict[str, Any]) -> None:
    obj["spec"]["services"]["decode"]["replicas"] = 4
    obj["spec"]["services"]["prefill"]["replicas"] = 0


def test_the_servers_may_change_replica_counts() -> None:
    assert refusals(set_replicas) == []


@pytest.mark.parametrize(
    "username",
    ["system:serviceaccount:ml:qwen-pd-register", "system:serviceaccount:ml:other-disc", "alice", "system:admin"],
)
def test_only_the_graphs_own_servers_are_held_to_it(username: str) -> None:
    def rewrite(obj: dict[str, Any]) -> None:
        obj["spec"]["image"] = "evil/image:1"

    assert refusals(rewrite, username) is None


SERVICE_SCHEMA = structural_schema(ServiceSpec)["properties"]
SPEC_SCHEMA = structural_schema(InferaDeploymentSpec)["properties"]


def other(value: Any, schema: dict[str, Any]) -> Any:
    """A value of the field's type that differs from `value` (None: the field is absent), as the
    API server would have admitted it: the schema decides its type."""
    kind = schema.get("type") or ("string" if schema.get("x-kubernetes-int-or-string") else "object")
    if kind == "string":
        return f"{value or ''}-changed"
    if kind in ("integer", "number"):
        return (value or 0) + 1
    if kind == "boolean":
        return not value
    if kind == "array":
        return [*(value or []), copy.deepcopy((value or ["x"])[0])]
    return {**(value or {}), "changed": "yes"}


def change_field(obj: dict[str, Any], schema: dict[str, Any], field: str) -> None:
    obj[field] = other(obj.get(field), schema[field])


@pytest.mark.parametrize("field", [field for field in SERVICE_SCHEMA if field != "replicas"])
def test_every_other_field_of_a_service_is_held(field: str) -> None:
    """Set, changed or removed: every field but replicas, walked from the model so that a new
    field cannot slip by."""
    message = ["the scaling API may change only spec.services.<service>.replicas"]
    decode = lambda obj: obj["spec"]["services"]["decode"]  # noqa: E731
    assert refusals(lambda obj: change_field(decode(obj), SERVICE_SCHEMA, field)) == message
    if field in decode(parent(PD)):
        assert refusals(lambda obj: decode(obj).pop(field)) == message


@pytest.mark.parametrize("field", [field for field in SPEC_SCHEMA if field != "services"])
def test_every_other_field_of_the_spec_is_held(field: str) -> None:
    message = ["the scaling API may change replica counts only, not the rest of the spec"]
    assert refusals(lambda obj: change_field(obj["spec"], SPEC_SCHEMA, field)) == message


def test_services_may_not_come_or_go() -> None:
    message = "the scaling API may change replica counts only, not add or remove services"
    assert refusals(lambda obj: obj["spec"]["services"].pop("decode")) == [message]
    added = refusals(lambda obj: obj["spec"]["services"].__setitem__("extra", {"componentType": "worker"}))
    assert added == [message]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("labels", {"infera.example/x": "1"}),
        ("annotations", {"infera.example/x": "1"}),
        ("finalizers", ["example.com/hold"]),
        ("ownerReferences", [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "1"}]),
    ],
)
def test_the_metadata_is_held(field: str, value: Any) -> None:
    assert field in policy.METADATA_FIELDS
    assert refusals(lambda obj: obj["metadata"].__setitem__(field, value)) == [
        "the scaling API may change replica counts only, not the metadata"
    ]
