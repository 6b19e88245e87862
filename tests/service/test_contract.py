"""The Metacontroller wire contract and bad input, through the real service over HTTP."""

import http.client
import json
from pathlib import Path

import pytest

from hooks import reconcile
from hooks.contract import parse_request
from tests.support.graphs import graph
from tests.support.prerequisites import SHARED, need
from tests.support.requests import PD, observed_as_applied, parent, request_body
from tests.support.service import HookClient, start_server


def applied(child: dict) -> dict:
    """A child as Metacontroller stores it after applying it: server fields plus last-applied."""
    stored = json.loads(json.dumps(child))
    stored["metadata"].update(
        namespace="ml",
        uid="c4d5e6f7-0819-4a2b-bc3d-4e5f60718293",
        resourceVersion="48190",
        annotations={"metacontroller.k8s.io/last-applied-configuration": json.dumps(child)},
    )
    stored["status"] = {"replicas": 1, "readyReplicas": 0}
    return stored


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"{not json", "request body is not valid JSON"),
        (b"[]", "the request body must be a JSON object"),
        (b"{}", "'parent' is missing or not an object"),
        (b'{"parent": "qwen"}', "'parent' is missing or not an object"),
        (b'{"parent": {"spec": {}}}', "'parent.metadata.name' is missing"),
        (b'{"parent": {"metadata": {"name": "a"}}, "children": []}', "'children' must be an object"),
        (
            b'{"parent": {"metadata": {"name": "a"}}, "children": {"Deployment.apps/v1": {"x": 1}}}',
            "'children.Deployment.apps/v1.x' must be a Kubernetes object",
        ),
        (
            b'{"parent": {"metadata": {"name": "a"}}, "children": {"Deployment.apps/v1": {"x": {"metadata": {"name": "x"}}}}}',
            "'children.Deployment.apps/v1.x' must be a Kubernetes object: a kind, a name, labels and annotations of strings, "
            "spec and status objects",
        ),
        (b'{"parent": {"metadata": {"name": "a"}}, "finalizing": "yes"}', "'finalizing' must be a boolean"),
    ],
)
@pytest.mark.parametrize("path", ["/sync", "/finalize"])
def test_malformed_requests_get_400(hooks, path: str, body: bytes, error: str) -> None:
    reply = hooks.request("POST", path, body)
    assert reply.status == 400
    assert reply.headers["Content-Type"] == "application/json"
    assert reply.json["error"].startswith(error)


def test_wrong_method_content_type_and_size(hooks) -> None:
    reply = hooks.request("GET", "/sync")
    assert (reply.status, reply.headers["Allow"]) == (405, "OPTIONS, POST")
    assert "error" in reply.json
    assert hooks.request("GET", "/nowhere").status == 404
    reply = hooks.request("POST", "/sync", b"parent=x", content_type="application/x-www-form-urlencoded")
    assert reply.status == 415 and "application/json" in reply.json["error"]


