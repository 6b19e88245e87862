"""BlueGreen on the data plane: two generations of a prefill/decode graph serving at once, and
the front door moving from one to the other under a stream of chat completions.

The test process drives the hook through the simulated Metacontroller (tests/support/simulator.py)
from a graph serving generation A to a changed spec: the sync that answers generation B beside A
(kept as applied), the one that moves the server Service's selector to B, and the one that
leaves A out (its workloads deleted). The sandbox then runs every pod of that middle answer, both
generations at once, and the scenario (`serves_across_the_switch`) plays the rest as the
answers say: the server Service is a ClusterIP on the node whose new connections go to the
server pod its selector selects, first A's, then, mid-stream, B's; then A's pods stop as
kubelet stops the pods of a deleted workload.

The two generations differ by STANDIN_VERSION, which the stand-in engine records with every
request and says in every reply: which generation served each leg of each request is read
from the engines themselves.
"""

import copy
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hooks.vocabulary import GENERATION_LABEL
from tests.support.e2e import sandbox
from tests.support.e2e.graphs import server, worker
from tests.support.e2e.sandbox import NODE_IP, Cluster, Pod, serve_relay, wait_until
from tests.support.e2e.scenarios import (
    WORKER_INFO,
    chat,
    engine_requests,
    registered,
    start,
    stream_chat,
    worker_port,
)
from tests.support.prerequisites import SHARED
from tests.support.service import HookClient
from tests.support.simulator import Metacontroller

NAME = "e2e"
SCENARIO = "blue_green:serves_across_the_switch"
VERSION_ENV = "STANDIN_VERSION"
WORKERS = ("prefill", "decode")
# The selector every router of a generation watches workers with (docs/rollouts.md).
ROUTER_SELECTOR = "infera.amd.com/deployment={name},infera.amd.com/generation={generation}"
# The reply's identity, which the stand-in ends the decode's last token with.
IDENTITY = re.compile(r"\[decode pod=(?P<pod>\S+) port=\d+ room=(?P<room>\d+) version=(?P<version>\S+)\]")
# How many requests the stream completes in each phase: before the switch, after it, and once
# the old generation is gone.
PER_PHASE = 8
CLIENTS = 2
MAX_TOKENS = 4
SCENARIO_TIMEOUT = 240


def spec(model: Path, version: str) -> dict[str, Any]:
    """A router, a prefill and a decode pool under BlueGreen, whose engines are build `version`."""
    env = [{"name": VERSION_ENV, "value": version}]
    return {
        "image": "rocm/infera:v0.2.10",
        "rollout": {"strategy": "BlueGreen"},
        "services": {
            "server": server(model),
            "prefill": {**worker(model, "prefill"), "env": env},
            "decode": {**worker(model, "decode"), "env": env},
        },
    }


def set_version(version: str) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        for service in WORKERS:
            spec["services"][service]["env"] = [{"name": VERSION_ENV, "value": version}]

    return change


def workloads(children: list[dict[str, Any]], generation: str) -> list[str]:
    return sorted(
        child["metadata"]["name"]
        for child in children
        if child["kind"] == "Deployment" and child["metadata"]["labels"].get(GENERATION_LABEL) == generation
    )


def front_door(children: list[dict[str, Any]]) -> dict[str, Any]:
    (service,) = [c for c in children if c["kind"] == "Service" and c["metadata"]["name"] == f"{NAME}-server"]
    return service


