"""What the fleet is: its InferaDeployments (the examples' shapes, in turn), the kwok nodes and
volumes that hold them, and the Metacontroller settings each run uses."""

import copy
import math
from typing import Any

from tests.support.cluster import kwok_node, volume
from tests.support.prerequisites import REPO
from tests.support.requests import load_yaml

# PD, mixed, multi-node on LeaderWorkerSet, GAIE, autoscaled: each graph takes the next shape.
SHAPES = {
    "pd": "pd-disaggregated.yaml",
    "mixed": "single-node-mixed.yaml",
    "multinode": "multinode-tp.yaml",
    "gaie": "gaie-pd.yaml",
    "autoscaled": "pd-autoscaling.yaml",
}
NAMESPACES = 10
# Pods per node for the fleet's own nodes; each graph has at most 5 pods.
PODS_PER_NODE = 250
FLEET_NODE_CAPACITY = {
    "cpu": "100000",
    "memory": "1000Ti",
    "pods": str(PODS_PER_NODE),
    "ephemeral-storage": "1000Ti",
    "amd.com/gpu": "10000",
    "nvidia.com/gpu": "10000",
}

# Metacontroller's flags by fleet size: its defaults, and what docs/operations.md recommends.
DEFAULTS = {"workers": 5, "client-go-qps": 5, "client-go-burst": 10}
RECOMMENDED = [  # (up to this many graphs, settings)
    (100, DEFAULTS),
    (1000, {"workers": 20, "client-go-qps": 100, "client-go-burst": 200}),
    (5000, {"workers": 50, "client-go-qps": 300, "client-go-burst": 600}),
]


def recommended(graphs: int) -> dict[str, int]:
    return next((settings for limit, settings in RECOMMENDED if graphs <= limit), RECOMMENDED[-1][1])


def namespaces() -> list[str]:
    return [f"fleet-{index}" for index in range(NAMESPACES)]


def graphs(count: int) -> list[dict[str, Any]]:
    """`count` InferaDeployments, the shapes in turn, spread over the fleet's namespaces."""
    examples = {shape: load_yaml(REPO / "examples" / name)[0] for shape, name in SHAPES.items()}
    fleet = []
    for index in range(count):
        shape = list(SHAPES)[index % len(SHAPES)]
        graph = copy.deepcopy(examples[shape])
        graph["metadata"] = {"name": f"{shape}-{index}", "namespace": f"fleet-{index % NAMESPACES}"}
        fleet.append(graph)
    return fleet


def nodes(count: int) -> list[dict[str, Any]]:
    """Enough kwok nodes for every pod of `count` graphs, and one to spare."""
    fleet_nodes = []
    for index in range(math.ceil(5 * count / PODS_PER_NODE) + 1):
        node = kwok_node(f"fleet-node-{index}")
        node["status"] = {"capacity": FLEET_NODE_CAPACITY, "allocatable": FLEET_NODE_CAPACITY}
        fleet_nodes.append(node)
    return fleet_nodes


def volumes(count: int) -> list[dict[str, Any]]:
    """A volume for each graph's NATS claim."""
    return [volume(f"fleet-{index}") for index in range(count)]
