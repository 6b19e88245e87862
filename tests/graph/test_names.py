"""The names of a graph's children, against the one table of them (hooks/api/names.py): every
child a graph renders (and every object the LeaderWorkerSet controller makes of one) is a name
of the table, within its kind's limit; and no graph can give a child the kind and name of
another graph's."""

import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings

from hooks.api import name_rules, names, rules
from hooks.kubernetes_names import DNS_LABEL
from hooks.vocabulary import CHILD_KINDS
from tests.support.graphs import graph
from tests.support.requests import PD, controller, parent
from tests.support.service import HookClient
from tests.support.simulator import Metacontroller
from tests.support.specs import QUEUE_METRICS, graphs_with_every_child

Key = tuple[str, str]


def made_of_leader_worker_sets(children: dict[Key, dict[str, Any]]) -> set[Key]:
    """What the LeaderWorkerSet controller makes of each LeaderWorkerSet: its leaders'
    StatefulSet and headless Service, named as it, and a StatefulSet <name>-<group> for each
    group it may run (as many as its autoscaler allows)."""
    made = set()
    for (kind, name), child in children.items():
        if kind != "LeaderWorkerSet":
            continue
        made |= {("StatefulSet", name), ("Service", name)}
        made |= {("StatefulSet", f"{name}-{group}") for group in (0, max(0, child["spec"]["replicas"] - 1))}
    return made


def test_every_kind_the_hook_makes_has_a_limit_and_a_name() -> None:
    kinds = {child.kind for child in CHILD_KINDS}
    assert kinds == set(names.KIND_LIMITS)
    assert kinds == {kind for name in names.NAMES if name.made_by is None for kind in name.kinds}


@settings(max_examples=25)
@given(graph=graphs_with_every_child())
def test_every_name_a_graph_gets_is_in_the_table_within_its_kinds_limit(hooks: HookClient, graph: dict) -> None:
    status = hooks.sync(graph)["status"]
    if status["state"] == "failed":
        assert any(rule.message in status["message"] for rule in name_rules.LENGTH_RULES), status["message"]
        return
    mc = Metacontroller(hooks, graph)
    for _ in range(2):  # workers that wait for the model download come once it completes
        mc.converge()
        mc.mark_ready()
    mc.converge()
    assert mc.parent["status"]["state"] != "failed", mc.parent["status"]["message"]
    name, services = graph["metadata"]["name"], sorted(graph["spec"]["services"])
    made = made_of_leader_worker_sets(mc.children)
    for kind, child in sorted(set(mc.children) | made):
        rows = [
            row
            for row in names.NAMES
            if kind in row.kinds
            and (row.made_by is None) == ((kind, child) in mc.children)
            and row.regex(name, services).fullmatch(child)
        ]
        assert rows, f"{kind} {child} is no name of hooks/api/names.py"
        limit = names.KIND_LIMITS[kind].characters
        assert limit is None or len(child) <= limit, f"{kind} {child}: {len(child)} characters, more than {limit}"


def rich(strategy: str) -> dict[str, Any]:
    """Graph a-b with every kind of child: broker, gateway, model cache, monitoring, graph
    isolation, autoscaled and budgeted pools, a multi-node one."""
    autoscaling = {"maxReplicas": 3, "metrics": QUEUE_METRICS}
    return parent(
        {
            "apiVersion": "infera.amd.com/v1alpha1",
            "kind": "InferaDeployment",
            "metadata": {"name": "a-b"},
            "spec": {
                "image": "engine:v1",
                "gaie": {"enabled": True, "tokenizerPath": "Qwen/Qwen3-0.6B", "gatewayName": "gw", "eppReplicas": 2},
                "modelCache": {"source": "hf://Qwen/Qwen3-0.6B", "size": "20Gi"},
                "monitoring": {},
                "networkPolicy": {"isolate": "graph"},
                "rollout": {"strategy": strategy},
                "services": {
                    "server": {
                        "componentType": "server",
                        "replicas": 2,
                        "autoscaling": {**autoscaling, "minReplicas": 2},
                        "args": ["--router-tokenizer-path", "Qwen/Qwen3-0.6B"],
                    },
                    "decode": {
                        "componentType": "worker",
                        "autoscaling": autoscaling,
                        "args": ["--model-path", "Qwen/Qwen3-0.6B"],
                    },
                    "m": {
                        "componentType": "worker",
                        "numberOfNodes": 2,
                        "replicas": 2,
                        "args": ["--model-path", "Qwen/Qwen3-0.6B"],
                    },
                },
            },
        }
    )


def claiming(graph: str, service: str, multi_node: bool) -> dict[str, Any]:
    """Graph `graph` whose service `service` has children of as many kinds as a service can: a
    server with a Service, or a multi-node pool; autoscaled, budgeted and isolated."""
    autoscaling = {"minReplicas": 2, "maxReplicas": 3, "metrics": QUEUE_METRICS}
    if multi_node:
        claimant = {"componentType": "worker", "numberOfNodes": 2, "args": ["--model-path", "Qwen/Qwen3-0.6B"]}
    else:
        claimant = {"componentType": "server", "args": ["--router-tokenizer-path", "Qwen/Qwen3-0.6B"]}
    worker = "w" if service != "w" else "v"
    services = {
        service: claimant | {"replicas": 2, "autoscaling": autoscaling},
        worker: {"componentType": "worker", "args": ["--model-path", "Qwen/Qwen3-0.6B"]},
    }
    spec = {"image": "engine:v1", "networkPolicy": {"isolate": "graph"}, "services": services}
    return parent(
        {"apiVersion": "infera.amd.com/v1alpha1", "kind": "InferaDeployment", "metadata": {"name": graph}, "spec": spec}
    )


