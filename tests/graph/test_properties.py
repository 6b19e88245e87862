"""Property-based tests over generated InferaDeployments, through the hook app.

- no input makes the hook answer 500;
- every invalid spec gets `failed` with a message and keeps what runs;
- every valid spec gets schema-valid children with unique kind/name pairs (checked by the
  client and the simulator), and once converged a further sync writes nothing.
"""

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.prerequisites import REPO
from tests.support.requests import controller, load_yaml, parent, request_body
from tests.support.simulator import Metacontroller
from tests.support.specs import JSON, idep, mutated_specs, valid_specs

SETTINGS = settings(max_examples=40)  # the rest from the "infera" profile (tests/conftest.py)


@SETTINGS
@given(spec=valid_specs())
def test_valid_specs_render_valid_children_and_converge(hooks, spec: dict[str, Any]) -> None:
    mc = Metacontroller(hooks, idep(spec), composite=controller("lws", "monitoring"))
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
