"""NetworkPolicies: who may connect to the graph's pods, and on which ports.

Ingress only: the processes call the API server, etcd, the model hub and one another, and
egress rules would have to name addresses the hook cannot know. Every policy names its ports by
number, with the protocol written out, as the API server stores them. A network plugin that does
not enforce NetworkPolicies ignores them, so the broker's is rendered by default (but where a
service runs on its node's network, whose traffic a policy cannot tell from the node's).

- `broker` (the default): the NATS broker admits only the graph's own pods to its client port.
  With the NATS request transport every prompt crosses it; open, any pod of the cluster could
  subscribe to `>` and read them, or publish forged requests and KV events.
- `graph`: besides, each service's pods admit only what the runtime's traffic needs (docs/
  security.md has the table): a worker, the graph's workers on every port (the engines' KV
  transfer and collectives bind ports the kernel picks) and the graph's routers on the ports
  they call; a server, `serverFrom`; the Endpoint Picker and the frontend sidecars, `gatewayFrom`.
"""

from typing import Any

from hooks import runtime
from hooks.api.fields import primary_index
from hooks.api.graph import InferaDeployment
from hooks.api.network import NetworkPolicyPeer
from hooks.api.services import ServiceSpec
from hooks.observed import pod_templates
from hooks.renderers import nats
from hooks.vocabulary import (
    COMPONENT_LABEL,
    DEPLOYMENT_LABEL,
    EPP_SUFFIX,
    NATS_SUFFIX,
    SERVICE_LABEL,
    object_metadata,
    selector_labels,
)

# Linux's default for a new network namespace (net.ipv4.ip_local_port_range), which a pod has
# unless its securityContext sets the sysctl.
EPHEMERAL_PORTS = (32768, 60999)
EPHEMERAL_SYSCTL = "net.ipv4.ip_local_port_range"
# The lowest port an unprivileged process binds; the SGLang wrapper's port blocks start there.
FIRST_UNPRIVILEGED_PORT = 1024
SGLANG_DP_FLAGS = ("--dp-size", "--data-parallel-size")

Port = tuple[int, int | None]  # a port, or the first and last of a range


def _ports(ports: list[Port]) -> list[dict[str, Any]]:
    rendered = []
    for port, end in sorted(set(ports), key=lambda entry: (entry[0], entry[1] or entry[0])):
        entry: dict[str, Any] = {"port": port, "protocol": "TCP"}
        if end is not None:
            entry["endPort"] = end
        rendered.append(entry)
    return rendered


def _peers(peers: list[NetworkPolicyPeer]) -> list[dict[str, Any]]:
    return [peer.model_dump(by_alias=True, exclude_none=True) for peer in peers]


def _graph_pods(idep: InferaDeployment, **labels: str) -> dict[str, Any]:
    """The graph's own pods in its namespace (with `labels` too)."""
    return {"podSelector": {"matchLabels": {DEPLOYMENT_LABEL: idep.name, **labels}}}


