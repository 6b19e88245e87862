"""The NetworkPolicies (hooks/renderers/network.py) and the broker's token, rendered directly:
exact policies for each kind of graph, every one valid against NetworkPolicy's strict schema.
Whether they admit what the real processes do is the end-to-end tests' to prove
(tests/support/e2e/policies.py); what the API server stores, the control plane tier's."""

from typing import Any

import pytest

from hooks.api.fields import SpecError
from hooks.render import render_children
from hooks.renderers import nats, network
from hooks.renderers.env import operator_env
from hooks.runtime import Process, client_url
from tests.support.graphs import graph
from tests.support.inline_specs import GAIE, SERVER, WORKER, build, labels, selector, valid
from tests.support.requests import PD, children_by_key, controller, parent, request_body

PROMETHEUS = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
CLIENTS = [
    {"podSelector": {"matchLabels": {"app": "web"}}},
    {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}},
]


def graph_pods(**extra: str) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": {"infera.amd.com/deployment": "g", **extra}}}


def tcp(*ports: int | tuple[int, int]) -> list[dict[str, Any]]:
    return [
        {"port": port, "protocol": "TCP"}
        if isinstance(port, int)
        else {"port": port[0], "endPort": port[1], "protocol": "TCP"}
        for port in ports
    ]


def policy(service: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"g-{service}", "labels": labels(service)},
        "spec": {"podSelector": {"matchLabels": selector(service)}, "policyTypes": ["Ingress"], "ingress": rules},
    }


def policies(idep: Any) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in render_children(idep) if c["kind"] == "NetworkPolicy"}


def broker(rules: list[dict[str, Any]]) -> dict[str, Any]:
    """Labelled as the broker's other children."""
    rendered = policy("nats", rules)
    rendered["metadata"]["labels"]["infera.amd.com/component"] = "nats"
    return rendered


BROKER = broker([{"from": [graph_pods()], "ports": tcp(4222)}])
PEERS = {"from": [graph_pods(**{"infera.amd.com/component": "worker"})]}
SERVERS = [graph_pods(**{"infera.amd.com/component": "server"})]


def test_by_default_only_the_graphs_pods_reach_the_broker() -> None:
    """The broker's client port admits the graph's pods; nothing else is isolated."""
    rendered = policies(build({"server": SERVER, "worker": WORKER}))
    assert rendered == {"g-nats": BROKER}
    valid(*rendered.values())


@pytest.mark.parametrize(
    "spec", [{"nats": {"deploy": False}}, {"networkPolicy": {"isolate": "none"}}], ids=["no-broker", "none"]
)
def test_no_policy_without_a_broker_or_when_asked_for_none(spec: dict[str, Any]) -> None:
    assert policies(build({"server": SERVER, "worker": WORKER}, **spec)) == {}


def test_an_isolated_graph_over_nats() -> None:
    """Workers admit one another on every port, and the servers on the engine's port and the
    SGLang wrapper's KV-event publisher; a server admits anyone on its port; Prometheus reaches
    each port that serves /metrics."""
    idep = build(
        {"server": SERVER, "decode": {**WORKER, "role": "decode"}},
        networkPolicy={"isolate": "graph", "metricsFrom": PROMETHEUS},
    )
    rendered = policies(idep)
    assert rendered == {
        "g-nats": broker([{"from": [graph_pods()], "ports": tcp(4222)}, {"from": PROMETHEUS, "ports": tcp(8222)}]),
        "g-decode": policy(
            "decode",
            [PEERS, {"from": SERVERS, "ports": tcp(5557, 30000)}, {"from": PROMETHEUS, "ports": tcp(30000)}],
        ),
        "g-server": policy("server", [{"ports": tcp(8000)}]),
    }
    valid(*rendered.values())


