"""The rendered NetworkPolicies judged against the connections a scenario's real processes made
(tests/support/e2e/connections.py records them in the sandbox), by Cyclonus (tests/support/netpol.py).

Two questions, each answered exactly:
- Is every connection between two pods admitted? A connection from or to the node (kubelet's
  probes, the test acting as a client, the API server, etcd) is not a NetworkPolicy's to judge.
- What else do the policies admit? Every pod's listening ports are asked for from every pod of
  the graph, from a pod of the same namespace outside the graph and from a pod of another
  namespace, from a client the spec admits to its servers and from a pod of the Gateway's
  namespace; what is admitted but was never used is summed up by kind (the source's and
  destination's role, and the port, or `any` between workers, or `ephemeral` for a port the
  kernel picked) for the test to compare with what it expects.
"""

import json
from pathlib import Path
from typing import Any

from tests.support.e2e.sandbox import NETWORK_RECORD
from tests.support.netpol import Endpoint, Traffic, allowed

COMPONENT_LABEL = "infera.amd.com/component"
SERVICE_LABEL = "infera.amd.com/service"
EPHEMERAL_LOW = 32768
Kind = tuple[str, str, int | str]  # source role, destination role, port
# Pods outside the graph that the scenarios' specs name: a client the servers admit
# (`serverFrom`), and a Gateway's namespace (`gaie.gatewayNamespace`).
CLIENT, CLIENT_LABELS = "client", {"app": "client"}
GATEWAY, GATEWAY_NAMESPACE = "gateway", "gateways"


def role(labels: dict[str, str]) -> str:
    return labels.get(COMPONENT_LABEL) or labels.get(SERVICE_LABEL, "unknown")


def _kind(source: str, destination: str, port: int) -> Kind:
    if source == destination == "worker":
        return (source, destination, "any")
    return (source, destination, "ephemeral" if port >= EPHEMERAL_LOW else port)


def judge(workdir: Path, children: list[dict[str, Any]], namespace: str) -> set[Kind]:
    """AssertionError naming any pod-to-pod connection the policies refuse; else the kinds of
    what they admit that was not used."""
    record = json.loads((workdir / NETWORK_RECORD).read_text())
    policies = [child for child in children if child["kind"] == "NetworkPolicy"]
    assert policies, "the graph rendered no NetworkPolicy"
    pods = {
        name: (Endpoint(namespace, tuple(sorted(pod["labels"].items())), pod["ip"]), role(pod["labels"]))
        for name, pod in record["pods"].items()
    }
    by_ip = {endpoint.ip: (name, endpoint) for name, (endpoint, _) in pods.items()}
    used = [
        (by_ip[source], by_ip[destination], port, protocol)
        for source, destination, port, protocol in record["connections"]
        if source in by_ip and destination in by_ip
    ]
    assert used, f"no connection between two pods was recorded: {record['connections']}"
    verdicts = allowed(policies, namespace, [Traffic(s[1], d[1], port, protocol) for s, d, port, protocol in used])
    refused = [
        f"{s[0]} -> {d[0]}:{port}/{protocol}"
        for (s, d, port, protocol), ok in zip(used, verdicts, strict=True)
        if not ok
    ]
    assert not refused, f"the rendered NetworkPolicies refuse connections the graph made: {refused}"

    outsiders = {
        "elsewhere": Endpoint("elsewhere", (), "10.99.0.1"),
        "neighbour": Endpoint(namespace, (("app", "other"),), "10.99.0.2"),
        CLIENT: Endpoint(namespace, tuple(CLIENT_LABELS.items()), "10.99.0.3"),
        GATEWAY: Endpoint(GATEWAY_NAMESPACE, (), "10.99.0.4"),
    }
    sources = {name: (endpoint, pod_role) for name, (endpoint, pod_role) in pods.items()}
    sources |= {name: (endpoint, name) for name, endpoint in outsiders.items()}
    seen = {(s[0], d[0], port, protocol) for s, d, port, protocol in used}
    candidates = [
        (source, (destination, pods[destination][1]), port, protocol)
        for source in sources
        for destination, pod in record["pods"].items()
        for port, protocol in pod["listening"]
        if source != destination and (source, destination, port, protocol) not in seen
    ]
    answers = allowed(
        policies,
        namespace,
        [Traffic(sources[s][0], pods[d][0], port, protocol) for s, (d, _), port, protocol in candidates],
    )
    return {
        _kind(sources[source][1], destination_role, port)
        for (source, (_, destination_role), port, _), ok in zip(candidates, answers, strict=True)
        if ok
    }
