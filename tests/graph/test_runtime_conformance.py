"""Runtime conformance: every container the hook renders starts under the real Infera runtime.

Each container's command line, as kubelet starts it (downward API, `$(VAR)` expansion, the
LeaderWorkerSet variables), goes through its entry point's own parser from
../shared/upstream/runtime (tests/support/runtime.py), under its own environment. Then the start-up
decisions each `__main__` takes from the result must hold in the rendered graph:

- discovery: every process uses the spec's backend; a router has a selector (flag or
  INFERA_K8S_LABEL_SELECTOR) that selects the worker pods and may list and watch pods, a worker
  knows its Pod (POD_NAME) and may patch it; with etcd, everyone has the endpoint;
- a worker registers the address of its own pod (the Pod IP, never 0.0.0.0), and a PD worker
  passes the runtime's own disaggregation preflight in the role of its service;
- whoever uses NATS (request transport, or KV events) resolves the managed broker, which then
  exists; the KV-aware routers and the workers share one KV-event plane;
- every process listens where its Service, probe or InferencePool sends traffic, and the EPP
  sends the gateway to the pool's port; multi-node SGLang ranks know their group.
"""

import copy
import json
import shlex
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.graph.test_blue_green import SELECTOR_SETTINGS, WHOLE_GRAPH
from tests.support import kubelet, runtime
from tests.support.graphs import GraphBuilder, graph
from tests.support.prerequisites import REPO, need_upstream
from tests.support.requests import (
    PD,
    controller_for,
    load_yaml,
    parent,
    request_body,
    upstream_corpus,
    vllm_worker_args,
)

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
ROUTER_MODULES = (runtime.SERVER, runtime.EPP)
WORKER_MODULES = (runtime.SGLANG, runtime.VLLM)
GENERATION = "infera.amd.com/generation"
# Addresses a process can bind so that its probes, its Service and its peers reach it.
REACHABLE_BINDS = ("0.0.0.0", "::", "")


def process_argv(argv: list[str], env: dict[str, str]) -> tuple[str, list[str], dict[str, str]] | None:
    """The Infera module a container starts, its arguments and environment, as python3 receives
    them (after a wrapper such as infera-exec, or run by the real shell for `sh -c`)."""
    for started, started_env in kubelet.python_processes(argv, env):
        for index in range(len(started) - 1):
            if started[index] == "-m" and started[index + 1] in runtime.PARSERS:
                return started[index + 1], started[index + 2 :], started_env
    return None


@dataclass
class Started:
    """One Infera process of the graph, as its entry point parsed its command line."""

    pod: kubelet.Pod
    container: dict[str, Any]
    module: str
    argv: list[str]
    args: Any
    env: dict[str, str]

    @property
    def where(self) -> str:
        return f"{self.pod.owner} ({self.pod.facts.name}) container {self.container['name']}: {self.module}"

    @property
    def service(self) -> str:
        return self.pod.labels.get("infera.amd.com/service", "")

    @property
    def is_worker(self) -> bool:
        return self.module in WORKER_MODULES

    @property
    def listens_on(self) -> int:
        return (
            self.args.server_args.port
            if self.module == runtime.SGLANG
            else (self.args.grpc_port if self.module == runtime.EPP else self.args.port)
        )