def kinds_by_name(children: dict[Key, dict[str, Any]]) -> dict[str, set[str]]:
    by_name: dict[str, set[str]] = {}
    for kind, name in set(children) | made_of_leader_worker_sets(children):
        by_name.setdefault(name, set()).add(kind)
    return by_name


@pytest.mark.parametrize("strategy", ["RollingUpdate", "BlueGreen"])
def test_no_graph_can_give_its_child_the_kind_and_name_of_another_graphs(hooks: HookClient, strategy: str) -> None:
    """Each name of a graph's children, <graph>-<rest>, is also <other graph>-<service> for every
    way of cutting it at a '-': a graph of that name with that service either is refused or has
    no child of that name of the same kind. (Two graphs' services can share names, a-b with
    service c and a with service b-c: that is detected at run time, not here.)"""
    mc = Metacontroller(hooks, rich(strategy))
    for _ in range(2):
        mc.converge()
        mc.mark_ready()
    mc.converge()
    graph, services = mc.parent["metadata"]["name"], mc.parent["spec"]["services"]
    theirs = {
        name: kinds
        for name, kinds in kinds_by_name(mc.children).items()
        if name not in {f"{graph}-{s}" for s in services}
    }
    checked = 0
    for name, kinds in sorted(theirs.items()):
        for cut in (match.start() for match in re.finditer("-", name)):
            other, service = name[:cut], name[cut + 1 :]
            if other == graph or not (DNS_LABEL.fullmatch(other) and DNS_LABEL.fullmatch(service)):
                continue
            for multi_node in (False, True):
                answer = hooks.sync(claiming(other, service, multi_node))
                if answer["status"]["state"] == "failed":
                    message = answer["status"]["message"]
                    assert any(r.message(other, service) in message for r in name_rules.CLAIM_RULES), message
                    continue
                ours = kinds_by_name({(c["kind"], c["metadata"]["name"]): c for c in answer["children"]})
                assert not ours.get(name, set()) & kinds, f"{other} with service {service} has {name} as {graph} has"
                checked += 1
    assert checked > 10


@pytest.fixture(scope="module")
def converged(hooks: HookClient) -> Metacontroller:
    """qwen-pd running, under a controller that may create LeaderWorkerSets."""
    mc = Metacontroller(hooks, parent(PD), composite=controller("lws"))
    mc.converge()
    return mc


def add_server(name: str) -> Callable[[dict[str, Any]], None]:
    server = {"componentType": "server", "port": 4222, "args": ["--router-tokenizer-path", "Qwen/Qwen3-0.6B"]}
    return lambda spec: spec["services"].__setitem__(name, server)


def test_a_running_graph_given_another_graphs_plumbing_name_fails_and_keeps_its_children(
    converged: Metacontroller,
) -> None:
    """qwen-pd with a server b-nats would own Service qwen-pd-b-nats, the broker of graph
    qwen-pd-b: its workers would send their prompts and KV events to this graph's pods."""
    (rule,) = [rule for rule in name_rules.CLAIM_RULES if rule.tail == "-nats"]
    message = converged.refusal(add_server("b-nats"))
    assert message == f"invalid spec: {rule.message('qwen-pd', 'b-nats')}"
    assert message == (
        "invalid spec: service name 'b-nats' ends in -nats: its children, qwen-pd-b-nats, would have the name of "
        "the StatefulSet, Service and NetworkPolicy of the NATS broker (<metadata.name>-nats) in another "
        "InferaDeployment (or this one), and one would stand in for the other; rename the service"
    )


BOUNDS = {
    "a billion nodes per group": (
        lambda spec: spec["services"]["decode"].update(numberOfNodes=1_000_000_000),
        f"invalid spec: spec.services.decode.numberOfNodes: {rules.NODES_RULE}",
    ),
    "one node more than the bound": (
        lambda spec: spec["services"]["decode"].update(numberOfNodes=rules.MAX_NODES + 1),
        f"invalid spec: spec.services.decode.numberOfNodes: {rules.NODES_RULE}",
    ),
    "more groups than their names leave room for": (
        lambda spec: spec["services"]["decode"].update(numberOfNodes=2, replicas=names.MAX_GROUPS + 1),
        f"invalid spec: spec.services.decode: {rules.GROUPS_RULE}",
    ),
}


@pytest.mark.parametrize("case", BOUNDS)
def test_a_bound_on_a_groups_size_or_count_fails_and_keeps_the_running_pool(
    converged: Metacontroller, case: str
) -> None:
    """Without it the running Deployment would be deleted for a LeaderWorkerSet that never
    schedules (or whose later groups' StatefulSets the API server refuses)."""
    change, message = BOUNDS[case]
    assert converged.refusal(change) == message


def test_a_group_of_the_most_nodes_in_the_most_groups_renders(hooks: HookClient) -> None:
    answer = hooks.sync(graph().nodes(decode=rules.MAX_NODES).replicas(decode=names.MAX_GROUPS).obj())
    assert answer["status"]["state"] == "initializing"
    (group,) = [child for child in answer["children"] if child["kind"] == "LeaderWorkerSet"]
    assert (group["spec"]["replicas"], group["spec"]["leaderWorkerTemplate"]["size"]) == (10_000, 64)
