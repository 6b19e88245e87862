"""Faults on the real control plane, as a person makes and sees them with kubectl: a child the
API server refuses to create again after `kubectl delete` (a ResourceQuota), a broker pod no
node takes, and a BlueGreen front door deleted or edited mid-rollout. What the graph says is
read from `kubectl get idep` and a watch of its versions; who wrote what, from the audit log.

Metacontroller's part is played by tests/support/composite_driver.py, as in test_graphs.py.
"""

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from hooks.vocabulary import GENERATION_LABEL
from tests.cluster.test_blue_green import (
    FRONT_DOOR,
    NAME,
    NEW_IMAGE,
    audited,
    cordoned,
    deployments_of,
    front_door,
    patch_image,
    settled,
    stable_graph,
    watched,
    writes_to,
)
from tests.cluster.test_graphs import columns, eventually, get
from tests.support.cluster import Cluster
from tests.support.localcluster import Installed
from tests.support.prerequisites import REPO
from tests.support.requests import load_yaml

PD_NAME = "qwen-faults"


def ready_pd_graph(installed: Installed, namespace: str) -> dict[str, Any]:
    """examples/pd-disaggregated.yaml as `PD_NAME`, Ready on kwok nodes."""
    cluster = installed.cluster
    (idep,) = copy.deepcopy(load_yaml(REPO / "examples" / "pd-disaggregated.yaml"))
    idep["metadata"] = {"name": PD_NAME, "namespace": namespace}
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(idep))
    wait_for(cluster, namespace, "Ready", 180)
    return get(cluster, "-n", namespace, "idep", PD_NAME)


def conditions(idep: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in idep["status"]["conditions"]}


def kubectl(cluster: Cluster, *arguments: str, stdin: str | None = None) -> None:
    done = cluster.kubectl(*arguments, stdin=stdin)
    assert done.returncode == 0, done.stderr


def wait_for(cluster: Cluster, namespace: str, condition: str, seconds: int = 120) -> None:
    """`kubectl wait --for=condition=...` on the PD graph."""
    waited = cluster.kubectl(
        "wait", "-n", namespace, f"--for=condition={condition}", f"idep/{PD_NAME}", f"--timeout={seconds}s",
        timeout=seconds + 10,
    )  # fmt: skip
    assert waited.returncode == 0, waited.stderr


@pytest.mark.parametrize("namespace", ["faults-quota"], indirect=True)
def test_a_child_the_api_server_will_not_create_again_holds_readiness_and_is_named(
    installed: Installed, namespace: str
) -> None:
    cluster = installed.cluster
    ready_pd_graph(installed, namespace)
    service = f"{PD_NAME}-server"
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-more-services", "namespace": namespace},
        "spec": {"hard": {"services": "0"}},
    }
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(quota))
    errors_before = len(installed.driver.errors)
    kubectl(cluster, "delete", "-n", namespace, "service", service)

    said = f"not created yet: Service {service} (if it stays missing, another object holds the name"
    pending = eventually(
        lambda: (idep := get(cluster, "-n", namespace, "idep", PD_NAME))["status"]["state"] == "pending" and idep,
        "the graph to say it is pending",
    )
    assert said in pending["status"]["message"]
    assert conditions(pending)["Ready"][:2] == ("False", "ChildrenMissing")
    assert conditions(pending)["ChildrenCreated"][:2] == ("False", "ChildrenMissing")
    shown = columns(cluster, namespace, PD_NAME, "wide")
    assert shown["STATE"] == "pending" and shown["MESSAGE"].startswith(said)
    wait_for(cluster, namespace, "ChildrenCreated=False", 10)
    # Metacontroller's create was refused by the quota, every time it tried.
    refused = installed.driver.errors[errors_before:]
    assert refused and all("exceeded quota" in error for error in refused), refused

    kubectl(cluster, "delete", "-n", namespace, "resourcequota", "no-more-services")
    wait_for(cluster, namespace, "Ready")
    assert conditions(get(cluster, "-n", namespace, "idep", PD_NAME))["ChildrenCreated"][:2] == ("True", "AllCreated")
    # What the quota refused was expected; the driver's other errors still fail the module.
    installed.driver.errors[errors_before:] = [
        error for error in installed.driver.errors[errors_before:] if "exceeded quota" not in error
    ]


