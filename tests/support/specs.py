"""Hypothesis strategies for InferaDeployment specs: valid ones, as the runtime's entry points
accept them, and valid ones with one field replaced by arbitrary JSON."""

import copy
from typing import Any

from hypothesis import strategies as st

from hooks.runtime import DIST_INIT_PORT, SGLANG_POD_PORTS
from tests.support.requests import parent, vllm_worker_args

# What a worker pod's other listeners bind by default (the KV plane, a prefill engine's
# bootstrap server, a group leader's rendezvous): a service port among them is a spec the hook
# rightly refuses, so a valid spec avoids them.
POD_PORTS = {*SGLANG_POD_PORTS.values(), DIST_INIT_PORT}

names = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True).filter(lambda n: n not in ("nats", "disc", "epp"))
quantities = st.sampled_from(["1", "500m", "1000m", "2", 4, "0.5", "1Gi", "1024Mi", "64Gi", "1.5Gi", "2000", "1e3"])
env_vars = st.lists(
    st.fixed_dictionaries(
        {"name": st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True)},
        optional={"value": st.text(max_size=8)},
    ),
    max_size=3,
)
label_values = st.from_regex(r"([a-z0-9]([-a-z0-9]{0,6}[a-z0-9])?)?", fullmatch=True)


def resources(component: str) -> st.SearchStrategy[dict[str, Any]]:
    optional = {"cpu": quantities, "memory": quantities, "sharedMemory": quantities}
    if component == "worker":  # a GPU on the router is invalid
        optional |= {"gpu": st.integers(0, 8), "gpuType": st.sampled_from(["amd.com/gpu", "nvidia.com/gpu"])}
    return st.fixed_dictionaries({}, optional=optional)


def service(component: str) -> st.SearchStrategy[dict[str, Any]]:
    optional: dict[str, st.SearchStrategy] = {
        "replicas": st.integers(0, 4),
        "port": st.integers(1024, 65535).filter(lambda port: port not in POD_PORTS),
        "image": st.sampled_from(["engine:v1", "example.com/engine:v2"]),
        "resources": resources(component),
        "args": st.lists(
            st.sampled_from(
                [["--tp-size", "2"], ["--drain-timeout", "45"], ["--drain-timeout=7.5"], ["--trust-remote-code"]]
            ),
            max_size=3,
        ).map(lambda groups: [arg for group in groups for arg in group]),
        "env": env_vars,
        "skipReadinessProbe": st.booleans(),
        "podLabels": st.dictionaries(
            st.sampled_from(["team", "infera.amd.com/tier", "rack"]), label_values, max_size=2
        ),
        "podAnnotations": st.dictionaries(
            st.sampled_from(["note", "infera.amd.com/owner"]), st.text(max_size=5), max_size=2
        ),
    }
    if component == "worker":
        optional["role"] = st.sampled_from(["mixed", "prefill", "decode"])
        optional["numberOfNodes"] = st.integers(1, 3)
    return st.fixed_dictionaries({"componentType": st.just(component)}, optional=optional)


@st.composite
def valid_specs(draw: st.DrawFn) -> dict[str, Any]:
    worker_names = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    server_names = draw(st.lists(names.filter(lambda n: n not in worker_names), max_size=2, unique=True))
    services = {name: draw(service("worker")) for name in worker_names}
    services |= {name: draw(service("server")) for name in server_names}
    spec: dict[str, Any] = {"image": "engine:v1", "services": services}
    spec |= draw(
        st.fixed_dictionaries(
            {},
            optional={
                "backendFramework": st.sampled_from(["sglang", "vllm"]),
                "nats": st.fixed_dictionaries({}, optional={"deploy": st.booleans(), "storageSize": quantities}),
                "envs": env_vars,
                "monitoring": st.fixed_dictionaries(
                    {},
                    optional={
                        "interval": st.sampled_from(["15s", "1m"]),
                        "natsExporter": st.fixed_dictionaries({"enabled": st.booleans()}),
                    },
                ),
            },
        )
    )
    if draw(st.booleans()):
        spec |= {"discoveryBackend": "etcd", "etcdEndpoint": "etcd:2379"}
    # What the runtime's entry points require (the hook refuses a spec without it).
    for svc in services.values():
        if svc["componentType"] == "server":
            required = ["--router-tokenizer-path", "Qwen/Qwen3-0.6B"]
        elif spec.get("backendFramework") == "vllm":
            required = vllm_worker_args(svc.get("role", "mixed"))
        else:
            required = ["--model-path", "Qwen/Qwen3-0.6B"]
        svc["args"] = required + svc.get("args", [])
    return spec


