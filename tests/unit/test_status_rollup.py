"""The status roll-up called directly: a pure function of the parsed spec, the observed children,
the previous status and a clock. The graph tests (tests/graph/test_status_contract.py) drive it
through the simulator; these pin the branches a converging cluster rarely shows."""

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from hooks import answer as answer_step
from hooks import memo, status
from hooks import observed as observed_state
from hooks.api.graph import InferaDeployment
from hooks.contract import LAST_APPLIED_ANNOTATION, child_key
from hooks.encoding import EncodedChild
from hooks.render import render_children
from tests.support.graphs import GraphBuilder, graph
from tests.support.prerequisites import REPO
from tests.support.requests import parent
from tests.support.schemas import validate_status

PD = InferaDeployment.from_parent(parent(REPO / "examples" / "pd-disaggregated.yaml"))
GAIE = InferaDeployment.from_parent(parent(REPO / "examples" / "gaie-pd.yaml"))
MOMENT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
STAMP = "2026-11-30T12:00:00Z"


def clock() -> datetime:
    return MOMENT


def no_clock() -> datetime:
    raise AssertionError("the clock is read although no condition changed")


def converged(idep: InferaDeployment, ready: bool = True) -> list[dict[str, Any]]:
    """The rendered children as the API server reports them once their controllers caught up."""
    observed = []
    for child in render_children(idep):
        child = copy.deepcopy(child)
        child["metadata"]["generation"] = 1
        if child["kind"] in ("Deployment", "LeaderWorkerSet", "StatefulSet"):
            count = child["spec"]["replicas"] if ready else 0
            child["status"] = {
                "observedGeneration": 1,
                "replicas": child["spec"]["replicas"],
                "readyReplicas": count,
                "updatedReplicas": count,
            }
        if child["kind"] in ("InferencePool", "HTTPRoute") and ready:
            accepted = {"type": "Accepted", "status": "True", "observedGeneration": 1}
            child["status"] = {"parents": [{"conditions": [accepted]}]}
        observed.append(child)
    return observed


def wire(idep: InferaDeployment, observed: list[dict[str, Any]], previous: dict[str, Any] | None = None, **kw: Any):
    now = kw.pop("now", clock)
    inputs = status.StatusInputs.of({child_key(child): child for child in observed}, previous or {}, **kw)
    rolled = status.as_wire(status.roll_up(idep, inputs, now))
    validate_status(rolled)
    return rolled


def by_type(rolled: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in rolled["conditions"]}


def test_a_ready_graph_in_wire_form() -> None:
    """camelCase keys, nothing unset (no gaie key without GAIE), every condition stamped once."""
    assert wire(PD, converged(PD)) == {
        "state": "ready",
        "message": "all 3 services ready",
        "readyServices": "3/3",
        "services": {
            name: {"kind": "Deployment", "replicas": 1, "readyReplicas": 1} for name in ("decode", "prefill", "server")
        },
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "AllServicesReady",
                "message": "all 3 services ready",
                "observedGeneration": 1,
                "lastTransitionTime": STAMP,
            },
            {
                "type": "ChildKindsRegistered",
                "status": "True",
                "reason": "AllRegistered",
                "message": "every child kind the spec needs is registered",
                "observedGeneration": 1,
                "lastTransitionTime": STAMP,
            },
            {
                "type": "ChildrenCreated",
                "status": "True",
                "reason": "AllCreated",
                "message": "every child the graph needs exists",
                "observedGeneration": 1,
                "lastTransitionTime": STAMP,
            },
            {
                "type": "SpecValid",
                "status": "True",
                "reason": "Valid",
                "message": "spec is valid and rendered",
                "observedGeneration": 1,
                "lastTransitionTime": STAMP,
            },
        ],
    }


def test_an_unchanged_world_never_reads_the_clock() -> None:
    previous = wire(PD, converged(PD))
    assert wire(PD, converged(PD), previous, now=no_clock) == previous


def test_hostile_counts_in_observed_status_count_as_zero() -> None:
    """A workload status is whatever the API server holds; strings or booleans are not counts."""
    observed = converged(PD)
    for child in observed:
        if child["kind"] == "Deployment":
            child["status"] = {"observedGeneration": 1, "replicas": "1", "readyReplicas": True, "updatedReplicas": 1.0}
    rolled = wire(PD, observed)
    assert rolled["services"]["decode"] == {"kind": "Deployment", "replicas": 0, "readyReplicas": 0}
    assert (rolled["state"], rolled["readyServices"]) == ("pending", "0/3")


def test_a_workload_of_the_other_kind_still_reports_during_a_switch() -> None:
    """Moving decode to two nodes asks for a LeaderWorkerSet; until it exists, the Deployment
    that still serves is what the status reports."""
    multinode = InferaDeployment.from_parent(graph().nodes(decode=2).obj())
    rolled = wire(multinode, converged(PD))
    assert rolled["services"]["decode"] == {"kind": "Deployment", "replicas": 1, "readyReplicas": 1}