def roll_out(hooks: HookClient, model: Path, old: str, new: str) -> dict[str, Any]:
    """Drive the hook from a graph serving engines `old` to a spec of engines `new`, asserting
    each sync's writes; return the answers the sandbox plays: the children of both generations
    (the Progressing answer), the server Service once switched, the workloads then deleted."""
    doc = {"apiVersion": "infera.amd.com/v1alpha1", "kind": "InferaDeployment", "metadata": {"name": NAME}}
    mc = Metacontroller(hooks, {**doc, "spec": spec(model, old)})
    for _ in range(2):
        mc.converge()
        mc.mark_ready()
    assert mc.parent["status"]["state"] == "ready", mc.parent["status"]
    a = mc.parent["status"]["rollout"]["servingGeneration"]
    assert mc.parent["status"]["rollout"]["phase"] == "Stable", mc.parent["status"]["rollout"]

    mc.edit(set_version(new))
    writes = mc.child_writes(mc.sync())
    rollout = mc.parent["status"]["rollout"]
    b = rollout["incomingGeneration"]
    assert (rollout["phase"], rollout["servingGeneration"]) == ("Progressing", a) and b != a, rollout
    names = [f"{NAME}-{s}-{b}" for s in ("decode", "prefill", "server")]
    assert writes == [("create", "Deployment", name) for name in names], writes
    both = copy.deepcopy(mc.last_answer["children"])
    progressing = copy.deepcopy(mc.parent)  # the changed spec, as the sandbox's pods see it
    assert workloads(both, a) == [f"{NAME}-{s}-{a}" for s in ("decode", "prefill", "server")]
    assert workloads(both, b) == names
    assert front_door(both)["spec"]["selector"][GENERATION_LABEL] == a

    mc.mark_ready()  # B's pools ready: in the sandbox, every pod is ready before the switch
    assert mc.child_writes(mc.sync()) == [("update", "Service", f"{NAME}-server")]
    assert mc.parent["status"]["rollout"]["phase"] == "Switching", mc.parent["status"]["rollout"]
    switched = copy.deepcopy(front_door(mc.last_answer["children"]))
    assert switched["spec"]["selector"][GENERATION_LABEL] == b

    writes = mc.child_writes(mc.sync())
    assert mc.parent["status"]["rollout"]["phase"] == "Draining", mc.parent["status"]["rollout"]
    deleted = [name for verb, kind, name in writes if verb == "delete" and kind == "Deployment"]
    assert writes == [("delete", "Deployment", name) for name in workloads(both, a)], writes
    return {
        "idep": progressing,
        "children": both,
        "blue_green": {
            "generations": {a: old, b: new},
            "old": a,
            "new": b,
            "switched": switched,
            "deleted": deleted,
        },
    }


def run(hooks: HookClient, workdir: Path, model: Path, old: str = "blue", new: str = "green") -> str:
    """The rollout through the hook, then its pods in the sandbox; the scenario's output."""
    graph = roll_out(hooks, model, old, new)
    (workdir / "graph.json").write_text(json.dumps({**graph, "scenario": SCENARIO, "shared": str(SHARED.resolve())}))
    result = sandbox.run(workdir, timeout=SCENARIO_TIMEOUT, env=dict(os.environ))
    # The scenario's traceback first: the processes' logs after it may be long.
    failure = result.stdout[result.stdout.find("Traceback") :][:5000] if "Traceback" in result.stdout else ""
    assert result.returncode == 0, f"{failure}\n...\n{result.stdout[-15000:]}\n{result.stderr[-5000:]}"
    return result.stdout


# --- in the sandbox ---------------------------------------------------------------------------


def selected(cluster: Cluster, service: dict[str, Any]) -> Pod:
    """The one pod a Service's selector selects."""
    selector = service["spec"]["selector"]
    (pod,) = [p for p in cluster.pods.values() if selector.items() <= p.labels.items()]
    return pod


def of_generation(cluster: Cluster, generation: str, service: str) -> Pod:
    (pod,) = [
        p
        for p in cluster.pods.values()
        if p.labels.get(GENERATION_LABEL) == generation and p.labels.get("infera.amd.com/service") == service
    ]
    return pod


def worker_of(pod: Pod, generation: str) -> bool:
    return pod.labels.get(GENERATION_LABEL) == generation and pod.labels.get("infera.amd.com/service") in WORKERS


def worker_url(pod: Pod) -> str:
    return f"http://{pod.ip}:{worker_port(pod)}"


