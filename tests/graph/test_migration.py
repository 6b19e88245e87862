"""Taking over a graph the upstream Infera operator created: its children have the same names,
but every workload selector carries its managed-by label, which cannot change in place."""

import copy
from typing import Any

from hooks.contract import LAST_APPLIED_ANNOTATION
from tests.support.requests import PD
from tests.support.simulator import Metacontroller

UPSTREAM = {"app.kubernetes.io/managed-by": "infera-operator"}


def as_upstream_made(child: dict[str, Any]) -> dict[str, Any]:
    """The child as the upstream operator wrote it: its labels and selectors, no record of ours."""
    made = copy.deepcopy(child)
    del made["metadata"]["labels"]["controller-uid"]
    made["metadata"]["labels"] |= UPSTREAM
    made["metadata"].get("annotations", {}).pop(LAST_APPLIED_ANNOTATION, None)
    if child["kind"] in ("Deployment", "StatefulSet"):
        made["spec"]["selector"]["matchLabels"] |= UPSTREAM
        made["spec"]["template"]["metadata"]["labels"] |= UPSTREAM
    if child["kind"] == "Service":
        made["spec"]["selector"] |= UPSTREAM
    return made


def upstream_graph(hooks) -> Metacontroller:
    mc = Metacontroller(hooks, PD)
    mc.converge()
    mc.mark_ready()
    mc.children = {key: as_upstream_made(child) for key, child in mc.children.items()}
    return mc


def test_unlabelled_children_are_released_not_taken_over(hooks) -> None:
    """Why docs/migration.md labels them first: Metacontroller releases them (they would no
    longer go with the InferaDeployment), creating their namesakes fails, and the old pods keep
    running untracked."""
    mc = upstream_graph(hooks)
    before = {key: child["spec"] for key, child in mc.children.items() if "spec" in child}
    writes = mc.child_writes(mc.sync())
    assert sorted(writes) == sorted(("release", *key) for key in mc.children)
    assert all(
        "ownerReferences" not in c["metadata"] or not c["metadata"]["ownerReferences"] for c in mc.children.values()
    )
    assert {key: child["spec"] for key, child in mc.children.items() if "spec" in child} == before
    assert mc.parent["status"]["state"] == "initializing"  # the hook saw no child at all
    assert mc.child_writes(mc.sync()) == []


def test_children_with_the_upstream_selector_are_replaced_and_the_rest_updated(hooks) -> None:
    mc = upstream_graph(hooks)
    for child in mc.children.values():  # docs/migration.md's `kubectl label ... controller-uid=<uid>`
        child["metadata"]["labels"]["controller-uid"] = mc.uid
    # The first sync lets go of every child whose selector is not its own (the simulator, like
    # the API server, refuses a workload's selector change), and takes over the rest in place.
    writes = mc.child_writes(mc.sync())
    workloads = [("Deployment", f"qwen-pd-{s}") for s in ("decode", "prefill", "server")] + [
        ("StatefulSet", "qwen-pd-nats"),
        ("Service", "qwen-pd-nats"),
        ("Service", "qwen-pd-server"),
    ]
    assert sorted(w for w in writes if w[0] == "delete") == sorted(("delete", *key) for key in workloads)
    assert {w[0] for w in writes} <= {"delete", "update"}
    message = mc.parent["status"]["message"]
    assert "Deployment qwen-pd-decode is being replaced: the selector changed from" in message
    assert "(spec.selector cannot change in place)" in message
    # The next sync creates them as this operator renders them, and the graph converges.
    assert sorted(w for w in mc.child_writes(mc.sync()) if w[0] == "create") == sorted(
        ("create", *key) for key in workloads
    )
    mc.converge()
    mc.mark_ready()
    mc.converge()
    assert mc.parent["status"]["state"] == "ready" and mc.sync() == []


def test_children_labelled_after_their_release_are_adopted(hooks) -> None:
    """Labelling late still works: Metacontroller adopts the orphans, then replaces and updates."""
    mc = upstream_graph(hooks)
    mc.sync()  # released
    for child in mc.children.values():
        child["metadata"]["labels"]["controller-uid"] = mc.uid
    released = set(mc.children)
    writes = mc.child_writes(mc.sync())
    assert {w[1:] for w in writes if w[0] == "adopt"} == released
    assert {w[0] for w in writes} == {"adopt", "delete", "update"}
    mc.converge()
    mc.mark_ready()
    mc.converge()
    assert mc.parent["status"]["state"] == "ready" and mc.sync() == []
