"""One run of the fleet benchmark: the loopback control plane with the bundle installed, the real
Metacontroller at the given settings, and the fleet taken through its phases, each measured."""

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.bench.cluster_fleet import fleet
from tests.bench.cluster_fleet.meter import Figures, Meter, tree_cpu_seconds
from tests.support.cluster import Cluster, accepted_status
from tests.support.localcluster import installed_hooks
from tests.support.metacontroller import running
from tests.support.prerequisites import need_schemas

IDEPS = "/apis/infera.amd.com/v1alpha1"
ROUTES = {"inferencepools": "/apis/inference.networking.k8s.io/v1", "httproutes": "/apis/gateway.networking.k8s.io/v1"}
# A phase that waits on Metacontroller is over once the hooks have had no call for this long.
QUIET_SECONDS = 15
# No phase may take longer: a fleet that does not converge says so instead of hanging.
PHASE_TIMEOUT = 3600
SHARE = 10  # one graph (or pod) in SHARE churns or changes
# Listing the whole fleet costs the API server too: not more often than this.
POLL_SECONDS = 5


def _parallel(step: Callable[[Any], Any], items: list[Any]) -> None:
    with ThreadPoolExecutor(8) as pool:
        for result in pool.map(step, items):
            if isinstance(result, httpx.Response):
                result.raise_for_status()


class Run:
    def __init__(self, cluster: Cluster, hook_log: Path, hook_pid: int, workdir: Path, graphs: int) -> None:
        self.cluster = cluster
        self.admin = cluster.admin(timeout=120)
        self.meter = Meter(self.admin, cluster.audit_log, hook_log, hook_pid, workdir / "metacontroller.log")
        self.hook_log = hook_log
        self.graphs = fleet.graphs(graphs)

    # What the fleet looks like now.

    def ideps(self) -> list[dict[str, Any]]:
        return self.admin.get(f"{IDEPS}/inferadeployments").raise_for_status().json()["items"]

    def accept_routes(self) -> None:
        """The Gateway controller's part: it accepts every InferencePool and HTTPRoute it has
        not accepted at its generation yet."""
        for resource, group in ROUTES.items():
            for item in self.admin.get(f"{group}/{resource}").raise_for_status().json()["items"]:
                generation = item["metadata"]["generation"]
                parents = item.get("status", {}).get("parents", [])
                if any(c.get("observedGeneration") == generation for p in parents for c in p.get("conditions", [])):
                    continue
                meta = item["metadata"]
                self.admin.patch(
                    f"{group}/namespaces/{meta['namespace']}/{resource}/{meta['name']}/status",
                    json={"status": accepted_status(resource, generation)},
                    headers={"Content-Type": "application/merge-patch+json"},
                ).raise_for_status()

    def wait_for(self, done: Callable[[list[dict[str, Any]]], bool], what: str) -> float:
        """Poll the fleet (accepting routes as a Gateway would) until it is `done`; when it
        first was (monotonic)."""
        deadline = time.monotonic() + PHASE_TIMEOUT
        while True:
            self.accept_routes()
            if done(self.ideps()):
                return time.monotonic()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the fleet was not {what} within {PHASE_TIMEOUT} s")
            time.sleep(POLL_SECONDS)

    def wait_quiet(self) -> float:
        """Until the hooks have had no call for QUIET_SECONDS; when the last call came."""
        last_size, last_change = self.hook_log.stat().st_size, time.monotonic()
        deadline = last_change + PHASE_TIMEOUT
        while time.monotonic() - last_change < QUIET_SECONDS:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the hooks were called without a pause of {QUIET_SECONDS} s for {PHASE_TIMEOUT} s")
            time.sleep(1)
            if (size := self.hook_log.stat().st_size) != last_size:
                last_size, last_change = size, time.monotonic()
        return last_change

    # The phases.

    def create(self) -> float:
        def post(graph: dict[str, Any]) -> httpx.Response:
            namespace = graph["metadata"]["namespace"]
            return self.admin.post(f"{IDEPS}/namespaces/{namespace}/inferadeployments", json=graph)

        _parallel(post, self.graphs)
        return self.wait_for(lambda items: len(items) == len(self.graphs) and all(map(synced, items)), "synced")

    def ready(self) -> float:
        self.wait_for(lambda items: all(map(ready, items)), "Ready")
        return self.wait_quiet()

    def pods(self) -> list[dict[str, Any]]:
        pods = self.admin.get("/api/v1/pods").raise_for_status().json()["items"]
        return sorted(
            (pod for pod in pods if pod["metadata"]["namespace"].startswith("fleet-")),
            key=lambda pod: (pod["metadata"]["namespace"], pod["metadata"]["name"]),
        )

    def set_ready(self, pods: list[dict[str, Any]], status: str) -> None:
        conditions = [{"type": kind, "status": status} for kind in ("Ready", "ContainersReady")]

        def patch(pod: dict[str, Any]) -> httpx.Response:
            meta = pod["metadata"]
            return self.admin.patch(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                json={"status": {"conditions": conditions}},
                headers={"Content-Type": "application/strategic-merge-patch+json"},
            )

        _parallel(patch, pods)

    def churn(self) -> float:
        """One pod in SHARE turns unready and, once the hooks are quiet, ready again."""
        churned = self.pods()[::SHARE]
        self.set_ready(churned, "False")
        self.wait_quiet()
        self.set_ready(churned, "True")
        self.wait_for(lambda items: all(map(ready, items)), "Ready")
        return self.wait_quiet()

    def change(self) -> float:
        """One graph in SHARE gets a new variable in every service (a new template everywhere)."""
        changed = self.graphs[::SHARE]

        def patch(graph: dict[str, Any]) -> httpx.Response:
            meta = graph["metadata"]
            return self.admin.patch(
                f"{IDEPS}/namespaces/{meta['namespace']}/inferadeployments/{meta['name']}",
                json={"spec": {"envs": [{"name": "FLEET_BENCHMARK_CHANGE", "value": "1"}]}},
                headers={"Content-Type": "application/merge-patch+json"},
            )

        _parallel(patch, changed)
        self.wait_for(lambda items: all(synced(i) and ready(i) for i in items), "changed and Ready")
        return self.wait_quiet()

    def delete(self) -> float:
        def remove(graph: dict[str, Any]) -> httpx.Response:
            meta = graph["metadata"]
            return self.admin.delete(f"{IDEPS}/namespaces/{meta['namespace']}/inferadeployments/{meta['name']}")

        _parallel(remove, self.graphs)
        return self.wait_for(lambda items: not items, "deleted")


