"""Per-service autoscaling and disruption budgets, through the hook app and the simulated
Metacontroller: the hook hands the replica count to a HorizontalPodAutoscaler and never fights
it, and a node drain takes at most `maxUnavailable` pods of a pool."""

import copy
from typing import Any

import pytest

from hooks.renderers.autoscaling import DEFAULT_BEHAVIOR
from tests.support.graphs import GraphBuilder, graph
from tests.support.prerequisites import need_schemas
from tests.support.requests import PD, children_by_key, controller, parent, request_body
from tests.support.simulator import Metacontroller

QUEUE_DEPTH = {
    "type": "Pods",
    "pods": {"metric": {"name": "sglang_num_queue_reqs"}, "target": {"type": "AverageValue", "averageValue": "8"}},
}
AUTOSCALING = {"minReplicas": 1, "maxReplicas": 8, "metrics": [QUEUE_DEPTH]}
DECODE = ("Deployment", "qwen-pd-decode")
REFUSED = "spec.services.decode.autoscaling: the API server would refuse HorizontalPodAutoscaler qwen-pd-decode made from it: "


def pods(name: str = "m", target: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Pods metric source (and only the source)."""
    return {"pods": {"metric": {"name": name}, "target": target or {"type": "AverageValue", "averageValue": "1"}}}


def metrics(*items: dict[str, Any]) -> dict[str, Any]:
    return {"maxReplicas": 2, "metrics": [item if "type" in item else {"type": "Pods", **item} for item in items]}


def behavior(**scale_down: Any) -> dict[str, Any]:
    return {**metrics(pods()), "behavior": {"scaleDown": scale_down}}


DECODE_HPA = ("HorizontalPodAutoscaler", "qwen-pd-decode")


def autoscaled(**decode: Any) -> GraphBuilder:
    """The PD graph with its decode pool autoscaled (and `decode` changes on top)."""
    return graph().autoscaling("decode", **AUTOSCALING).service("decode", **decode)


def converged(hooks, obj: dict[str, Any]) -> Metacontroller:
    mc = Metacontroller(hooks, obj)
    mc.converge()
    mc.mark_ready()
    mc.converge()
    return mc


def test_the_autoscaler_targets_the_pool_and_starts_from_replicas(hooks) -> None:
    answer = hooks.sync(autoscaled(replicas=2).obj())
    children = children_by_key(answer)
    assert children[DECODE_HPA] == {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {
            "name": "qwen-pd-decode",
            "labels": {
                "app.kubernetes.io/managed-by": "infera-hooks",
                "infera.amd.com/deployment": "qwen-pd",
                "infera.amd.com/service": "decode",
            },
        },
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "qwen-pd-decode"},
            "minReplicas": 1,
            "maxReplicas": 8,
            "metrics": [QUEUE_DEPTH],
            "behavior": DEFAULT_BEHAVIOR,
        },
    }
    # Before the workload exists, replicas is where it starts.
    assert children[DECODE]["spec"]["replicas"] == 2
    assert [key for key in children if key[0] == "HorizontalPodAutoscaler"] == [DECODE_HPA]


def test_the_default_behavior_scales_up_at_once_and_down_slowly() -> None:
    """A new worker takes minutes to load a model: shedding one in a lull is expensive."""
    assert DEFAULT_BEHAVIOR["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert DEFAULT_BEHAVIOR["scaleDown"] == {
        "stabilizationWindowSeconds": 600,
        "selectPolicy": "Max",
        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
    }


def test_metric_quantities_are_rendered_as_the_api_server_stores_them(hooks) -> None:
    """`averageValue: 1000m` is stored as "1", an unquoted 8 as "8", 0.5 as "500m", and a null
    not at all: anything else would be re-applied on every sync."""
    metrics = [
        {
            "type": "Pods",
            "pods": {"metric": {"name": "a"}, "target": {"type": "AverageValue", "averageValue": "1000m"}},
        },
        {
            "type": "External",
            "external": {"metric": {"name": "b", "selector": None}, "target": {"type": "Value", "value": 8}},
        },
        {
            "type": "External",
            "external": {"metric": {"name": "c"}, "target": {"type": "AverageValue", "averageValue": 0.5}},
        },
    ]
    obj = autoscaled(
        autoscaling={**AUTOSCALING, "metrics": metrics, "behavior": {"scaleDown": {"selectPolicy": "Min"}}}
    ).obj()
    hpa = children_by_key(hooks.sync(obj))[DECODE_HPA]["spec"]
    assert [m["pods" if m["type"] == "Pods" else "external"]["target"] for m in hpa["metrics"]] == [
        {"type": "AverageValue", "averageValue": "1"},
        {"type": "Value", "value": "8"},
        {"type": "AverageValue", "averageValue": "500m"},
    ]
    assert hpa["metrics"][1]["external"]["metric"] == {"name": "b"}  # the API server drops a null
    assert hpa["behavior"] == {"scaleDown": {"selectPolicy": "Min"}}  # given: passed through as written


def test_a_scale_up_by_the_autoscaler_is_never_undone(hooks) -> None:
    """The hook emits the live count the autoscaler set, so the count is never changed back.
    Metacontroller records every desired object in its last-applied annotation, so the first
    sync after a scaling decision updates that annotation alone (a Deployment's generation moves
    with its annotations, which it copies to its ReplicaSets); after it, nothing is written."""
    mc = converged(hooks, autoscaled().obj())
    mc.autoscale(*DECODE, 5)
    scaled = copy.deepcopy(mc.children[DECODE])
    assert mc.child_writes(mc.sync()) == [("update", *DECODE)]
    recorded = mc.children[DECODE]
    assert recorded["spec"] == scaled["spec"]
    assert recorded["metadata"]["generation"] == scaled["metadata"]["generation"] + 1
    for _ in range(5):
        assert mc.child_writes(mc.sync()) == []
    assert mc.children[DECODE]["spec"]["replicas"] == 5
    assert mc.sync() == []  # the status settled too
    notice = "decode: replicas 1 in the spec is not applied while autoscaling owns the count (5 now)"
    assert mc.parent["status"]["message"].endswith(notice)


def test_a_new_replicas_in_the_spec_is_not_applied_while_the_autoscaler_owns_the_count(hooks) -> None:
    """The router's scaling API (or a user) writing spec replicas: said in status, not applied."""
    mc = converged(hooks, autoscaled().obj())
    mc.autoscale(*DECODE, 4)
    mc.converge()
    mc.edit(lambda spec: spec["services"]["decode"].update(replicas=2))
    assert mc.child_writes(mc.sync()) == []
    assert mc.children[DECODE]["spec"]["replicas"] == 4
    assert mc.parent["status"]["message"].endswith(
        "decode: replicas 2 in the spec is not applied while autoscaling owns the count (4 now)"
    )


def test_new_bounds_clamp_the_live_count(hooks) -> None:
    mc = converged(hooks, autoscaled().obj())
    mc.autoscale(*DECODE, 6)
    mc.converge()
    mc.edit(lambda spec: spec["services"]["decode"]["autoscaling"].update(maxReplicas=3))
    assert mc.child_writes(mc.sync()) == [("update", *DECODE), ("update", *DECODE_HPA)]
    assert mc.children[DECODE]["spec"]["replicas"] == 3
    mc.edit(lambda spec: spec["services"]["decode"]["autoscaling"].update(minReplicas=3, maxReplicas=3))
    mc.converge()
    mc.autoscale(*DECODE, 1)  # below the floor (a stale write): lifted back
    assert mc.child_writes(mc.sync()) == [("update", *DECODE)]
    assert mc.children[DECODE]["spec"]["replicas"] == 3


def test_removing_autoscaling_hands_the_count_back_in_one_sync(hooks) -> None:
    mc = converged(hooks, autoscaled(replicas=2).obj())
    mc.autoscale(*DECODE, 7)
    mc.converge()
    mc.edit(lambda spec: spec["services"]["decode"].pop("autoscaling"))
    assert mc.child_writes(mc.sync()) == [("update", *DECODE), ("delete", *DECODE_HPA)]
    assert mc.children[DECODE]["spec"]["replicas"] == 2
    assert mc.sync() == []


def test_status_reports_the_autoscaler(hooks) -> None:
    mc = converged(hooks, autoscaled().obj())
    mc.set_status(
        *DECODE_HPA,
        {
            "currentReplicas": 2,
            "desiredReplicas": 5,
            "conditions": [
                {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale", "message": "ok"},
                {
                    "type": "ScalingActive",
                    "status": "False",
                    "reason": "FailedGetPodsMetric",
                    "message": "unable to get metric sglang_num_queue_reqs: " + "x" * 400,
                },
            ],
        },
    )
    mc.sync()
    status = mc.parent["status"]
    assert status["services"]["decode"]["autoscaling"] == {
        "minReplicas": 1,
        "maxReplicas": 8,
        "currentReplicas": 2,
        "desiredReplicas": 5,
    }
    assert "autoscaling" not in status["services"]["prefill"]
    trouble = "decode autoscaler: ScalingActive is False (FailedGetPodsMetric: unable to get metric"
    assert trouble in status["message"]
    assert len(status["message"]) < 400  # the autoscaler's own message is cut short
    assert status["state"] == "ready"  # the pool serves; it only cannot scale


def test_a_switch_between_one_and_several_nodes_moves_the_autoscaler_along(hooks) -> None:
    """The LeaderWorkerSet counts groups, not pods: it starts from replicas, not the Deployment's count."""
    need_schemas()
    mc = Metacontroller(hooks, autoscaled(replicas=2).obj(), composite=controller("lws"))
    mc.converge()
    mc.autoscale(*DECODE, 5)
    mc.converge()
    mc.edit(lambda spec: spec["services"]["decode"].update(numberOfNodes=2))
    mc.converge()
    lws = mc.children[("LeaderWorkerSet", "qwen-pd-decode")]
    assert lws["spec"]["replicas"] == 2 and DECODE not in mc.children
    assert mc.children[DECODE_HPA]["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": "qwen-pd-decode",
    }
    mc.autoscale("LeaderWorkerSet", "qwen-pd-decode", 3)
    mc.converge()
    assert mc.children[("LeaderWorkerSet", "qwen-pd-decode")]["spec"]["replicas"] == 3


@pytest.mark.parametrize(
    ("services", "budgets"),
    [
        ({}, {"qwen-pd-decode": 1, "qwen-pd-prefill": 1}),  # workers always; a single router never
        ({"server": {"replicas": 2}}, {"qwen-pd-decode": 1, "qwen-pd-prefill": 1, "qwen-pd-server": 1}),
        (
            {"server": {"autoscaling": {**AUTOSCALING, "minReplicas": 2}}},
            {"qwen-pd-decode": 1, "qwen-pd-prefill": 1, "qwen-pd-server": 1},
        ),
        ({"server": {"replicas": 3, "autoscaling": AUTOSCALING}}, {"qwen-pd-decode": 1, "qwen-pd-prefill": 1}),
        ({"decode": {"disruptionBudget": {"maxUnavailable": "25%"}}}, {"qwen-pd-decode": "25%", "qwen-pd-prefill": 1}),
        ({"prefill": {"disruptionBudget": {"enabled": False}}}, {"qwen-pd-decode": 1}),
    ],
)
def test_disruption_budgets(hooks, services: dict[str, Any], budgets: dict[str, int | str]) -> None:
    built = graph()
    for service, fields in services.items():
        built.service(service, **fields)
    children = children_by_key(hooks.sync(built.obj()))
    rendered = {name: child for (kind, name), child in children.items() if kind == "PodDisruptionBudget"}
    assert {name: pdb["spec"]["maxUnavailable"] for name, pdb in rendered.items()} == budgets
    for name, pdb in rendered.items():
        service = name.removeprefix("qwen-pd-")
        assert pdb["spec"]["selector"] == {
            "matchLabels": {"infera.amd.com/deployment": "qwen-pd", "infera.amd.com/service": service}
        }
        # The budget selects exactly the pool's pods.
        assert (
            pdb["spec"]["selector"]["matchLabels"].items()
            <= children[("Deployment", name)]["spec"]["template"]["metadata"]["labels"].items()
        )
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_a_budget_over_a_multinode_pool_selects_every_rank(hooks) -> None:
    need_schemas()
    obj = graph().nodes(decode=2).obj()
    children = children_by_key(hooks.hook("/sync", request_body(obj, composite=controller("lws"))))
    selector = children[("PodDisruptionBudget", "qwen-pd-decode")]["spec"]["selector"]["matchLabels"]
    template = children[("LeaderWorkerSet", "qwen-pd-decode")]["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        assert selector.items() <= template[role]["metadata"]["labels"].items()


def test_without_the_budget_kind_registered_default_budgets_are_left_out_and_said(hooks) -> None:
    composite = controller()
    composite["spec"]["childResources"] = [
        c for c in composite["spec"]["childResources"] if c["resource"] != "poddisruptionbudgets"
    ]
    answer = hooks.hook("/sync", request_body(parent(PD), composite=composite))
    assert [key for key in children_by_key(answer) if key[0] == "PodDisruptionBudget"] == []
    assert ("Deployment", "qwen-pd-decode") in children_by_key(answer)
    assert answer["status"]["state"] == "initializing"
    assert answer["status"]["message"].endswith(
        "no PodDisruptionBudget for decode, prefill: this CompositeController does not register PodDisruptionBudget "
        "(policy/v1); enable it in metacontroller/compositecontroller.yaml"
    )
    # Asked for explicitly, a budget the controller cannot create fails the graph, as any other kind.
    obj = graph().service("decode", disruptionBudget={"maxUnavailable": 2}).obj()
    answer = hooks.hook("/sync", request_body(obj, composite=composite))
    assert answer["status"]["state"] == "failed"
    assert "PodDisruptionBudget qwen-pd-decode cannot be created" in answer["status"]["message"]


@pytest.mark.parametrize(
    ("autoscaling", "message"),
    [
        ({"maxReplicas": 2}, "spec.services.decode.autoscaling.metrics: Field required"),
        (
            {"maxReplicas": 2, "metrics": []},
            "spec.services.decode.autoscaling.metrics: List should have at least 1 item",
        ),
        (
            {"maxReplicas": 2, "metrics": [{**QUEUE_DEPTH, "pods": {**QUEUE_DEPTH["pods"], "window": "1m"}}]},
            "spec.services.decode.autoscaling: the API server would refuse HorizontalPodAutoscaler qwen-pd-decode "
            "made from it: spec.metrics[0].pods: unknown field 'window'",
        ),
        (
            {"maxReplicas": 2, "metrics": [{"type": "Pods", "pods": {"metric": {"name": "m"}}}]},
            "spec.services.decode.autoscaling: the API server would refuse HorizontalPodAutoscaler qwen-pd-decode "
            "made from it: spec.metrics[0].pods: must contain ['target'] properties",
        ),
        (
            {"maxReplicas": 2, "metrics": [{"type": "Object", "object": {"target": {"value": "lots"}}}]},
            "spec.services.decode.autoscaling.metrics[0].object.target.value: 'lots' is not a Kubernetes quantity",
        ),
        # What the API server's autoscaling validation refuses beyond the schema.
        (
            metrics(pods(target={"type": "AverageValue"})),
            REFUSED + "spec.metrics[0].pods.target.averageValue: a AverageValue target needs a positive averageValue",
        ),
        (
            metrics(pods(target={"type": "AverageValue", "averageValue": "-1"})),
            REFUSED + "spec.metrics[0].pods.target.averageValue: a AverageValue target needs a positive averageValue",
        ),
        (
            metrics(pods(target={"type": "Value", "value": "1"})),
            REFUSED + "spec.metrics[0].pods.target.type: must be AverageValue for a Pods metric",
        ),
        (
            metrics({"type": "Foo"}),
            REFUSED + "spec.metrics[0].type: 'Foo' must be one of Object, Pods, Resource, ContainerResource, External",
        ),
        (
            metrics({"type": "External", **pods()}),
            REFUSED + "spec.metrics[0]: a External metric sets external and no other source (it sets pods)",
        ),
        (
            metrics(pods(name="")),
            REFUSED + "spec.metrics[0].pods.metric.name: '' is not a metric name (non-empty, no '/' or '%')",
        ),
        (
            metrics(
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 0}},
                }
            ),
            REFUSED
            + "spec.metrics[0].resource.target.averageUtilization: a Utilization target needs a positive averageUtilization",
        ),
        (
            behavior(policies=[]),
            REFUSED
            + "spec.behavior.scaleDown.policies: must list at least one policy (leave the field out for the default)",
        ),
        (
            behavior(stabilizationWindowSeconds=99999),
            REFUSED + "spec.behavior.scaleDown.stabilizationWindowSeconds: must be between 0 and 3600",
        ),
        (
            behavior(selectPolicy="Bogus"),
            REFUSED + "spec.behavior.scaleDown.selectPolicy: 'Bogus' must be one of Max, Min, Disabled",
        ),
        (
            behavior(policies=[{"type": "Pods", "value": 0, "periodSeconds": 60}]),
            REFUSED + "spec.behavior.scaleDown.policies[0].value: must be greater than 0",
        ),
        (
            behavior(policies=[{"type": "Pods", "value": 1, "periodSeconds": 5000}]),
            REFUSED + "spec.behavior.scaleDown.policies[0].periodSeconds: must be between 1 and 1800",
        ),
        (
            behavior(tolerance="0.05"),
            REFUSED
            + "spec.behavior.scaleDown.tolerance: needs the HPAConfigurableTolerance feature gate; leave it out",
        ),
    ],
)
def test_a_bad_autoscaling_spec_fails_in_status_and_keeps_what_runs(hooks, autoscaling: dict, message: str) -> None:
    mc = converged(hooks, parent(PD))
    before = copy.deepcopy(mc.children)
    mc.edit(lambda spec: spec["services"]["decode"].update(autoscaling=autoscaling))
    assert mc.child_writes(mc.sync()) == []
    assert mc.children == before
    assert mc.parent["status"]["state"] == "failed"
    assert message in mc.parent["status"]["message"]