class Graph:
    """The rendered graph of one InferaDeployment and the start-up checks over its processes."""

    def __init__(self, idep: dict[str, Any], children: list[dict[str, Any]]) -> None:
        self.idep, self.children = idep, children
        self.name, self.namespace = idep["metadata"]["name"], idep["metadata"]["namespace"]
        self.spec = idep["spec"]
        self.by_key = {(c["kind"], c["metadata"]["name"]): c for c in children}
        self.pods = kubelet.pods(children, self.namespace)
        self.problems: list[str] = []
        self.processes: list[Started] = []
        self.running: set[str] = set()  # pods with an Infera entry point, started or refused
        for pod in self.pods:
            for container in pod.spec["containers"] + pod.spec.get("initContainers", []):
                env = kubelet.container_env(container, pod.facts, pod.labels)
                found = process_argv(kubelet.container_argv(container, env), env)
                if found is None:
                    continue
                self.running.add(pod.facts.name)
                module, argv, started_env = found
                try:
                    parsed = runtime.parse(module, argv, started_env)
                except runtime.Refused as refused:
                    self.problems.append(f"{pod.owner} container {container['name']}: {refused}")
                    continue
                self.processes.append(Started(pod, container, module, argv, parsed, started_env))

    def fail(self, process: Started, problem: str) -> None:
        self.problems.append(f"{process.where}: {problem}")

    # --- what the graph provides -------------------------------------------------------------

    def verbs(self, account: str, group: str, resource: str, name: str | None = None) -> set[str]:
        """The verbs on `resource` (the object `name`, else any) that `account`'s RoleBindings
        grant in the namespace."""
        verbs: set[str] = set()
        for child in self.children:
            if (
                child["kind"] == "RoleBinding"
                and {"kind": "ServiceAccount", "name": account, "namespace": self.namespace} in child["subjects"]
            ):
                role = self.by_key.get(("Role", child["roleRef"]["name"]), {"rules": []})
                verbs |= {
                    v
                    for rule in role["rules"]
                    if resource in rule["resources"]
                    and group in rule["apiGroups"]
                    and (not rule.get("resourceNames") or name in rule["resourceNames"])
                    for v in rule["verbs"]
                }
        return verbs

    def managed_nats(self) -> str | None:
        name = f"{self.name}-nats"
        service = self.by_key.get(("Service", name))
        if ("StatefulSet", name) in self.by_key and service and 4222 in [p["port"] for p in service["spec"]["ports"]]:
            return f"nats://{name}:4222"
        return None

    def worker_pods(self, router: Started | None = None) -> list[kubelet.Pod]:
        """The worker pods; with a router under BlueGreen, those of its generation."""
        generation = router.pod.labels.get(GENERATION) if router and self.blue_green else None
        return [
            pod
            for pod in self.pods
            if pod.labels.get("infera.amd.com/component") == "worker"
            and (generation is None or pod.labels.get(GENERATION) == generation)
        ]

    def generation_selector(self, router: Started) -> dict[str, str]:
        return {"infera.amd.com/deployment": self.name, GENERATION: router.pod.labels.get(GENERATION, "")}

    def pool_port(self) -> int | None:
        """The target port of the InferencePool (one per generation under BlueGreen: the same port)."""
        ports = {c["spec"]["targetPorts"][0]["number"] for c in self.children if c["kind"] == "InferencePool"}
        return ports.pop() if len(ports) == 1 else None

    @property
    def blue_green(self) -> bool:
        return (self.spec.get("rollout") or {}).get("strategy") == "BlueGreen"

    # --- the checks ----------------------------------------------------------------------------

    def check(self) -> list[str]:
        workloads = [p for p in self.pods if p.labels.get("infera.amd.com/service") in self.spec["services"]]
        for pod in workloads:
            # Only the other ranks of a group may run something else (a Ray worker, say).
            if pod.facts.name not in self.running and pod.facts.lws.get("LWS_WORKER_INDEX", "0") == "0":
                self.problems.append(f"{pod.owner}: no container runs an Infera entry point")
        kv_planes = set()
        for process in self.processes:
            self.check_discovery(process)
            self.check_nats(process)
            self.check_ports(process)
            if process.is_worker:
                self.check_worker(process)
            if process.module in ROUTER_MODULES and process.args.router_policy == "kv-aware":
                kv_planes.add(process.args.kv_event_transport)
            if process.is_worker and process.args.enable_kv_events:
                kv_planes.add(process.args.kv_event_transport)
        if len(kv_planes) > 1:
            self.problems.append(f"routers and workers use different KV-event transports: {sorted(kv_planes)}")
        # Routers and workers must meet: the same etcd prefix, the same namespace to watch.
        for setting in ("etcd_prefix", "k8s_namespace"):
            values = {
                getattr(p.args, setting)
                for p in self.processes
                if p.args.discovery_backend == ("etcd" if setting == "etcd_prefix" else "kubernetes")
            }
            if len(values) > 1:
                self.problems.append(f"processes disagree on {setting}: {sorted(map(str, values))}")
        self.check_pod_ports()
        if (self.spec.get("gaie") or {}).get("enabled"):
            self.check_gateway()
        return self.problems

    def check_pod_ports(self) -> None:
        """No two listeners of one pod on one port (a sidecar shares the pod's network)."""
        for pod in self.pods:
            bound: dict[int, str] = {}
            for process in (p for p in self.processes if p.pod is pod):
                for port in listening_ports(process):
                    if port in bound:
                        self.fail(process, f"binds port {port}, which {bound[port]} binds too")
                    bound[port] = process.where

    def check_gateway(self) -> None:
        """One Endpoint Picker, and a frontend in every pod that serves a worker's API."""
        pickers = [p for p in self.processes if p.module == runtime.EPP]
        if len(pickers) != 1:
            self.problems.append(f"{len(pickers)} Endpoint Pickers run, not one")
        fronted = {
            p.pod.facts.name
            for p in self.processes
            if p.module == runtime.SERVER and p.pod.labels.get("infera.amd.com/component") == "worker"
        }
        for pod in self.worker_pods():
            if pod.facts.lws.get("LWS_WORKER_INDEX", "0") == "0" and pod.facts.name not in fronted:
                self.problems.append(f"{pod.owner} ({pod.facts.name}) serves a worker without a GAIE frontend")

    def check_discovery(self, process: Started) -> None:
        args, backend = process.args, self.spec.get("discoveryBackend", "kubernetes")
        if args.discovery_backend != backend:
            self.fail(process, f"discovers through {args.discovery_backend}, the graph through {backend}")
            return
        if backend == "etcd":
            if args.etcd_endpoint != self.spec["etcdEndpoint"]:
                self.fail(process, f"etcd endpoint {args.etcd_endpoint!r}, not {self.spec['etcdEndpoint']!r}")
            return
        account = process.pod.spec.get("serviceAccountName", "default")
        verbs = self.verbs(account, "", "pods")
        if process.is_worker:
            # K8sRegistrationClient patches the Pod named by POD_NAME in POD_NAMESPACE, and
            # nothing else (infera/common/registration_k8s.py).
            if process.env.get("POD_NAME") != process.pod.facts.name or "patch" not in verbs:
                self.fail(process, "cannot register: it needs POD_NAME and an account that may patch its Pod")
            return
        selector = dict(part.split("=", 1) for part in (args.k8s_label_selector or "").split(",") if "=" in part)
        if not selector:
            self.fail(process, "--discovery-backend=kubernetes without a label selector: exits at start-up")
        elif not all(selector.items() <= pod.labels.items() for pod in self.worker_pods(process)):
            self.fail(process, f"selector {args.k8s_label_selector!r} misses worker pods")
        elif self.blue_green and selector != self.generation_selector(process):
            # Under BlueGreen a router must see the workers of its own generation and no other.
            self.fail(process, f"selector {args.k8s_label_selector!r} is not its generation's")
        if not {"list", "watch"} <= verbs:
            self.fail(process, "its account may not list and watch pods")
        # The scaling API reads its own Pod for its InferaDeployment's name, then reads and
        # patches that InferaDeployment (infera/server/scaling.py).
        if getattr(args, "enable_scaling_api", False) and not (
            "get" in verbs and {"get", "patch"} <= self.verbs(account, "infera.amd.com", "inferadeployments", self.name)
        ):
            self.fail(process, "serves the scaling API, but its account may not read its Pod and patch its graph")

    def check_nats(self, process: Started) -> None:
        args = process.args
        uses = getattr(args, "request_transport", None) == "nats" or (
            args.kv_event_transport == "nats"
            and (not process.is_worker or args.enable_kv_events)
            and (process.is_worker or args.router_policy == "kv-aware")
        )
        if not uses:
            return
        nats_bus = runtime.load("infera.kv.nats_bus")
        with runtime.environment(process.env):
            url = nats_bus.resolve_nats_url(args.nats_server)
        # The graph's own broker where it is deployed; a broker of one's own named explicitly.
        own = url != nats_bus.DEFAULT_NATS_URL and not url.startswith(f"nats://{self.name}-nats:")
        if url != self.managed_nats() and not own:
            self.fail(process, f"uses NATS at {url}, but the graph's broker is {self.managed_nats()}")

    def check_worker(self, process: Started) -> None:
        args, pod = process.args, process.pod
        preflight = runtime.load("infera.common.disagg_preflight")
        role = self.spec["services"].get(process.service, {}).get("role", "mixed")
        bind = args.server_args.host if process.module == runtime.SGLANG else args.host
        if bind not in (*REACHABLE_BINDS, pod.facts.ip) and not (process.module == runtime.VLLM and bind is None):
            self.fail(process, f"binds {bind}: its probes, router and peers cannot reach it")
        if process.module == runtime.SGLANG:
            mode = args.server_args.disaggregation_mode or "null"
            running = "mixed" if mode == "null" else mode
            host = args.server_args.host
        else:
            running, host = args.disagg_mode.value, args.host
        if running != role:
            self.fail(process, f"registers as {running}, the service is {role}")
        is_disagg = running != "mixed"  # as both wrappers' main() decide it
        # Both wrappers' main(): under Kubernetes discovery the Pod IP is advertised.
        advertised = args.advertise_host
        if args.discovery_backend == "kubernetes" and not advertised:
            advertised = process.env.get("POD_IP")
        registered = advertised or host
        if registered != pod.facts.ip:
            self.fail(process, f"registers {registered!r}, not its Pod IP {pod.facts.ip}")
        try:
            preflight.validate_advertise_host(registered, is_disagg=is_disagg)
            if process.module == runtime.SGLANG:
                preflight.validate_sglang_transport(
                    getattr(args.server_args, "disaggregation_transfer_backend", None),
                    is_disagg=is_disagg,
                    allow_tcp=args.disaggregation_allow_tcp,
                )
            else:
                preflight.validate_vllm_transport(
                    args.disagg_meta, is_disagg=is_disagg, allow_tcp=args.disaggregation_allow_tcp
                )
        except preflight.DisaggPreflightError as error:
            self.fail(process, f"refused by the disaggregation preflight: {error}")
        lws = pod.facts.lws
        if lws and process.module == runtime.SGLANG:  # every rank must join its group
            server_args = args.server_args
            if (server_args.nnodes, server_args.node_rank) != (
                int(lws["LWS_GROUP_SIZE"]),
                int(lws["LWS_WORKER_INDEX"]),
            ):
                self.fail(
                    process,
                    f"rank {server_args.node_rank} of {server_args.nnodes}, not {lws['LWS_WORKER_INDEX']} of {lws['LWS_GROUP_SIZE']}",
                )
            if (server_args.dist_init_addr or "").rsplit(":", 1)[0] != lws["LWS_LEADER_ADDRESS"]:
                self.fail(process, f"rendezvous at {server_args.dist_init_addr}, not the group leader")

    def check_ports(self, process: Started) -> None:
        port, container = process.listens_on, process.container
        if port not in [p["containerPort"] for p in container.get("ports") or []]:
            self.fail(process, f"listens on {port}, which the container does not declare")
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            target = (container.get(probe) or {}).get("httpGet", {}).get("port")
            if target is not None and target != port:
                self.fail(process, f"its {probe} checks port {target}, it listens on {port}")
        component = process.pod.labels.get("infera.amd.com/component")
        if process.module == runtime.SERVER and component == "server":
            service = self.by_key[("Service", f"{self.name}-{process.service}")]
            if [p["targetPort"] for p in service["spec"]["ports"]] != [port]:
                self.fail(process, f"its Service sends traffic to {service['spec']['ports']}, it listens on {port}")
        if (
            process.module == runtime.SERVER
            and (self.spec.get("gaie") or {}).get("enabled")
            and process.args.router_mode != "direct"
        ):
            self.fail(process, "a router behind the Inference Gateway must trust the EPP's pick (--router-mode direct)")
        if process.module == runtime.SERVER and component == "worker" and port != self.pool_port():
            self.fail(process, f"the frontend listens on {port}, the InferencePool targets {self.pool_port()}")
        if process.module == runtime.EPP:
            if process.args.destination_port != self.pool_port():
                self.fail(
                    process,
                    f"sends the gateway to port {process.args.destination_port}, the pool is on {self.pool_port()}",
                )
            if container["readinessProbe"]["grpc"]["port"] != process.args.grpc_health_port:
                self.fail(
                    process, f"serves gRPC health on {process.args.grpc_health_port}, its probe checks another port"
                )