def _policy(idep: InferaDeployment, service: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    """The policy of a service's pods (or a plumbing part's), named as its workload."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": nats.broker_metadata(idep) if service == NATS_SUFFIX else object_metadata(idep, service),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(idep, service)},
            "policyTypes": ["Ingress"],
            # No rule admits nothing: a pod of the policy with no rule is closed.
            "ingress": rules,
        },
    }


def _rule(ports: list[Port], peers: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Admits `peers` (None: any source) to `ports` (empty: every port)."""
    rule: dict[str, Any] = {}
    if peers is not None:
        rule["from"] = peers
    if ports:
        rule["ports"] = _ports(ports)
    return rule


def _metrics_rule(idep: InferaDeployment, ports: list[Port]) -> list[dict[str, Any]]:
    metrics_from = idep.spec.network_policy.metrics_from
    return [] if metrics_from is None else [_rule(ports, _peers(metrics_from))]


def broker_policy(idep: InferaDeployment) -> dict[str, Any]:
    """The graph's pods to the client port; the monitoring port (and the exporter's) only to
    metricsFrom (kubelet's probes come from the node, which a NetworkPolicy never stops)."""
    rules = [_rule([(runtime.NATS_CLIENT_PORT, None)], [_graph_pods(idep)])]
    metrics: list[Port] = [(nats.MONITOR_PORT, None)]
    if nats.nats_exporter(idep):
        metrics.append((nats.EXPORTER_PORT, None))
    return _policy(idep, NATS_SUFFIX, rules + _metrics_rule(idep, metrics))


def _gateway_peers(idep: InferaDeployment) -> list[dict[str, Any]]:
    """gatewayFrom, else every pod of the Gateway's namespace (its proxies run there)."""
    if idep.spec.network_policy.gateway_from is not None:
        return _peers(idep.spec.network_policy.gateway_from)
    namespace = idep.spec.gaie.gateway_namespace or idep.metadata.namespace
    return [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}]


def epp_policy(idep: InferaDeployment) -> dict[str, Any]:
    """The gateway to the ext-proc port; its health port is kubelet's."""
    return _policy(idep, EPP_SUFFIX, [_rule([(runtime.EPP_GRPC_PORT, None)], _gateway_peers(idep))])


def server_policy(idep: InferaDeployment, service: str, svc: ServiceSpec) -> dict[str, Any]:
    """serverFrom (or anyone) to the server's port; nothing in the graph calls a server."""
    port: list[Port] = [(svc.effective_port, None)]
    server_from = idep.spec.network_policy.server_from
    # Open to anyone, the port needs no rule for metricsFrom.
    rules = (
        [_rule(port, None)] if server_from is None else [_rule(port, _peers(server_from))] + _metrics_rule(idep, port)
    )
    return _policy(idep, service, rules)


def ephemeral_ports(pod_spec: dict[str, Any]) -> tuple[int, int]:
    """The range the kernel picks a pod's unbound ports from: its sysctl, else Linux's default."""
    for sysctl in (pod_spec.get("securityContext") or {}).get("sysctls") or []:
        if sysctl.get("name") == EPHEMERAL_SYSCTL:
            words = str(sysctl.get("value", "")).split()
            if len(words) == 2 and all(word.isdigit() for word in words) and 0 < int(words[0]) <= int(words[1]) < 65536:
                return int(words[0]), int(words[1])
    return EPHEMERAL_PORTS


def _sglang_port(entry: runtime.EntryPoint, flag: str) -> int:
    """A port the SGLang wrapper binds, from its flag (an address's port) or the flag's default."""
    value = (entry.known(flag) or "").rsplit(":", 1)[-1]
    return int(value) if value.isdigit() else runtime.SGLANG_POD_PORTS[flag]


def _publisher_ports(entry: runtime.EntryPoint, pod_spec: dict[str, Any]) -> list[Port]:
    """The engine's own KV-event publisher: the wrapper has the kernel pick its port from the
    pod's ephemeral range, or, for SGLang's DP ranks, a block below it."""
    low, high = ephemeral_ports(pod_spec)
    ports: list[Port] = [(low, high)]
    dp = next(filter(None, map(entry.known, SGLANG_DP_FLAGS)), "")
    if entry.module == runtime.SGLANG and dp.isdigit() and int(dp) > 1 and low > FIRST_UNPRIVILEGED_PORT:
        ports.append((FIRST_UNPRIVILEGED_PORT, low - 1))
    return ports


