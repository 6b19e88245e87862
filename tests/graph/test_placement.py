"""spec.placement: the worker pods of a generation told to share a fabric domain, by pod affinity
for the cluster's scheduler or by Kueue's queue and topology annotations; servers go anywhere.
(The scheduler and the API server judge these fields in tests/cluster/test_placement.py.)"""

from typing import Any

import pytest

from tests.support.graphs import graph
from tests.support.prerequisites import need_schemas
from tests.support.requests import PD, parent
from tests.support.simulator import Metacontroller

RACK = "example.com/rack"


def workloads(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in answer["children"] if c["kind"] in ("Deployment", "LeaderWorkerSet")}


def templates(workload: dict[str, Any]) -> list[dict[str, Any]]:
    if workload["kind"] == "Deployment":
        return [workload["spec"]["template"]]
    lwt = workload["spec"]["leaderWorkerTemplate"]
    return [lwt["leaderTemplate"], lwt["workerTemplate"]]


def workers_of(name: str, generation: str = "") -> dict[str, Any]:
    labels = {"infera.amd.com/deployment": name, "infera.amd.com/component": "worker"}
    if generation:
        labels["infera.amd.com/generation"] = generation
    return {"matchLabels": labels}


def sync(hooks, built) -> dict[str, Any]:
    need_schemas()  # LeaderWorkerSets are validated against the upstream CRD
    return hooks.sync(built.obj())


def test_required_placement_ties_every_worker_of_the_graph_to_one_domain(hooks) -> None:
    answer = sync(hooks, graph().placement(topologyKey=RACK))
    term = {"labelSelector": workers_of("qwen-pd"), "topologyKey": RACK}
    placed = {name: [t["spec"].get("affinity") for t in templates(w)] for name, w in workloads(answer).items()}
    assert placed == {
        "qwen-pd-prefill": [{"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}],
        "qwen-pd-decode": [{"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}],
        # The router moves no KV cache.
        "qwen-pd-server": [None],
    }
    for workload in workloads(answer).values():
        assert "kueue.x-k8s.io/queue-name" not in workload["metadata"]["labels"]


def test_a_graph_without_placement_has_no_affinity_and_an_empty_placement_is_refused(hooks) -> None:
    answer = sync(hooks, graph())
    assert all("affinity" not in t["spec"] for w in workloads(answer).values() for t in templates(w))
    status = hooks.sync(graph().placement().obj())["status"]
    assert status["state"] == "failed"
    assert status["message"] == (
        "invalid spec: spec.placement: placement needs topologyKey (the node label that names a fabric domain), "
        "scheduler Kueue, or both"
    )


def test_under_blue_green_a_generation_chooses_its_own_domain(hooks) -> None:
    mc = Metacontroller(hooks, graph().placement(topologyKey=RACK).blue_green().obj())
    mc.converge()
    (prefill,) = [c for (kind, name), c in mc.children.items() if name.startswith("qwen-pd-prefill-")]
    generation = prefill["metadata"]["labels"]["infera.amd.com/generation"]
    (term,) = prefill["spec"]["template"]["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term == {"labelSelector": workers_of("qwen-pd", generation), "topologyKey": RACK}


def test_placement_is_part_of_what_a_generation_runs(hooks) -> None:
    """Adding a placement reschedules every worker pod anyway: under BlueGreen it does so as a new
    generation beside the serving one, never by moving the serving pods."""

    def generation(built) -> str:
        mc = Metacontroller(hooks, built.obj())
        mc.converge()
        return mc.parent["status"]["rollout"]["servingGeneration"]

    plain = generation(graph().blue_green())
    assert generation(graph().blue_green().placement(topologyKey=RACK)) != plain
    assert generation(graph().blue_green()) == plain


def test_preferred_placement_prefers_the_domain_and_multi_node_groups_take_one_each(hooks) -> None:
    built = graph().placement(topologyKey=RACK, mode="Preferred").nodes(decode=2)
    answer = sync(hooks, built)
    term = {"labelSelector": workers_of("qwen-pd"), "topologyKey": RACK}
    (prefill,) = templates(workloads(answer)["qwen-pd-prefill"])
    assert prefill["spec"]["affinity"] == {
        "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}
    }
    # A group's leader is placed before its ranks exist: LeaderWorkerSet keeps each group in a
    # domain of its own, which the single-node workers then follow.
    decode = workloads(answer)["qwen-pd-decode"]
    assert decode["metadata"]["annotations"] == {"leaderworkerset.sigs.k8s.io/exclusive-topology": RACK}
    assert [t["spec"].get("affinity") for t in templates(decode)] == [None, None]


def test_a_required_placement_gives_multi_node_groups_a_domain_each_too(hooks) -> None:
    answer = sync(hooks, graph().placement(topologyKey=RACK).nodes(decode=2))
    decode = workloads(answer)["qwen-pd-decode"]
    assert decode["metadata"]["annotations"] == {"leaderworkerset.sigs.k8s.io/exclusive-topology": RACK}
    assert "annotations" not in workloads(answer)["qwen-pd-prefill"]["metadata"]


def test_a_templates_own_affinity_stands_beside_the_placements(hooks) -> None:
    own = {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "kubernetes.io/hostname"}
    nodes = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["mi300x"]}]}]
        }
    }
    built = (
        graph()
        .placement(topologyKey=RACK)
        .extra_pod_spec(
            "decode",
            affinity={"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [own]}, "nodeAffinity": nodes},
        )
    )
    (decode,) = templates(workloads(sync(hooks, built))["qwen-pd-decode"])
    assert decode["spec"]["affinity"] == {
        "nodeAffinity": nodes,
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                own,
                {"labelSelector": workers_of("qwen-pd"), "topologyKey": RACK},
            ]
        },
    }