def listening_ports(process: Started) -> list[int]:
    """Every port the process binds in its pod, from what its entry point parsed."""
    args = process.args
    if process.module == runtime.EPP:
        return [args.grpc_port, args.grpc_health_port]
    if process.module != runtime.SGLANG:
        return [process.listens_on]
    ports = [process.listens_on]
    if args.kv_events != "off":  # the KV plane's ZMQ publisher and snapshot server
        ports += [int(args.kv_events_bind.rsplit(":", 1)[1]), args.kv_snapshot_port]
    if args.server_args.disaggregation_mode == "prefill":
        ports.append(args.server_args.disaggregation_bootstrap_port)
    if (args.server_args.nnodes or 1) > 1 and process.pod.facts.lws.get("LWS_WORKER_INDEX") == "0":
        ports.append(int(args.server_args.dist_init_addr.rsplit(":", 1)[1]))
    return ports


def rendered_graph(hooks, idep: dict[str, Any]) -> Graph:
    """The first sync's children; with a model cache, the graph once its download completed
    (the workers wait for it, so the first sync renders none)."""
    runtime.need_runtime()
    answer = hooks.hook("/sync", request_body(idep, composite=controller_for(idep)))
    assert answer["status"]["state"] == "initializing", answer["status"]["message"]
    downloads = [child for child in answer["children"] if child["kind"] == "Job"]
    if downloads:
        done = [{**job, "status": {"conditions": [{"type": "Complete", "status": "True"}]}} for job in downloads]
        answer = hooks.hook("/sync", request_body(idep, done, composite=controller_for(idep)))
        assert answer["status"]["modelCache"]["phase"] == "Ready", answer["status"]
    return Graph(idep, answer["children"])