def test_a_failing_spec_or_a_withheld_kind_keeps_the_autoscalers_count(hooks) -> None:
    """Where the hook keeps what runs as last applied, an autoscaled workload keeps the count its
    autoscaler set: the recorded one would undo every decision while the spec is being fixed."""
    mc = converged(hooks, autoscaled(replicas=2).obj())
    mc.autoscale(*DECODE, 6)
    mc.converge()
    mc.edit(
        lambda spec: spec.update(
            patches=[
                {
                    "target": {"kind": "Deployment", "name": "qwen-pd-nope"},
                    "patch": [{"op": "add", "path": "/spec/paused", "value": True}],
                }
            ]
        )
    )
    mc.sync()
    assert mc.parent["status"]["state"] == "failed"
    for count in (3, 8):
        mc.autoscale(*DECODE, count)
        assert mc.child_writes(mc.sync()) in ([], [("update", *DECODE)])
        assert mc.children[DECODE]["spec"]["replicas"] == count
    # The same while the pool is held back for a kind the controller does not register.
    mc.edit(lambda spec: spec.pop("patches"))
    mc.edit(lambda spec: spec["services"]["decode"].update(numberOfNodes=2))
    mc.sync()
    assert mc.parent["status"]["state"] == "failed"
    mc.autoscale(*DECODE, 5)
    mc.converge()
    assert mc.children[DECODE]["spec"]["replicas"] == 5


