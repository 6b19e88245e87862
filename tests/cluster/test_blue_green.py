"""BlueGreen on the real control plane: an image change under `spec.rollout.strategy: BlueGreen`
brings the new generation up beside the serving one on kwok GPU nodes, moves the server
Service's selector in place and only then deletes the old generation, as docs/rollouts.md says;
and a revert while the new generation cannot be scheduled removes it and writes nothing to the
serving one. Every status the API server stores is read through a watch (what `kubectl get
idep -w` shows), every write from its audit log.
"""

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from hooks.vocabulary import GENERATION_LABEL
from tests.cluster.test_graphs import columns, eventually, get, metacontroller_writes, wait_graph_ready
from tests.support.cluster import NODE_NAMES, Cluster, versions_of
from tests.support.graphs import graph
from tests.support.localcluster import Installed
from tests.support.metacontroller import USER as METACONTROLLER_USER

NAME = "qwen-bg"
SERVICES = ("decode", "prefill", "server")
FRONT_DOOR = f"{NAME}-server"
NEW_IMAGE = "rocm/infera:sglang-v0.1.2"
IDEPS = "/apis/infera.amd.com/v1alpha1/namespaces/{namespace}/inferadeployments"


def deployments_of(generation: str) -> set[str]:
    return {f"{NAME}-{service}-{generation}" for service in SERVICES}


def stable_graph(installed: Installed, namespace: str) -> dict[str, Any]:
    """examples/pd-disaggregated.yaml as `NAME` under BlueGreen, ready and Stable on kwok nodes."""
    cluster = installed.cluster
    idep = graph(NAME).metadata(namespace=namespace).blue_green().manifest()
    applied = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(idep))
    assert applied.returncode == 0, applied.stderr
    wait_graph_ready(installed, namespace, NAME)
    parent = eventually(lambda: settled(cluster, namespace, "Stable"), "the graph to be Stable")
    generation = parent["status"]["rollout"]["servingGeneration"]
    assert len(generation) == 8, generation
    assert parent["status"]["rollout"] == {
        "strategy": "BlueGreen",
        "phase": "Stable",
        "servingGeneration": generation,
        "message": f"generation {generation} serves",
    }
    assert parent["status"]["state"] == "ready"
    assert columns(cluster, namespace, NAME)["ROLLOUT"] == "Stable"
    assert columns(cluster, namespace, NAME, "wide")["SERVING"] == generation
    assert {d["metadata"]["name"] for d in get(cluster, "-n", namespace, "deployments")["items"]} == deployments_of(
        generation
    )
    assert generation_pods(cluster, namespace) == {service: (generation, "Running") for service in SERVICES}, (
        cluster.unready_pods(namespace)
    )
    assert front_door(cluster, namespace)["spec"]["selector"][GENERATION_LABEL] == generation
    return parent


def settled(cluster: Cluster, namespace: str, phase: str) -> dict[str, Any] | None:
    """The graph once its status, about its current spec, is at the rollout `phase`."""
    idep = get(cluster, "-n", namespace, "idep", NAME)
    status = idep.get("status") or {}
    current = status.get("observedGeneration") == idep["metadata"]["generation"]
    return idep if current and (status.get("rollout") or {}).get("phase") == phase else None


