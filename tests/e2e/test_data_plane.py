"""The rendered graph serves: each scenario renders an InferaDeployment through the hook, runs
its data plane for real in a sandbox on this machine (tests/support/e2e/sandbox.py: the Infera runtime's
router and worker wrappers, a real NATS or etcd, a fake Kubernetes API, a stand-in engine), and
asserts what a user would (tests/support/e2e/scenarios.py)."""

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.e2e import sandbox
from tests.support.e2e.graphs import mixed, pd, worker
from tests.support.e2e.policies import CLIENT_LABELS, GATEWAY_NAMESPACE, Kind, judge
from tests.support.e2e.tokenizer import build_tokenizer
from tests.support.prerequisites import SHARED, need_schemas
from tests.support.requests import controller_for, parent, request_body

# The graph isolated, its servers open to one client.
ISOLATED = {"isolate": "graph", "serverFrom": [{"podSelector": {"matchLabels": CLIENT_LABELS}}]}
# What the policies admit that a scenario may not use, and why it stays admitted:
# - the client serverFrom names, to the server (the test's own requests come from the node);
CLIENTS: set[Kind] = {("client", "server", 8000)}
# - a server to a worker's HTTP port over NATS, which carries the requests here: a worker whose
#   NATS consumer fails registers over HTTP, and so do some prefill/decode protocols;
HTTP_BESIDE_NATS: set[Kind] = {("server", "worker", 30000)}
# - a worker to another on any port: the stand-in engine only bootstraps prefill/decode (8998)
#   and a group (5000), where a real one also moves KV and runs collectives on ports the
#   transfer engines and the kernel choose.
PEERS: set[Kind] = {("worker", "worker", "any")}
# - the gateway's namespace to the picker and the frontend sidecars (the test plays the gateway
#   from the node).
GATEWAY: set[Kind] = {("gateway", "epp", 9002), ("gateway", "worker", 8100)}


def run_scenario(
    hooks,
    scenario: str,
    spec: Callable[[Path], dict[str, Any]],
    admitted: set[Kind],
    env: dict[str, str] | None = None,
    secrets: dict[str, dict[str, str]] | None = None,
) -> str:
    """Render the spec, with the graph isolated, through the hook; run the scenario on what it
    rendered; judge its connections against the rendered NetworkPolicies, which must admit
    every one and, of what was not used, exactly `admitted` (tests/support/e2e/policies.py); return
    the scenario's output."""
    sandbox.need_sandbox()
    need_schemas()
    with sandbox.workdir() as workdir:
        model = build_tokenizer(workdir / "model")
        idep = parent(
            {
                "apiVersion": "infera.amd.com/v1alpha1",
                "kind": "InferaDeployment",
                "metadata": {"name": "e2e"},
                "spec": {"image": "rocm/infera:v0.2.10", "networkPolicy": ISOLATED, **spec(model)},
            }
        )
        answer = hooks.hook("/sync", request_body(idep, composite=controller_for(idep)))
        assert answer["status"]["state"] == "initializing", answer["status"]["message"]
        (workdir / "graph.json").write_text(
            json.dumps(
                {
                    "idep": idep,
                    "children": answer["children"],
                    "scenario": scenario,
                    "shared": str(SHARED.resolve()),
                    "secrets": secrets or {},
                }
            )
        )
        result = sandbox.run(workdir, env={**os.environ, **(env or {})})
        assert result.returncode == 0, f"{result.stdout[-20000:]}\n{result.stderr[-5000:]}"
        print(result.stdout)
        unused = judge(workdir, answer["children"], idep["metadata"]["namespace"])
    assert unused == admitted
    return result.stdout


def test_mixed_worker_behind_the_router_with_kubernetes_discovery(hooks) -> None:
    run_scenario(hooks, "serves_and_routes_by_prefix", mixed, CLIENTS | HTTP_BESIDE_NATS)


def test_a_broker_that_requires_a_token(hooks) -> None:
    """Every process of the graph gives the broker the token from the Secret, and a client
    without it (or with another) is refused."""
    run_scenario(
        hooks,
        "serves_and_routes_by_prefix",
        lambda model: {**mixed(model), "nats": {"tokenSecretRef": {"name": "nats-auth", "key": "token"}}},
        CLIENTS | HTTP_BESIDE_NATS,
        secrets={"nats-auth": {"token": "e2e-Broker.token~1"}},
    )


def test_etcd_discovery(hooks) -> None:
    run_scenario(
        hooks,
        "serves_and_routes_by_prefix",
        lambda model: {**mixed(model), "discoveryBackend": "etcd", "etcdEndpoint": "etcd.infra:2379"},
        CLIENTS | HTTP_BESIDE_NATS,
    )


def test_prefill_decode_disaggregation(hooks) -> None:
    run_scenario(hooks, "disaggregates", pd, CLIENTS | HTTP_BESIDE_NATS | PEERS)


def test_without_the_managed_nats(hooks) -> None:
    run_scenario(hooks, "serves_over_http_and_zmq", lambda model: {**mixed(model), "nats": {"deploy": False}}, CLIENTS)


@pytest.mark.parametrize("nats", [True, False], ids=["over-nats", "over-http"])
def test_graceful_scale_down(hooks, nats: bool) -> None:
    """Over NATS the worker tracks its in-flight requests; over HTTP it asks its engine's /metrics."""
    run_scenario(
        hooks,
        "drains_on_scale_down",
        lambda model: {**mixed(model), "nats": {"deploy": nats}},
        CLIENTS | (HTTP_BESIDE_NATS if nats else set()),
        env={"STANDIN_TOKEN_DELAY": "0.1"},
    )


@pytest.mark.parametrize("nats", [True, False], ids=["over-nats", "over-zmq"])
def test_multi_node_group_behind_the_inference_gateway(hooks, nats: bool) -> None:
    """Over ZMQ the picker subscribes to the engines' own KV events, which NATS carries otherwise."""
    run_scenario(
        hooks,
        "gateway_routes_to_the_group_leader",
        lambda model: {
            "gaie": {
                "enabled": True,
                "tokenizerPath": str(model),
                "gatewayName": "gw",
                "gatewayNamespace": GATEWAY_NAMESPACE,
                "frontendPort": 8100,
            },
            "nats": {"deploy": nats},
            "services": {"tp": {**worker(model), "numberOfNodes": 2}},
        },
        # A group's other rank may reach the broker, as every pod of the graph, but leaves NATS to
        # its leader; it binds an engine publisher too, which nothing subscribes to (only the
        # leader registers).
        PEERS | GATEWAY | ({("worker", "nats", 4222)} if nats else {("epp", "worker", "ephemeral")}),
    )