def test_over_zmq_servers_pull_snapshots_and_subscribe_to_the_engine() -> None:
    """Without the broker a server also calls the snapshot server and the engine's publisher,
    on a port the kernel picks from the pod's ephemeral range; serverFrom admits its clients
    (and Prometheus then needs metricsFrom)."""
    idep = build(
        {"server": SERVER, "worker": {**WORKER, "port": 31000}},
        nats={"deploy": False},
        networkPolicy={"isolate": "graph", "serverFrom": CLIENTS, "metricsFrom": PROMETHEUS},
    )
    rendered = policies(idep)
    assert rendered == {
        "g-worker": policy(
            "worker",
            [
                PEERS,
                {"from": SERVERS, "ports": tcp(5557, 8801, 31000, (32768, 60999))},
                {"from": PROMETHEUS, "ports": tcp(31000)},
            ],
        ),
        "g-server": policy("server", [{"from": CLIENTS, "ports": tcp(8000)}, {"from": PROMETHEUS, "ports": tcp(8000)}]),
    }
    valid(*rendered.values())


@pytest.mark.parametrize(
    ("args", "sysctls", "ports"),
    [
        # The wrapper's flags move its publisher and snapshot server.
        (
            ["--kv-events-bind", "tcp://0.0.0.0:6000", "--kv-snapshot-port=6001"],
            None,
            [6000, 6001, 30000, (32768, 60999)],
        ),
        # SGLang's DP ranks publish on a block below the ephemeral range.
        (["--dp-size", "2"], None, [(1024, 32767), 5557, 8801, 30000, (32768, 60999)]),
        # The pod's own ephemeral range.
        (None, [{"name": "net.ipv4.ip_local_port_range", "value": "40000 50000"}], [5557, 8801, 30000, (40000, 50000)]),
        # A range the kernel would refuse leaves Linux's default.
        (None, [{"name": "net.ipv4.ip_local_port_range", "value": "50000 40000"}], [5557, 8801, 30000, (32768, 60999)]),
        # Without KV events, only the engine's port.
        (["--kv-events", "off", "--no-enable-kv-events"], None, [30000]),
    ],
    ids=["flags", "dp", "sysctl", "bad-sysctl", "no-kv-events"],
)
def test_the_ports_servers_call_follow_the_command_line_and_the_pod(
    args: list[str] | None, sysctls: list[dict[str, str]] | None, ports: list[Any]
) -> None:
    worker: dict[str, Any] = {**WORKER, "args": ["--model-path", "m", *(args or [])]}
    if sysctls:
        worker["extraPodSpec"] = {"securityContext": {"sysctls": sysctls}}
    idep = build({"server": SERVER, "worker": worker}, nats={"deploy": False}, networkPolicy={"isolate": "graph"})
    rules = policies(idep)["g-worker"]["spec"]["ingress"]
    assert rules[1] == {"from": SERVERS, "ports": tcp(*ports)}
    valid(policies(idep)["g-worker"])


def test_a_port_that_starts_a_range_is_written_before_it() -> None:
    """The worker's own port at the bottom of the ephemeral range: both, the port first."""
    idep = build(
        {"server": SERVER, "worker": {**WORKER, "port": 32768}},
        nats={"deploy": False},
        networkPolicy={"isolate": "graph"},
    )
    assert policies(idep)["g-worker"]["spec"]["ingress"][1]["ports"] == tcp(5557, 8801, 32768, (32768, 60999))


def test_empty_selector_parts_are_written_as_the_api_server_stores_them() -> None:
    """An empty map or list in a peer is absent once stored: rendered so, or every sync would
    re-apply it. An empty podSelector stays: it selects every pod of the namespace."""
    written = [
        {"podSelector": {"matchLabels": {}, "matchExpressions": []}},
        {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Exists", "values": []}]}},
        {"ipBlock": {"cidr": "10.0.0.0/8", "except": []}},
    ]
    idep = build({"server": SERVER, "worker": WORKER}, networkPolicy={"isolate": "graph", "serverFrom": written})
    assert policies(idep)["g-server"]["spec"]["ingress"] == [
        {
            "from": [
                {"podSelector": {}},
                {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]}},
                {"ipBlock": {"cidr": "10.0.0.0/8"}},
            ],
            "ports": tcp(8000),
        }
    ]