def assert_starts(hooks, idep: dict[str, Any]) -> Graph:
    graph = rendered_graph(hooks, idep)
    assert graph.check() == []
    assert graph.processes, "no Infera process in the graph"
    return graph


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_every_example_starts(hooks, path) -> None:
    assert_starts(hooks, parent(path))


CORPUS = upstream_corpus()


@pytest.mark.parametrize("name", sorted({name for name, _ in CORPUS}) or ["(upstream corpus missing)"])
def test_every_upstream_corpus_file_starts(hooks, name: str) -> None:
    need_upstream()
    for file_name, doc in CORPUS:
        if file_name == name:
            assert_starts(hooks, parent(copy.deepcopy(doc)))


# --- the combinations the issue names, each proved -------------------------------------------


def pd(**spec: Any) -> GraphBuilder:
    """The PD graph with top-level `spec` fields set."""
    return graph().spec(**spec)


GAIE = {"enabled": True, "tokenizerPath": "Qwen/Qwen3-0.6B", "gatewayName": "gw"}


@pytest.mark.parametrize(
    "idep",
    [
        pd(discoveryBackend="etcd", etcdEndpoint="etcd.infra:2379").obj(),
        pd(nats={"deploy": False}).obj(),
        pd(discoveryBackend="etcd", etcdEndpoint="etcd:2379", nats={"deploy": False}).obj(),
        pd().vllm().obj(),
        pd(discoveryBackend="etcd", etcdEndpoint="etcd:2379", nats={"deploy": False}).vllm().obj(),
        pd(gaie={**GAIE, "frontendPort": 8123}).obj(),
        pd(
            gaie={**GAIE, "frontendPort": 9000}, nats={"deploy": False}, discoveryBackend="etcd", etcdEndpoint="e:1"
        ).obj(),
    ],
    ids=[
        "etcd",
        "nats-off",
        "etcd-nats-off",
        "vllm-pd",
        "vllm-pd-etcd-nats-off",
        "gaie-frontend-port",
        "gaie-etcd-nats-off",
    ],
)
def test_combination_starts(hooks, idep: dict[str, Any]) -> None:
    assert_starts(hooks, idep)


