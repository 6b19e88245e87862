"""The simulator against the real Metacontroller: every example, scripted through the same steps
(create, scale a pool, change the spec, BlueGreen's image change and revert, GAIE off and on,
a spec the hook refuses and its fix, delete) on the cluster and in process, must end each step
with the same children as stored, the same status and the same writes.

The graphs move in lockstep, one step at a time on the cluster, so the waits overlap. The world
the simulator cannot make (what the workload controllers, kwok's pods, the autoscaler and the
Gateway report) is copied into it from the cluster once the step has settled there: each
child's status, an autoscaler's count of the workload it targets, and the graph's Pods (the
hooks read them for a pod no node takes and, under spec.placement, for where workers run).
What Metacontroller does with the hooks' answers is not copied: the creates, updates and
deletes, the last-applied record, generations, the parent's finalizer and status are each the
simulator's own, compared with the audit log and the stored objects. The status is compared by
its content at the end of each step and its writes by whether there were any (the cluster's
pods become ready one by one, the simulator's at once); the simulator goes from the world
before the step to the world after it, so a write the cluster makes in a state between the two
(a BlueGreen phase) is one both must make.
"""

import contextlib
import copy
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hooks.contract import LAST_APPLIED_ANNOTATION
from tests.cluster.test_blue_green import NEW_IMAGE
from tests.cluster.test_graphs import EXAMPLES, accept_gateway_routes, children, comparable, eventually, get, quiet
from tests.support.cluster import Cluster, graph_namespace
from tests.support.localcluster import COMPONENTS, Installed
from tests.support.metacontroller import USER as METACONTROLLER_USER
from tests.support.requests import RESOURCE_KINDS, controller, load_yaml
from tests.support.service import HookClient
from tests.support.simulator import Metacontroller, Write

Change = Callable[[dict[str, Any]], None]
Key = tuple[str, str]  # a child's kind and name
WORKLOADS = ("Deployment", "StatefulSet", "LeaderWorkerSet")
# A mount of a volume no pod has: the CRD admits any pod spec, the hook refuses this one.
UNKNOWN_MOUNT = {"containers": [{"name": "main", "volumeMounts": [{"name": "models", "mountPath": "/models"}]}]}


@dataclass(frozen=True)
class Step:
    what: str
    change: Change
    state: str = "ready"


@dataclass
class Graph:
    """One example on both sides: its namespace and name on the cluster, its simulator."""

    example: Path
    namespace: str
    name: str
    steps: list[Step]
    simulated: Metacontroller | None = None
    # What the hooks' previous answer set, by child: a field it set and the next drops is
    # removed by the merge, which the comparison of the stored child must see.
    records: dict[Key, dict[str, Any]] = field(default_factory=dict)
    differences: list[str] = field(default_factory=list)


def first_worker(spec: dict[str, Any]) -> str:
    """The first worker pool whose count the spec owns (an autoscaler owns the others')."""
    return next(
        name
        for name, svc in sorted(spec["services"].items())
        if svc["componentType"] == "worker" and "autoscaling" not in svc
    )


def scaled(spec: dict[str, Any]) -> None:
    worker = spec["services"][first_worker(spec)]
    worker["replicas"] = worker.get("replicas", 1) + 1


def with_env(spec: dict[str, Any]) -> None:
    spec["envs"] = [*(spec.get("envs") or []), {"name": "INFERA_DIFFERENTIAL", "value": "1"}]


def replacing(new: dict[str, Any]) -> Change:
    """The edit that makes a spec `new`."""

    def change(spec: dict[str, Any]) -> None:
        spec.clear()
        spec.update(copy.deepcopy(new))

    return change


def refused(spec: dict[str, Any]) -> None:
    spec["services"][first_worker(spec)]["extraPodSpec"] = copy.deepcopy(UNKNOWN_MOUNT)


def fixed(spec: dict[str, Any]) -> None:
    del spec["services"][first_worker(spec)]["extraPodSpec"]