def test_kueue_gets_the_queue_on_worker_workloads_and_topology_on_their_pods(hooks) -> None:
    built = graph().placement(topologyKey=RACK, scheduler="Kueue", kueue={"queueName": "gpus"}).nodes(decode=2)
    answer = sync(hooks, built)
    found = {
        name: (
            w["metadata"]["labels"].get("kueue.x-k8s.io/queue-name"),
            [t["metadata"].get("annotations") for t in templates(w)],
        )
        for name, w in workloads(answer).items()
    }
    required = {"kueue.x-k8s.io/podset-required-topology": RACK}
    assert found == {
        "qwen-pd-prefill": ("gpus", [required]),
        # Leader and workers of a group are one pod set group: Kueue puts them in one domain.
        "qwen-pd-decode": ("gpus", [required | {"kueue.x-k8s.io/podset-group-name": "decode"}] * 2),
        "qwen-pd-server": (None, [None]),
    }
    # Kueue ignores pod affinity when it places a pod set.
    assert all("affinity" not in t["spec"] for w in workloads(answer).values() for t in templates(w))


def test_kueue_without_a_topology_key_only_queues(hooks) -> None:
    built = graph().placement(scheduler="Kueue", kueue={"queueName": "gpus"})
    found = {
        n: (
            w["metadata"]["labels"].get("kueue.x-k8s.io/queue-name"),
            [t["metadata"].get("annotations") for t in templates(w)],
        )
        for n, w in workloads(sync(hooks, built)).items()
    }
    assert found == {
        "qwen-pd-prefill": ("gpus", [None]),
        "qwen-pd-decode": ("gpus", [None]),
        "qwen-pd-server": (None, [None]),
    }


@pytest.fixture(scope="module")
def converged(hooks) -> Metacontroller:
    mc = Metacontroller(hooks, parent(PD))
    mc.converge()
    return mc


def placed(**placement: Any):
    return lambda spec: spec.update(placement=placement)


def extra(service: str, **pod_spec: Any):
    return lambda spec: spec["services"][service].update(extraPodSpec=pod_spec)


def both(*changes):
    def change(spec: dict[str, Any]) -> None:
        for one in changes:
            one(spec)

    return change


REPELLING = {
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchLabels": {"infera.amd.com/service": "decode"}},
                "topologyKey": "kubernetes.io/hostname",
            },
            {
                "labelSelector": {
                    "matchExpressions": [{"key": "infera.amd.com/component", "operator": "In", "values": ["worker"]}]
                },
                "topologyKey": RACK,
            },
        ]
    }
}


def pinned(value: str) -> dict[str, Any]:
    return {"nodeSelector": {RACK: value}}


def node_terms(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    """A required node affinity of alternative terms, each its match expressions."""
    required = {"nodeSelectorTerms": [{"matchExpressions": expressions} for expressions in terms]}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}}