def scaling_api(how: str) -> dict[str, Any]:
    """The PD graph whose router serves the scaling API, enabled by its flag or its variable."""
    if how == "flag":
        return pd().add_args("server", "--enable-scaling-api").obj()
    return pd().env("server", {"name": "INFERA_ENABLE_SCALING_API", "value": "True"}).obj()


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_a_router_serving_the_scaling_api_may_read_and_patch_its_graph(hooks, how: str) -> None:
    graph = assert_starts(hooks, scaling_api(how))
    assert graph.verbs("qwen-pd-disc", "infera.amd.com", "inferadeployments", "qwen-pd") == {"get", "patch"}
    assert graph.verbs("qwen-pd-disc", "infera.amd.com", "inferadeployments", "other-graph") == set()
    assert graph.verbs("qwen-pd-register", "infera.amd.com", "inferadeployments", "qwen-pd") == set()


def test_no_account_may_touch_the_graph_without_the_scaling_api(hooks) -> None:
    graph = assert_starts(hooks, pd().obj())
    assert graph.verbs("qwen-pd-disc", "", "pods") == {"list", "watch"}
    assert graph.verbs("qwen-pd-register", "", "pods") == {"patch"}
    for account in ("qwen-pd-disc", "qwen-pd-register"):
        assert graph.verbs(account, "infera.amd.com", "inferadeployments", "qwen-pd") == set()


def test_the_checks_catch_a_scaling_api_without_its_permissions(hooks) -> None:
    def enable(container: dict[str, Any]) -> None:
        container["command"].append("--enable-scaling-api")

    problems = tampered(hooks, pd().obj(), "Deployment", "qwen-pd-server", enable)
    assert any("qwen-pd-server" in p and "serves the scaling API, but its account may not" in p for p in problems), (
        problems
    )


def test_multinode_sglang_behind_the_gateway_starts(hooks) -> None:
    obj = pd(gaie={**GAIE, "frontendPort": 8200}).nodes(decode=3).obj()
    graph = assert_starts(hooks, obj)
    ranks = sorted(p.pod.facts.name for p in graph.processes if p.service == "decode" and p.is_worker)
    assert ranks == ["qwen-pd-decode-0", "qwen-pd-decode-0-1", "qwen-pd-decode-0-2"]
    frontends = [p for p in graph.processes if p.service == "decode" and not p.is_worker]
    assert [p.pod.facts.name for p in frontends] == ["qwen-pd-decode-0"]  # only the leader joins the pool


# --- the checker finds what the issue found ----------------------------------------------------


def tampered(hooks, idep: dict[str, Any], kind: str, name: str, change) -> list[str]:
    """The problems of the rendered graph after `change(container)` on one child's primary."""
    graph = rendered_graph(hooks, idep)
    child = graph.by_key[(kind, name)]
    change(child["spec"]["template"]["spec"]["containers"][0])
    return Graph(idep, graph.children).check()


def replace_flags(old: list[str], new: list[str]):
    def change(container: dict[str, Any]) -> None:
        command = container["command"]
        at = next(i for i in range(len(command)) if command[i : i + len(old)] == old)
        command[at : at + len(old)] = new

    return change


@pytest.mark.parametrize(
    ("idep", "kind", "name", "old", "new", "problem"),
    [
        (
            pd().obj(),
            "Deployment",
            "qwen-pd-decode",
            ["--discovery-backend", "kubernetes"],
            ["--discovery-backend", "kubernetes", "--k8s-label-selector", "infera.amd.com/deployment=qwen-pd"],
            "unrecognized arguments: --k8s-label-selector",
        ),
        (
            pd(gaie=GAIE).obj(),
            "Deployment",
            "qwen-pd-epp",
            ["--router-tokenizer-path"],
            ["--tokenizer-path"],
            "the following arguments are required: --router-tokenizer-path",
        ),
        (
            pd(discoveryBackend="etcd", etcdEndpoint="e:1").obj(),
            "Deployment",
            "qwen-pd-server",
            ["--discovery-backend", "etcd"],
            [],
            "discovers through kubernetes, the graph through etcd",
        ),
        (
            pd(discoveryBackend="etcd", etcdEndpoint="e:1").obj(),
            "Deployment",
            "qwen-pd-decode",
            ["--advertise-host", "$(POD_IP)"],
            [],
            "registers '0.0.0.0', not its Pod IP",
        ),
        (
            pd(nats={"deploy": False}).obj(),
            "Deployment",
            "qwen-pd-prefill",
            ["--request-transport", "http", "--kv-event-transport", "zmq"],
            [],
            "uses NATS at nats://127.0.0.1:4222, but the graph's broker is None",
        ),
        (
            pd().vllm().obj(),
            "Deployment",
            "qwen-pd-decode",
            ["--discovery-backend", "kubernetes"],
            ["--discovery-backend", "kubernetes", "--disaggregation-mode", "decode"],
            "unrecognized arguments: --disaggregation-mode",
        ),
        (
            pd(gaie={**GAIE, "frontendPort": 8100}).obj(),
            "Deployment",
            "qwen-pd-epp",
            ["--destination-port", "8100"],
            [],
            "sends the gateway to port 8000, the pool is on 8100",
        ),
        (pd().obj(), "Deployment", "qwen-pd-decode", ["--host", "0.0.0.0"], [], "binds 127.0.0.1"),
        (
            pd().obj(),
            "Deployment",
            "qwen-pd-decode",
            ["--disaggregation-mode", "decode"],
            [],
            "registers as mixed, the service is decode",
        ),
    ],
    ids=[
        "worker-selector",
        "epp-tokenizer-flag",
        "etcd-without-backend",
        "etcd-without-advertise",
        "nats-off-untold",
        "vllm-disaggregation-mode",
        "epp-destination-port",
        "sglang-default-bind",
        "sglang-without-role",
    ],
)
def test_the_checks_catch_the_defects_the_issue_found(hooks, idep, kind, name, old, new, problem) -> None:
    problems = tampered(hooks, idep, kind, name, replace_flags(old, new))
    assert any(problem in found for found in problems), problems