def steps_of(spec: dict[str, Any]) -> list[Step]:
    """The steps every example takes, and those its shape adds: BlueGreen's image change and
    revert, GAIE off and on again."""
    steps = [Step("scale a pool", scaled), Step("set an env var", with_env)]
    if (spec.get("rollout") or {}).get("strategy") == "BlueGreen":
        image = spec["image"]
        steps += [
            Step("change the image", lambda s: s.update(image=NEW_IMAGE)),
            Step("revert the image", lambda s: s.update(image=image)),
        ]
    if (spec.get("gaie") or {}).get("enabled"):
        steps += [
            Step("turn GAIE off", lambda s: s["gaie"].update(enabled=False)),
            Step("turn GAIE on", lambda s: s["gaie"].update(enabled=True)),
        ]
    return [*steps, Step("refused spec", refused, "failed"), Step("fix the refused spec", fixed)]


def settled(cluster: Cluster, graph: Graph, state: str) -> bool:
    """Whether the graph's status speaks of its current spec, in `state`, and a BlueGreen
    rollout is Stable."""
    accept_gateway_routes(cluster, graph.namespace, only_new=True)
    idep = get(cluster, "-n", graph.namespace, "idep", graph.name)
    status = idep.get("status") or {}
    rollout = status.get("rollout")
    return (
        status.get("observedGeneration") == idep["metadata"]["generation"]
        and status.get("state") == state
        and (rollout is None or rollout["phase"] == "Stable" or state == "failed")
    )


def real_writes(cluster: Cluster, namespace: str, since: int, until: int | None = None) -> Counter[Write]:
    """Metacontroller's successful writes in `namespace` from audit entry `since` to `until`, as
    the simulator names them (tests/support/simulator.py Write); its Events left out."""
    writes: Counter[Write] = Counter()
    for event in cluster.audit_writes(METACONTROLLER_USER)[since:until]:
        ref = event["objectRef"]
        if ref.get("namespace") != namespace or event["responseStatus"]["code"] >= 300 or ref["resource"] == "events":
            continue
        if ref["resource"] == "inferadeployments":
            writes[
                ("status" if ref.get("subresource") == "status" else "finalizer", "InferaDeployment", ref["name"])
            ] += 1
        else:
            writes[(event["verb"], RESOURCE_KINDS[ref["resource"]], ref["name"])] += 1
    return writes


def compared_writes(writes: Counter[Write]) -> Counter[Write]:
    """The writes to compare: each child write as often as it was made; the parent's status
    once if at all (the cluster's pods become ready one by one, the simulator's at once)."""
    return Counter({write: 1 if write[0] == "status" else count for write, count in writes.items()})


def mirrored(simulated: Metacontroller, real: dict[Key, dict[str, Any]], pods: dict[str, dict[str, Any]]) -> bool:
    """Copies the world's part of each child from the cluster into the simulator: its status
    (what its controller, kwok's pods or the Gateway reported) and, for a workload an
    autoscaler targets, its count; and the graph's Pods, by name. Whether anything changed."""
    targeted = {
        (target["kind"], target["name"])
        for (kind, _), child in simulated.children.items()
        if kind == "HorizontalPodAutoscaler"
        for target in [child["spec"]["scaleTargetRef"]]
    }
    changed = simulated.pods != pods
    simulated.pods = copy.deepcopy(pods)
    for key, child in simulated.children.items():
        if key not in real:
            continue
        status = real[key].get("status")
        if status is not None and child.get("status") != status:
            child["status"] = copy.deepcopy(status)
            changed = True
        replicas = (real[key].get("spec") or {}).get("replicas")
        if key in targeted and isinstance(replicas, int) and replicas != child["spec"].get("replicas"):
            simulated.autoscale(*key, replicas)
            changed = True
    return changed


def simulated_step(
    simulated: Metacontroller, real: dict[Key, dict[str, Any]], pods: dict[str, dict[str, Any]]
) -> list[Write]:
    """The simulator through one step: it converges, the world catches up with the cluster's,
    until neither moves; its writes meanwhile."""
    start = len(simulated.writes)
    for _ in range(6):
        simulated.converge()
        if not mirrored(simulated, real, pods):
            return simulated.writes[start:]
    raise AssertionError(f"the simulator never settled: {simulated.writes[start:][-10:]}")


