"""The Inference Gateway front door (spec.gaie): EPP, InferencePool, HTTPRoute, frontend sidecars."""

import copy
from typing import Any

import pytest

from tests.support.argv import entry_point
from tests.support.graphs import GraphBuilder, graph
from tests.support.prerequisites import SHARED, need_schemas, need_upstream
from tests.support.requests import PD, children_by_key, controller, load_yaml, parent, request_body
from tests.support.simulator import Metacontroller

WITH_GAIE = controller("gaie")
WITH_ALL = controller("lws", "gaie")
GAIE = {"enabled": True, "tokenizerPath": "Qwen/Qwen3-0.6B", "gatewayName": "inference-gateway", "modelName": "qwen3"}
SELECTOR = "infera.amd.com/deployment=qwen-pd"
KV_EVENTS = {"--kv-event-transport": "nats", "--nats-server": "nats://qwen-pd-nats:4222"}
NATS = {"--request-transport": "nats", **KV_EVENTS}


def gaie_pd(**gaie: Any) -> GraphBuilder:
    """The PD graph behind the gateway: GAIE, with `gaie` on top."""
    return graph().gaie(**(GAIE | gaie))


def sync(hooks, obj: dict[str, Any], composite: dict[str, Any] = WITH_GAIE) -> dict[str, Any]:
    need_schemas()  # InferencePool, HTTPRoute and LeaderWorkerSet validate against the upstream CRDs
    return hooks.hook("/sync", request_body(obj, composite=composite))


