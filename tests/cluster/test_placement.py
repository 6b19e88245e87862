"""spec.placement on the real control plane: the real kube-scheduler (and, for multi-node pools,
the LeaderWorkerSet controller) places a graph's workers by the pod affinity the hook renders,
and the real Kueue (tests/support/kueue.py) admits them by the queue and topology the hook
renders, on kwok GPU nodes labelled into three fabric domains of two 8-GPU nodes each (16 GPUs a
domain).

Only those six nodes carry the domain label, and a pod that must share a domain runs only on a
node that has one; the graphs without placement are held to the same six nodes by node affinity,
so that the two are compared on one set of nodes.
"""

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.test_graphs import columns, eventually, get, wait_graph_ready
from tests.support.cluster import Cluster, graph_namespace
from tests.support.graphs import GraphBuilder, graph
from tests.support.kueue import running_kueue
from tests.support.localcluster import Installed
from tests.support.prerequisites import REPO

RACK = "infera.test/rack"
# What Kueue's ResourceFlavor selects the racks' nodes by.
RACK_NODE = "infera.test/rack-node"
RACKS = {
    "rack-a": ("gpu-node-1", "gpu-node-2"),
    "rack-b": ("gpu-node-3", "gpu-node-4"),
    "rack-c": ("gpu-node-5", "gpu-node-6"),
}
NAME = "placed"
ON_RACKS = {
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": RACK, "operator": "Exists"}]}]
            }
        }
    }
}


@pytest.fixture(scope="module", autouse=True)
def racks(installed: Installed) -> Iterator[None]:
    cluster = installed.cluster
    for rack, nodes in RACKS.items():
        labelled = cluster.kubectl("label", "node", *nodes, f"{RACK}={rack}", f"{RACK_NODE}=true")
        assert labelled.returncode == 0, labelled.stderr
    yield
    cluster.kubectl("label", "node", *(node for nodes in RACKS.values() for node in nodes), f"{RACK}-", f"{RACK_NODE}-")


def four_gpu_pd(namespace: str, prefill: int = 2, decode: int = 2) -> GraphBuilder:
    """The PD example with 4-GPU workers: two of each fill a domain."""
    return (
        graph(NAME)
        .metadata(namespace=namespace)
        .replicas(prefill=prefill, decode=decode)
        .resources("prefill", gpu=4, cpu="4", memory="16Gi")
        .resources("decode", gpu=4, cpu="4", memory="16Gi")
    )


def apply(cluster: Cluster, built: GraphBuilder) -> None:
    applied = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(built.manifest()))
    assert applied.returncode == 0, applied.stderr


OFF_RACK = "(no rack)"


def worker_racks(cluster: Cluster, namespace: str) -> dict[str, str | None]:
    """Each worker pod's rack (OFF_RACK on a node of none, None while it waits for a node), by name."""
    rack_of = {node: rack for rack, nodes in RACKS.items() for node in nodes}
    pods = get(cluster, "-n", namespace, "pods", "-l", "infera.amd.com/component=worker")["items"]
    return {
        pod["metadata"]["name"]: rack_of.get(pod["spec"]["nodeName"], OFF_RACK) if pod["spec"].get("nodeName") else None
        for pod in pods
        if not pod["metadata"].get("deletionTimestamp")
    }


def on_racks(built: GraphBuilder, *services: str) -> GraphBuilder:
    """`built` with its `services` held to the racks' nodes, where a placement does not."""
    for service in services:
        built.extra_pod_spec(service, **ON_RACKS)
    return built


@pytest.fixture
def namespace(installed: Installed, request: pytest.FixtureRequest) -> Iterator[str]:
    with graph_namespace(installed.cluster, request.node.name.removeprefix("test_").replace("_", "-")[:60]) as made:
        yield made


def test_required_lands_every_worker_in_one_domain(installed: Installed, namespace: str) -> None:
    cluster = installed.cluster
    apply(cluster, four_gpu_pd(namespace).placement(topologyKey=RACK))
    wait_graph_ready(installed, namespace, NAME)
    placed = worker_racks(cluster, namespace)
    assert len(placed) == 4 and len(set(placed.values())) == 1 and None not in placed.values(), placed
    # `kubectl get idep -o wide` says where each pool runs.
    nodes: dict[str, set[str]] = {}
    for pod in get(cluster, "-n", namespace, "pods", "-l", "infera.amd.com/component=worker")["items"]:
        nodes.setdefault(pod["metadata"]["labels"]["infera.amd.com/service"], set()).add(pod["spec"]["nodeName"])
    summary = "; ".join(f"{service}: {','.join(sorted(on))}" for service, on in sorted(nodes.items()))
    assert eventually(lambda: columns(cluster, namespace, NAME, "wide")["NODES"] == summary, "the NODES column")