def as_applied(stored: Any, applied: Any) -> Any:
    """The stored object where the hooks' answer set something: what the API server made of it."""
    if isinstance(applied, dict):
        if not isinstance(stored, dict):
            return stored
        return {key: as_applied(stored.get(key, "<absent>"), value) for key, value in applied.items()}
    if isinstance(applied, list) and isinstance(stored, list) and len(stored) == len(applied):
        return [as_applied(s, a) for s, a in zip(stored, applied, strict=True)]
    return stored


def either(previous: Any, current: Any) -> Any:
    """The fields the previous answer or the current one set (the current one's lists)."""
    if isinstance(previous, dict) and isinstance(current, dict):
        return {
            key: either(previous.get(key), current[key]) if key in current else previous[key]
            for key in previous | current
        }
    return current


def child_view(child: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """What Metacontroller and the API server made of a child: the record of what was applied
    (the annotation's very text), the stored fields this answer or the previous one set (one
    the previous set and this one dropped must be gone), a workload's generation (readiness
    reads it), the controller reference."""
    metadata = child["metadata"]
    record = (metadata.get("annotations") or {}).get(LAST_APPLIED_ANNOTATION)
    return {
        "record": record,
        "stored": as_applied(child, either(previous, json.loads(record))) if record else None,
        "generation": metadata.get("generation") if child["kind"] in WORKLOADS else None,
        "owners": [
            {k: ref.get(k) for k in ("apiVersion", "kind", "name", "uid", "controller", "blockOwnerDeletion")}
            for ref in metadata.get("ownerReferences") or []
        ],
    }


def differences(what: str, real: Any, simulated: Any) -> list[str]:
    return [] if real == simulated else [f"{what}:\n  cluster:   {real!r}\n  simulator: {simulated!r}"]


def simulator_for(installed: Installed, parent: dict[str, Any]) -> Metacontroller:
    """The simulator of the graph as the cluster stores it once created (its spec with the CRD's
    defaults, its uid, which the children's selector label is), before Metacontroller's first
    write to it."""
    created = copy.deepcopy(parent)
    created["status"] = {}
    created["metadata"].pop("finalizers", None)
    return Metacontroller(HookClient(installed.hooks_url), created, controller(*COMPONENTS))


def compared_step(installed: Installed, graph: Graph, step: str, since: int) -> None:
    """The step's outcome on the cluster against the simulator's, which takes the step now; any
    difference is the graph's."""
    cluster, simulated = installed.cluster, graph.simulated
    assert simulated is not None
    parent = get(cluster, "-n", graph.namespace, "idep", graph.name)
    real = {
        (c["kind"], c["metadata"]["name"]): c for c in children(cluster, graph.namespace, parent["metadata"]["uid"])
    }
    pods = {pod["metadata"]["name"]: pod for pod in get(cluster, "-n", graph.namespace, "pods")["items"]}
    # What Metacontroller wrote up to this look at the cluster, not after it.
    until = len(cluster.audit_writes(METACONTROLLER_USER))
    written = simulated_step(simulated, real, pods)
    found = differences("children", sorted(real), sorted(simulated.children))
    for key in sorted(set(real) & set(simulated.children)):
        previous = graph.records.get(key)
        found += differences(f"{key}", child_view(real[key], previous), child_view(simulated.children[key], previous))
    found += differences("status", comparable(parent["status"]), comparable(simulated.parent["status"]))
    found += differences(
        "writes",
        compared_writes(real_writes(cluster, graph.namespace, since, until)),
        compared_writes(Counter(written)),
    )
    graph.differences += [f"{graph.example.name}, {step}: {difference}" for difference in found]
    graph.records = {
        key: json.loads(child["metadata"]["annotations"][LAST_APPLIED_ANNOTATION]) for key, child in real.items()
    }


def settle(installed: Installed, moving: list[tuple[Graph, str]]) -> None:
    """Until each graph's status speaks of its spec in the state it expects, and then
    Metacontroller's syncs write nothing more in their namespaces."""
    cluster = installed.cluster
    eventually(
        lambda: all(settled(cluster, graph, state) for graph, state in moving),
        "every graph to settle",
        timeout=300,
    )
    namespaces = [graph.namespace for graph, _ in moving]
    eventually(lambda: quiet(installed, *namespaces), "the syncs to write nothing", 180)


@pytest.fixture
def graphs(installed: Installed) -> Iterator[list[Graph]]:
    """Every example in a namespace of its own, not yet created."""
    with contextlib.ExitStack() as stack:
        made = []
        for example in EXAMPLES:
            (idep,) = load_yaml(example)
            namespace = stack.enter_context(graph_namespace(installed.cluster, f"diff-{example.stem}"))
            made.append(Graph(example, namespace, idep["metadata"]["name"], steps_of(idep["spec"])))
        yield made


def test_the_simulator_takes_every_step_as_metacontroller_does(installed: Installed, graphs: list[Graph]) -> None:
    cluster = installed.cluster

    # 1. Create every example; each simulator starts from its graph as stored.
    since = len(cluster.audit_writes(METACONTROLLER_USER))
    for graph in graphs:
        applied = cluster.kubectl("apply", "-n", graph.namespace, "-f", str(graph.example))
        assert applied.returncode == 0, applied.stderr
    settle(installed, [(graph, "ready") for graph in graphs])
    for graph in graphs:
        graph.simulated = simulator_for(installed, get(cluster, "-n", graph.namespace, "idep", graph.name))
        compared_step(installed, graph, "create", since)

    # 2. Each graph's steps, the i-th of every graph at once.
    for index in range(max(len(graph.steps) for graph in graphs)):
        moving = [graph for graph in graphs if index < len(graph.steps)]
        since = len(cluster.audit_writes(METACONTROLLER_USER))
        for graph in moving:
            spec = get(cluster, "-n", graph.namespace, "idep", graph.name)["spec"]
            graph.steps[index].change(spec)
            replaced = cluster.kubectl(
                "patch", "-n", graph.namespace, "idep", graph.name, "--type=json",
                "-p", json.dumps([{"op": "replace", "path": "/spec", "value": spec}]),
            )  # fmt: skip
            assert replaced.returncode == 0, (graph.example.name, graph.steps[index].what, replaced.stderr)
        settle(installed, [(graph, graph.steps[index].state) for graph in moving])
        for graph in moving:
            stored = get(cluster, "-n", graph.namespace, "idep", graph.name)
            assert graph.simulated is not None
            graph.simulated.edit(replacing(stored["spec"]))
            assert graph.simulated.parent["metadata"]["generation"] == stored["metadata"]["generation"]
            compared_step(installed, graph, graph.steps[index].what, since)

    # 3. Delete every graph: the finalize hook's stages, their pods draining meanwhile.
    since = len(cluster.audit_writes(METACONTROLLER_USER))
    for graph in graphs:
        deleted = cluster.kubectl("delete", "-n", graph.namespace, "idep", graph.name, "--wait=false")
        assert deleted.returncode == 0, deleted.stderr
    eventually(
        lambda: all(not get(cluster, "-n", graph.namespace, "idep")["items"] for graph in graphs),
        "every graph to be gone",
        timeout=300,
    )
    for graph in graphs:
        simulated = graph.simulated
        assert simulated is not None
        start = len(simulated.writes)
        # Its own pods from here, which drain as its teardown deletes their workloads.
        simulated.pods = {}
        simulated.run_pods()
        while not simulated.finalized:
            assert len(simulated.writes) - start < 200, simulated.writes[start:]
            simulated.finalize()
            simulated.pods_finish_draining()
        written = [
            ("finalizer", *write[1:]) if write[0] == "finalized" else write for write in simulated.writes[start:]
        ]
        graph.differences += [
            f"{graph.example.name}, delete: {difference}"
            for difference in differences(
                "writes",
                compared_writes(real_writes(cluster, graph.namespace, since)),
                compared_writes(Counter(written)),
            )
        ]

    found = [difference for graph in graphs for difference in graph.differences]
    assert not found, f"{len(found)} differences, the first ones:\n" + "\n".join(found[:12])