@pytest.mark.parametrize(
    ("kind", "path", "field"),
    [("Deployment", "/spec/replicas", "replicas"), ("HorizontalPodAutoscaler", "/spec/maxReplicas", "maxReplicas")],
)
def test_a_patch_on_what_the_autoscaler_owns_is_refused(hooks, kind: str, path: str, field: str) -> None:
    obj = autoscaled().patch(kind, "qwen-pd-decode", {"op": "replace", "path": path, "value": 3}).obj()
    status = hooks.sync(obj)["status"]
    assert status["state"] == "failed"
    assert status["message"].startswith(
        f"patches[0] ({kind} qwen-pd-decode): spec.{field} is set by spec.services.decode.autoscaling, not by a patch"
    )


def test_readiness_counts_an_autoscaled_pool_against_its_minimum(hooks) -> None:
    """A scale-up is minutes of model loading: it must not turn a serving graph pending."""
    mc = converged(hooks, autoscaled().obj())
    mc.autoscale(*DECODE, 4)
    # The Deployment controller sees the new count: one pod ready, three loading their model.
    mc.mark_ready(lambda kind, name: 1 if name == "qwen-pd-decode" else None)
    mc.sync()
    assert mc.parent["status"]["state"] == "ready"
    assert mc.parent["status"]["services"]["decode"]["replicas"] == 4