@pytest.mark.parametrize("deploy", [True, False], ids=["nats", "zmq"])
def test_vllm_engines_publish_whatever_the_transport(deploy: bool) -> None:
    kv = '{"kv_connector":"MoRIIOConnector","kv_role":"kv_consumer"}'
    worker = {**WORKER, "role": "decode", "args": ["--model", "m", "--kv-transfer-config", kv]}
    idep = build(
        {"server": SERVER, "decode": worker},
        backendFramework="vllm",
        nats={"deploy": deploy},
        networkPolicy={"isolate": "graph"},
    )
    assert policies(idep)["g-decode"]["spec"]["ingress"][1] == {"from": SERVERS, "ports": tcp(30000, (32768, 60999))}


@pytest.mark.parametrize("deploy", [True, False], ids=["nats", "zmq"])
def test_behind_a_gateway(deploy: bool) -> None:
    """The Gateway's namespace reaches the picker's ext-proc port and the frontend sidecars; the
    picker subscribes to the engines only over ZMQ; with no server, no rule names servers (an
    empty `from` would admit everyone)."""
    idep = build(
        {"worker": WORKER},
        gaie={**GAIE, "gatewayNamespace": "gateways"},
        nats={"deploy": deploy},
        networkPolicy={"isolate": "graph"},
    )
    gateway = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateways"}}}]
    picker = [{"from": [graph_pods(**{"infera.amd.com/service": "epp"})], "ports": tcp((32768, 60999))}]
    rendered = policies(idep)
    assert rendered == {
        **({"g-nats": BROKER} if deploy else {}),
        "g-epp": policy("epp", [{"from": gateway, "ports": tcp(9002)}]),
        "g-worker": policy("worker", [PEERS, *([] if deploy else picker), {"from": gateway, "ports": tcp(8100)}]),
    }
    valid(*rendered.values())


def test_gateway_from_replaces_the_gateways_namespace() -> None:
    idep = build({"worker": WORKER}, gaie=GAIE, networkPolicy={"isolate": "graph", "gatewayFrom": CLIENTS})
    rendered = policies(idep)
    assert rendered["g-epp"]["spec"]["ingress"] == [{"from": CLIENTS, "ports": tcp(9002)}]
    assert rendered["g-worker"]["spec"]["ingress"][-1] == {"from": CLIENTS, "ports": tcp(8100)}