def router_ports(svc: ServiceSpec, pod_spec: dict[str, Any]) -> tuple[list[Port], list[Port]]:
    """The ports of a worker pod that the servers call, and those the Endpoint Picker calls.

    A server calls the engine's HTTP port, and subscribes to the SGLang wrapper's KV-event
    publisher; with KV events over ZMQ it also pulls the wrapper's snapshots and subscribes to
    the engine's own publisher, as it always does a vLLM engine's. The Endpoint Picker only
    subscribes to the engine's publisher, with KV events over ZMQ. A process other than an
    Infera worker: its port, for the servers."""
    servers: list[Port] = [(svc.effective_port, None)]
    containers = pod_spec["containers"]
    entry = runtime.entry_point(containers[primary_index(containers) or 0])
    if entry is None or entry.module not in runtime.WORKER_MODULES.values():
        return servers, []
    sglang = entry.module == runtime.SGLANG
    plane = runtime.kv_plane(entry)
    if sglang and entry.known("--kv-events") != "off":
        servers.append((_sglang_port(entry, "--kv-events-bind"), None))
        if plane == "zmq":
            servers.append((_sglang_port(entry, "--kv-snapshot-port"), None))
    publisher = _publisher_ports(entry, pod_spec) if plane is not None else []
    if plane == "zmq" or not sglang:
        servers += publisher
    return servers, publisher if plane == "zmq" else []


def worker_policy(idep: InferaDeployment, service: str, svc: ServiceSpec, pod_spec: dict[str, Any]) -> dict[str, Any]:
    """The graph's workers on every port (prefill/decode transfer, a group's rendezvous and
    collectives, the frontend sidecars routing to any worker); its servers and Endpoint Picker
    on theirs; the gateway to the frontend sidecars."""
    rules = [_rule([], [_graph_pods(idep, **{COMPONENT_LABEL: "worker"})])]
    server_ports, picker_ports = router_ports(svc, pod_spec)
    # A rule only for peers the graph has.
    if any(not other.is_worker for other in idep.spec.services.values()):
        rules.append(_rule(server_ports, [_graph_pods(idep, **{COMPONENT_LABEL: "server"})]))
    # No ports would mean every port: the picker gets a rule only where it calls one.
    if idep.spec.gaie.enabled and picker_ports:
        rules.append(_rule(picker_ports, [_graph_pods(idep, **{SERVICE_LABEL: EPP_SUFFIX})]))
    if idep.spec.gaie.enabled:
        rules.append(_rule([(idep.spec.gaie.frontend_port, None)], _gateway_peers(idep)))
    rules += _metrics_rule(idep, [(svc.effective_port, None)])
    return _policy(idep, service, rules)


def host_network_services(idep: InferaDeployment) -> list[str]:
    """The services whose pods share their node's network (an extraPodSpec's hostNetwork): most
    network plugins see their traffic as the node's, which no podSelector admits."""
    return sorted(name for name, svc in idep.spec.services.items() if (svc.extra_pod_spec or {}).get("hostNetwork"))


def asked_for(idep: InferaDeployment) -> bool:
    """Whether the spec says anything of its NetworkPolicies (else the defaults apply)."""
    return "network_policy" in idep.spec.model_fields_set


def plumbing(idep: InferaDeployment) -> list[dict[str, Any]]:
    """The broker's policy and, isolating the graph, the Endpoint Picker's. By default the
    broker's is left out where a service runs on its node's network: the policy would cut it
    off from the broker (defaults_left_out says so)."""
    isolate = idep.spec.network_policy.isolate
    children = []
    if isolate != "none" and idep.spec.nats.deploy and (asked_for(idep) or not host_network_services(idep)):
        children.append(broker_policy(idep))
    if isolate == "graph" and idep.spec.gaie.enabled:
        children.append(epp_policy(idep))
    return children


def service_policies(
    idep: InferaDeployment, service: str, svc: ServiceSpec, workload: dict[str, Any]
) -> list[dict[str, Any]]:
    """A service's policy when isolating the graph, from its rendered workload."""
    if idep.spec.network_policy.isolate != "graph":
        return []
    if not svc.is_worker:
        return [server_policy(idep, service, svc)]
    leader, _ = pod_templates(workload)[0]
    return [worker_policy(idep, service, svc, leader["spec"])]