@pytest.mark.parametrize("namespace", ["faults-broker"], indirect=True)
def test_a_broker_pod_no_node_takes_holds_readiness_in_the_schedulers_words(
    installed: Installed, namespace: str
) -> None:
    cluster = installed.cluster
    ready_pd_graph(installed, namespace)
    with cordoned(cluster):
        kubectl(cluster, "delete", "-n", namespace, "pod", f"{PD_NAME}-nats-0", "--wait=false")
        pending = eventually(
            lambda: (
                "unschedulable" in ((idep := get(cluster, "-n", namespace, "idep", PD_NAME))["status"]["message"])
                and idep
            ),
            "the graph to say why its broker waits",
        )
        message = pending["status"]["message"]
        assert pending["status"]["state"] == "pending"
        assert message.startswith("NATS broker 0/1 ready; nats: 1 pod unschedulable: 0/"), message
        assert "node(s) were unschedulable" in message
        assert conditions(pending)["Ready"][:2] == ("False", "BrokerNotReady")
    wait_for(cluster, namespace, "Ready")


def untouched(cluster: Cluster, namespace: str, generation: str) -> dict[str, tuple[str, str]]:
    return {
        d["metadata"]["name"]: (d["metadata"]["uid"], d["metadata"]["resourceVersion"])
        for d in get(cluster, "-n", namespace, "deployments")["items"]
        if d["metadata"]["name"] in deployments_of(generation)
    }


@pytest.fixture
def stalled_rollout(installed: Installed, namespace: str) -> Iterator[tuple[dict[str, Any], str, str]]:
    """A BlueGreen graph mid-rollout whose new generation no node takes: (the graph, the serving
    generation, the incoming one)."""
    cluster = installed.cluster
    parent = stable_graph(installed, namespace)
    old = parent["status"]["rollout"]["servingGeneration"]
    with cordoned(cluster):
        patch_image(cluster, namespace, NEW_IMAGE)
        rolling = eventually(
            lambda: (
                (idep := settled(cluster, namespace, "Progressing"))
                and "unschedulable" in idep["status"]["rollout"]["message"]
                and idep
            ),
            "the rollout to say its new pods wait",
        )
        new = rolling["status"]["rollout"]["incomingGeneration"]
        assert rolling["status"]["state"] == "ready"
        yield rolling, old, new


@pytest.mark.parametrize(
    ("namespace", "fault"),
    [("faults-door-deleted", "delete"), ("faults-door-edited", "edit")],
    indirect=["namespace"],
)
def test_a_front_door_deleted_or_edited_mid_rollout_comes_back_to_the_serving_generation(
    installed: Installed, namespace: str, fault: str, stalled_rollout: tuple[dict[str, Any], str, str]
) -> None:
    cluster = installed.cluster
    rolling, old, new = stalled_rollout
    serving = untouched(cluster, namespace, old)
    assert set(serving) == deployments_of(old)
    since = len(audited(cluster, namespace))
    with watched(cluster, namespace, rolling["metadata"]["resourceVersion"]) as seen:
        if fault == "delete":
            kubectl(cluster, "delete", "-n", namespace, "service", FRONT_DOOR)
        else:
            selector = json.dumps({"spec": {"selector": {GENERATION_LABEL: new}}})
            kubectl(cluster, "patch", "-n", namespace, "service", FRONT_DOOR, "--type=merge", "-p", selector)
        eventually(
            lambda: (
                (door := cluster.kubectl("get", "-n", namespace, "service", FRONT_DOOR, "-o", "json")).returncode == 0
                and json.loads(door.stdout)["spec"]["selector"].get(GENERATION_LABEL) == old
            ),
            "the front door back on the serving generation",
        )
        back = eventually(
            lambda: (
                (idep := get(cluster, "-n", namespace, "idep", NAME))["status"]["state"] == "ready"
                and "restored" not in idep["status"]["rollout"]["message"]
                and idep
            ),
            "the graph ready again",
        )
        eventually(
            lambda: any(i["metadata"]["resourceVersion"] == back["metadata"]["resourceVersion"] for i in seen),
            "the watch to catch up",
            30,
        )
    # Every status written meanwhile: the serving generation served throughout.
    assert {
        (i["status"]["rollout"]["servingGeneration"], i["status"]["rollout"].get("incomingGeneration")) for i in seen
    } == {(old, new)}
    # Nobody wrote to the serving generation's Deployments: they are the objects they were.
    assert writes_to(audited(cluster, namespace)[since:], "deployments", deployments_of(old)) == []
    assert untouched(cluster, namespace, old) == serving
    assert front_door(cluster, namespace)["spec"]["selector"][GENERATION_LABEL] == old
    assert columns(cluster, namespace, NAME, "wide")["SERVING"] == old