@pytest.mark.parametrize(
    ("peer", "message"),
    [
        ({"ipBlock": {"cidr": "10.0.0.0/33"}}, "'10.0.0.0/33' is not a CIDR"),
        ({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/16"]}}, "must be a strict subset of cidr"),
        ({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.0.0/8"]}}, "must be a strict subset of cidr"),
        ({"podSelector": {"matchLabels": {"-bad": "x"}}}, "spec.networkPolicy.serverFrom.0.podSelector.matchLabels"),
        ({"podSelector": {"matchExpressions": [{"key": "a", "operator": "Has"}]}}, "operator"),
    ],
)
def test_a_bad_peer_is_named(peer: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match="spec.networkPolicy.serverFrom") as raised:
        build({"server": SERVER, "worker": WORKER}, networkPolicy={"isolate": "graph", "serverFrom": [peer]})
    assert message in str(raised.value)


def test_a_token_reaches_the_broker_and_every_client_through_kubelets_expansion() -> None:
    """The broker requires it; every process's NATS URL carries it as the user, its variable
    defined before the URL that refers to it."""
    idep = build({"server": SERVER, "worker": WORKER}, nats={"tokenSecretRef": {"name": "nats-auth", "key": "token"}})
    token = {"name": "INFERA_NATS_TOKEN", "valueFrom": {"secretKeyRef": {"name": "nats-auth", "key": "token"}}}
    url = "nats://$(INFERA_NATS_TOKEN)@g-nats:4222"
    statefulset, _ = nats.render(idep)
    (broker,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert broker["command"][-2:] == ["--auth", "$(INFERA_NATS_TOKEN)"] and broker["env"] == [token]
    assert client_url(idep) == url
    for process in Process:
        names = [var["name"] for var in operator_env(idep, process)]
        assert names.index("INFERA_NATS_TOKEN") == names.index("NATS_SERVER") - 1
        assert {"name": "NATS_SERVER", "value": url} in operator_env(idep, process)
    valid(statefulset)


@pytest.mark.parametrize(
    ("nats", "message"),
    [
        (
            {"tokenSecretRef": {"name": "n", "key": "t", "optional": True}},
            "spec.nats.tokenSecretRef: optional must not",
        ),
        ({"deploy": False, "tokenSecretRef": {"name": "n", "key": "t"}}, "spec.nats: nats.tokenSecretRef applies to"),
    ],
    ids=["optional", "no-broker"],
)
def test_a_token_the_broker_may_not_get_is_refused(nats: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        build({"worker": WORKER}, nats=nats)


def test_the_broker_policy_is_plumbing_and_a_service_policy_follows_its_workload() -> None:
    idep = build({"server": SERVER, "worker": WORKER}, networkPolicy={"isolate": "graph"})
    assert [f"{c['kind']}/{c['metadata']['name']}" for c in render_children(idep)] == (
        "ServiceAccount/g-disc Role/g-disc RoleBinding/g-disc ServiceAccount/g-register Role/g-register "
        "RoleBinding/g-register StatefulSet/g-nats Service/g-nats NetworkPolicy/g-nats Deployment/g-server "
        "Service/g-server NetworkPolicy/g-server Deployment/g-worker NetworkPolicy/g-worker "
        "PodDisruptionBudget/g-worker"
    ).split()
    assert network.plumbing(idep) == [policies(idep)["g-nats"]]


def test_without_the_policy_kind_registered_the_brokers_is_left_out_and_said(hooks) -> None:
    """A CompositeController of an older bundle: the default policy is left out (the broker
    runs as before) and the status says why; policies asked for hold their services back."""
    composite = controller()
    composite["spec"]["childResources"] = [
        c for c in composite["spec"]["childResources"] if c["resource"] != "networkpolicies"
    ]
    answer = hooks.hook("/sync", request_body(parent(PD), composite=composite))
    children = children_by_key(answer)
    assert [key for key in children if key[0] == "NetworkPolicy"] == []
    assert ("StatefulSet", "qwen-pd-nats") in children
    assert answer["status"]["state"] == "initializing"
    assert answer["status"]["message"].endswith(
        "no NetworkPolicy for the NATS broker, so any pod of the cluster may connect to it: this CompositeController "
        "does not register NetworkPolicy (networking.k8s.io/v1); enable it in metacontroller/compositecontroller.yaml"
    )
    answer = hooks.hook("/sync", request_body(graph().network_policy(isolate="broker").obj(), composite=composite))
    assert answer["status"]["state"] == "failed"
    assert "NetworkPolicy qwen-pd-nats cannot be created" in answer["status"]["message"]
    assert ("StatefulSet", "qwen-pd-nats") not in children_by_key(answer)
    # Nothing to say where no policy was wanted.
    for unwanted in (graph().network_policy(isolate="none"), graph().nats(deploy=False)):
        answer = hooks.hook("/sync", request_body(unwanted.obj(), composite=composite))
        assert "NetworkPolicy" not in answer["status"]["message"], answer["status"]["message"]


def test_a_service_on_the_nodes_network_leaves_the_default_broker_policy_out_and_says_why(hooks) -> None:
    """A hostNetwork pod's traffic is the node's to most network plugins: the default policy
    would cut it off from the broker on upgrade. Asked for, the policy is rendered."""
    on_the_node = graph().extra_pod_spec("decode", hostNetwork=True)
    answer = hooks.sync(on_the_node.obj())
    assert [key for key in children_by_key(answer) if key[0] == "NetworkPolicy"] == []
    assert answer["status"]["message"].endswith(
        "no NetworkPolicy for the NATS broker, so any pod of the cluster may connect to it: decode runs on the "
        "node's network, which a policy cannot tell from the node's own traffic; set networkPolicy.isolate to "
        "broker to have it anyway (then those pods reach the broker only from its node)"
    )
    answer = hooks.sync(on_the_node.network_policy(isolate="broker").obj())
    assert ("NetworkPolicy", "qwen-pd-nats") in children_by_key(answer)
    assert "NetworkPolicy" not in answer["status"]["message"]
