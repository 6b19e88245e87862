"""Which pods hold a graph's teardown: owned by a worker pool's controller, as the real
controllers name their ReplicaSets and StatefulSets, or being deleted."""

from typing import Any

import pytest

from hooks import teardown
from hooks.contract import parse_request
from tests.support.graphs import graph
from tests.support.requests import PD, parent, request_body

WORKER = {"infera.amd.com/deployment": "qwen-pd", "infera.amd.com/component": "worker"}
DELETED = "2026-12-06T10:00:00Z"


def pod(name: str, labels: dict[str, str], owner: tuple[str, str] | None = None, **metadata: Any) -> dict[str, Any]:
    """A pod, owned (as a controller) by `owner`, with more `metadata`."""
    if owner is not None:
        kind, owner_name = owner
        metadata.setdefault(
            "ownerReferences",
            [{"apiVersion": "apps/v1", "kind": kind, "name": owner_name, "uid": "u", "controller": True}],
        )
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels, **metadata}}


def holding(*pods: dict[str, Any], spec: dict[str, Any] | None = None) -> list[str]:
    obj = parent(PD)
    if spec is not None:
        obj["spec"] = spec
    found = teardown.worker_pods(parse_request(request_body(obj, finalizing=True, related=list(pods))))
    assert found is not None
    return [p["metadata"]["name"] for p in found]


PREFILL = {**WORKER, "infera.amd.com/service": "prefill", "pod-template-hash": "7d9f8b6c5"}
DECODE_GROUP = {**WORKER, "infera.amd.com/service": "decode", "leaderworkerset.sigs.k8s.io/group-index": "3"}
BLUE = {**PREFILL, "infera.amd.com/generation": "5f7c2a"}


@pytest.mark.parametrize(
    ("candidate", "holds"),
    [
        (pod("a", PREFILL, ("ReplicaSet", "qwen-pd-prefill-7d9f8b6c5")), True),
        (pod("a", BLUE, ("ReplicaSet", "qwen-pd-prefill-5f7c2a-7d9f8b6c5")), True),
        (pod("a", DECODE_GROUP, ("StatefulSet", "qwen-pd-decode")), True),  # a group's leader
        (pod("a", DECODE_GROUP, ("StatefulSet", "qwen-pd-decode-3")), True),  # its other ranks
        # Labelled as the graph's worker, but no worker pool's controller owns it.
        (pod("a", PREFILL), False),
        (pod("a", PREFILL, ("ReplicaSet", "qwen-pd-prefill-other")), False),
        (pod("a", BLUE, ("ReplicaSet", "qwen-pd-prefill-7d9f8b6c5")), False),  # another generation's name
        (pod("a", DECODE_GROUP, ("StatefulSet", "qwen-pd-decode-4")), False),
        (pod("a", PREFILL, ("Job", "qwen-pd-prefill-7d9f8b6c5")), False),
        (pod("a", {**PREFILL, "pod-template-hash": "x"}, ("StatefulSet", "qwen-pd-prefill-x")), False),
        # The server's pods and the broker's hold nothing, whatever their labels say.
        (pod("a", {**PREFILL, "infera.amd.com/service": "server"}, ("ReplicaSet", "qwen-pd-server-7d9f8b6c5")), False),
        (pod("a", {**WORKER, "infera.amd.com/service": "nats"}, ("StatefulSet", "qwen-pd-nats")), False),
        # Another graph's.
        (
            pod("a", {**PREFILL, "infera.amd.com/deployment": "qwen"}, ("ReplicaSet", "qwen-pd-prefill-7d9f8b6c5")),
            False,
        ),
        # Being deleted: draining, whoever owns it, if it is labelled a worker.
        (pod("a", PREFILL, deletionTimestamp=DELETED), True),
        (pod("a", {**PREFILL, "infera.amd.com/component": "nats"}, deletionTimestamp=DELETED), False),
        # Whatever else the owner references hold.
        (pod("a", PREFILL, ownerReferences="qwen-pd-prefill-7d9f8b6c5"), False),
        (pod("a", PREFILL, ownerReferences=[7, {"kind": "ReplicaSet", "name": "qwen-pd-prefill-7d9f8b6c5"}]), False),
    ],
)
def test_a_pod_holds_the_plane_if_a_worker_pools_controller_owns_it(candidate: dict[str, Any], holds: bool) -> None:
    assert holding(candidate) == (["a"] if holds else [])


def test_pools_are_the_specs_workers_or_services_it_does_not_name() -> None:
    """A pool the spec calls a server holds nothing; one it does not name (or not readably) is
    taken for a worker's."""
    prefill = pod("a", PREFILL, ("ReplicaSet", "qwen-pd-prefill-7d9f8b6c5"))
    assert holding(prefill, spec=graph().service("prefill", componentType="server").obj()["spec"]) == []
    assert holding(prefill, spec=graph().without("prefill").obj()["spec"]) == ["a"]
    assert holding(prefill, spec={"services": "unreadable"}) == ["a"]


def test_without_the_customize_hook_no_pod_is_visible() -> None:
    body = request_body(parent(PD), finalizing=True)
    assert teardown.worker_pods(parse_request(body)) is None