REFUSED = {
    "mode without topologyKey": (
        placed(scheduler="Kueue", kueue={"queueName": "q"}, mode="Preferred"),
        "invalid spec: spec.placement: placement.mode needs placement.topologyKey: the node label whose value names "
        "a fabric domain",
    ),
    "Kueue without its queue": (
        placed(topologyKey=RACK, scheduler="Kueue"),
        "invalid spec: spec.placement: placement.kueue is set exactly when placement.scheduler is Kueue: set "
        "kueue.queueName to the LocalQueue of the graph's namespace",
    ),
    "a queue for the default scheduler": (
        placed(topologyKey=RACK, kueue={"queueName": "q"}),
        "invalid spec: spec.placement: placement.kueue is set exactly when placement.scheduler is Kueue: set "
        "kueue.queueName to the LocalQueue of the graph's namespace",
    ),
    "a topology key that is no label key": (
        placed(topologyKey="rack/a/b"),
        "invalid spec: spec.placement.topologyKey: 'rack/a/b' is not a valid label or annotation key (e.g. example.com/team)",
    ),
    "workers that repel each other's domain": (
        both(placed(topologyKey=RACK), extra("prefill", affinity=REPELLING)),
        "spec.services.prefill.extraPodSpec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[1]: "
        f"keeps the graph's workers out of each other's {RACK} domain, which spec.placement requires them to share; "
        "remove the term, narrow its labelSelector, or set placement.mode Preferred",
    ),
    "pools pinned to different domains": (
        both(placed(topologyKey=RACK), extra("prefill", **pinned("a")), extra("decode", **pinned("b"))),
        "spec.services.decode.extraPodSpec and spec.services.prefill.extraPodSpec: no "
        f"{RACK} domain is left that they all allow, while spec.placement requires every worker of the graph in "
        "one: pin them to one domain, or set placement.mode Preferred",
    ),
    "a pool pinned by node affinity away from another's": (
        both(
            placed(topologyKey=RACK),
            extra("prefill", **pinned("a")),
            extra(
                "decode",
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": RACK, "operator": "In", "values": ["b", "c"]}]}
                            ]
                        }
                    }
                },
            ),
        ),
        "spec.services.decode.extraPodSpec and spec.services.prefill.extraPodSpec: no "
        f"{RACK} domain is left that they all allow, while spec.placement requires every worker of the graph in "
        "one: pin them to one domain, or set placement.mode Preferred",
    ),
    "a node selector and node affinity that leave no domain": (
        both(
            placed(topologyKey=RACK),
            extra("decode", nodeSelector={RACK: "a"}, **node_terms([{"key": RACK, "operator": "In", "values": ["b"]}])),
        ),
        "spec.services.decode.extraPodSpec: no "
        f"{RACK} domain is left that it allows, while spec.placement requires every worker of the graph in one: "
        "pin them to one domain, or set placement.mode Preferred",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_placement_that_cannot_hold_fails_and_keeps_every_child(converged: Metacontroller, case: str) -> None:
    change, message = REFUSED[case]
    assert converged.refusal(change) == message


ACCEPTED = {
    "workers repelled only per node": both(
        placed(topologyKey=RACK),
        extra(
            "prefill",
            affinity={
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": REPELLING["podAntiAffinity"][
                        "requiredDuringSchedulingIgnoredDuringExecution"
                    ][:1]
                }
            },
        ),
    ),
    "repelling under Preferred": both(placed(topologyKey=RACK, mode="Preferred"), extra("prefill", affinity=REPELLING)),
    "pools pinned apart under Preferred": both(
        placed(topologyKey=RACK, mode="Preferred"), extra("prefill", **pinned("a")), extra("decode", **pinned("b"))
    ),
    "pools pinned to one domain": both(
        placed(topologyKey=RACK), extra("prefill", **pinned("a")), extra("decode", **pinned("a"))
    ),
    "a pin on another label": both(
        placed(topologyKey=RACK), extra("prefill", nodeSelector={"zone": "x"}), extra("decode", **pinned("b"))
    ),
}


ACCEPTED |= {
    # One alternative leaves the rack open: the pool is not pinned.
    "a pin with an open alternative": both(
        placed(topologyKey=RACK),
        extra("prefill", **pinned("a")),
        extra(
            "decode",
            **node_terms([{"key": RACK, "operator": "In", "values": ["b"]}], [{"key": "gpu", "operator": "Exists"}]),
        ),
    ),
    # Alternatives pin to either: a shares with the other pool.
    "alternatives that include the other pool's domain": both(
        placed(topologyKey=RACK),
        extra("prefill", **pinned("a")),
        extra(
            "decode",
            **node_terms(
                [{"key": RACK, "operator": "In", "values": ["b"]}],
                [{"key": RACK, "operator": "In", "values": ["a", "c"]}],
            ),
        ),
    ),
}


@pytest.mark.parametrize("case", ACCEPTED)
def test_a_placement_the_templates_leave_room_for_is_accepted(hooks, case: str) -> None:
    obj = parent(PD)
    ACCEPTED[case](obj["spec"])
    status = hooks.sync(obj)["status"]
    assert status["state"] != "failed", status["message"]


def test_status_names_the_nodes_each_worker_pool_runs_on(hooks) -> None:
    mc = Metacontroller(hooks, graph().replicas(decode=3).placement(topologyKey=RACK).obj())
    mc.converge()
    mc.run_pods()
    assert mc.parent["status"]["placement"] == {"nodes": {}, "summary": ""}
    decode = sorted(name for name in mc.pods if name.startswith("qwen-pd-decode-"))
    nodes = {decode[0]: "node-b", decode[1]: "node-a"}  # the third waits for a node
    for name, pod in mc.pods.items():
        pod["spec"]["nodeName"] = nodes.get(name, "node-a" if name.startswith("qwen-pd-prefill-") else "node-z")
        if name == decode[2]:
            del pod["spec"]["nodeName"]
    mc.sync()
    assert mc.parent["status"]["placement"] == {
        # The router's node is no worker's.
        "nodes": {"decode": ["node-a", "node-b"], "prefill": ["node-a"]},
        "summary": "decode: node-a,node-b; prefill: node-a",
    }


def test_without_placement_the_status_says_nothing_of_nodes(hooks) -> None:
    mc = Metacontroller(hooks, graph().obj())
    mc.converge()
    mc.run_pods()
    for pod in mc.pods.values():
        pod["spec"]["nodeName"] = "node-a"
    mc.sync()
    assert "placement" not in mc.parent["status"]