def pod_templates(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every pod template the answer would create pods from, by a readable name."""
    templates = {}
    for child in answer["children"]:
        name = child["metadata"]["name"]
        if child["kind"] in ("Deployment", "StatefulSet"):
            templates[name] = child["spec"]["template"]
        elif child["kind"] == "LeaderWorkerSet":
            templates[f"{name}/leader"] = child["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
            templates[f"{name}/worker"] = child["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    return templates


def test_gaie_objects(hooks) -> None:
    answer = sync(hooks, gaie_pd(hostnames=["qwen.example.com"], gatewayNamespace="gateways").obj())
    children = children_by_key(answer)
    epp = children[("Deployment", "qwen-pd-epp")]
    pod = epp["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # gaie.modelName is informational: the picker has no such flag.
    assert entry_point(container["command"]) == (
        "infera.gaie",
        {
            "--grpc-port": "9002",
            "--grpc-health-port": "9003",
            "--destination-port": "8000",
            "--router-tokenizer-path": "Qwen/Qwen3-0.6B",
            "--discovery-backend": "kubernetes",
            "--k8s-label-selector": SELECTOR,
            **KV_EVENTS,
        },
    )
    assert container["image"] == "rocm/infera:sglang-v0.1.1"
    assert [p["containerPort"] for p in container["ports"]] == [9002, 9003]
    assert container["readinessProbe"]["grpc"] == {"port": 9003, "service": "inference-extension"}
    assert pod["serviceAccountName"] == "qwen-pd-epp"  # its own: it lists and watches pods, nothing more
    assert epp["spec"]["template"]["metadata"]["labels"]["infera.amd.com/service"] == "epp"
    assert children[("Service", "qwen-pd-epp")]["spec"]["ports"] == [
        {"name": "grpc-ext-proc", "port": 9002, "targetPort": "grpc-ext-proc", "protocol": "TCP"}  # TLS: no h2c
    ]
    pool = children[("InferencePool", "qwen-pd-pool")]["spec"]
    assert pool == {
        "selector": {"matchLabels": {"infera.amd.com/deployment": "qwen-pd", "infera.amd.com/gaie-frontend": "true"}},
        "targetPorts": [{"number": 8000}],
        "endpointPickerRef": {"kind": "Service", "name": "qwen-pd-epp", "port": {"number": 9002}},
    }
    route = children[("HTTPRoute", "qwen-pd-route")]["spec"]
    assert route == {
        "parentRefs": [
            {
                "group": "gateway.networking.k8s.io",
                "kind": "Gateway",
                "name": "inference-gateway",
                "namespace": "gateways",
            }
        ],
        "hostnames": ["qwen.example.com"],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [
                    {
                        "group": "inference.networking.k8s.io",
                        "kind": "InferencePool",
                        "name": "qwen-pd-pool",
                        "weight": 1,
                    }
                ],
            }
        ],
    }


def test_route_defaults_to_own_namespace_and_epp_image_override(hooks) -> None:
    children = children_by_key(sync(hooks, gaie_pd(eppImage="example.com/epp:v2").obj()))
    assert children[("HTTPRoute", "qwen-pd-route")]["spec"]["parentRefs"][0]["namespace"] == "ml"
    assert "hostnames" not in children[("HTTPRoute", "qwen-pd-route")]["spec"]
    assert (
        children[("Deployment", "qwen-pd-epp")]["spec"]["template"]["spec"]["containers"][0]["image"]
        == "example.com/epp:v2"
    )
    (_, sidecar) = children[("Deployment", "qwen-pd-decode")]["spec"]["template"]["spec"]["containers"]
    assert sidecar["image"] == "example.com/epp:v2"


def test_pool_selects_exactly_the_pods_with_the_sidecar(hooks) -> None:
    obj = (
        gaie_pd()
        .nodes(decode=2)
        .service("server", podLabels={"infera.amd.com/gaie-frontend": "true"})  # cannot opt in
        .obj()
    )
    answer = sync(hooks, obj, WITH_ALL)
    selector = children_by_key(answer)[("InferencePool", "qwen-pd-pool")]["spec"]["selector"]["matchLabels"]
    selected = {
        name
        for name, template in pod_templates(answer).items()
        if selector.items() <= template["metadata"]["labels"].items()
    }
    assert selected == {"qwen-pd-prefill", "qwen-pd-decode/leader"}
    for name, template in pod_templates(answer).items():
        names = [c["name"] for c in template["spec"]["containers"]]
        assert names == (["infera", "infera-frontend"] if name in selected else [names[0]]), name


def test_frontend_sidecar_and_direct_router(hooks) -> None:
    answer = sync(hooks, gaie_pd(frontendPort=8100).obj())
    (main, sidecar) = children_by_key(answer)[("Deployment", "qwen-pd-prefill")]["spec"]["template"]["spec"][
        "containers"
    ]
    assert entry_point(sidecar["command"]) == (
        "infera.server",
        {
            "--host": "0.0.0.0",
            "--port": "8100",
            "--router-mode": "direct",
            "--router-tokenizer-path": "Qwen/Qwen3-0.6B",
            "--discovery-backend": "kubernetes",
            "--k8s-label-selector": SELECTOR,
            **NATS,
        },
    )
    assert sidecar["ports"] == [{"name": "frontend", "containerPort": 8100, "protocol": "TCP"}]
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/v1/models", "port": 8100, "scheme": "HTTP"}
    assert sidecar["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", "15"]}}}
    assert "POD_IP" in [v["name"] for v in sidecar["env"]]
    assert children_by_key(answer)[("InferencePool", "qwen-pd-pool")]["spec"]["targetPorts"] == [{"number": 8100}]
    epp = children_by_key(answer)[("Deployment", "qwen-pd-epp")]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert epp[epp.index("--destination-port") + 1] == "8100"  # the picker sends the gateway to the pool's port
    (server,) = children_by_key(answer)[("Deployment", "qwen-pd-server")]["spec"]["template"]["spec"]["containers"]
    assert server["command"][server["command"].index("--router-mode") + 1] == "direct"


def test_frontend_port_must_not_clash_with_a_worker(hooks) -> None:
    status = hooks.sync(gaie_pd(frontendPort=30000).obj())["status"]
    assert status["state"] == "failed"
    assert "gaie.frontendPort 30000 is also services.decode's port" in status["message"]


def test_status_rolls_up_gateway_readiness(hooks) -> None:
    need_schemas()
    mc = Metacontroller(hooks, gaie_pd().obj(), composite=WITH_GAIE)
    mc.converge()
    mc.mark_ready()
    mc.converge()
    status = mc.parent["status"]
    assert status["state"] == "pending"
    # The pool exists and its gateway writes no conditions yet: that counts as ready.
    assert status["gaie"] == {
        "eppReplicas": 1,
        "eppReadyReplicas": 1,
        "inferencePoolName": "qwen-pd-pool",
        "httpRouteName": "qwen-pd-route",
        "inferencePoolReady": True,
        "httpRouteAccepted": False,
        "ready": False,
    }
    assert status["message"] == "gateway: EPP 1/1 ready, HTTPRoute qwen-pd-route not accepted"
    assert [c["reason"] for c in status["conditions"] if c["type"] == "Ready"] == ["GatewayNotReady"]

    mc.gateway_accepts(False)
    mc.converge()
    assert mc.parent["status"]["gaie"]["inferencePoolReady"] is False
    assert mc.parent["status"]["message"] == (
        "gateway: EPP 1/1 ready, InferencePool qwen-pd-pool not accepted, HTTPRoute qwen-pd-route not accepted"
    )

    mc.gateway_accepts(True)
    mc.converge()
    status = mc.parent["status"]
    assert status["state"] == "ready" and status["gaie"]["ready"] is True
    assert mc.sync() == []


def test_turning_gaie_off_and_dropping_hostnames_prune_exactly_that(hooks) -> None:
    need_schemas()
    mc = Metacontroller(hooks, gaie_pd(hostnames=["a.example.com"]).obj(), composite=WITH_GAIE)
    mc.converge()
    mc.edit(lambda spec: spec["gaie"].pop("hostnames"))
    assert mc.child_writes(mc.sync()) == [("update", "HTTPRoute", "qwen-pd-route")]
    assert "hostnames" not in mc.children[("HTTPRoute", "qwen-pd-route")]["spec"]
    mc.converge()
    # Each worker pod's frontend sidecar discovers workers as a router does.
    assert mc.children[("Role", "qwen-pd-register")]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch", "watch"]}
    ]
    mc.edit(lambda spec: spec["gaie"].update(enabled=False))
    writes = sorted(mc.child_writes(mc.sync()))
    assert writes == sorted(
        [
            ("delete", "Deployment", "qwen-pd-epp"),
            ("delete", "Service", "qwen-pd-epp"),
            ("delete", "InferencePool", "qwen-pd-pool"),
            ("delete", "HTTPRoute", "qwen-pd-route"),
            # and the picker's identity
            ("delete", "ServiceAccount", "qwen-pd-epp"),
            ("delete", "Role", "qwen-pd-epp"),
            ("delete", "RoleBinding", "qwen-pd-epp"),
            # the sidecar and pool label leave the workers; the server leaves direct mode
            ("update", "Deployment", "qwen-pd-decode"),
            ("update", "Deployment", "qwen-pd-prefill"),
            ("update", "Deployment", "qwen-pd-server"),
            # with no frontend in them, worker pods no longer list and watch pods
            ("update", "Role", "qwen-pd-register"),
        ]
    )
    assert mc.children[("Role", "qwen-pd-register")]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}
    ]
    for name in ("qwen-pd-decode", "qwen-pd-prefill"):
        template = mc.children[("Deployment", name)]["spec"]["template"]
        assert [c["name"] for c in template["spec"]["containers"]] == ["infera"]
        assert "infera.amd.com/gaie-frontend" not in template["metadata"]["labels"]
    mc.converge()
    assert mc.sync() == []


def test_unregistered_gaie_kinds_are_withheld_with_a_reason(hooks) -> None:
    # The base bundle registers neither InferencePool nor HTTPRoute.
    answer = hooks.hook("/sync", request_body(gaie_pd().obj(), composite=controller()))
    kinds = {c["kind"] for c in answer["children"]}
    assert not kinds & {"InferencePool", "HTTPRoute"}
    assert ("Deployment", "qwen-pd-epp") not in children_by_key(answer)  # the gateway part is withheld as a unit
    assert answer["status"]["state"] == "failed"
    assert "enable the kustomize component metacontroller/components/gaie" in answer["status"]["message"]
    # The rest of the graph stays exactly as without GAIE: no sidecar, no direct-mode router.
    without = parent(PD)
    plain = {
        key: c for key, c in children_by_key(hooks.hook("/sync", request_body(without, composite=controller()))).items()
    }
    assert children_by_key(answer) == plain


def test_upstream_gaie_sample_renders(hooks) -> None:
    sample = SHARED / "upstream" / "examples" / "infera_v1alpha1_inferadeployment_gaie.yaml"
    need_upstream()
    (doc,) = load_yaml(sample)
    answer = sync(hooks, parent(copy.deepcopy(doc)))
    assert answer["status"]["state"] == "initializing", answer["status"]
    children = children_by_key(answer)
    route = children[("HTTPRoute", "demo-gaie-route")]["spec"]
    assert route["parentRefs"][0]["namespace"] == "my-model" and route["parentRefs"][0]["name"] == "inference-gateway"
    assert {("Deployment", "demo-gaie-epp"), ("InferencePool", "demo-gaie-pool")} <= set(children)


@pytest.mark.parametrize(
    ("gaie", "field"),
    [
        ({"hostnames": ["Qwen.Example.com"]}, "spec.gaie.hostnames.0"),
        ({"hostnames": ["qwen.example.com:8080"]}, "spec.gaie.hostnames.0"),
        ({"gatewayNamespace": "Bad_NS"}, "spec.gaie.gatewayNamespace"),
        ({"gatewayName": "gw/x"}, "spec.gaie.gatewayName"),
    ],
)
def test_gateway_references_are_validated(hooks, gaie: dict, field: str) -> None:
    status = hooks.sync(gaie_pd(**gaie).obj())["status"]
    assert status["state"] == "failed" and f"invalid spec: {field}: String should match pattern" in status["message"]


def test_a_stale_acceptance_does_not_count(hooks) -> None:
    need_schemas()
    mc = Metacontroller(hooks, gaie_pd().obj(), composite=WITH_GAIE)
    mc.converge()
    mc.mark_ready()
    mc.gateway_accepts()
    mc.converge()
    assert mc.parent["status"]["gaie"]["ready"] is True
    mc.children[("HTTPRoute", "qwen-pd-route")]["metadata"]["generation"] = 2  # edited; the gateway has not caught up
    mc.converge()
    assert mc.parent["status"]["gaie"]["httpRouteAccepted"] is False


def test_frontend_port_must_not_be_one_the_worker_binds(hooks) -> None:
    """The sidecar shares the worker's network: SGLang's KV snapshot server binds 8801 by default."""
    status = sync(hooks, gaie_pd(frontendPort=8801).obj())["status"]
    assert status["state"] == "failed"
    assert (
        "services.decode: containers infera and infera-frontend would both listen on port 8801 in one pod: "
        "choose another gaie.frontendPort"
    ) in status["message"]
    # vLLM binds no such port: the same frontendPort is fine there.
    assert sync(hooks, gaie_pd(frontendPort=8801).vllm().obj())["status"]["state"] == "initializing"