def idep(spec: dict[str, Any]) -> dict[str, Any]:
    return parent(
        {"apiVersion": "infera.amd.com/v1alpha1", "kind": "InferaDeployment", "metadata": {"name": "gen"}, "spec": spec}
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70000) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
SPEC_FIELDS = [
    "backendFramework",
    "image",
    "discoveryBackend",
    "etcdEndpoint",
    "nats",
    "gaie",
    "envs",
    "patches",
    "rollout",
    "monitoring",
]
SERVICE_FIELDS = [
    "componentType",
    "role",
    "replicas",
    "numberOfNodes",
    "port",
    "resources",
    "args",
    "env",
    "skipReadinessProbe",
    "extraPodSpec",
    "podLabels",
    "podAnnotations",
    "bogus",
]


@st.composite
def mutated_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid spec with one field replaced by arbitrary JSON (often, but not always, invalid)."""
    spec = copy.deepcopy(draw(valid_specs()))
    if draw(st.booleans()):
        spec[draw(st.sampled_from(SPEC_FIELDS))] = draw(JSON)
    else:
        target = spec["services"][draw(st.sampled_from(sorted(spec["services"])))]
        target[draw(st.sampled_from(SERVICE_FIELDS))] = draw(JSON)
    return spec


QUEUE_METRICS = [
    {
        "type": "Pods",
        "pods": {"metric": {"name": "sglang_num_queue_reqs"}, "target": {"type": "AverageValue", "averageValue": "4"}},
    }
]


def _named(letter: str, length: int) -> str:
    return letter + "x" * (length - 1)


@st.composite
def graphs_with_every_child(draw: st.DrawFn) -> dict[str, Any]:
    """InferaDeployments with any kind of child the hook makes, and names drawn up to and past
    the lengths hooks/api/names.py allows: every one either renders or is refused by a rule of
    that table."""
    blue_green, gaie, cache = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    length = draw(st.one_of(st.integers(1, 20), st.integers(35, 61)))
    service_length = st.one_of(st.integers(1, 8), st.integers(8, 62 - length) if length < 54 else st.just(1))
    services: dict[str, Any] = {}
    for letter in "vw"[: draw(st.integers(1, 2))]:
        worker = {"componentType": "worker", "args": ["--model-path", "Qwen/Qwen3-0.6B"]}
        worker |= draw(
            st.fixed_dictionaries(
                {"replicas": st.integers(0, 3), "numberOfNodes": st.integers(1, 3)},
                optional={
                    "autoscaling": st.fixed_dictionaries(
                        {"maxReplicas": st.sampled_from([2, 12, 10_000]), "metrics": st.just(QUEUE_METRICS)}
                    ),
                    "disruptionBudget": st.fixed_dictionaries({"enabled": st.booleans()}),
                },
            )
        )
        services[_named(letter, draw(service_length))] = worker
    servers = draw(st.integers(1 if blue_green and not gaie else 0, 2))
    for letter in "rs"[:servers]:
        server = {"componentType": "server", "args": ["--router-tokenizer-path", "Qwen/Qwen3-0.6B"]}
        services[_named(letter, draw(service_length))] = server | draw(
            st.fixed_dictionaries({"replicas": st.integers(1, 3)})
        )
    spec: dict[str, Any] = {"image": "engine:v1", "services": services}
    spec["nats"] = {"deploy": draw(st.booleans())}
    spec["networkPolicy"] = {"isolate": draw(st.sampled_from(["none", "broker", "graph"]))}
    if gaie:
        spec["gaie"] = {
            "enabled": True,
            "tokenizerPath": "Qwen/Qwen3-0.6B",
            "gatewayName": "gateway",
            "eppReplicas": draw(st.integers(1, 2)),
        }
    if blue_green:
        spec["rollout"] = {"strategy": "BlueGreen"}
    elif draw(st.booleans()):
        spec |= {"discoveryBackend": "etcd", "etcdEndpoint": "etcd:2379"}
    if cache:
        spec["modelCache"] = {"source": "hf://Qwen/Qwen3-0.6B", "size": "20Gi"}
    if draw(st.booleans()):
        spec["monitoring"] = {}
    return parent(
        {
            "apiVersion": "infera.amd.com/v1alpha1",
            "kind": "InferaDeployment",
            "metadata": {"name": _named("g", length)},
            "spec": spec,
        }
    )
