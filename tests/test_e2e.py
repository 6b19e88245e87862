"""The rendered graph serves: each scenario renders an InferaDeployment through the hook, runs
its data plane for real in a sandbox on this machine (tests/e2e/sandbox.py: the Infera runtime's
router and worker wrappers, a real NATS or etcd, a fake Kubernetes API, a stand-in engine), and
asserts what a user would (tests/e2e/scenarios.py)."""

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import sandbox
from tests.e2e.scenarios import MODEL, PAGE_SIZE
from tests.e2e.tokenizer import build_tokenizer
from tests.support.prerequisites import SHARED, need, need_runtime, need_schemas
from tests.support.requests import controller_for, parent, request_body

SCENARIO_TIMEOUT = 150


def need_sandbox() -> None:
    need_runtime()
    missing = [tool for tool in ("unshare", "nsenter", "ip") if shutil.which(tool) is None]
    need(not missing, f"{', '.join(missing)} not on PATH (util-linux, iproute2)")
    probe = subprocess.run(
        [
            *sandbox.UNSHARE,
            "sh",
            "-c",
            "ip link add probe0 type bridge && ip link add probe1 type veth peer name probe2",
        ],
        capture_output=True,
        text=True,
    )
    need(
        probe.returncode == 0,
        "user, mount, network and PID namespaces with bridges and veth pairs are not "
        f"available here: {probe.stderr.strip()}",
    )


def server(model: Path, *args: str) -> dict[str, Any]:
    return {"componentType": "server", "args": ["--router-tokenizer-path", str(model), *args]}


def worker(model: Path, role: str = "mixed", *args: str) -> dict[str, Any]:
    flags = ["--model-path", str(model), "--served-model-name", MODEL, "--page-size", str(PAGE_SIZE)]
    if role != "mixed":
        flags += ["--disaggregation-transfer-backend", "mori"]
    return {"componentType": "worker", "role": role, "args": [*flags, *args]}


def mixed(model: Path) -> dict[str, Any]:
    return {"services": {"server": server(model), "worker": worker(model)}}


def pd(model: Path) -> dict[str, Any]:
    return {
        "services": {
            "server": server(model),
            "prefill": worker(model, "prefill"),
            "decode": worker(model, "decode"),
            "mixed": worker(model),
        }
    }


def run_scenario(
    hooks, scenario: str, spec: Callable[[Path], dict[str, Any]], env: dict[str, str] | None = None
) -> str:
    """Render the spec through the hook, run the scenario on what it rendered, return its output."""
    need_sandbox()
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
        try:
            result = sandbox.run(workdir, SCENARIO_TIMEOUT, env={**os.environ, **(env or {})})
        except subprocess.TimeoutExpired:
            logs = "\n".join(
                f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}"
                for log in sorted((workdir / "logs").glob("*.log"))
            )
            pytest.fail(f"the sandbox did not end within {SCENARIO_TIMEOUT} s\n{logs}")
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