def synced(item: dict[str, Any]) -> bool:
    return item.get("status", {}).get("observedGeneration") == item["metadata"]["generation"]


def ready(item: dict[str, Any]) -> bool:
    conditions = item.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@contextmanager
def _installed(workdir: Path, graphs: int) -> Iterator[tuple[Cluster, Any, list[dict[str, Any]]]]:
    with installed_hooks(workdir, need_schemas()) as (cluster, hooks, manifests):
        documents = [
            *({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}} for name in fleet.namespaces()),
            *fleet.nodes(graphs),
            *fleet.volumes(graphs),
        ]
        cluster.apply(*documents)
        yield cluster, hooks, manifests


def run(workdir: Path, graphs: int, settings: dict[str, int], flush_seconds: int) -> list[Figures]:
    """Every phase's figures for `graphs` graphs under Metacontroller with `settings`."""
    arguments = [f"--{flag}={value}" for flag, value in settings.items()]
    # Metacontroller resyncs every parent and child at this interval (its informers' resync).
    arguments.append(f"--cache-flush-interval={flush_seconds}s")
    figures = []
    with _installed(workdir, graphs) as (cluster, hooks, manifests), ExitStack() as metacontroller:
        bench = Run(cluster, hooks.log, hooks.process.pid, workdir, graphs)
        meter = bench.meter
        process = metacontroller.enter_context(running(cluster, manifests, workdir, arguments)).process
        time.sleep(5)  # its informers list and it registers the CompositeController
        steps: list[tuple[str, Callable[[], float | None]]] = [
            ("create", bench.create),
            ("ready", bench.ready),
            ("steady", lambda: time.sleep(2 * flush_seconds + QUIET_SECONDS)),
            ("restart", None),  # below: it replaces the process
            ("pod churn", bench.churn),
            ("spec change", bench.change),
            ("delete", bench.delete),
        ]
        for name, step in steps:
            print(f"  {time.strftime('%H:%M:%S')} {name}", flush=True)
            meter.start(process.pid)
            if step is None:
                spent = tree_cpu_seconds(process.pid)
                metacontroller.close()
                process = metacontroller.enter_context(running(cluster, manifests, workdir, arguments)).process
                meter.restarted(process.pid, spent)
                ended = bench.wait_quiet()
            else:
                ended = step()
            figures.append(meter.stop(name, ended))
    return figures