def test_a_rollout_its_controller_has_not_seen_is_not_ready() -> None:
    observed = converged(PD)
    decode = next(c for c in observed if c["metadata"]["name"] == "qwen-pd-decode")
    decode["metadata"]["generation"] = 2  # spec changed, status still from generation 1
    rolled = wire(PD, observed)
    assert (rolled["state"], rolled["message"]) == ("pending", "decode 0/1 ready; waiting on 1 of 3 services")


@pytest.mark.parametrize(
    ("change", "waiting"),
    [
        ("epp", "gateway: EPP 0/1 ready"),
        ("pool", "gateway: EPP 1/1 ready, InferencePool qwen-gaie-pool not accepted"),
        ("route", "gateway: EPP 1/1 ready, HTTPRoute qwen-gaie-route not accepted"),
        ("stale-route", "gateway: EPP 1/1 ready, HTTPRoute qwen-gaie-route not accepted"),
    ],
)
def test_the_gateway_holds_readiness_until_every_part_is_ready(change: str, waiting: str) -> None:
    observed = converged(GAIE)
    by_key = {(c["kind"], c["metadata"]["name"]): c for c in observed}
    epp = by_key[("Deployment", "qwen-gaie-epp")]
    pool, route = by_key[("InferencePool", "qwen-gaie-pool")], by_key[("HTTPRoute", "qwen-gaie-route")]
    if change == "epp":
        epp["status"]["readyReplicas"] = 0
    elif change == "pool":  # a gateway that writes conditions and has not accepted the pool
        pool["status"]["parents"][0]["conditions"][0]["status"] = "False"
    elif change == "route":
        del route["status"]
    else:  # an Accepted verdict about an older generation does not count
        route["metadata"]["generation"] = 2
    rolled = wire(GAIE, observed)
    assert (rolled["state"], rolled["message"]) == ("pending", waiting)
    assert by_type(rolled)["Ready"]["reason"] == "GatewayNotReady"
    assert rolled["gaie"]["ready"] is False


def test_a_pool_without_conditions_is_ready_once_it_exists() -> None:
    observed = converged(GAIE)
    next(c for c in observed if c["kind"] == "InferencePool").pop("status")
    rolled = wire(GAIE, observed)
    assert rolled["gaie"] == {
        "eppReplicas": 1,
        "eppReadyReplicas": 1,
        "inferencePoolName": "qwen-gaie-pool",
        "httpRouteName": "qwen-gaie-route",
        "inferencePoolReady": True,
        "httpRouteAccepted": True,
        "ready": True,
    }
    assert rolled["state"] == "ready"


def test_unregistered_kinds_fail_the_graph_and_notices_are_said() -> None:
    rolled = wire(PD, converged(PD), unregistered=["LeaderWorkerSet x cannot be created"], notices=["kept y"])
    assert (rolled["state"], rolled["message"]) == (
        "failed",
        "LeaderWorkerSet x cannot be created; all 3 services ready; kept y",
    )
    conditions = by_type(rolled)
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "KindNotRegistered")
    assert conditions["ChildKindsRegistered"]["message"] == "LeaderWorkerSet x cannot be created"
    assert (conditions["SpecValid"]["status"], conditions["SpecValid"]["message"]) == ("True", "kept y")


def test_a_failed_spec_keeps_the_registration_verdict_and_bounds_its_message() -> None:
    previous = wire(PD, converged(PD), unregistered=["HTTPRoute z cannot be created"])
    registered = by_type(previous)["ChildKindsRegistered"]
    rolled = status.as_wire(status.failed("x" * 5000, 3, previous, clock))
    validate_status(rolled)
    assert rolled["state"] == "failed"
    assert len(rolled["message"]) < status.MAX_MESSAGE and rolled["message"].endswith("(2992 more characters)")
    assert [c["type"] for c in rolled["conditions"]] == [
        "Ready",
        "ChildKindsRegistered",
        "ChildrenCreated",
        "SpecValid",
    ]
    assert by_type(rolled)["ChildKindsRegistered"] == registered
    assert by_type(rolled)["Ready"]["status"] == "Unknown"


def test_a_carried_over_condition_that_no_longer_fits_the_crd_is_dropped() -> None:
    previous = {"conditions": [{"type": "ChildKindsRegistered", "status": "Maybe"}, "not a condition"]}
    rolled = status.as_wire(status.failed("bad", 1, previous, clock))
    assert [c["type"] for c in rolled["conditions"]] == ["Ready", "SpecValid"]


def recorded(
    observed: list[dict[str, Any]], namespace: str = "ml", uid: str = "7b1c2d3e"
) -> dict[tuple[str, str], dict]:
    """The observed children with the last-applied record Metacontroller writes: each as
    answered, with the namespace and its controller-uid label stamped on."""
    by_key = {}
    for child in observed:
        applied = {k: v for k, v in copy.deepcopy(child).items() if k != "status"}
        applied["metadata"]["namespace"] = namespace
        applied["metadata"].setdefault("labels", {})["controller-uid"] = uid
        applied["metadata"].pop("generation", None)
        child = copy.deepcopy(child)
        child["metadata"].setdefault("annotations", {})[LAST_APPLIED_ANNOTATION] = json.dumps(applied)
        by_key[child_key(child)] = child
    return by_key


