"""Specs whose children the API server would refuse fail in the hook, naming the spec field, and
keep every observed child: nothing is left for Metacontroller to apply and fail on."""

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import REPO, parent
from tests.simulator import Metacontroller

PD = REPO / "examples" / "pd-disaggregated.yaml"
Change = Callable[[dict[str, Any]], None]


@pytest.fixture(scope="module")
def converged(hooks) -> Metacontroller:
    mc = Metacontroller(hooks, parent(PD))
    mc.converge()
    return mc


def refusal(converged: Metacontroller, change: Change) -> str:
    """The failed message a converged PD graph gets for `change`; asserts nothing was written."""
    mc = copy.deepcopy(converged)
    before = {key: dict(child) for key, child in mc.children.items()}
    mc.edit(change)
    writes = mc.sync()
    assert mc.child_writes(writes) == [] and mc.children == before
    assert mc.parent["status"]["state"] == "failed"
    return mc.parent["status"]["message"]


def rename_service(old: str, new: str) -> Change:
    return lambda spec: spec["services"].__setitem__(new, spec["services"].pop(old))


TRAILING_NEWLINES = {
    "service name": (
        rename_service("decode", "decode\n"),
        "invalid spec: spec.services: service name 'decode\\n' must be a DNS label: lower-case letters, digits "
        "and '-', starting with a letter",
    ),
    "pod label key": (
        lambda spec: spec["services"]["decode"].update(podLabels={"team\n": "a"}),
        "invalid spec: spec.services.decode.podLabels: 'team\\n' is not a valid label or annotation key "
        "(e.g. example.com/team)",
    ),
    "pod label value": (
        lambda spec: spec["services"]["decode"].update(podLabels={"team": "a\n"}),
        "invalid spec: spec.services.decode.podLabels.team: String should match pattern "
        "'^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$'",
    ),
    "gateway name": (
        lambda spec: spec.update(gaie={"enabled": True, "tokenizerPath": "t", "gatewayName": "gw\n"}),
        "invalid spec: spec.gaie.gatewayName: String should match pattern "
        "'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'",
    ),
}


@pytest.mark.parametrize("case", TRAILING_NEWLINES)
def test_a_trailing_newline_is_not_a_valid_name(converged: Metacontroller, case: str) -> None:
    change, message = TRAILING_NEWLINES[case]
    assert refusal(converged, change) == message
