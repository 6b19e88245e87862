"""Upgrading the hook under graphs an earlier build created: the children that build's own CLI
rendered (tests/golden/upgrade/, each file says which build and how), created and ready as
Metacontroller left them, then synced by this build. The first sync must write exactly what the
upgrade note says, and under BlueGreen start no generation."""

import copy
from typing import Any

import pytest

from hooks.contract import LAST_APPLIED_ANNOTATION
from hooks.generations import TEMPLATES_ANNOTATION
from tests.support.graphs import graph
from tests.support.prerequisites import REPO
from tests.support.requests import load_yaml
from tests.support.simulator import Metacontroller

EXAMPLE = REPO / "examples" / "pd-blue-green.yaml"
UPGRADE = REPO / "tests" / "golden" / "upgrade"
# The build before spec.monitoring, whose hook spread no router across nodes.
BEFORE_MONITORING = "1537eaf"
# Its answer's generation for the example (the label of every workload it rendered).
OLD_GENERATION = "8d8de081"
# Main before placement left the digest: a generation's name held the routers' spread.
SPREAD_IN_DIGEST = "a2fc70b"
SPREAD_GENERATION = "c4cee1b0"
# The generation it named for the example with the image rocm/infera:sglang-v0.1.2.
SPREAD_NEW_IMAGE_GENERATION = "22f93bb4"
SPREAD = {
    "maxSkew": 1,
    "topologyKey": "kubernetes.io/hostname",
    "whenUnsatisfiable": "ScheduleAnyway",
}


def rolling_update(idep: dict[str, Any]) -> dict[str, Any]:
    """The example as its fixture under RollingUpdate was rendered: without spec.rollout."""
    return graph(source=idep).spec(rollout=None).obj()


def created_by(build: str, fixture: str, idep: dict[str, Any], hooks) -> Metacontroller:
    """The graph as Metacontroller left it under `build`: every child of that build's render
    created, every workload ready."""
    mc = Metacontroller(hooks, idep)
    mc.created_before(load_yaml(UPGRADE / f"{fixture}-{build}.yaml"))
    mc.mark_ready()
    return mc


def template_spec(children: dict[tuple[str, str], dict[str, Any]], name: str) -> dict[str, Any]:
    return children[("Deployment", name)]["spec"]["template"]["spec"]


