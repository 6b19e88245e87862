"""BlueGreen rollouts that survive faults: a front door deleted or edited by hand, a status
lost, and a serving generation's workload deleted mid-rollout. After every sync the invariant of
test_blue_green holds (no router sees two generations, nothing ready behind the front door is
lost), and the serving generation is never deleted while the incoming one is not ready."""

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from hooks.contract import LAST_APPLIED_ANNOTATION
from hooks.generations import TEMPLATES_ANNOTATION
from hooks.vocabulary import GENERATION_LABEL
from tests.graph.test_blue_green import GAIE_PD, blue_green, checked_sync, generation_names, only_ready, serving
from tests.support.apply import record
from tests.support.requests import PD
from tests.support.simulator import Metacontroller

SERVER_SERVICE = ("Service", "qwen-pd-server")


def mid_rollout(
    hooks: Any, change: Callable[[dict[str, Any]], None], source: Any = PD
) -> tuple[Metacontroller, str, str]:
    """A served BlueGreen graph, `change`d: the new generation created and none of it ready."""
    mc = serving(Metacontroller(hooks, blue_green(source)))
    old = mc.parent["status"]["rollout"]["servingGeneration"]
    mc.edit(change)
    checked_sync(mc)
    new = mc.parent["status"]["rollout"]["incomingGeneration"]
    mc.mark_ready(only_ready(mc, new))
    assert checked_sync(mc) == []
    return mc, old, new


def new_image(spec: dict[str, Any]) -> None:
    spec["image"] = "rocm/infera:sglang-v0.1.2"


def decode_flag(spec: dict[str, Any]) -> None:
    spec["services"]["decode"]["args"].append("--enable-metrics")


def route_backend(mc: Metacontroller) -> str:
    (route,) = [child for (kind, _), child in mc.children.items() if kind == "HTTPRoute"]
    return route["spec"]["rules"][0]["backendRefs"][0]["name"]


def delete_service(mc: Metacontroller, new: str) -> None:
    mc.delete(*SERVER_SERVICE)


def select_new(mc: Metacontroller, new: str) -> None:
    mc.children[SERVER_SERVICE]["spec"]["selector"][GENERATION_LABEL] = new


def wipe_status(fault: Callable[[Metacontroller, str], None]) -> Callable[[Metacontroller, str], None]:
    def both(mc: Metacontroller, new: str) -> None:
        fault(mc, new)
        mc.parent["status"] = {}

    return both


@pytest.mark.parametrize(
    "fault",
    [delete_service, select_new, wipe_status(delete_service), wipe_status(lambda mc, new: None)],
    ids=["deleted", "edited", "deleted and status lost", "status lost"],
)
def test_a_front_door_lost_mid_rollout_is_restored_and_the_serving_generation_kept(hooks, fault) -> None:
    mc, old, new = mid_rollout(hooks, new_image)
    serving_children = {key: copy.deepcopy(mc.children[key]) for key in generation_names(mc, old)}
    fault(mc, new)
    writes = checked_sync(mc)
    assert not [write for write in writes if write[0] == "delete"]
    assert mc.children[SERVER_SERVICE]["spec"]["selector"][GENERATION_LABEL] == old
    assert {key: mc.children[key] for key in serving_children} == serving_children
    rollout = mc.parent["status"]["rollout"]
    assert (rollout["servingGeneration"], rollout["incomingGeneration"]) == (old, new)
    assert checked_sync(mc) == []
    assert mc.parent["status"]["state"] == "ready"
    # The rollout then goes on as ever: the door moves once the new generation is ready.
    mc.mark_ready()
    assert checked_sync(mc) == [("update", *SERVER_SERVICE)]
    assert checked_sync(mc) == [("delete", *key) for key in sorted(serving_children)]


def test_the_front_door_restored_is_said_while_it_is_put_back(hooks) -> None:
    mc, old, new = mid_rollout(hooks, new_image)
    select_new(mc, new)
    mc.sync()
    assert mc.parent["status"]["rollout"]["message"].endswith(
        f"; the front door, deleted or edited, is restored to generation {old}"
    )
    mc.sync()
    assert "restored" not in mc.parent["status"]["rollout"]["message"]