def test_without_placement_the_same_workers_spread(installed: Installed, namespace: str) -> None:
    apply(installed.cluster, on_racks(four_gpu_pd(namespace), "prefill", "decode"))
    wait_graph_ready(installed, namespace, NAME)
    placed = worker_racks(installed.cluster, namespace)
    assert len(placed) == 4 and len(set(placed.values())) > 1, placed


def test_workers_beyond_one_domain_wait_and_status_says_why(installed: Installed, namespace: str) -> None:
    cluster = installed.cluster
    apply(cluster, four_gpu_pd(namespace, decode=3).placement(topologyKey=RACK))

    def held() -> dict[str, Any] | None:
        # Which pool's pod is left over is the scheduler's choice: it takes them in any order.
        status = get(cluster, "-n", namespace, "idep", NAME).get("status") or {}
        message = status.get("message") or ""
        return status if re.search(r"\b(prefill|decode): 1 pod unschedulable: ", message) else None

    status = eventually(held, "the status to name the worker pod that waits", timeout=180)
    assert status["state"] == "pending"
    assert "didn't match pod affinity rules" in status["message"], status["message"]
    placed = worker_racks(cluster, namespace)
    running = {rack for rack in placed.values() if rack is not None}
    assert list(placed.values()).count(None) == 1 and len(running) == 1, placed


def test_preferred_spills_the_excess_into_another_domain(installed: Installed, namespace: str) -> None:
    built = four_gpu_pd(namespace, decode=3).placement(topologyKey=RACK, mode="Preferred")
    apply(installed.cluster, on_racks(built, "prefill", "decode"))
    wait_graph_ready(installed, namespace, NAME)
    placed = worker_racks(installed.cluster, namespace)
    assert len(placed) == 5 and None not in placed.values() and len(set(placed.values())) == 2, placed


def serving(cluster: Cluster, namespace: str) -> str | None:
    """The generation that serves once the rollout is Stable at the current spec, else None."""
    idep = get(cluster, "-n", namespace, "idep", NAME)
    status = idep.get("status") or {}
    rollout = status.get("rollout") or {}
    current = status.get("observedGeneration") == idep["metadata"]["generation"]
    return rollout.get("servingGeneration") if current and rollout.get("phase") == "Stable" else None


def test_a_blue_green_generation_chooses_a_domain_with_room(installed: Installed, namespace: str) -> None:
    """The serving generation fills its domain; the next one, whose pods need only share a domain
    with each other, starts whole in another while the first still serves."""
    cluster = installed.cluster
    built = four_gpu_pd(namespace).placement(topologyKey=RACK).blue_green()
    apply(cluster, built)
    wait_graph_ready(installed, namespace, NAME)
    first = eventually(lambda: serving(cluster, namespace), "the first generation to serve")
    (first_rack,) = set(worker_racks(cluster, namespace).values())

    apply(cluster, built.image("rocm/infera:sglang-v0.1.2"))
    second = eventually(
        lambda: (generation := serving(cluster, namespace)) != first and generation,
        "the second generation to serve",
        timeout=300,
    )
    racks = worker_racks(cluster, namespace)
    assert all(second in name for name in racks), racks  # the first generation is gone
    assert len(racks) == 4 and len(set(racks.values())) == 1 and None not in racks.values(), racks
    assert set(racks.values()) != {first_rack}, racks


def test_a_multi_node_groups_ranks_share_a_domain(installed: Installed, namespace: str) -> None:
    """Two groups of two 8-GPU ranks, where a rack holds one group: LeaderWorkerSet's exclusive
    topology gives each group a rack of its own, and its ranks stay in it."""
    cluster = installed.cluster
    built = (
        graph(NAME, REPO / "examples" / "multinode-tp.yaml")
        .metadata(namespace=namespace)
        .replicas(worker=2)
        .placement(topologyKey=RACK, mode="Preferred")
    )
    apply(cluster, built)
    wait_graph_ready(installed, namespace, NAME, seconds=240)
    pods = get(cluster, "-n", namespace, "pods", "-l", "infera.amd.com/component=worker")["items"]
    placed = worker_racks(cluster, namespace)
    groups: dict[str, set[str | None]] = {}
    for pod in pods:
        groups.setdefault(pod["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"], set()).add(
            placed[pod["metadata"]["name"]]
        )
    assert len(pods) == 4 and all(len(racks) == 1 and None not in racks for racks in groups.values()), groups
    assert len(set().union(*groups.values()) - {OFF_RACK}) == 2, groups