def unrecorded(children: dict[tuple[str, str], dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The children without the record of a generation's templates this build adds to each
    BlueGreen workload, and without Metacontroller's record of what it applied: what the update
    that adds it changes, no pod of it (a Deployment's generation moves with its annotations)."""
    bare = copy.deepcopy(children)
    for child in bare.values():
        annotations = child["metadata"].get("annotations") or {}
        for key in (TEMPLATES_ANNOTATION, LAST_APPLIED_ANNOTATION):
            annotations.pop(key, None)
        if "annotations" in child["metadata"] and not annotations:
            del child["metadata"]["annotations"]
        child["metadata"].pop("resourceVersion", None)
        child["metadata"].pop("generation", None)
    return bare


def recorded(generation: str) -> list[tuple[str, str, str]]:
    """The updates this build's first sync makes to record the templates of `generation`."""
    return [("update", "Deployment", f"qwen-bg-{s}-{generation}") for s in ("decode", "prefill", "server")]


@pytest.mark.parametrize(
    ("fixture", "shape", "suffix"),
    [("pd-blue-green", lambda idep: idep, f"-{OLD_GENERATION}"), ("pd-blue-green-rolling-update", rolling_update, "")],
    ids=["BlueGreen", "RollingUpdate"],
)
def test_upgrading_from_the_build_before_monitoring_only_spreads_the_routers(hooks, fixture, shape, suffix) -> None:
    (example,) = load_yaml(EXAMPLE)
    mc = created_by(BEFORE_MONITORING, fixture, shape(example), hooks)
    server = f"qwen-bg-server{suffix}"
    before = copy.deepcopy(mc.children)

    writes = mc.child_writes(mc.sync())

    # No generation starts: the server's Deployment alone changes its pods, in place (under
    # BlueGreen every workload of the generation gains the record of its templates, no pod).
    assert writes == (recorded(OLD_GENERATION) if suffix else [("update", "Deployment", server)])
    spread = SPREAD | {
        "labelSelector": {
            "matchLabels": {"infera.amd.com/deployment": "qwen-bg", "infera.amd.com/service": "server"}
            | ({"infera.amd.com/generation": OLD_GENERATION} if suffix else {})
        }
    }
    assert template_spec(mc.children, server) == template_spec(before, server) | {"topologySpreadConstraints": [spread]}
    assert {key: child for key, child in unrecorded(mc.children).items() if key != ("Deployment", server)} == {
        key: child for key, child in unrecorded(before).items() if key != ("Deployment", server)
    }
    assert mc.parent["status"].get("rollout") == (stable(OLD_GENERATION) if suffix else None)
    # The server's pods roll as any change to them does; then nothing more is written.
    assert (mc.parent["status"]["state"], mc.parent["status"]["message"]) == (
        "pending",
        "server 0/2 ready; waiting on 1 of 3 services",
    )
    mc.mark_ready()
    assert mc.child_writes(mc.sync()) == []
    assert mc.parent["status"]["state"] == "ready"


def stable(generation: str) -> dict[str, Any]:
    return {
        "strategy": "BlueGreen",
        "phase": "Stable",
        "servingGeneration": generation,
        "message": f"generation {generation} serves",
    }


def test_a_generation_named_with_its_spread_keeps_serving_under_its_name(hooks) -> None:
    """A graph a build from c3dfbbd to a2fc70b created: its generation's name is a digest that
    held the spread, which this build's does not. What it runs is what the spec renders, so it
    keeps serving as it is; it changes in place, and a change to what runs starts a generation
    this build names."""
    mc = created_by(SPREAD_IN_DIGEST, "pd-blue-green", load_yaml(EXAMPLE)[0], hooks)
    before = copy.deepcopy(mc.children)
    assert mc.child_writes(mc.sync()) == recorded(SPREAD_GENERATION)
    assert unrecorded(mc.children) == unrecorded(before)
    mc.mark_ready()  # the Deployment controller observes the generation the record moved
    assert mc.child_writes(mc.sync()) == []
    assert mc.parent["status"]["rollout"] == stable(SPREAD_GENERATION)
    assert mc.parent["status"]["state"] == "ready"

    mc.edit(lambda spec: spec["services"]["server"].update(replicas=3))
    assert mc.child_writes(mc.sync()) == [("update", "Deployment", f"qwen-bg-server-{SPREAD_GENERATION}")]
    assert mc.parent["status"]["rollout"]["servingGeneration"] == SPREAD_GENERATION

    mc.mark_ready()
    mc.edit(lambda spec: spec.update(image="rocm/infera:sglang-v0.1.2"))
    writes = mc.child_writes(mc.sync())
    new = mc.parent["status"]["rollout"]["incomingGeneration"]
    assert writes == [("create", "Deployment", f"qwen-bg-{s}-{new}") for s in ("decode", "prefill", "server")]
    # Reverted, the spec is again what the serving generation runs: the new one goes.
    mc.edit(lambda spec: spec.update(image="rocm/infera:sglang-v0.1.1"))
    assert mc.child_writes(mc.sync()) == [
        ("delete", "Deployment", f"qwen-bg-{s}-{new}") for s in ("decode", "prefill", "server")
    ]
    assert mc.child_writes(mc.sync()) == []
    assert mc.parent["status"]["rollout"] == stable(SPREAD_GENERATION)


def test_a_generation_named_with_its_spread_may_switch_to_rolling_update_on_its_own(hooks) -> None:
    """The switch is refused only when it also changes what runs: the name is not what runs."""
    mc = created_by(SPREAD_IN_DIGEST, "pd-blue-green", load_yaml(EXAMPLE)[0], hooks)
    mc.sync()
    mc.edit(lambda spec: spec.update(rollout={"strategy": "RollingUpdate"}))
    assert mc.child_writes(mc.sync()) == [
        ("create", "Deployment", f"qwen-bg-{s}") for s in ("decode", "prefill", "server")
    ]
    mc.mark_ready()
    assert mc.child_writes(mc.sync()) == [("update", "Service", "qwen-bg-server")]
    assert mc.child_writes(mc.sync()) == [
        ("delete", "Deployment", f"qwen-bg-{s}-{SPREAD_GENERATION}") for s in ("decode", "prefill", "server")
    ]
    assert mc.parent["status"]["rollout"]["phase"] == "Draining"
    assert mc.child_writes(mc.sync()) == []
    assert mc.sync() == []
    assert "rollout" not in mc.parent["status"] and mc.parent["status"]["state"] == "ready"


def test_a_rollout_in_flight_under_a_build_that_digested_the_spread_goes_on(hooks) -> None:
    """Upgraded mid-rollout: the incoming generation that build created already runs what the
    spec renders, so it is neither replaced nor renamed; the front door moves to it once ready."""
    idep = graph(source=EXAMPLE).image("rocm/infera:sglang-v0.1.2").obj()
    mc = created_by(SPREAD_IN_DIGEST, "pd-blue-green", idep, hooks)
    incoming = [
        child
        for child in load_yaml(UPGRADE / f"pd-blue-green-new-image-{SPREAD_IN_DIGEST}.yaml")
        if child["kind"] == "Deployment" and child["metadata"]["name"] != "qwen-bg-nats"
    ]
    mc.created_before(incoming)
    new = [f"qwen-bg-{s}-{SPREAD_NEW_IMAGE_GENERATION}" for s in ("decode", "prefill", "server")]
    mc.mark_ready(lambda kind, name: 0 if name in new else None)
    before = copy.deepcopy(mc.children)

    # The incoming generation, rendered, gains the record; the serving one is kept as applied.
    assert mc.child_writes(mc.sync()) == recorded(SPREAD_NEW_IMAGE_GENERATION)
    assert unrecorded(mc.children) == unrecorded(before)
    rollout = mc.parent["status"]["rollout"]
    assert (rollout["phase"], rollout["servingGeneration"], rollout["incomingGeneration"]) == (
        "Progressing",
        SPREAD_GENERATION,
        SPREAD_NEW_IMAGE_GENERATION,
    )
    mc.mark_ready()
    assert mc.child_writes(mc.sync()) == [("update", "Service", "qwen-bg-server")]
    assert mc.child_writes(mc.sync()) == [
        ("delete", "Deployment", f"qwen-bg-{s}-{SPREAD_GENERATION}") for s in ("decode", "prefill", "server")
    ]
    assert mc.child_writes(mc.sync()) == []
    assert mc.parent["status"]["rollout"] == stable(SPREAD_NEW_IMAGE_GENERATION)


def test_this_build_names_the_old_builds_generation_as_it_did(hooks) -> None:
    """The other direction: a graph without spread keeps its generation's name, so an old
    build's graph is still the generation this build renders."""
    rendered = load_yaml(UPGRADE / f"pd-blue-green-{BEFORE_MONITORING}.yaml")
    labels = {
        child["metadata"]["labels"]["infera.amd.com/generation"]
        for child in rendered
        if child["kind"] == "Deployment" and child["metadata"]["name"] != "qwen-bg-nats"
    }
    assert labels == {OLD_GENERATION}
    mc = Metacontroller(hooks, EXAMPLE)
    mc.sync()
    assert mc.parent["status"]["rollout"]["servingGeneration"] == OLD_GENERATION


def test_a_workload_of_a_generation_named_otherwise_deleted_is_restored_not_renamed(hooks) -> None:
    """The generation an earlier build named goes on though one of its workloads is gone: it is
    created again as the spec renders it, and no generation of this build's name starts."""
    mc = created_by(SPREAD_IN_DIGEST, "pd-blue-green", load_yaml(EXAMPLE)[0], hooks)
    mc.sync()
    key = ("Deployment", f"qwen-bg-decode-{SPREAD_GENERATION}")
    before = mc.children[key]["spec"]
    mc.delete(*key)
    assert mc.child_writes(mc.sync()) == [("create", *key)]
    assert mc.children[key]["spec"] == before
    assert mc.parent["status"]["rollout"] == stable(SPREAD_GENERATION)
