"""Status that tells the truth: a graph is ready only when every child its answer holds exists,
the broker its processes publish to is ready, and its pools are; and it says why not, down to
what the scheduler says of a pod no node takes."""

import copy
from typing import Any

import pytest

from tests.support.graphs import graph
from tests.support.requests import EXAMPLES, PD, load_yaml
from tests.support.simulator import Metacontroller

SERVED = ["pd-disaggregated", "gaie-pd", "pd-model-cache", "pd-autoscaling", "multinode-tp", "pd-monitored"]
UNSCHEDULABLE = (
    "0/4 nodes are available: 4 Insufficient amd.com/gpu. preemption: 0/4 nodes are available: 4 No preemption "
    "victims found for incoming pod."
)


def conditions(mc: Metacontroller) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in mc.parent["status"]["conditions"]}


def serving(example: str, hooks: Any) -> Metacontroller:
    return Metacontroller(hooks, load_yaml(EXAMPLES / f"{example}.yaml")[0]).serve()


@pytest.mark.parametrize("example", SERVED)
def test_a_child_that_cannot_be_created_holds_readiness_and_is_named(hooks, example: str) -> None:
    """Each child of a ready graph in turn, deleted and its create refused (a quota, an
    admission policy): the graph is pending, says which child and why it may be missing, keeps
    every other child as it is, and is ready again once the create goes through."""
    served = serving(example, hooks)
    wrong = []
    for kind, name in sorted(served.children):
        mc = copy.deepcopy(served)
        kept = {key: child for key, child in mc.children.items() if key != (kind, name)}
        mc.delete(kind, name, refuse=True)
        writes = mc.child_writes(mc.sync())
        status, ready, created = mc.parent["status"], conditions(mc)["Ready"], conditions(mc)["ChildrenCreated"]
        said = f"not created yet: {kind} {name} (if it stays missing, another object holds the name"
        # A download Job serves nothing: the model cache's phase says what it does.
        holds = kind != "Job"
        if (
            writes != []
            or mc.refusals != [(kind, name)]
            or {key: mc.children[key] for key in kept} != kept
            or (created["status"], created["reason"]) != ("False", "ChildrenMissing")
            or not created["message"].startswith(f"not created yet: {kind} {name} (")
            or holds
            and (
                status["state"] != "pending"
                or said not in status["message"]
                or (ready["status"], ready["reason"]) != ("False", "ChildrenMissing")
            )
        ):
            wrong.append((kind, name, writes, status["state"], status["message"]))
            continue
        mc.refused.clear()
        mc.sync()
        mc.mark_ready()
        mc.gateway_accepts()
        mc.sync()
        if (conditions(mc)["ChildrenCreated"]["status"], mc.parent["status"]["state"]) != ("True", "ready"):
            wrong.append((kind, name, "not ready again", mc.parent["status"]["message"]))
    assert wrong == []


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("Service", "qwen-pd-nats"),
        ("Service", "qwen-pd-server"),
        ("Deployment", "qwen-pd-decode"),
        ("Role", "qwen-pd-disc"),
    ],
)
def test_a_name_held_by_another_owner_is_named(hooks, kind: str, name: str) -> None:
    mc = Metacontroller(hooks, PD).serve()
    mc.hold(kind, name)
    mc.sync()
    assert mc.parent["status"]["state"] == "pending"
    assert (
        f"not created yet: {kind} {name} (if it stays missing, another object holds the name"
        in (mc.parent["status"]["message"])
    )
    assert mc.sync() == []  # and it stays so, writing nothing


def test_several_missing_children_are_listed_then_counted(hooks) -> None:
    mc = Metacontroller(hooks, PD).serve()
    for key in sorted(mc.children)[:7]:
        mc.delete(*key, refuse=True)
    mc.sync()
    message = conditions(mc)["ChildrenCreated"]["message"]
    listed = message.removeprefix("not created yet: ").split(" and 2 more (")[0].split(", ")
    assert message.startswith("not created yet: ") and " and 2 more (if they stay missing" in message
    assert len(set(listed)) == 5 and {f"{kind} {name}" for kind, name in mc.refused} >= set(listed)