# --- Kueue ---------------------------------------------------------------------------------------

QUEUE = "gpu-queue"
KUEUE = "kueue.x-k8s.io/v1beta2"


@pytest.fixture(scope="module")
def kueue(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Kueue, with what docs/placement.md says the cluster admin creates: a Topology of the
    racks, a ResourceFlavor of their nodes, and a ClusterQueue with room for every GPU of them
    (so that only the topology holds a workload back)."""
    cluster = installed.cluster
    with running_kueue(cluster, tmp_path_factory.mktemp("kueue")):
        cluster.apply(
            {
                "apiVersion": KUEUE,
                "kind": "Topology",
                "metadata": {"name": "racks"},
                "spec": {"levels": [{"nodeLabel": RACK}, {"nodeLabel": "kubernetes.io/hostname"}]},
            },
            {
                "apiVersion": KUEUE,
                "kind": "ResourceFlavor",
                "metadata": {"name": "racks"},
                "spec": {"nodeLabels": {RACK_NODE: "true"}, "topologyName": "racks"},
            },
            {
                "apiVersion": KUEUE,
                "kind": "ClusterQueue",
                "metadata": {"name": "gpus"},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory", "amd.com/gpu"],
                            "flavors": [
                                {
                                    "name": "racks",
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": "1000"},
                                        {"name": "memory", "nominalQuota": "100Ti"},
                                        {"name": "amd.com/gpu", "nominalQuota": "48"},
                                    ],
                                }
                            ],
                        }
                    ],
                },
            },
        )
        yield


def queued_group(namespace: str, nodes: int) -> GraphBuilder:
    """examples/multinode-kueue.yaml's graph with one group of `nodes` 8-GPU ranks, in `namespace`."""
    return (
        graph(NAME, REPO / "examples" / "multinode-kueue.yaml")
        .metadata(namespace=namespace)
        .replicas(worker=1)
        .nodes(worker=nodes)
        .placement(topologyKey=RACK, scheduler="Kueue", kueue={"queueName": QUEUE})
    )


def local_queue(cluster: Cluster, namespace: str) -> None:
    cluster.apply(
        {
            "apiVersion": KUEUE,
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": namespace},
            "spec": {"clusterQueue": "gpus"},
        }
    )


def test_kueue_admits_a_group_that_fits_into_one_domain(installed: Installed, kueue: None, namespace: str) -> None:
    cluster = installed.cluster
    local_queue(cluster, namespace)
    apply(cluster, queued_group(namespace, nodes=2))
    wait_graph_ready(installed, namespace, NAME, seconds=240)
    placed = worker_racks(cluster, namespace)
    assert len(placed) == 2 and len(set(placed.values())) == 1 and None not in placed.values(), placed
    (workload,) = get(cluster, "-n", namespace, "workloads.kueue.x-k8s.io")["items"]
    admitted = {c["type"]: c["status"] for c in workload["status"]["conditions"]}
    assert admitted.get("Admitted") == "True", workload["status"]


def test_kueue_admits_no_part_of_a_group_that_fits_no_domain(installed: Installed, kueue: None, namespace: str) -> None:
    """Three 8-GPU ranks need 24 GPUs in one rack of 16: the group is never admitted, so no rank
    runs, and the graph's status says its pods wait in Kueue's words."""
    cluster = installed.cluster
    local_queue(cluster, namespace)
    apply(cluster, queued_group(namespace, nodes=3))

    def held() -> dict[str, Any] | None:
        status = get(cluster, "-n", namespace, "idep", NAME).get("status") or {}
        return status if "worker: 3 pods unschedulable" in (status.get("message") or "") else None

    status = eventually(held, "the status to say the group's pods wait", timeout=180)
    assert status["state"] == "pending", status
    (workload,) = eventually(
        lambda: get(cluster, "-n", namespace, "workloads.kueue.x-k8s.io")["items"], "Kueue's workload of the group"
    )
    requests = [pod_set.get("topologyRequest", {}).get("required") for pod_set in workload["spec"]["podSets"]]
    assert requests == [RACK] * len(requests) and requests, workload["spec"]["podSets"]
    assert {c["type"]: c["status"] for c in workload["status"].get("conditions", [])}.get("Admitted") != "True"
    waiting = worker_racks(cluster, namespace)
    assert waiting and set(waiting.values()) == {None}, waiting