def test_no_notice_for_an_autoscaler_the_controller_cannot_create(hooks) -> None:
    composite = controller()
    composite["spec"]["childResources"] = [
        c for c in composite["spec"]["childResources"] if c["resource"] != "horizontalpodautoscalers"
    ]
    mc = Metacontroller(hooks, parent(PD), composite=composite)
    mc.converge()
    mc.edit(lambda spec: spec["services"]["decode"].update(replicas=3, autoscaling=copy.deepcopy(AUTOSCALING)))
    mc.sync()
    message = mc.parent["status"]["message"]
    assert message.startswith("HorizontalPodAutoscaler qwen-pd-decode cannot be created")
    assert "autoscaling owns" not in message


def test_a_missing_autoscaler_beside_a_running_pool_is_said(hooks) -> None:
    """An autoscaler the API server refused leaves the pool at a fixed count: say it, rather than
    report a healthy graph with nothing scaling it."""
    mc = converged(hooks, autoscaled().obj())
    del mc.children[DECODE_HPA]  # refused, or deleted by hand
    status = hooks.hook("/sync", mc.body())["status"]
    assert "decode autoscaler: HorizontalPodAutoscaler qwen-pd-decode does not exist yet" in status["message"]
    mc.converge()  # created again: the message goes
    assert "does not exist" not in mc.parent["status"]["message"]