def post_declared_size(url: str, size: int) -> int:
    """Announce a body of `size` bytes and return the status the server answers with."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.putrequest("POST", "/sync")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(size))
    connection.endheaders()
    response = connection.getresponse()
    assert "error" in json.loads(response.read())
    connection.close()
    return response.status


def test_oversized_body_is_refused_and_service_keeps_serving(hooks, hook_url: str) -> None:
    assert post_declared_size(hook_url, 16 * 1024 * 1024 + 1) == 413
    assert hooks.request("GET", "/healthz").status == 200
    assert hooks.sync(parent(PD))["status"]["state"] == "initializing"


def test_body_limit_is_configurable(tmp_path) -> None:
    with start_server(tmp_path, "--max-request-bytes", "2048") as url:
        assert post_declared_size(url, 2049) == 413
        small = HookClient(url).post("/sync", request_body(parent(PD)))
        assert small.status == 413  # the PD request itself is larger than 2 KiB
        assert HookClient(url).post("/sync", {"parent": {"metadata": {"name": "a"}}}).status == 200


def test_health_endpoints(hooks) -> None:
    assert hooks.request("GET", "/healthz").json == {"status": "ok"}
    assert hooks.request("GET", "/readyz").json == {"status": "ready"}


def test_answer_has_only_status_and_children(hooks) -> None:
    answer = hooks.sync(parent(PD))
    assert set(answer) == {"status", "children"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"backendFramework": "tensorrt"}, "spec.backendFramework: Input should be 'sglang' or 'vllm'"),
        ({"discoveryBackend": "etcd"}, "spec: etcdEndpoint is required when discoveryBackend is etcd"),
        ({"services": {"server": {"componentType": "server", "image": "x"}}}, "at least one worker"),
        (
            {"services": {"Decode": {"componentType": "worker", "image": "x"}}},
            "spec.services: service name 'Decode' must be a DNS label",
        ),
        (
            {"services": {"decode": {"componentType": "worker", "replicas": -1, "image": "x"}}},
            "spec.services.decode.replicas: Input should be greater than or equal to 0",
        ),
        (
            {"services": {"decode": {"componentType": "worker", "image": "x", "resources": {"memory": "lots"}}}},
            "spec.services.decode.resources.memory: 'lots' is not a Kubernetes quantity",
        ),
        (
            {"image": None},
            "spec: every service needs an image: set spec.image or services.<name>.image (services.server has none)",
        ),
        ({"unknownField": 1}, "spec.unknownField: unknown field"),
        ({"imag": "x"}, "spec.imag: unknown field; did you mean image?"),
    ],
)
def test_bad_spec_fails_in_status_and_keeps_every_child(hooks, change: dict, message: str) -> None:
    good = parent(PD)
    observed = [applied(child) for child in hooks.sync(good)["children"]]
    bad = parent(PD)
    bad["spec"].update(change)
    bad["spec"] = {k: v for k, v in bad["spec"].items() if v is not None}
    answer = hooks.sync(bad, observed)
    assert answer["status"]["state"] == "failed"
    assert message in answer["status"]["message"]
    spec_valid = next(c for c in answer["status"]["conditions"] if c["type"] == "SpecValid")
    assert (spec_valid["status"], spec_valid["reason"]) == ("False", "InvalidSpec")
    assert message in spec_valid["message"]
    # Exactly what was last applied comes back: Metacontroller changes and deletes nothing.
    kept = [
        json.loads(c["metadata"]["annotations"]["metacontroller.k8s.io/last-applied-configuration"]) for c in observed
    ]
    key = lambda child: (child["kind"], child["metadata"]["name"])  # noqa: E731
    assert sorted(answer["children"], key=key) == sorted(kept, key=key)


def test_child_without_last_applied_is_kept_without_server_fields(hooks) -> None:
    bad = parent(PD)
    bad["spec"]["backendFramework"] = "tensorrt"
    adopted = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": "qwen-pd-disc",
            "namespace": "ml",
            "uid": "u",
            "resourceVersion": "9",
            "labels": {"a": "b"},
        },
        "secrets": [{"name": "token"}],
    }
    answer = hooks.sync(bad, [adopted])
    assert answer["children"] == [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "qwen-pd-disc", "namespace": "ml", "labels": {"a": "b"}},
            "secrets": [{"name": "token"}],
        }
    ]


def test_metacontroller_sample_envelopes_parse(hooks) -> None:
    """The envelope exactly as Metacontroller v4.17 serialises it, with our parent inside."""
    samples = SHARED / "metacontroller"
    need(
        samples.is_dir(),
        f"Metacontroller's example hook bodies are not at {samples}: they come with the project's reference "
        "folder (set INFERA_SHARED_DIR to it), not from an upstream release",
    )
    for name, path in (("sync_request_v2.json", "/sync"), ("finalize_request_v2.json", "/finalize")):
        body = json.loads(Path(samples / name).read_text())
        body["parent"] = parent(PD) | {"metadata": body["parent"]["metadata"]}
        answer = hooks.hook(path, body)
        if path == "/sync":
            # The sample controller registers only Deployments and Services: the NATS broker and
            # the discovery identity are withheld (with a reason), the rest is rendered, and the
            # sample's own observed Deployment llama-server, whose selector is not ours and
            # cannot change in place, is let go to be created anew on the next sync.
            assert sorted((c["kind"], c["metadata"]["name"]) for c in answer["children"]) == [
                ("Deployment", "llama-decode"),
                ("Deployment", "llama-prefill"),
                ("Service", "llama-server"),
            ]
            assert answer["status"]["state"] == "failed"
            assert "Deployment llama-server is being replaced: the selector changed" in answer["status"]["message"]
            for kind in (
                "StatefulSet llama-nats",
                "ServiceAccount llama-disc",
                "Role llama-disc",
                "RoleBinding llama-disc",
            ):
                assert (
                    f"{kind} cannot be created: this CompositeController does not register"
                    in answer["status"]["message"]
                )
        else:
            assert answer == {
                "status": {"state": "terminating", "message": "all children deleted"},
                "children": [],
                "finalized": True,
            }


def test_immutable_claim_template_is_kept_and_reported(hooks) -> None:
    observed = [applied(child) for child in hooks.sync(parent(PD))["children"]]
    obj = graph().nats(deploy=True, storageSize="20Gi").obj()
    answer = hooks.sync(obj, observed)
    (statefulset,) = [c for c in answer["children"] if c["kind"] == "StatefulSet"]
    claim = statefulset["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "4Gi"
    assert answer["status"]["message"].endswith(
        "nats.storageSize/storageClassName change not applied to StatefulSet qwen-pd-nats: "
        "spec.volumeClaimTemplates is immutable (delete the StatefulSet to recreate it)"
    )
    # A new graph gets the new size.
    assert "20Gi" in str(hooks.sync(obj)["children"])


def test_nesting_too_deep_to_encode_is_a_bad_request(hooks: HookClient) -> None:
    """orjson decodes 1,024 levels, the standard library encodes about 990 in a gunicorn worker:
    a child's status in between gets the 400 a too-deep body always got, not a 500. Over HTTP,
    since the depth left depends on the server's stack."""
    observed = observed_as_applied(reconcile.sync(parse_request(request_body(parent(PD))))["children"], {}, 2)
    body = json.dumps(request_body(parent(PD), observed))
    deep = "[" * 1000 + "]" * 1000
    body = body.replace('"status": {}', f'"status": {{"x": {deep}}}', 1)
    reply = hooks.request("POST", "/sync", body.encode())
    assert (reply.status, reply.json) == (400, {"error": "request body is nested too deeply"})