def test_a_broker_that_is_not_ready_holds_readiness(hooks) -> None:
    mc = Metacontroller(hooks, PD).serve()
    mc.set_status("StatefulSet", "qwen-pd-nats", {"replicas": 1, "readyReplicas": 0, "updatedReplicas": 1})
    mc.sync()
    assert mc.parent["status"]["state"] == "pending"
    assert mc.parent["status"]["message"] == "NATS broker 0/1 ready"
    assert conditions(mc)["Ready"]["reason"] == "BrokerNotReady"
    assert mc.parent["status"]["readyServices"] == "3/3"  # the broker is plumbing, not a service


def test_a_graph_without_the_broker_does_not_wait_for_one(hooks) -> None:
    doc = load_yaml(EXAMPLES / "pd-vllm-moriio.yaml")[0]
    mc = Metacontroller(hooks, doc).serve()
    assert not any(kind == "StatefulSet" for kind, _ in mc.children)
    assert mc.parent["status"]["state"] == "ready"


def unschedulable(pod: dict[str, Any], message: str = UNSCHEDULABLE) -> None:
    pod["status"] = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message},
        ],
    }


def test_pods_no_node_takes_are_said_in_the_schedulers_words(hooks) -> None:
    mc = Metacontroller(hooks, PD)
    mc.converge()
    mc.mark_ready(lambda kind, name: 0 if name == "qwen-pd-decode" else None)
    mc.run_pods()
    decode = [pod for name, pod in sorted(mc.pods.items()) if name.startswith("qwen-pd-decode")]
    unschedulable(decode[0])
    mc.sync()
    assert mc.parent["status"]["message"] == (
        f"decode 0/1 ready; waiting on 1 of 3 services; decode: 1 pod unschedulable: {UNSCHEDULABLE}"
    )
    # A pod on its way to a node, or being deleted, waits for nothing.
    decode[0]["status"]["conditions"][0]["reason"] = "SchedulerError"
    mc.sync()
    assert mc.parent["status"]["message"] == "decode 0/1 ready; waiting on 1 of 3 services"


def test_many_unscheduled_pods_are_counted_and_the_first_quoted_in_one_line(hooks) -> None:
    doc = graph().replicas(decode=3).obj()
    mc = Metacontroller(hooks, doc)
    mc.converge()
    mc.mark_ready(lambda kind, name: 0 if name == "qwen-pd-decode" else None)
    mc.run_pods()
    for index, (_, pod) in enumerate(sorted(p for p in mc.pods.items() if p[0].startswith("qwen-pd-decode"))):
        unschedulable(pod, f"0/{index}  nodes\n are available: " + "x" * 500)
    mc.sync()
    (line,) = [part for part in mc.parent["status"]["message"].split("; ") if "unschedulable" in part]
    # Cut where it is too long, and said to be: the ellipsis is the 200th character.
    assert line == "decode: 3 pods unschedulable: " + ("0/0 nodes are available: " + "x" * 500)[:199] + "…"


def test_the_incoming_generations_unscheduled_pods_are_the_rollouts_business(hooks) -> None:
    doc = graph().blue_green().obj()
    mc = Metacontroller(hooks, doc).serve()
    mc.edit(lambda spec: spec.update(image="rocm/infera:sglang-v0.1.2"))
    mc.sync()
    new = mc.parent["status"]["rollout"]["incomingGeneration"]
    mc.mark_ready(lambda kind, name: 0 if name.endswith(new) else None)
    mc.run_pods()
    (decode,) = [pod for name, pod in mc.pods.items() if name.startswith(f"qwen-pd-decode-{new}-")]
    unschedulable(decode)
    mc.sync()
    status = mc.parent["status"]
    assert status["state"] == "ready"  # the serving generation serves
    assert status["rollout"]["message"].endswith(f"; decode: 1 pod unschedulable: {UNSCHEDULABLE}")
    assert "unschedulable" not in conditions(mc)["Ready"]["message"]


def test_the_brokers_unscheduled_pod_is_said_under_blue_green_too(hooks) -> None:
    """The broker's pod belongs to no generation: its words are the graph's."""
    doc = graph().blue_green().obj()
    mc = Metacontroller(hooks, doc).serve()
    mc.run_pods()
    mc.set_status("StatefulSet", "qwen-pd-nats", {"replicas": 1, "readyReplicas": 0, "updatedReplicas": 1})
    unschedulable(mc.pods["qwen-pd-nats-0"])
    mc.sync()
    assert mc.parent["status"]["message"] == f"NATS broker 0/1 ready; nats: 1 pod unschedulable: {UNSCHEDULABLE}"
