"""The rendered graph serves: each scenario renders an InferaDeployment through the hook, runs
its data plane for real in a sandbox on this machine (tests/e2e/sandbox.py: the Infera runtime's
router and worker wrappers, a real NATS or etcd, a fake Kubernetes API, a stand-in engine), and
asserts what a user would (tests/e2e/scenarios.py)."""

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import sandbox
from tests.e2e.graphs import mixed, pd, worker
from tests.e2e.tokenizer import build_tokenizer
from tests.support.prerequisites import SHARED, need_schemas
from tests.support.requests import controller_for, parent, request_body


def run_scenario(
    hooks, scenario: str, spec: Callable[[Path], dict[str, Any]], env: dict[str, str] | None = None
) -> str:
    """Render the spec through the hook, run the scenario on what it rendered, return its output."""
    sandbox.need_sandbox()
    need_schemas()
    with sandbox.workdir() as workdir:
        model = build_tokenizer(workdir / "model")
        idep = parent(
            {
                "apiVersion": "infera.amd.com/v1alpha1",
                "kind": "InferaDeployment",
                "metadata": {"name": "e2e"},
                "spec": {"image": "rocm/infera:v0.2.10", **spec(model)},
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
                }
            )
        )
        result = sandbox.run(workdir, env={**os.environ, **(env or {})})
    assert result.returncode == 0, f"{result.stdout[-20000:]}\n{result.stderr[-5000:]}"
    print(result.stdout)
    return result.stdout


def test_mixed_worker_behind_the_router_with_kubernetes_discovery(hooks) -> None:
    run_scenario(hooks, "serves_and_routes_by_prefix", mixed)


def test_etcd_discovery(hooks) -> None:
    run_scenario(
        hooks,
        "serves_and_routes_by_prefix",
        lambda model: {**mixed(model), "discoveryBackend": "etcd", "etcdEndpoint": "etcd.infra:2379"},
    )


def test_prefill_decode_disaggregation(hooks) -> None:
    run_scenario(hooks, "disaggregates", pd)


def test_without_the_managed_nats(hooks) -> None:
    run_scenario(hooks, "serves_over_http_and_zmq", lambda model: {**mixed(model), "nats": {"deploy": False}})


@pytest.mark.parametrize("nats", [True, False], ids=["over-nats", "over-http"])
def test_graceful_scale_down(hooks, nats: bool) -> None:
    """Over NATS the worker tracks its in-flight requests; over HTTP it asks its engine's /metrics."""
    run_scenario(
        hooks,
        "drains_on_scale_down",
        lambda model: {**mixed(model), "nats": {"deploy": nats}},
        env={"STANDIN_TOKEN_DELAY": "0.1"},
    )


def test_multi_node_group_behind_the_inference_gateway(hooks) -> None:
    run_scenario(
        hooks,
        "gateway_routes_to_the_group_leader",
        lambda model: {
            "gaie": {"enabled": True, "tokenizerPath": str(model), "gatewayName": "gw", "frontendPort": 8100},
            "services": {"tp": {**worker(model), "numberOfNodes": 2}},
        },
    )