def test_the_checks_catch_a_rank_outside_its_group(hooks) -> None:
    obj = pd().nodes(decode=2).obj()
    graph = rendered_graph(hooks, obj)
    group = graph.by_key[("LeaderWorkerSet", "qwen-pd-decode")]["spec"]["leaderWorkerTemplate"]
    command = group["workerTemplate"]["spec"]["containers"][0]["command"]
    del command[command.index("--nnodes") :]
    problems = Graph(obj, graph.children).check()
    assert any("qwen-pd-decode-0-1" in p and "rank 0 of None, not 1 of 2" in p for p in problems), problems


def test_the_checks_catch_missing_gateway_processes(hooks) -> None:
    graph = rendered_graph(hooks, pd(gaie=GAIE).obj())
    children = [c for c in graph.children if c["metadata"]["name"] != "qwen-pd-epp" or c["kind"] != "Deployment"]
    decode = next(c for c in children if c["metadata"]["name"] == "qwen-pd-decode")
    decode["spec"]["template"]["spec"]["containers"].pop()  # the frontend sidecar
    problems = Graph(graph.idep, children).check()
    assert "0 Endpoint Pickers run, not one" in problems, problems
    assert any("qwen-pd-decode" in p and "serves a worker without a GAIE frontend" in p for p in problems), problems


def test_the_checks_catch_a_worker_outside_the_selector(hooks) -> None:
    def relabel(container: dict[str, Any]) -> None:
        container["command"][container["command"].index("infera.amd.com/deployment=qwen-pd")] = "app=other"

    problems = tampered(hooks, pd().obj(), "Deployment", "qwen-pd-server", relabel)
    assert any("selector 'app=other' misses worker pods" in p for p in problems), problems


# --- generated graphs across every combination ------------------------------------------------

SGLANG_ARGS = st.lists(
    st.sampled_from(
        [
            ["--tp-size", "2"],
            ["--mem-fraction-static", "0.8"],
            ["--trust-remote-code"],
            ["--drain-timeout", "120"],
            ["--page-size", "16"],
        ]
    ),
    max_size=3,
)
VLLM_ARGS = st.lists(
    st.sampled_from(
        [
            ["--gpu-memory-utilization", "0.85"],
            ["--trust-remote-code"],
            ["--drain-timeout=90"],
            ["--max-model-len", "8192"],
            ["--enforce-eager"],
        ]
    ),
    max_size=3,
)
SERVER_ARGS = st.lists(
    st.sampled_from(
        [
            ["--router-policy", "round-robin"],
            ["--router-policy", "kv-aware"],
            ["--request-max-retries", "2"],
            ["--migration-limit", "1"],
            ["--enable-scaling-api"],
        ]
    ),
    max_size=2,
)
CONNECTORS = st.sampled_from(["MooncakeConnector", "NixlConnector", "MoRIIOConnector"])


def as_template(spec: dict[str, Any], service: dict[str, Any], wrapper: str) -> dict[str, Any]:
    """The service written as the upstream operator's users write it: a full extraPodSpec whose
    command says everything this graph needs (the operator injects nothing into it)."""
    worker = service["componentType"] == "worker"
    module = f"infera.engine.{spec['backendFramework']}" if worker else "infera.server"
    port = service.get("port", 30000 if worker else 8000)
    command = ["python3", "-m", module, "--host", "0.0.0.0", "--port", str(port), *service.pop("args")]
    if spec.get("discoveryBackend") == "etcd":
        command += ["--discovery-backend", "etcd", "--etcd-endpoint", spec["etcdEndpoint"]]
        command += ["--advertise-host", "$(POD_IP)" if wrapper != "sh" else "$POD_IP"] if worker else []
    if not spec["nats"]["deploy"]:
        command += ["--request-transport", "http", "--kv-event-transport", "zmq"]
    if worker and spec["backendFramework"] == "sglang":
        command += ["--disaggregation-mode", service["role"]] if service["role"] != "mixed" else []
        if service["numberOfNodes"] > 1:
            index, leader = (
                ("$(LWS_WORKER_INDEX)", "$(LWS_LEADER_ADDRESS)")
                if wrapper != "sh"
                else ("$LWS_WORKER_INDEX", "$LWS_LEADER_ADDRESS")
            )
            command += [
                "--nnodes",
                str(service["numberOfNodes"]),
                "--node-rank",
                index,
                "--dist-init-addr",
                f"{leader}:5000",
            ]
    if not worker and (spec.get("gaie") or {}).get("enabled"):
        command += ["--router-mode", "direct"]
    if wrapper == "infera-exec":
        command = ["/overlay/bin/infera-exec", *command]
    elif wrapper == "sh":
        # Quoted as people do: variables in double quotes, so the shell expands them.
        command = ["/bin/sh", "-c", "exec " + " ".join(f'"{w}"' if "$" in w else shlex.quote(w) for w in command)]
    service["extraPodSpec"] = {"containers": [{"name": "main", "image": "vendor/engine:v1", "command": command}]}
    return service