def stalled(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """The graph once its rollout says the new generation's pods wait for a node."""
    return eventually(  # type: ignore[no-any-return]
        lambda: (
            (idep := settled(cluster, namespace, "Progressing"))
            and "unschedulable" in idep["status"]["rollout"]["message"]
            and idep
        ),
        "the rollout to say its new pods wait",
    )


def generation_pods(cluster: Cluster, namespace: str) -> dict[str, tuple[str, str]]:
    """Each service's pod, by its generation label and phase (a service with two pods fails)."""
    pods = get(cluster, "-n", namespace, "pods", "-l", GENERATION_LABEL)["items"]
    found = {}
    for pod in pods:
        labels = pod["metadata"]["labels"]
        service = labels["infera.amd.com/service"]
        assert service not in found, [p["metadata"]["name"] for p in pods]
        found[service] = (labels[GENERATION_LABEL], pod["status"].get("phase", ""))
    return found


def front_door(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return get(cluster, "-n", namespace, "service", FRONT_DOOR)


def audited(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    """Every completed write the audit log holds in `namespace`, by anyone, in order."""
    return [event for event in cluster.completed_writes() if event["objectRef"].get("namespace") == namespace]


def writes_to(events: list[dict[str, Any]], resource: str, names: set[str]) -> list[tuple[str, str, str, str]]:
    """(user, verb, resource[/subresource], name) of each successful write to those objects."""
    return [
        (
            event["user"]["username"],
            event["verb"],
            resource + ("/" + event["objectRef"]["subresource"] if event["objectRef"].get("subresource") else ""),
            event["objectRef"]["name"],
        )
        for event in events
        if event["objectRef"]["resource"] == resource
        and event["objectRef"].get("name") in names
        and event["responseStatus"]["code"] < 300
    ]


def patch_image(cluster: Cluster, namespace: str, image: str) -> int:
    """Sets the graph's image; the parent's metadata.generation that carries it."""
    patched = cluster.kubectl(
        "patch", "-n", namespace, "idep", NAME, "--type=merge", "-p", json.dumps({"spec": {"image": image}}),
        "-o", "json",
    )  # fmt: skip
    assert patched.returncode == 0, patched.stderr
    return int(json.loads(patched.stdout)["metadata"]["generation"])


def watched(cluster: Cluster, namespace: str, resource_version: str) -> AbstractContextManager[list[dict[str, Any]]]:
    """Every version of the graph the API server stores from `resource_version` on
    (`kubectl get idep -w`)."""
    return versions_of(cluster, IDEPS.format(namespace=namespace), NAME, resource_version)


def phases(seen: list[dict[str, Any]], generation: int) -> list[tuple[str, str, str | None]]:
    """(phase, servingGeneration, incomingGeneration) of each status written about the spec at
    metadata.generation `generation`, consecutive repeats (a pool's ready count moving) merged."""
    steps: list[tuple[str, str, str | None]] = []
    for idep in seen:
        status = idep.get("status") or {}
        if status.get("observedGeneration") != generation:
            continue
        rollout = status["rollout"]
        step = (rollout["phase"], rollout["servingGeneration"], rollout.get("incomingGeneration"))
        if not steps or steps[-1] != step:
            steps.append(step)
    return steps


@dataclass
class Rollout:
    """A rollout as a test watched it: every version of the graph seen, the last, the
    metadata.generation that changed what runs, the generations, the front door before."""

    seen: list[dict[str, Any]]
    done: dict[str, Any]
    changed: int
    old: str
    new: str
    service: dict[str, Any]


def rolled_out(cluster: Cluster, namespace: str, rollout: Rollout, since: int, since_metacontroller: int) -> None:
    """What a finished rollout shows (docs/rollouts.md), from audit entries `since` (anyone's)
    and `since_metacontroller` (Metacontroller's) on."""
    seen, done, changed, old, new, service = (
        rollout.seen, rollout.done, rollout.changed, rollout.old, rollout.new, rollout.service,
    )  # fmt: skip
    # Every status written about the change, in order: the new generation starts beside the
    # serving one, the front door moves, the old generation is removed, one generation is left.
    assert phases(seen, changed) == [
        ("Progressing", old, new),
        ("Switching", new, None),
        ("Draining", new, None),
        ("Stable", new, None),
    ]
    # A rollout in progress does not make a serving graph pending.
    assert {idep["status"]["state"] for idep in seen if idep["status"].get("observedGeneration") == changed} == {
        "ready"
    }
    assert done["status"]["rollout"] == {
        "strategy": "BlueGreen",
        "phase": "Stable",
        "servingGeneration": new,
        "message": f"generation {new} serves",
    }
    assert columns(cluster, namespace, NAME)["ROLLOUT"] == "Stable"
    assert columns(cluster, namespace, NAME, "wide")["SERVING"] == new

    # Metacontroller's writes, in order: the new generation's Deployments, then the Service's
    # selector, then the old generation's Deployments deleted; nothing else but the status.
    writes = [
        w for w in metacontroller_writes(cluster, namespace, since_metacontroller) if w[1] != "inferadeployments/status"
    ]
    assert len(writes) == 7, writes
    assert sorted(writes[:3]) == [("create", "deployments", name) for name in sorted(deployments_of(new))], writes
    assert writes[3] == ("update", "services", FRONT_DOOR), writes
    assert sorted(writes[4:]) == [("delete", "deployments", name) for name in sorted(deployments_of(old))], writes

    # By anyone: the old generation's Deployments are never updated or patched (status
    # included), only deleted by Metacontroller; the Service is updated once, never deleted,
    # and keeps its address while its selector moves to the new generation.
    events = audited(cluster, namespace)[since:]
    assert sorted(writes_to(events, "deployments", deployments_of(old))) == [
        (METACONTROLLER_USER, "delete", "deployments", name) for name in sorted(deployments_of(old))
    ]
    assert writes_to(events, "services", {FRONT_DOOR}) == [(METACONTROLLER_USER, "update", "services", FRONT_DOOR)]
    moved = front_door(cluster, namespace)
    assert (moved["metadata"]["uid"], moved["spec"]["clusterIP"]) == (
        service["metadata"]["uid"],
        service["spec"]["clusterIP"],
    )
    assert moved["spec"]["selector"] == {**service["spec"]["selector"], GENERATION_LABEL: new}


@pytest.mark.parametrize("namespace", ["blue-green"], indirect=True)
def test_an_image_change_starts_the_new_generation_moves_the_service_in_place_then_drains_the_old(
    installed: Installed, namespace: str
) -> None:
    cluster = installed.cluster
    parent = stable_graph(installed, namespace)
    old = parent["status"]["rollout"]["servingGeneration"]
    service = front_door(cluster, namespace)
    since_metacontroller = len(cluster.audit_writes(METACONTROLLER_USER))
    since = len(audited(cluster, namespace))

    with watched(cluster, namespace, parent["metadata"]["resourceVersion"]) as seen:
        changed = patch_image(cluster, namespace, NEW_IMAGE)
        done = eventually(
            lambda: (
                (idep := settled(cluster, namespace, "Stable"))
                and idep["status"]["rollout"]["servingGeneration"] != old
                and idep
            ),
            "the new generation to serve, Stable",
        )
        new = done["status"]["rollout"]["servingGeneration"]
        # The last status written is in the watch before it ends.
        eventually(
            lambda: any(idep["metadata"]["resourceVersion"] == done["metadata"]["resourceVersion"] for idep in seen),
            "the watch to catch up",
            30,
        )

    assert new != old and len(new) == 8
    rolled_out(cluster, namespace, Rollout(seen, done, changed, old, new, service), since, since_metacontroller)

    # The real controllers follow: the old pods go, the new ones run, and the Service's
    # endpoints are the new server pod's.
    assert {d["metadata"]["name"] for d in get(cluster, "-n", namespace, "deployments")["items"]} == deployments_of(new)
    eventually(
        lambda: generation_pods(cluster, namespace) == {s: (new, "Running") for s in SERVICES},
        "only the new generation's pods, running",
    )
    (server_pod,) = get(
        cluster, "-n", namespace, "pods", "-l", f"infera.amd.com/service=server,{GENERATION_LABEL}={new}"
    )["items"]
    eventually(
        lambda: (
            [
                endpoint.get("targetRef", {}).get("name")
                for slice_ in get(
                    cluster, "-n", namespace, "endpointslices", "-l", f"kubernetes.io/service-name={FRONT_DOOR}"
                )["items"]
                for endpoint in slice_.get("endpoints") or []
            ]
            == [server_pod["metadata"]["name"]]
        ),
        "the Service's endpoints to be the new server pod",
        60,
    )


@contextmanager
def cordoned(cluster: Cluster) -> Iterator[None]:
    """No room: every node unschedulable, so a new generation's pods stay Pending."""
    done = cluster.kubectl("cordon", *NODE_NAMES)
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        done = cluster.kubectl("uncordon", *NODE_NAMES)
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("namespace", ["blue-green-revert"], indirect=True)
def test_reverting_mid_rollout_deletes_the_incoming_generation_and_writes_nothing_to_the_serving_one(
    installed: Installed, namespace: str
) -> None:
    cluster = installed.cluster
    parent = stable_graph(installed, namespace)
    old = parent["status"]["rollout"]["servingGeneration"]
    image = parent["spec"]["image"]
    serving = {d["metadata"]["name"]: d for d in get(cluster, "-n", namespace, "deployments")["items"]}
    service = front_door(cluster, namespace)
    since = len(audited(cluster, namespace))

    with cordoned(cluster):
        changed = patch_image(cluster, namespace, NEW_IMAGE)
        rolling = eventually(lambda: settled(cluster, namespace, "Progressing"), "the rollout to progress")
        new = rolling["status"]["rollout"]["incomingGeneration"]
        assert new != old and rolling["status"]["rollout"]["servingGeneration"] == old
        eventually(
            lambda: (
                {d["metadata"]["name"] for d in get(cluster, "-n", namespace, "deployments")["items"]}
                == deployments_of(old) | deployments_of(new)
            ),
            "the new generation's Deployments",
        )
        # Its pods exist and cannot be scheduled: it cannot become ready, the rollout stays.
        incoming = lambda: get(cluster, "-n", namespace, "pods", "-l", f"{GENERATION_LABEL}={new}")["items"]  # noqa: E731
        pending = eventually(
            lambda: (
                len(pods := incoming()) == 3
                and all(
                    any(
                        c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                        for c in p["status"].get("conditions") or []
                    )
                    for p in pods
                )
                and pods
            ),
            "the new generation's pods, unschedulable",
        )
        assert {p["status"]["phase"] for p in pending} == {"Pending"}
        # The status says so once a sync has read the new Deployments (the one that created
        # them saw none).
        waiting = {s: {"replicas": 1, "readyReplicas": 0} for s in SERVICES}
        still = eventually(
            lambda: (
                (idep := settled(cluster, namespace, "Progressing"))
                and idep["status"]["rollout"]["pools"] == waiting
                and idep
            ),
            "the rollout to report its pools waiting",
            30,
        )
        assert still["status"]["rollout"]["incomingGeneration"] == new
        assert still["status"]["state"] == "ready"
        since_metacontroller = len(cluster.audit_writes(METACONTROLLER_USER))

        with watched(cluster, namespace, still["metadata"]["resourceVersion"]) as seen:
            reverted = patch_image(cluster, namespace, image)
            done = eventually(lambda: settled(cluster, namespace, "Stable"), "the graph to be Stable again")
            eventually(
                lambda: any(
                    idep["metadata"]["resourceVersion"] == done["metadata"]["resourceVersion"] for idep in seen
                ),
                "the watch to catch up",
                30,
            )

    assert done["status"]["rollout"] == {
        "strategy": "BlueGreen",
        "phase": "Stable",
        "servingGeneration": old,
        "message": f"generation {old} serves",
    }
    assert phases(seen, reverted) == [("Draining", old, None), ("Stable", old, None)]
    # Metacontroller's writes after the revert: the incoming generation's Deployments deleted.
    writes = [
        w for w in metacontroller_writes(cluster, namespace, since_metacontroller) if w[1] != "inferadeployments/status"
    ]
    assert sorted(writes) == [("delete", "deployments", name) for name in sorted(deployments_of(new))]
    assert {d["metadata"]["name"] for d in get(cluster, "-n", namespace, "deployments")["items"]} == deployments_of(old)
    eventually(lambda: incoming() == [], "the new generation's pods to be gone")

    # The serving generation, through both changes: nobody wrote to its Deployments or to the
    # Service; they are the objects they were.
    events = audited(cluster, namespace)[since:]
    assert writes_to(events, "deployments", deployments_of(old)) == []
    assert writes_to(events, "services", {FRONT_DOOR}) == []
    assert {
        d["metadata"]["name"]: (d["metadata"]["uid"], d["metadata"]["resourceVersion"])
        for d in get(cluster, "-n", namespace, "deployments")["items"]
    } == {name: (d["metadata"]["uid"], d["metadata"]["resourceVersion"]) for name, d in serving.items()}
    after = front_door(cluster, namespace)
    assert (after["metadata"]["uid"], after["metadata"]["resourceVersion"], after["spec"]) == (
        service["metadata"]["uid"],
        service["metadata"]["resourceVersion"],
        service["spec"],
    )
    assert generation_pods(cluster, namespace) == {s: (old, "Running") for s in SERVICES}
    assert changed + 1 == reverted