def with_spec(built: GraphBuilder) -> InferaDeployment:
    return InferaDeployment.from_parent(built.obj())


def answer(idep: InferaDeployment) -> list[EncodedChild]:
    return [EncodedChild.of(child) for child in render_children(idep)]


def changing(idep: InferaDeployment, observed: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    return answer_step.services_changing(answer_step.workloads_answered(idep, answer(idep), observed))


def test_services_changing_are_those_whose_workload_the_answer_changes_beyond_replicas() -> None:
    observed = recorded(converged(PD))
    assert changing(PD, observed) == []
    # Replicas alone: an autoscaler's or a scale's doing, counted against the new count instead.
    scaled = with_spec(graph().replicas(decode=3))
    assert changing(scaled, observed) == []
    # A new image is a new template for every pod; a workload the answer creates is new too.
    moved = with_spec(graph().image("rocm/infera:sglang-v0.1.2"))
    assert changing(moved, observed) == ["decode", "prefill", "server"]
    del observed[("Deployment", "qwen-pd-decode")]
    assert changing(PD, observed) == ["decode"]
    # Without a record (a workload adopted from elsewhere) nothing says it changes.
    bare = {
        key: {**child, "metadata": {k: v for k, v in child["metadata"].items() if k != "annotations"}}
        for key, child in observed.items()
    }
    assert changing(PD, bare) == ["decode"]


# --- the status memo's key: whatever the roll-up reads of an observed child is in it ---------------------------

KEYED_GRAPHS = [GAIE, InferaDeployment.from_parent(parent(REPO / "examples" / "pd-autoscaling.yaml"))]
# Fields another controller writes, added where they are missing, and values to set them to.
WRITTEN_FIELDS = [
    "replicas", "readyReplicas", "updatedReplicas", "observedGeneration", "generation", "currentReplicas",
    "desiredReplicas", "conditions", "parents", "status", "labels",
]  # fmt: skip
VALUES = [None, 0, 2, "True", [{"type": "Accepted", "status": "True", "observedGeneration": 3}]]


def changes(node: Any) -> Iterator[tuple[Any, Any]]:
    """Every (container, key) of `node` a field could be set at: each field present, and the
    fields controllers write added to each object."""
    if isinstance(node, dict):
        for key in list(node):
            yield node, key
            yield from changes(node[key])
        yield from ((node, field) for field in WRITTEN_FIELDS if field not in node)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield node, index
            yield from changes(item)


@pytest.mark.parametrize("idep", KEYED_GRAPHS, ids=lambda idep: idep.name)
def test_every_observed_field_the_roll_up_reads_is_in_the_status_memos_key(idep: InferaDeployment) -> None:
    """Each field of each observed child set to each of a few values: where the roll-up, reading
    the children whole, says anything else, the memo's key differs too."""
    observed = converged(idep)
    by_key = {child_key(child): child for child in observed}

    def whole() -> dict[str, Any]:
        return status.as_wire(status.roll_up(idep, status.StatusInputs.of(by_key, {}), clock))

    def key() -> str:  # as the memo takes it: at once, as text
        return memo.key_of((idep, status.StatusInputs.of(by_key, {}))).hex()

    unchanged, unchanged_key = whole(), key()
    missed = []
    for child in observed:
        for container, field in list(changes(child)):
            # A child's kind and name identify it; its metadata is an object, its spec and status
            # one or none (contract.py checks the first two, the API server's schemas the last).
            if (container is child and field in ("kind", "apiVersion", "metadata")) or (
                container is child["metadata"] and field == "name"
            ):
                continue
            present, before = (
                field in container if isinstance(container, dict) else True,
                container[field] if (not isinstance(container, dict) or field in container) else None,
            )
            for value in [None, {}] if container is child and field in ("spec", "status") else VALUES:
                container[field] = value
                try:
                    rolled = whole()
                except (AttributeError, TypeError):  # a shape the API server's schema refuses
                    continue
                if rolled != unchanged and key() == unchanged_key:
                    missed.append((child["kind"], child["metadata"]["name"], field, value))
            if present:
                container[field] = before
            else:
                del container[field]
    assert missed == []


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("FailedGetResourceMetric:  the  metrics\nAPI is down", "FailedGetResourceMetric: the metrics API is down"),
        ("x" * 200, "x" * 200),
        ("y" * 201, "y" * 199 + "…"),
    ],
)
def test_another_controllers_words_are_quoted_on_one_line_and_a_cut_says_so(text: str, shown: str) -> None:
    assert observed_state.quoted(text) == shown
