"""Specs whose children the API server would refuse fail in the hook, naming the spec field, and
keep every observed child: nothing is left for Metacontroller to apply and fail on."""

import copy
import re
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


def test_a_child_over_the_object_size_limit_is_refused(converged: Metacontroller) -> None:
    big = {"name": "BLOB", "value": "x" * (1536 * 1024)}
    message = refusal(converged, lambda spec: spec.update(envs=[big]))
    assert re.fullmatch(
        r"Deployment qwen-pd-decode would be 1,5\d\d,\d\d\d bytes; the API server stores at most 1,572,864 bytes "
        r"\(1\.5 MiB\) per object: shorten what the spec puts in it \(envs, args, extraPodSpec, patches\)",
        message,
    ), message


def test_an_answer_over_the_size_bound_is_refused(converged: Metacontroller) -> None:
    def many_services_with_long_envs(spec: dict[str, Any]) -> None:
        spec["envs"] = [{"name": "BLOB", "value": "x" * (600 * 1024)}]
        for index in range(20):
            spec["services"][f"pool{index:02d}"] = copy.deepcopy(spec["services"]["decode"])

    message = refusal(converged, many_services_with_long_envs)
    # Rendering stops at the first child past the bound (8 MiB at 600 KiB per pool: the 14th pool).
    assert re.fullmatch(
        r"the graph's children would be 8,\d\d\d,\d\d\d bytes together, past the hook's bound of 8,388,608 bytes "
        r"\(8 MiB\) per InferaDeployment \(reached at Deployment qwen-pd-pool1\d\): use fewer services or smaller "
        r"envs, args, extraPodSpec and patches",
        message,
    ), message


def test_a_failure_message_stays_short_whatever_it_quotes(converged: Metacontroller) -> None:
    key = "k" * 100_000 + "\n"
    message = refusal(converged, lambda spec: spec["services"]["decode"].update(podLabels={key: "a"}))
    assert len(message) <= 2048
    assert message.startswith("invalid spec: spec.services.decode.podLabels: 'kkkk")
    assert message.endswith(" more characters)")
