"""The CRD's CEL rules, evaluated with cel-python, agree with the hook's own validation."""

from collections.abc import Callable
from typing import Any

import celpy
import pytest
import yaml

from hooks.api import name_rules, names, rules
from tests.support.prerequisites import REPO
from tests.support.requests import PD, load_yaml, parent, upstream_corpus

CRD = yaml.safe_load((REPO / "crds" / "infera.amd.com_inferadeployments.yaml").read_text())
ROOT = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
CEL = celpy.Environment()


def evaluate(expression: str, obj: Any) -> Any:
    return CEL.program(CEL.compile(expression)).evaluate({"self": celpy.json_to_cel(obj)})


def cel_violations(schema: dict[str, Any], obj: Any) -> list[str]:
    """Messages of every x-kubernetes-validations rule that `obj` breaks, walking the schema (a
    rule's messageExpression evaluated, as the API server does)."""
    messages = []
    for rule in schema.get("x-kubernetes-validations", []):
        if not evaluate(rule["rule"], obj):
            messages.append(
                str(evaluate(rule["messageExpression"], obj)) if "messageExpression" in rule else rule["message"]
            )
    if isinstance(obj, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in obj:
                messages += cel_violations(sub, obj[name])
        if isinstance(schema.get("additionalProperties"), dict):
            for value in obj.values():
                messages += cel_violations(schema["additionalProperties"], value)
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            messages += cel_violations(schema["items"], item)
    return messages


def test_every_rule_compiles() -> None:
    rules = []

    def collect(node: Any) -> None:
        if isinstance(node, dict):
            rules.extend(node.get("x-kubernetes-validations", []))
            for value in node.values():
                collect(value)

    collect(ROOT)
    assert len(rules) == 48
    for rule in rules:
        CEL.compile(rule["rule"])
        assert rule["message"]
        if "messageExpression" in rule:
            CEL.compile(rule["messageExpression"])


def test_examples_and_upstream_corpus_pass_every_rule() -> None:
    documents = [doc for path in sorted((REPO / "examples").glob("*.yaml")) for doc in load_yaml(path)]
    documents += [doc for _, doc in upstream_corpus()]
    assert len(documents) >= 3
    for doc in documents:
        assert cel_violations(ROOT, doc) == [], doc["metadata"]["name"]


def rename(new: str) -> Callable[[dict], None]:
    def change(obj: dict) -> None:
        obj["metadata"]["name"] = new

    return change


def spec_change(**fields: Any) -> Callable[[dict], None]:
    return lambda obj: obj["spec"].update(fields)


def service_change(service: str, **fields: Any) -> Callable[[dict], None]:
    return lambda obj: obj["spec"]["services"][service].update(fields)


def add_service(name: str, component: str = "worker", **fields: Any) -> Callable[[dict], None]:
    return lambda obj: obj["spec"]["services"].__setitem__(name, {"componentType": component, **fields})


def only_servers(obj: dict) -> None:
    obj["spec"]["services"] = {"server": obj["spec"]["services"]["server"]}


def only_workers(obj: dict) -> None:
    del obj["spec"]["services"]["server"]


def blue_green_with(change: Callable[[dict], None]) -> Callable[[dict], None]:
    def changed(obj: dict) -> None:
        change(obj)
        obj["spec"]["rollout"] = {"strategy": "BlueGreen"}

    return changed


def length_rule(template: str, when: names.When) -> str:
    """The message of the rule the names table derives for names of `template` under `when`."""
    (rule,) = [rule for rule in name_rules.LENGTH_RULES if (rule.name.template, rule.name.when) == (template, when)]
    return rule.message


def claim_rule(tail: str, service: str) -> str:
    """The message of the rule against service names ending in `tail`, for `service` of qwen-pd."""
    (rule,) = [rule for rule in name_rules.CLAIM_RULES if rule.tail == tail]
    return rule.message("qwen-pd", service)


CACHE = {"source": "hf://Qwen/Qwen3-0.6B", "size": "20Gi"}
GAIE_ON = {"enabled": True, "tokenizerPath": "Qwen/Qwen3-0.6B", "gatewayName": "gw"}


def gaie_without_image(obj: dict) -> None:
    image = obj["spec"].pop("image")
    for svc in obj["spec"]["services"].values():
        svc["image"] = image
    obj["spec"]["gaie"] = dict(GAIE_ON)


def gaie_with_long_name(obj: dict) -> None:
    obj["metadata"]["name"] = "g" * 60
    obj["spec"]["nats"] = {"deploy": False}
    obj["spec"]["gaie"] = dict(GAIE_ON)
    obj["spec"]["services"] = {"a": {"componentType": "worker"}, "b": {"componentType": "server"}}


def vllm_prefill_without_args(obj: dict) -> None:
    obj["spec"]["backendFramework"] = "vllm"
    del obj["spec"]["services"]["prefill"]["args"]


CASES = [
    ("etcd without endpoint", spec_change(discoveryBackend="etcd"), rules.ETCD_ENDPOINT_RULE),
    ("gaie without image", gaie_without_image, rules.GAIE_IMAGE_RULE),
    (
        # The picker's <name>-epp would fit: its InferencePool's is a character longer.
        "gaie pool name over 63",
        lambda obj: (gaie_with_long_name(obj), rename("g" * 59)(obj)),
        length_rule("pool", names.WITH_GAIE),
    ),
    ("gaie without tokenizer", spec_change(gaie={"enabled": True, "gatewayName": "gw"}), rules.GAIE_REQUIRED_RULE),
    ("gaie without gateway", spec_change(gaie={"enabled": True, "tokenizerPath": "t"}), rules.GAIE_REQUIRED_RULE),
    ("role on a server", service_change("server", role="prefill"), rules.SERVER_ROLE_RULE),
    ("gpu on a server", service_change("server", resources={"gpu": 1}), rules.SERVER_GPU_RULE),
    ("multi-node server", service_change("server", numberOfNodes=2), rules.SERVER_NODES_RULE),
    ("rdma on a server", service_change("server", rdma=True), rules.SERVER_RDMA_RULE),
    ("hostBoot off on a server", service_change("server", hostBoot=False), rules.SERVER_HOST_BOOT_RULE),
    ("no worker", only_servers, rules.ONE_WORKER_RULE),
    ("service named nats", add_service("nats"), rules.RESERVED_NAMES_RULE),
    ("service named disc", add_service("disc", "server"), rules.RESERVED_NAMES_RULE),
    ("service named epp", add_service("epp"), rules.RESERVED_NAMES_RULE),
    ("server named like another graph's broker", add_service("b-nats", "server"), claim_rule("-nats", "b-nats")),
    ("worker named like another graph's broker", add_service("w-nats"), claim_rule("-nats", "w-nats")),
    ("service named like another graph's picker", add_service("gw-epp", "server"), claim_rule("-epp", "gw-epp")),
    (
        "service named like another graph's generation",
        add_service("decode-0a1b2c3d"),
        claim_rule("-{generation}", "decode-0a1b2c3d"),
    ),
    (
        "service named like a generation of another graph's service",
        add_service("deadbeef"),
        claim_rule("-{generation}", "deadbeef"),
    ),
    (
        "picker's generation",
        add_service("x-epp-0a1b2c3d", "server"),
        claim_rule("-{generation}", "x-epp-0a1b2c3d"),
    ),
    (
        "multi-node service named like a group of another",
        add_service("decode-2", numberOfNodes=2),
        claim_rule("-{group}", "decode-2"),
    ),
    (
        "multi-node service with more groups than its name leaves room for",
        service_change("decode", numberOfNodes=2, replicas=names.MAX_GROUPS + 1),
        rules.GROUPS_RULE,
    ),
    (
        "multi-node service whose autoscaler may make more groups than its name leaves room for",
        service_change(
            "decode",
            numberOfNodes=2,
            autoscaling={"maxReplicas": names.MAX_GROUPS + 1, "metrics": [{"type": "Pods"}]},
        ),
        rules.GROUPS_RULE,
    ),
    ("child name over 63", add_service("w" * 56), length_rule("{service}", names.ALWAYS)),
    ("multi-node name over 47", add_service("m" * 40, numberOfNodes=2), length_rule("{service}-{group}", names.MULTI)),
    ("parent name with a dot", rename("qwen.pd"), rules.PARENT_NAME_RULE),
    ("parent name with upper case", rename("Qwen"), rules.PARENT_NAME_RULE),
    ("no image anywhere", lambda obj: obj["spec"].pop("image"), rules.IMAGE_RULE),
    ("nats name over 52", rename("n" * 48), length_rule("nats", names.WITH_NATS)),
    ("vLLM prefill without a kv role", vllm_prefill_without_args, rules.VLLM_ROLE_RULE),
    (
        "blue/green name over 54",
        blue_green_with(add_service("w" * 47)),
        length_rule("{service}-{generation}", names.BLUE_GREEN_GRAPH),
    ),
    (
        "blue/green multi-node name over 38",
        blue_green_with(add_service("m" * 32, numberOfNodes=2)),
        length_rule("{service}-{generation}-{group}", names.BLUE_GREEN_MULTI),
    ),
    (
        # The picker's <name>-epp-<generation> would fit: its InferencePool's is a character longer.
        "blue/green pool name over 63",
        blue_green_with(lambda obj: (gaie_with_long_name(obj), rename("g" * 50)(obj))),
        length_rule("pool-{generation}", names.BLUE_GREEN_GAIE),
    ),
    ("blue/green without a front door", blue_green_with(only_workers), rules.BLUE_GREEN_FRONT_DOOR_RULE),
    (
        "blue/green over etcd",
        blue_green_with(spec_change(discoveryBackend="etcd", etcdEndpoint="etcd:2379")),
        rules.BLUE_GREEN_DISCOVERY_RULE,
    ),
    (
        "env with value and valueFrom",
        spec_change(envs=[{"name": "A", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]),
        rules.ENV_VALUE_RULE,
    ),
    (
        "valueFrom with two sources",
        service_change(
            "decode",
            env=[
                {
                    "name": "A",
                    "valueFrom": {
                        "fieldRef": {"fieldPath": "metadata.name"},
                        "secretKeyRef": {"name": "s", "key": "k"},
                    },
                }
            ],
        ),
        rules.ENV_SOURCE_RULE,
    ),
    ("valueFrom with no source", spec_change(envs=[{"name": "A", "valueFrom": {}}]), rules.ENV_SOURCE_RULE),
    (
        "autoscaling minimum over maximum",
        service_change("decode", autoscaling={"minReplicas": 3, "maxReplicas": 2, "metrics": [{"type": "Pods"}]}),
        rules.AUTOSCALING_RANGE_RULE,
    ),
    (
        "model cache with a long name",
        lambda obj: (rename("m" * 46)(obj), obj["spec"].update(nats={"deploy": False}, modelCache=CACHE)),
        length_rule("download-{digest}", names.WITH_MODEL_CACHE),
    ),
    (
        "model cache without an image for its download",
        lambda obj: (gaie_without_image(obj), obj["spec"].update(gaie={}, modelCache=CACHE)),
        rules.MODEL_CACHE_IMAGE_RULE,
    ),
    (
        "model cache beside a service named models",
        lambda obj: (obj["spec"].update(modelCache=CACHE), add_service("models")(obj)),
        rules.MODELS_NAME_RULE,
    ),
    (
        "disruption budget of 0",
        service_change("decode", disruptionBudget={"maxUnavailable": 0}),
        rules.MAX_UNAVAILABLE_RULE,
    ),
    (
        "disruption budget of 0%",
        service_change("decode", disruptionBudget={"maxUnavailable": "0%"}),
        rules.MAX_UNAVAILABLE_RULE,
    ),
    (
        "disruption budget over 100%",
        service_change("prefill", disruptionBudget={"maxUnavailable": "101%"}),
        rules.MAX_UNAVAILABLE_RULE,
    ),
    ("nats storage of 0", spec_change(nats={"storageSize": "0"}), rules.NATS_STORAGE_RULE),
    ("nats storage of 0 as a number", spec_change(nats={"storageSize": 0}), rules.NATS_STORAGE_RULE),
    ("nats storage of 0.0Gi", spec_change(nats={"storageSize": "0.0Gi"}), rules.NATS_STORAGE_RULE),
    (
        "nats token that may be missing",
        spec_change(nats={"tokenSecretRef": {"name": "nats", "key": "token", "optional": True}}),
        rules.NATS_TOKEN_OPTIONAL_RULE,
    ),
    (
        "nats token without the managed broker",
        spec_change(nats={"deploy": False, "tokenSecretRef": {"name": "nats", "key": "token"}}),
        rules.NATS_TOKEN_DEPLOY_RULE,
    ),
    (
        "peer with an ipBlock and a selector",
        spec_change(networkPolicy={"serverFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}),
        rules.PEER_RULE,
    ),
    ("peer that names nothing", spec_change(networkPolicy={"metricsFrom": [{}]}), rules.PEER_RULE),
    (
        "selector In without values",
        spec_change(
            networkPolicy={
                "gatewayFrom": [{"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}]
            }
        ),
        rules.SELECTOR_VALUES_RULE,
    ),
    (
        "selector Exists with values",
        spec_change(
            networkPolicy={
                "serverFrom": [
                    {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["b"]}]}}
                ]
            }
        ),
        rules.SELECTOR_VALUES_RULE,
    ),
]


@pytest.mark.parametrize(("change", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_admission_and_hook_reject_with_the_same_message(hooks, change: Callable[[dict], None], message: str) -> None:
    obj = parent(PD)
    assert cel_violations(ROOT, obj) == []
    change(obj)
    assert cel_violations(ROOT, obj) == [message]
    status = hooks.sync(obj)["status"]
    assert status["state"] == "failed"
    assert message in status["message"]


def test_boundaries_are_accepted(hooks) -> None:
    """Exactly at each limit is fine, for admission and hook alike."""
    for change in [add_service("w" * 55, args=["--model-path", "m"]), rename("n" * 47)]:
        obj = parent(PD)
        change(obj)
        assert cel_violations(ROOT, obj) == []
        assert hooks.sync(obj)["status"]["state"] == "initializing"
    obj = parent(PD)
    add_service("m" * 39, numberOfNodes=2)(obj)
    assert cel_violations(ROOT, obj) == []
    obj = parent(PD)
    rename("n" * 55)(obj)  # qwen...-prefill is exactly 63
    obj["spec"]["nats"] = {"deploy": False}
    assert cel_violations(ROOT, obj) == []
    assert hooks.sync(obj)["status"]["state"] == "initializing"
    for length in (58, 49):  # <name>-pool and, under BlueGreen, <name>-pool-<generation> are exactly 63
        obj = parent(PD)
        gaie_with_long_name(obj)
        rename("g" * length)(obj)
        obj["spec"]["services"]["a"]["args"] = ["--model-path", "m"]
        obj["spec"]["services"]["b"]["args"] = ["--router-tokenizer-path", "t"]
        if length == 49:
            obj["spec"]["rollout"] = {"strategy": "BlueGreen"}
        assert cel_violations(ROOT, obj) == []
        assert hooks.sync(obj)["status"]["state"] == "initializing"
    obj = parent(PD)
    service_change("decode", numberOfNodes=2, replicas=names.MAX_GROUPS)(obj)
    assert cel_violations(ROOT, obj) == []


# Ends of names no child of a service shares a kind with (accounts, the gateway's pool and route,
# the PodMonitor, the model cache's claim and Job), or near misses of those that do.
UNCLAIMED = [
    "decode-pool",
    "router-route",
    "x-disc",
    "x-register",
    "router-metrics",
    "x-models",
    "x-download",
    "natsy",
    "x-nats2",
    "decode-2",  # single-node: a Deployment, never a group's StatefulSet
    "decode-deadbee",
    "x-deadbeef0",
    "decade",
]


@pytest.mark.parametrize("service", UNCLAIMED)
def test_names_no_other_graphs_child_can_have_are_accepted(hooks, service: str) -> None:
    obj = parent(PD)
    add_service(service, args=["--model-path", "m"])(obj)
    assert cel_violations(ROOT, obj) == []
    assert hooks.sync(obj)["status"]["state"] == "initializing"
