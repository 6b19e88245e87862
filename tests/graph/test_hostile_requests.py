"""Whatever a request body holds, the hooks answer 200 or 400, never 500: a wrong shape is
either the request's fault (400, naming it) or the spec's (`failed`, naming the field)."""

import copy
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from hooks.app import create_app
from tests.support.graphs import graph
from tests.support.prerequisites import REPO
from tests.support.requests import parent
from tests.support.service import HookClient, InProcessClient
from tests.support.simulator import Metacontroller

MOONCAKE = REPO / "examples" / "pd-1p1d-mooncake.yaml"  # extraPodSpec on every service
WRONG_VALUES = [None, [], {}, "x", 5, True, -1, 1e308, {"a": []}, [{}], "\ud800"]


@pytest.fixture(scope="module")
def converged_requests() -> tuple[InProcessClient, dict[str, dict]]:
    hooks = InProcessClient(create_app())
    obj = (
        graph(source=MOONCAKE)
        .patch("Deployment", "qwen-1p1d-server", {"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}})
        .obj()
    )
    mc = Metacontroller(hooks, obj)
    mc.converge()
    mc.mark_ready()
    mc.converge()
    return hooks, {"/sync": mc.body(), "/customize": mc.body(), "/finalize": mc.body(finalizing=True)}


def paths(node: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node[:2]) if isinstance(node, list) else ()
    for key, value in items:
        yield from paths(value, (*prefix, key))


def mutated(body: dict, path: tuple, value: Any) -> dict:
    out = copy.deepcopy(body)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def test_a_wrong_value_anywhere_in_a_request_never_answers_500(converged_requests) -> None:
    hooks, bodies = converged_requests
    rng = random.Random(12)
    cases = [
        (hook, path, value) for hook, body in bodies.items() for path in paths(body) if path for value in WRONG_VALUES
    ]
    failures = []
    for hook, path, value in rng.sample(cases, 3000):
        reply = hooks.post(hook, mutated(bodies[hook], path, value))
        text = reply.body.decode(errors="replace")
        if reply.status not in (200, 400) or "internal error" in text:
            failures.append(f"{hook} {'.'.join(map(str, path))} = {value!r}: {reply.status} {text[:200]}")
    assert failures == []


def test_every_path_of_the_spec_with_every_wrong_value(converged_requests) -> None:
    hooks, bodies = converged_requests
    spec_only = {"parent": bodies["/sync"]["parent"], "children": {}}
    failures = []
    for path in paths(spec_only["parent"]["spec"], ("parent", "spec")):
        for value in WRONG_VALUES:
            if len(path) > 2:
                reply = hooks.post("/sync", mutated(spec_only, path, value))
                text = reply.body.decode(errors="replace")
                if reply.status not in (200, 400) or "internal error" in text:
                    failures.append(f"{'.'.join(map(str, path))} = {value!r}: {reply.status} {text[:200]}")
    assert failures == []


SURROGATE = "holds a lone UTF-16 surrogate escape (\\ud800-\\udfff), which is not text"
BAD_REQUESTS = {
    "a lone surrogate in a value": (
        b'{"parent": {"metadata": {"name": "x"}, "spec": {"image": "\\ud800"}}}',
        f"parent.spec.image {SURROGATE}",
    ),
    "a lone surrogate in a key": (b'{"parent": {"metadata": {"\\udc00": 1}}}', f"parent.metadata.\\udc00 {SURROGATE}"),
    "observed labels that are not an object": (
        json.dumps(
            {
                "parent": {"metadata": {"name": "x"}},
                "children": {"Service.v1": {"ml/x": {"kind": "Service", "metadata": {"name": "x", "labels": "x"}}}},
            }
        ).encode(),
        "'children.Service.v1.ml/x' must be a Kubernetes object: a kind, a name, labels and annotations of strings, "
        "spec and status objects",
    ),
}


@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_bodies_that_are_not_hook_requests_get_400_naming_why(hooks: HookClient, case: str) -> None:
    body, error = BAD_REQUESTS[case]
    reply = hooks.request("POST", "/sync", body)
    assert (reply.status, reply.json) == (400, {"error": error})


def test_a_valid_surrogate_pair_is_text(hooks: HookClient) -> None:
    body = json.dumps({"parent": parent(MOONCAKE), "children": {}}).replace('"image": "', '"image": "\\ud83d\\ude00', 1)
    reply = hooks.request("POST", "/sync", body.encode())
    assert reply.status == 200
    images = {
        c["spec"]["template"]["spec"]["containers"][0]["image"]
        for c in reply.json["children"]
        if c["kind"] == "Deployment"
    }
    assert "\U0001f600" in "".join(images)  # one character again once the answer is decoded


STRANGE_BUT_ANSWERABLE = {
    "controller spec that is not an object": lambda body: body["controller"].update(spec="x"),
    "childResources entry with a list apiVersion": lambda body: body["controller"]["spec"]["childResources"][0].update(
        apiVersion=[]
    ),
    "parent conditions that are not a list": lambda body: body["parent"].setdefault("status", {}).update(conditions=5),
}


@pytest.mark.parametrize("case", STRANGE_BUT_ANSWERABLE)
def test_odd_but_harmless_shapes_are_answered(converged_requests, case: str) -> None:
    hooks, bodies = converged_requests
    body = copy.deepcopy(bodies["/sync"])
    STRANGE_BUT_ANSWERABLE[case](body)
    reply = hooks.post("/sync", body)
    assert reply.status == 200, reply.body.decode(errors="replace")
    assert "internal error" not in reply.json["status"]["message"]


def test_a_wrong_type_in_extra_pod_spec_names_the_field(converged_requests) -> None:
    hooks, bodies = converged_requests
    body = mutated(
        bodies["/sync"], ("parent", "spec", "services", "server", "extraPodSpec", "containers", 0, "name"), []
    )
    status = hooks.post("/sync", body).json["status"]
    assert status["state"] == "failed"
    assert status["message"] == "spec.services.server.extraPodSpec.containers[0].name: must be string"


def test_a_lone_surrogate_inside_an_observed_annotation_is_answered(converged_requests) -> None:
    from hooks.contract import LAST_APPLIED_ANNOTATION

    hooks, bodies = converged_requests
    body = copy.deepcopy(bodies["/sync"])
    body["parent"]["spec"]["backendFramework"] = "tensorrt"  # invalid: observed children are returned as last applied
    service = next(iter(body["children"]["Service.v1"].values()))
    service["metadata"]["annotations"][LAST_APPLIED_ANNOTATION] = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": service["metadata"]["name"]},
            "spec": {"x": "\ud800"},
        }
    )
    reply = hooks.post("/sync", body)
    assert reply.status == 200
    assert reply.json["status"]["state"] == "failed"