@pytest.mark.parametrize(
    "fault",
    [
        lambda mc, new: mc.delete(*next(key for key in mc.children if key[0] == "HTTPRoute")),
        lambda mc, new: next(c for (k, _), c in mc.children.items() if k == "HTTPRoute")["spec"]["rules"][0][
            "backendRefs"
        ][0].update(name=f"qwen-gaie-pool-{new}"),
    ],
    ids=["route deleted", "route edited"],
)
def test_a_gateway_front_door_lost_mid_rollout_is_restored(hooks, fault) -> None:
    mc, old, new = mid_rollout(hooks, new_image, GAIE_PD)
    mc.gateway_accepts()
    before = route_backend(mc)
    assert before.endswith(old)
    fault(mc, new)
    writes = checked_sync(mc)
    assert not [write for write in writes if write[0] == "delete"]
    assert route_backend(mc) == before
    assert mc.parent["status"]["rollout"]["servingGeneration"] == old


def test_with_every_witness_lost_and_nothing_ready_nothing_is_deleted(hooks) -> None:
    mc, old, new = mid_rollout(hooks, new_image)
    mc.mark_ready(lambda kind, name: 0 if name.startswith("qwen-pd-") and not name.endswith("nats") else None)
    mc.delete(*SERVER_SERVICE)
    mc.parent["status"] = {}
    writes = mc.child_writes(mc.sync())
    assert writes == [("create", *SERVER_SERVICE)]
    # An older generation exists only because it served: the door goes back to it.
    assert mc.children[SERVER_SERVICE]["spec"]["selector"][GENERATION_LABEL] == old


def recorded_body(child: dict[str, Any]) -> dict[str, Any]:
    return json.loads(child["metadata"]["annotations"][LAST_APPLIED_ANNOTATION])


def test_a_serving_workload_the_spec_still_renders_is_recreated_as_it_was(hooks) -> None:
    """Only decode changes: the serving generation's prefill, deleted mid-rollout, is rendered
    by this spec exactly as it was (its siblings' record proves it), so it is created again."""
    mc, old, new = mid_rollout(hooks, decode_flag)
    key = ("Deployment", f"qwen-pd-prefill-{old}")
    before = recorded_body(mc.children[key])
    mc.delete(*key)
    assert mc.child_writes(mc.sync()) == [("create", *key)]
    assert recorded_body(mc.children[key]) == before
    assert mc.parent["status"]["state"] == "pending"  # its pods start again
    mc.mark_ready(only_ready(mc, new))
    assert checked_sync(mc) == []
    assert mc.parent["status"]["state"] == "ready"


def test_a_serving_picker_and_pool_the_spec_still_renders_are_recreated(hooks) -> None:
    mc, old, new = mid_rollout(hooks, decode_flag, GAIE_PD)
    mc.gateway_accepts()
    gone = [key for key in generation_names(mc, old) if key[0] in ("InferencePool", "Service", "Deployment")]
    gone = [key for key in gone if "epp" in key[1] or key[0] == "InferencePool"]
    before = {key: recorded_body(mc.children[key]) for key in gone}
    assert len(before) == 3  # the picker, its Service and the pool
    for key in gone:
        mc.delete(*key)
    assert sorted(mc.child_writes(mc.sync())) == sorted(("create", *key) for key in gone)
    assert {key: recorded_body(mc.children[key]) for key in gone} == before


def test_a_serving_workload_the_spec_renders_differently_is_not_guessed_and_is_said(hooks) -> None:
    mc, old, new = mid_rollout(hooks, new_image)
    key = ("Deployment", f"qwen-pd-decode-{old}")
    mc.delete(*key)
    assert mc.child_writes(mc.sync()) == []
    status = mc.parent["status"]
    said = (
        f"Deployment qwen-pd-decode-{old} of the serving generation {old} is gone, and this spec renders it "
        f"differently: revert the spec to generation {old}'s to recreate it, or let generation {new} become ready "
        "to replace it"
    )
    created = next(c for c in status["conditions"] if c["type"] == "ChildrenCreated")
    assert (created["status"], created["reason"], created["message"]) == ("False", "ServingChildrenLost", said)
    assert status["state"] == "pending" and said in status["message"]
    # Reverting makes the serving generation the spec's again: it is rendered whole.
    mc.edit(lambda spec: spec.update(image="rocm/infera:sglang-v0.1.1"))
    writes = checked_sync(mc)
    assert ("create", *key) in writes
    assert all(write[2].endswith(new) for write in writes if write[0] == "delete")