class FrontDoor:
    """A Service's ClusterIP on the node: each new connection goes to the pod the Service's
    selector selects at that moment, as kube-proxy does; a connection open at a switch stays
    with its pod."""

    def __init__(self, cluster: Cluster, service: dict[str, Any]) -> None:
        self.cluster = cluster
        self.port = service["spec"]["ports"][0]["port"]
        self.backend = selected(cluster, service)
        self.stop = serve_relay(socket.create_server((NODE_IP, self.port)), self.connect)

    @property
    def url(self) -> str:
        return f"http://{NODE_IP}:{self.port}"

    def connect(self) -> socket.socket:
        return socket.create_connection((self.backend.ip, self.port), timeout=10)

    def switch(self, service: dict[str, Any]) -> None:
        """The Service updated in place: same address, another selector."""
        self.backend = selected(self.cluster, service)


class Stream(threading.Thread):
    """A client sending chat completions through the front door one after another, unary and
    streamed in turn, until told to stop; every outcome is kept."""

    def __init__(self, cluster: Cluster, door: FrontDoor, number: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.cluster, self.door, self.number, self.stopping = cluster, door, number, stop
        self.outcomes: list[dict[str, Any]] = []

    def run(self) -> None:
        while not self.stopping.is_set():
            streamed = len(self.outcomes) % 2 == 1
            outcome: dict[str, Any] = {"client": self.number, "stream": streamed, "sent": time.monotonic()}
            try:
                if streamed:
                    deltas, done = stream_chat(
                        self.cluster, "hello world", timeout=30, url=self.door.url, max_tokens=MAX_TOKENS
                    )
                    outcome |= {"text": "".join(deltas), "done": done}
                else:
                    reply = chat(self.cluster, "hello world", url=self.door.url, max_tokens=MAX_TOKENS)
                    outcome |= {"text": reply["choices"][0]["message"]["content"], "done": True}
            except Exception as error:  # noqa: BLE001 - every failure is asserted on
                outcome["error"] = repr(error)
            outcome["answered"] = time.monotonic()
            self.outcomes.append(outcome)


def assert_routers_apart(cluster: Cluster, plan: dict[str, Any]) -> None:
    """Each generation's router registered exactly its own generation's workers, with every
    worker of both generations registered (its Pod's annotation written), and asked the API
    server for pods with its own generation's selector only."""
    workers = [of_generation(cluster, g, s) for g in plan["generations"] for s in WORKERS]
    wait_until(
        "every worker of both generations to register",
        lambda: all(
            WORKER_INFO in (cluster.kube.pod(cluster.namespace, w.name)["metadata"].get("annotations") or {})
            for w in workers
        ),
        30,
    )
    for generation in plan["generations"]:
        router = of_generation(cluster, generation, "server")
        own = sorted(worker_url(of_generation(cluster, generation, s)) for s in WORKERS)
        url = f"http://{router.ip}:{cluster.by_key[('Service', f'{NAME}-server')]['spec']['ports'][0]['port']}"
        wait_until(
            f"the router of generation {generation} to register its workers",
            lambda url=url, own=own: (
                sorted(w["url"] for w in registered(cluster, url) if w["status"] == "active") == own
            ),
            30,
        )
        # Now that every worker of both generations is registered: its own, and nothing else.
        seen = sorted(w["url"] for w in registered(cluster, url))
        assert seen == own, (generation, seen, own)
        asked = {
            call.query.get("labelSelector")
            for call in cluster.kube.events
            if call.client == router.ip and call.path.endswith("/pods")
        }
        assert asked == {ROUTER_SELECTOR.format(name=NAME, generation=generation)}, (generation, asked)
        print(f"the router of generation {generation} registered {seen} only")


def until_answered(streams: list[Stream], what: str, count: int, since: float) -> None:
    wait_until(
        f"{count} requests {what}",
        lambda: sum(1 for s in streams for o in list(s.outcomes) if o["sent"] > since) >= count,
        60,
    )


def serves_across_the_switch(cluster: Cluster) -> None:
    """Both generations serve at once, each router seeing only its own workers; a stream of
    chat completions through the front door across its switch from A to B, and across the
    removal of A, never fails, and each request's prefill and decode are of one generation:
    A's before the switch, B's after it."""
    plan = json.loads((cluster.workdir / "graph.json").read_text())["blue_green"]
    old, new, versions = plan["old"], plan["new"], plan["generations"]
    start(cluster)
    assert sorted({p.labels.get(GENERATION_LABEL) for p in cluster.pods.values()} - {None}) == sorted(versions)
    assert_routers_apart(cluster, plan)

    door = FrontDoor(cluster, cluster.by_key[("Service", f"{NAME}-server")])
    assert door.backend is of_generation(cluster, old, "server")
    stop = threading.Event()
    streams = [Stream(cluster, door, number, stop) for number in range(CLIENTS)]
    began = time.monotonic()
    for stream in streams:
        stream.start()
    try:
        until_answered(streams, "before the switch", PER_PHASE, began)
        switched_at = time.monotonic()
        door.switch(plan["switched"])
        assert door.backend is of_generation(cluster, new, "server")
        until_answered(streams, "after the switch", PER_PHASE, switched_at)
        wait_until(
            "the requests sent before the switch to be answered",
            lambda: all(len(s.outcomes) > 0 and s.outcomes[-1]["sent"] > switched_at for s in streams),
            30,
        )
        # What the old generation's engines served, read while they still answer.
        records = {p.name: engine_requests(p) for p in cluster.pods.values() if worker_of(p, old)}
        # Draining: the old generation's workloads are deleted, and kubelet stops their pods.
        gone = [p for p in cluster.pods.values() if p.pod.owner.split("/", 1)[1] in plan["deleted"]]
        assert sorted(p.labels[GENERATION_LABEL] for p in gone) == [old] * 3, [p.name for p in gone]
        stopping = [threading.Thread(target=cluster.stop_pod, args=(p,)) for p in gone]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join(timeout=120)
        assert all(p.stopped_in is not None for p in gone), [(p.name, p.stopped_in) for p in gone]
        drained_at = time.monotonic()
        until_answered(streams, "once the old generation is gone", PER_PHASE, drained_at)
    finally:
        stop.set()
        for stream in streams:
            stream.join(timeout=60)
        door.stop()

    outcomes = sorted((o for s in streams for o in s.outcomes), key=lambda o: o["sent"])
    failed = [o for o in outcomes if "error" in o or not o["done"]]
    assert failed == [], failed
    served = {p.name: p for p in cluster.pods.values()}
    records |= {p.name: engine_requests(p) for p in served.values() if worker_of(p, new)}
    by_room: dict[int, list[dict[str, Any]]] = {}
    for pod_name, pod_records in records.items():
        for record in pod_records:
            by_room.setdefault(record["bootstrap_room"], []).append({**record, "pod": pod_name})
    generation_of_version = {version: generation for generation, version in versions.items()}
    counts = {old: 0, new: 0}
    for outcome in outcomes:
        identity = IDENTITY.search(outcome["text"])
        assert identity is not None, outcome
        generation = generation_of_version[identity["version"]]
        # One prefill and one decode leg, both of the generation whose engine answered.
        legs = sorted(by_room.get(int(identity["room"]), []), key=lambda r: r["role"])
        assert [(r["role"], r["version"], served[r["pod"]].labels[GENERATION_LABEL]) for r in legs] == [
            ("decode", versions[generation], generation),
            ("prefill", versions[generation], generation),
        ], (outcome, legs)
        assert legs[0]["pod"] == identity["pod"] and all(r["outcome"] == "ok" for r in legs), legs
        # The old generation before the switch, the new one after it.
        if outcome["answered"] < switched_at:
            assert generation == old, outcome
        if outcome["sent"] > switched_at:
            assert generation == new, outcome
        counts[generation] += 1
    # Every leg any engine served belongs to one of the stream's requests: none was retried
    # elsewhere, none crossed generations.
    assert sum(len(r) for r in records.values()) == 2 * len(outcomes), {k: len(r) for k, r in records.items()}
    assert counts[old] >= PER_PHASE and counts[new] >= 2 * PER_PHASE, counts
    print(f"{len(outcomes)} requests across the switch, none failed: by generation {counts}")