@st.composite
def graphs(draw: st.DrawFn) -> dict[str, Any]:
    backend = draw(st.sampled_from(["sglang", "vllm"]))
    spec: dict[str, Any] = {"image": "rocm/infera:v0.2.10", "backendFramework": backend, "services": {}}
    if draw(st.booleans()):
        spec |= {
            "discoveryBackend": "etcd",
            "etcdEndpoint": draw(st.sampled_from(["etcd:2379", "http://etcd.infra:2379"])),
        }
    spec["nats"] = {"deploy": draw(st.booleans())}
    ports = iter(draw(st.lists(st.integers(20000, 40000), min_size=4, max_size=4, unique=True)))
    roles = draw(st.sampled_from([["mixed"], ["prefill", "decode"], ["mixed", "prefill", "decode"]]))
    for role in roles:
        nodes = draw(st.integers(1, 3)) if backend == "sglang" else 1
        if backend == "sglang":
            args = ["--model-path", "Qwen/Qwen3-0.6B", *sum(draw(SGLANG_ARGS), [])]
            if role != "mixed":
                args += ["--disaggregation-transfer-backend", draw(st.sampled_from(["mori", "mooncake", "nixl"]))]
        else:
            args = [*vllm_worker_args("mixed"), *sum(draw(VLLM_ARGS), [])]
            if role != "mixed":
                kv_role = {"prefill": "kv_producer", "decode": "kv_consumer"}[role]
                args += ["--kv-transfer-config", json.dumps({"kv_connector": draw(CONNECTORS), "kv_role": kv_role})]
        service: dict[str, Any] = {
            "componentType": "worker",
            "role": role,
            "args": args,
            "numberOfNodes": nodes,
            "replicas": draw(st.integers(0, 3)),
        }
        if draw(st.booleans()):
            service["port"] = next(ports)
        spec["services"][role] = service
    gaie = draw(st.booleans())
    if gaie:
        spec["gaie"] = {**GAIE, "frontendPort": draw(st.sampled_from([8000, 8100, 9090]))}
    if not gaie or draw(st.booleans()):
        spec["services"]["router"] = {
            "componentType": "server",
            "port": next(ports),
            "args": ["--router-tokenizer-path", "Qwen/Qwen3-0.6B", *sum(draw(SERVER_ARGS), [])],
        }
    for service in spec["services"].values():
        wrapper = draw(st.sampled_from([None, "plain", "infera-exec", "sh"]))
        if wrapper:
            as_template(spec, service, wrapper)
    return parent(
        {"apiVersion": "infera.amd.com/v1alpha1", "kind": "InferaDeployment", "metadata": {"name": "gen"}, "spec": spec}
    )


@settings(max_examples=60)
@given(idep=graphs())
def test_generated_graphs_start(hooks, idep: dict[str, Any]) -> None:
    graph = rendered_graph(hooks, idep)
    assert graph.check() == []


# --- the hook refuses exactly what would not start or work -----------------------------------


def _drop(words: list[str], flag: str, values: int = 1) -> list[str]:
    at = words.index(flag)
    return words[:at] + words[at + 1 + values :]


# Edits of a template's command, as users write them: some equivalent spellings, some mistakes.
EDITS = {
    "port=": lambda w: _drop(w, "--port") + [f"--port={w[w.index('--port') + 1]}"],
    "no --host": lambda w: _drop(w, "--host"),
    "router flag": lambda w: w + ["--k8s-label-selector", "app=x"],
    "other port": lambda w: _drop(w, "--port") + ["--port", "31999"],
    "kv events zmq": lambda w: w + ["--kv-event-transport", "zmq"],
    "kv events nats": lambda w: w + ["--kv-event-transport", "nats"],
    "requests http": lambda w: w + ["--request-transport", "http"],
    "no discovery flag": lambda w: _drop(w, "--discovery-backend") if "--discovery-backend" in w else w,
    "no rendezvous": lambda w: (
        _drop(_drop(_drop(w, "--nnodes"), "--node-rank"), "--dist-init-addr") if "--nnodes" in w else w
    ),
    "no role": lambda w: _drop(w, "--disaggregation-mode") if "--disaggregation-mode" in w else w,
    "own broker": lambda w: w + ["--nats-server", "nats://nats.shared:4222"],
}


