"""The CRD's CEL rules, evaluated with cel-python, agree with the hook's own validation."""

from collections.abc import Callable
from typing import Any

import celpy
import pytest
import yaml

from hooks.api import name_rules, names, rules
from tests.support.graphs import GraphBuilder, graph
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
    assert len(rules) == 51
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


# A change of the PD graph that breaks a rule.
Change = Callable[[GraphBuilder], GraphBuilder]


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


PD_IMAGE = parent(PD)["spec"]["image"]


def gaie_without_image(built: GraphBuilder) -> GraphBuilder:
    """The gateway on, and the image moved from the spec to each service (the picker has none)."""
    built.image(None).gaie(**GAIE_ON)
    for service in ("server", "prefill", "decode"):
        built.service(service, image=PD_IMAGE)
    return built


def gaie_with_long_name(built: GraphBuilder) -> GraphBuilder:
    return built.name("g" * 60).nats(deploy=False).gaie(**GAIE_ON).only().worker("a").server("b")


CASES: list[tuple[str, Change, str]] = [
    ("etcd without endpoint", lambda g: g.spec(discoveryBackend="etcd"), rules.ETCD_ENDPOINT_RULE),
    ("gaie without image", gaie_without_image, rules.GAIE_IMAGE_RULE),
    (
        # The picker's <name>-epp would fit: its InferencePool's is a character longer.
        "gaie pool name over 63",
        lambda g: gaie_with_long_name(g).name("g" * 59),
        length_rule("pool", names.WITH_GAIE),
    ),
    ("gaie without tokenizer", lambda g: g.gaie(tokenizerPath=None), rules.GAIE_REQUIRED_RULE),
    (
        "gaie without gateway",
        lambda g: g.gaie(tokenizerPath="t", gatewayName=None),
        rules.GAIE_REQUIRED_RULE,
    ),
    ("role on a server", lambda g: g.service("server", role="prefill"), rules.SERVER_ROLE_RULE),
    ("gpu on a server", lambda g: g.resources("server", gpu=1), rules.SERVER_GPU_RULE),
    ("multi-node server", lambda g: g.nodes(server=2), rules.SERVER_NODES_RULE),
    ("rdma on a server", lambda g: g.service("server", rdma=True), rules.SERVER_RDMA_RULE),
    ("hostBoot off on a server", lambda g: g.service("server", hostBoot=False), rules.SERVER_HOST_BOOT_RULE),
    ("no worker", lambda g: g.only("server"), rules.ONE_WORKER_RULE),
    ("service named nats", lambda g: g.worker("nats"), rules.RESERVED_NAMES_RULE),
    ("service named disc", lambda g: g.server("disc"), rules.RESERVED_NAMES_RULE),
    ("service named epp", lambda g: g.worker("epp"), rules.RESERVED_NAMES_RULE),
    ("server named like another graph's broker", lambda g: g.server("b-nats"), claim_rule("-nats", "b-nats")),
    ("worker named like another graph's broker", lambda g: g.worker("w-nats"), claim_rule("-nats", "w-nats")),
    ("service named like another graph's picker", lambda g: g.server("gw-epp"), claim_rule("-epp", "gw-epp")),
    (
        "service named like another graph's generation",
        lambda g: g.worker("decode-0a1b2c3d"),
        claim_rule("-{generation}", "decode-0a1b2c3d"),
    ),
    (
        "service named like a generation of another graph's service",
        lambda g: g.worker("deadbeef"),
        claim_rule("-{generation}", "deadbeef"),
    ),
    (
        "picker's generation",
        lambda g: g.server("x-epp-0a1b2c3d"),
        claim_rule("-{generation}", "x-epp-0a1b2c3d"),
    ),
    (
        "multi-node service named like a group of another",
        lambda g: g.worker("decode-2", numberOfNodes=2),
        claim_rule("-{group}", "decode-2"),
    ),
    (
        "multi-node service with more groups than its name leaves room for",
        lambda g: g.service("decode", numberOfNodes=2, replicas=names.MAX_GROUPS + 1),
        rules.GROUPS_RULE,
    ),
    (
        "multi-node service whose autoscaler may make more groups than its name leaves room for",
        lambda g: g.nodes(decode=2).autoscaling("decode", maxReplicas=names.MAX_GROUPS + 1, metrics=[{"type": "Pods"}]),
        rules.GROUPS_RULE,
    ),
    ("child name over 63", lambda g: g.worker("w" * 56), length_rule("{service}", names.ALWAYS)),
    (
        "multi-node name over 47",
        lambda g: g.worker("m" * 40, numberOfNodes=2),
        length_rule("{service}-{group}", names.MULTI),
    ),
    ("parent name with a dot", lambda g: g.name("qwen.pd"), rules.PARENT_NAME_RULE),
    ("parent name with upper case", lambda g: g.name("Qwen"), rules.PARENT_NAME_RULE),
    ("no image anywhere", lambda g: g.image(None), rules.IMAGE_RULE),
    ("nats name over 52", lambda g: g.name("n" * 48), length_rule("nats", names.WITH_NATS)),
    ("vLLM prefill without a kv role", lambda g: g.backend("vllm").service("prefill", args=None), rules.VLLM_ROLE_RULE),
    (
        "blue/green name over 54",
        lambda g: g.worker("w" * 47).blue_green(),
        length_rule("{service}-{generation}", names.BLUE_GREEN_GRAPH),
    ),
    (
        "blue/green multi-node name over 38",
        lambda g: g.worker("m" * 32, numberOfNodes=2).blue_green(),
        length_rule("{service}-{generation}-{group}", names.BLUE_GREEN_MULTI),
    ),
    (
        # The picker's <name>-epp-<generation> would fit: its InferencePool's is a character longer.
        "blue/green pool name over 63",
        lambda g: gaie_with_long_name(g).name("g" * 50).blue_green(),
        length_rule("pool-{generation}", names.BLUE_GREEN_GAIE),
    ),
    ("blue/green without a front door", lambda g: g.without("server").blue_green(), rules.BLUE_GREEN_FRONT_DOOR_RULE),
    (
        "blue/green over etcd",
        lambda g: g.discovery("etcd", "etcd:2379").blue_green(),
        rules.BLUE_GREEN_DISCOVERY_RULE,
    ),
    (
        "env with value and valueFrom",
        lambda g: g.envs({"name": "A", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
        rules.ENV_VALUE_RULE,
    ),
    (
        "valueFrom with two sources",
        lambda g: g.env(
            "decode",
            {
                "name": "A",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}, "secretKeyRef": {"name": "s", "key": "k"}},
            },
        ),
        rules.ENV_SOURCE_RULE,
    ),
    ("valueFrom with no source", lambda g: g.envs({"name": "A", "valueFrom": {}}), rules.ENV_SOURCE_RULE),
    (
        "autoscaling minimum over maximum",
        lambda g: g.autoscaling("decode", minReplicas=3, maxReplicas=2, metrics=[{"type": "Pods"}]),
        rules.AUTOSCALING_RANGE_RULE,
    ),
    (
        "model cache with a long name",
        lambda g: g.name("m" * 46).nats(deploy=False).model_cache(**CACHE),
        length_rule("download-{digest}", names.WITH_MODEL_CACHE),
    ),
    (
        "model cache without an image for its download",
        lambda g: gaie_without_image(g).spec(gaie={}).model_cache(**CACHE),
        rules.MODEL_CACHE_IMAGE_RULE,
    ),
    (
        "model cache beside a service named models",
        lambda g: g.model_cache(**CACHE).worker("models"),
        rules.MODELS_NAME_RULE,
    ),
    (
        "disruption budget of 0",
        lambda g: g.service("decode", disruptionBudget={"maxUnavailable": 0}),
        rules.MAX_UNAVAILABLE_RULE,
    ),
    (
        "disruption budget of 0%",
        lambda g: g.service("decode", disruptionBudget={"maxUnavailable": "0%"}),
        rules.MAX_UNAVAILABLE_RULE,
    ),
    (
        "disruption budget over 100%",
        lambda g: g.service("prefill", disruptionBudget={"maxUnavailable": "101%"}),
        rules.MAX_UNAVAILABLE_RULE,
    ),
    ("nats storage of 0", lambda g: g.nats(storageSize="0"), rules.NATS_STORAGE_RULE),
    ("nats storage of 0 as a number", lambda g: g.nats(storageSize=0), rules.NATS_STORAGE_RULE),
    ("nats storage of 0.0Gi", lambda g: g.nats(storageSize="0.0Gi"), rules.NATS_STORAGE_RULE),
    (
        "nats token that may be missing",
        lambda g: g.nats(tokenSecretRef={"name": "nats", "key": "token", "optional": True}),
        rules.NATS_TOKEN_OPTIONAL_RULE,
    ),
    (
        "nats token without the managed broker",
        lambda g: g.nats(deploy=False, tokenSecretRef={"name": "nats", "key": "token"}),
        rules.NATS_TOKEN_DEPLOY_RULE,
    ),
    (
        "peer with an ipBlock and a selector",
        lambda g: g.network_policy(serverFrom=[{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]),
        rules.PEER_RULE,
    ),
    ("peer that names nothing", lambda g: g.network_policy(metricsFrom=[{}]), rules.PEER_RULE),
    ("placement that places nothing", lambda g: g.placement(), rules.PLACEMENT_EMPTY_RULE),
    (
        "placement mode without a topology key",
        lambda g: g.placement(mode="Preferred", scheduler="Kueue", kueue={"queueName": "q"}),
        rules.PLACEMENT_MODE_RULE,
    ),
    ("Kueue without a queue", lambda g: g.placement(topologyKey="rack", scheduler="Kueue"), rules.PLACEMENT_KUEUE_RULE),
    (
        "a queue for the default scheduler",
        lambda g: g.placement(topologyKey="rack", kueue={"queueName": "q"}),
        rules.PLACEMENT_KUEUE_RULE,
    ),
    (
        "selector In without values",
        lambda g: g.network_policy(
            gatewayFrom=[{"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}]
        ),
        rules.SELECTOR_VALUES_RULE,
    ),
    (
        "selector Exists with values",
        lambda g: g.network_policy(
            serverFrom=[{"podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["b"]}]}}]
        ),
        rules.SELECTOR_VALUES_RULE,
    ),
]


@pytest.mark.parametrize(("change", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_admission_and_hook_reject_with_the_same_message(hooks, change: Change, message: str) -> None:
    assert cel_violations(ROOT, graph().obj()) == []
    obj = change(graph()).obj()
    assert cel_violations(ROOT, obj) == [message]
    status = hooks.sync(obj)["status"]
    assert status["state"] == "failed"
    assert message in status["message"]


def test_boundaries_are_accepted(hooks) -> None:
    """Exactly at each limit is fine, for admission and hook alike."""
    for obj in (graph().worker("w" * 55, args=["--model-path", "m"]).obj(), graph("n" * 47).obj()):
        assert cel_violations(ROOT, obj) == []
        assert hooks.sync(obj)["status"]["state"] == "initializing"
    assert cel_violations(ROOT, graph().worker("m" * 39, numberOfNodes=2).obj()) == []
    obj = graph("n" * 55).nats(deploy=False).obj()  # qwen...-prefill is exactly 63
    assert cel_violations(ROOT, obj) == []
    assert hooks.sync(obj)["status"]["state"] == "initializing"
    for length in (58, 49):  # <name>-pool and, under BlueGreen, <name>-pool-<generation> are exactly 63
        built = gaie_with_long_name(graph()).name("g" * length)
        built.args("a", "--model-path", "m").args("b", "--router-tokenizer-path", "t")
        if length == 49:
            built.blue_green()
        obj = built.obj()
        assert cel_violations(ROOT, obj) == []
        assert hooks.sync(obj)["status"]["state"] == "initializing"
    assert cel_violations(ROOT, graph().service("decode", numberOfNodes=2, replicas=names.MAX_GROUPS).obj()) == []


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
    obj = graph().worker(service, args=["--model-path", "m"]).obj()
    assert cel_violations(ROOT, obj) == []
    assert hooks.sync(obj)["status"]["state"] == "initializing"