def test_a_generation_without_a_record_is_not_guessed(hooks) -> None:
    """A generation an earlier build made records no templates: its lost workload is not guessed."""
    mc, old, new = mid_rollout(hooks, decode_flag)
    for key in generation_names(mc, old):
        annotations = mc.children[key]["metadata"].get("annotations", {})
        if annotations.pop(TEMPLATES_ANNOTATION, None) is not None:
            applied = json.loads(annotations[LAST_APPLIED_ANNOTATION])
            del applied["metadata"]["annotations"][TEMPLATES_ANNOTATION]
            record(mc.children[key], applied)
    key = ("Deployment", f"qwen-pd-prefill-{old}")
    mc.delete(*key)
    assert mc.child_writes(mc.sync()) == []
    # Nothing says what it ran, nor that it ever existed: the serving pool says it is short.
    assert mc.parent["status"]["message"].startswith("prefill 0/1 ready; waiting on 1 of 3 services; ")
    created = next(c for c in mc.parent["status"]["conditions"] if c["type"] == "ChildrenCreated")
    assert created["status"] == "True"


def test_every_workload_of_a_generation_carries_the_record_of_them_all(hooks) -> None:
    mc = serving(Metacontroller(hooks, blue_green(GAIE_PD)))
    generation = mc.parent["status"]["rollout"]["servingGeneration"]
    workloads = [mc.children[key] for key in generation_names(mc, generation) if key[0] == "Deployment"]
    records = {child["metadata"]["annotations"][TEMPLATES_ANNOTATION] for child in workloads}
    (record,) = records
    assert [[kind, name] for kind, name, _ in json.loads(record)] == [
        ["Deployment", f"qwen-gaie-{service}"] for service in ("decode", "epp", "prefill")
    ]


def test_a_record_anyone_else_could_have_written_is_not_believed(hooks) -> None:
    """The record names the graph's own workloads with a digest each; any other is passed over,
    so that a forged record can neither recreate nor fill the status with what it says."""
    mc, old, new = mid_rollout(hooks, decode_flag)
    forged = json.dumps([["Deployment", "x" * 5000, "0" * 16], ["Deployment", "qwen-pd-prefill", "0" * 16]])
    for key in generation_names(mc, old):
        annotations = mc.children[key]["metadata"].get("annotations") or {}
        if TEMPLATES_ANNOTATION in annotations:
            annotations[TEMPLATES_ANNOTATION] = forged
    mc.delete("Deployment", f"qwen-pd-prefill-{old}")
    mc.sync()
    assert ("Deployment", f"qwen-pd-prefill-{old}") not in mc.children
    assert "x" * 100 not in json.dumps(mc.parent["status"])


def test_a_generation_that_no_longer_serves_is_not_restored(hooks) -> None:
    """As the front door moves, the generation it leaves is removed on the next sync: a workload
    of it deleted meanwhile is not created again."""
    mc, old, new = mid_rollout(hooks, decode_flag)
    mc.mark_ready()
    mc.delete("Deployment", f"qwen-pd-prefill-{old}")
    assert checked_sync(mc) == [("update", *SERVER_SERVICE)]
    assert checked_sync(mc) == [("delete", "Deployment", f"qwen-pd-{s}-{old}") for s in ("decode", "server")]


def test_leaving_blue_green_keeps_a_serving_graph_ready_while_the_unlabelled_pools_start(hooks) -> None:
    mc = serving(Metacontroller(hooks, blue_green(PD)))
    mc.edit(lambda spec: spec.update(rollout={"strategy": "RollingUpdate"}))
    mc.sync()
    status = mc.parent["status"]
    assert status["state"] == "ready"
    created = next(c for c in status["conditions"] if c["type"] == "ChildrenCreated")
    assert (created["status"], created["reason"]) == ("False", "ChildrenMissing")
    assert created["message"].startswith("not created yet: Deployment qwen-pd-decode, Deployment qwen-pd-prefill")
