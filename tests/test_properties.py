"""Property-based tests over generated InferaDeployments, through the real service.

- no input makes the hook answer 500;
- every invalid spec gets `failed` with a message and keeps what runs;
- every valid spec gets schema-valid children with unique kind/name pairs (checked by the
  client and the simulator), and once converged a further sync writes nothing.
"""

import copy
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.prerequisites import REPO
from tests.support.requests import controller, load_yaml, parent, request_body, vllm_worker_args
from tests.support.simulator import Metacontroller

SETTINGS = settings(max_examples=40)  # the rest from the "infera" profile (tests/conftest.py)

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
        "port": st.integers(1024, 65535),
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


@SETTINGS
@given(spec=valid_specs())
def test_valid_specs_render_valid_children_and_converge(hooks, spec: dict[str, Any]) -> None:
    mc = Metacontroller(hooks, idep(spec), composite=controller("lws"))
    mc.converge()
    assert mc.parent["status"]["state"] == "pending" or not any(s.get("replicas", 1) for s in spec["services"].values())
    workloads = {
        ("LeaderWorkerSet" if svc.get("numberOfNodes", 1) > 1 else "Deployment", f"gen-{name}")
        for name, svc in spec["services"].items()
    }
    assert workloads <= set(mc.children)
    mc.mark_ready()
    mc.converge()
    assert mc.parent["status"]["state"] == "ready"
    assert mc.sync() == []


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70000) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
SPEC_FIELDS = ["backendFramework", "image", "discoveryBackend", "etcdEndpoint", "nats", "gaie", "envs", "patches"]
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


@SETTINGS
@given(spec=mutated_specs())
def test_mutated_specs_never_500_and_fail_loudly_keeping_children(hooks, spec: dict[str, Any]) -> None:
    good = Metacontroller(hooks, load_yaml(REPO / "examples" / "pd-disaggregated.yaml")[0])
    good.converge()
    observed = list(good.children.values())
    bad = parent(good.parent)
    bad["spec"] = spec
    reply = hooks.post("/sync", request_body(bad, observed))
    assert reply.status == 200, reply.body
    answer = reply.json
    status = answer["status"]
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    key = lambda child: (child["kind"], child["metadata"]["name"])  # noqa: E731
    kept = {
        key(c): json.loads(c["metadata"]["annotations"]["metacontroller.k8s.io/last-applied-configuration"])
        for c in observed
    }
    if conditions["SpecValid"]["status"] == "False":
        assert status["state"] == "failed" and status["message"].strip()
        assert sorted(answer["children"], key=key) == sorted(kept.values(), key=key)
    elif conditions["ChildKindsRegistered"]["status"] == "False":
        # The services that need an unregistered kind keep what they have, exactly.
        assert status["state"] == "failed" and status["message"].strip()
        answered = {key(c): c for c in answer["children"]}
        for withheld in status["message"].split("; "):
            if "cannot be created" in withheld:
                name = withheld.split(" ")[1]
                assert all(answered[k] == v for k, v in kept.items() if k[1] == name)
    else:
        hooks.hook("/sync", request_body(bad, []))  # validates every child against its schema


@SETTINGS
@given(body=JSON, parent_value=JSON, path=st.sampled_from(["/sync", "/finalize", "/customize"]))
def test_arbitrary_bodies_never_500(hooks, body: Any, parent_value: Any, path: str) -> None:
    candidates = (
        body,
        {"parent": parent_value},
        {"parent": {"metadata": {"name": "x"}, "spec": parent_value}},
        {"parent": {"metadata": {"name": "x"}}, "children": parent_value, "related": body},
    )
    for candidate in candidates:
        reply = hooks.post(path, candidate)
        assert reply.status in (200, 400), reply.body
        assert isinstance(reply.json, dict)
        if reply.status == 400:
            assert reply.json["error"]
        elif path == "/sync":
            assert reply.json["status"]["state"] in ("failed", "initializing", "pending")


@SETTINGS
@given(
    raw=st.binary(max_size=200),
    content_type=st.sampled_from(["application/json", "text/plain", "application/json; charset=utf-8", ""]),
    method=st.sampled_from(["POST", "PUT", "GET", "DELETE"]),
    path=st.sampled_from(["/sync", "/finalize", "/customize", "/x"]),
)
def test_arbitrary_bytes_never_500(hooks, raw: bytes, content_type: str, method: str, path: str) -> None:
    reply = hooks.request(method, path, raw if method != "GET" else None, content_type=content_type or None)
    assert reply.status in (200, 400, 404, 405, 415), reply.body
    assert isinstance(reply.json, dict)