@st.composite
def edited_graphs(draw: st.DrawFn) -> dict[str, Any]:
    idep = draw(graphs())
    templated = [svc for svc in idep["spec"]["services"].values() if "extraPodSpec" in svc]
    if templated:
        container = draw(st.sampled_from(templated))["extraPodSpec"]["containers"][0]
        command = container["command"]
        shell = command[0] == "/bin/sh"
        words = shlex.split(command[2])[1:] if shell else command
        words = EDITS[draw(st.sampled_from(sorted(EDITS)))](words)
        container["command"] = (
            ["/bin/sh", "-c", "exec " + " ".join(f'"{w}"' if "$" in w else shlex.quote(w) for w in words)]
            if shell
            else words
        )
    return idep


@settings(max_examples=80)
@given(idep=edited_graphs())
def test_the_hook_refuses_exactly_what_would_not_start_or_work(hooks, idep: dict[str, Any]) -> None:
    """Over HTTP the hook accepts or refuses; the checker, running the runtime's parsers and the
    real shell on the same graph rendered without the hook's checks, must agree."""
    from hooks.api.graph import InferaDeployment
    from hooks.render import render_children

    runtime.need_runtime()
    status = hooks.hook("/sync", request_body(idep, composite=controller_for(idep)))["status"]
    problems = Graph(idep, render_children(InferaDeployment.from_parent(idep))).check()
    assert (status["state"] != "failed") == (problems == []), (status["message"], problems)


# --- BlueGreen: every router watches its own generation, and only the hook says so ------------


def as_blue_green(idep: dict[str, Any]) -> dict[str, Any]:
    return graph(source=idep).blue_green().obj()


def routers_on_their_generation(graph: Graph) -> None:
    routers = [process for process in graph.processes if process.module in ROUTER_MODULES]
    assert routers, "no router in the graph"
    for router in routers:
        generation = router.pod.labels[GENERATION]
        assert router.args.k8s_label_selector == f"infera.amd.com/deployment={graph.name},{GENERATION}={generation}"


KUBERNETES_EXAMPLES = [path for path in EXAMPLES if parent(path)["spec"].get("discoveryBackend") != "etcd"]


@pytest.mark.parametrize("path", KUBERNETES_EXAMPLES, ids=[path.name for path in KUBERNETES_EXAMPLES])
def test_every_example_under_blue_green_starts_with_its_routers_on_their_generation(hooks, path) -> None:
    routers_on_their_generation(assert_starts(hooks, as_blue_green(parent(path))))


@settings(max_examples=30)
@given(idep=graphs().filter(lambda idep: idep["spec"].get("discoveryBackend") != "etcd"))
def test_generated_graphs_under_blue_green_start_with_their_routers_on_their_generation(hooks, idep) -> None:
    """Templates of the upstream operator's kind (plain, infera-exec, sh -c) say no selector: the
    hook's variable gives each router its generation's."""
    graph = rendered_graph(hooks, as_blue_green(idep))
    assert graph.check() == []
    routers_on_their_generation(graph)


@pytest.mark.parametrize("case", SELECTOR_SETTINGS)
def test_each_way_a_spec_sets_the_selector_is_what_the_router_would_read(case: str) -> None:
    """The graph rendered without the hook's checks, under the runtime's parser (and the real
    shell): each setting the hook refuses under BlueGreen is read by the router, unless the hook's
    own flag wins over it; then the router watches the graph whole, every generation."""
    from hooks.api.graph import InferaDeployment
    from hooks.render import render_children

    runtime.need_runtime()
    idep = parent(as_blue_green(load_yaml(PD)[0]))
    setting = SELECTOR_SETTINGS[case]
    setting.change(idep["spec"])
    graph = Graph(idep, render_children(InferaDeployment.from_parent(idep).at_generation("g1")))
    (server,) = [process for process in graph.processes if process.module == runtime.SERVER]
    own = f"infera.amd.com/deployment=qwen-pd,{GENERATION}=g1"
    assert server.args.k8s_label_selector == (WHOLE_GRAPH if setting.read else own)
    broken = f"selector {WHOLE_GRAPH!r} is not its generation's"
    assert any(broken in problem for problem in graph.check()) == setting.read


@pytest.mark.parametrize("module", ROUTER_MODULES)
def test_the_routers_take_the_selector_flag_abbreviated_from_the_hooks_shortest_prefix(module: str) -> None:
    """argparse's allow_abbrev: the hook reads every prefix from SELECTOR_ABBREVIATION on as the
    flag, and the one shorter is ambiguous (--k8s-namespace)."""
    from hooks.runtime import SELECTOR_ABBREVIATION, SELECTOR_FLAG

    required = ["--router-tokenizer-path", "Qwen/Qwen3-0.6B"]
    for length in range(len(SELECTOR_ABBREVIATION), len(SELECTOR_FLAG) + 1):
        for argv in ([SELECTOR_FLAG[:length], "a=b"], [f"{SELECTOR_FLAG[:length]}=a=b"]):
            assert runtime.parse(module, required + argv, {}).k8s_label_selector == "a=b", argv
    with pytest.raises(runtime.Refused, match="ambiguous option"):
        runtime.parse(module, [*required, SELECTOR_ABBREVIATION[:-1], "a=b"], {})
