"""extraPodSpec both ways (full template, partial overlay) and the upstream operator's corpus."""

import copy
import shlex
from typing import Any

import pytest

from tests.support.graphs import GraphBuilder, graph
from tests.support.prerequisites import need_schemas, need_upstream
from tests.support.requests import (
    PD,
    children_by_key,
    controller,
    parent,
    request_body,
    upstream_corpus,
    vllm_worker_args,
)
from tests.support.schemas import KUBERNETES_VERSION, definition
from tests.support.simulator import Metacontroller

IDENTITY = ["POD_NAME", "POD_NAMESPACE", "POD_IP"]


def pd_with(service: str, extra: dict[str, Any], **fields: Any) -> GraphBuilder:
    """The PD graph whose `service` has extraPodSpec `extra` (and `fields`)."""
    return graph().service(service, extraPodSpec=extra, **fields)


def pod(answer: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in answer["children"] if c["metadata"]["name"] == name and c["kind"] == "Deployment"]
    return found["spec"]["template"]


FULL_WORKER = {
    "hostNetwork": True,
    "dnsPolicy": "ClusterFirstWithHostNet",
    "imagePullSecrets": [{"name": "regcred"}],
    "nodeSelector": {"kubernetes.io/hostname": "node-a"},
    "containers": [
        {
            "name": "main",
            "image": "vendor/sglang:v1",
            "command": [
                "python3",
                "-m",
                "infera.engine.sglang",
                "--host",
                "0.0.0.0",
                "--port",
                "30000",
                "--model-path",
                "/models/q",
                "--disaggregation-mode",
                "decode",
            ],
            "env": [
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "SGLANG_USE_AITER", "value": 1},
                {"name": "EMPTY", "value": ""},
            ],
            "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
            "resources": {
                "requests": {"cpu": "16000m", "memory": "64Gi", "amd.com/gpu": 1},
                "limits": {"cpu": "16", "memory": "64Gi", "amd.com/gpu": 1},
            },
            "volumeMounts": [{"name": "model", "mountPath": "/models", "readOnly": True}],
        }
    ],
    "volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": "models"}}],
    "terminationGracePeriodSeconds": 30,
}


def test_full_template_is_the_pod_completed_by_the_operator(hooks) -> None:
    template = pod(hooks.sync(pd_with("decode", FULL_WORKER).obj()), "qwen-pd-decode")
    spec = template["spec"]
    (main,) = spec["containers"]
    user = FULL_WORKER["containers"][0]
    # The user's command, image and resources (in stored form), and no injected flags.
    assert main["command"] == user["command"] and main["image"] == "vendor/sglang:v1"
    assert "args" in main  # the service's flat args still follow the template command
    assert main["resources"] == {
        "requests": {"cpu": "16", "memory": "64Gi", "amd.com/gpu": "1"},
        "limits": {"cpu": "16", "memory": "64Gi", "amd.com/gpu": "1"},
    }
    # Template env first; operator env added without duplicating a name it already sets.
    names = [v["name"] for v in main["env"]]
    assert names[:3] == ["POD_IP", "SGLANG_USE_AITER", "EMPTY"] and names.count("POD_IP") == 1
    assert set(IDENTITY + ["NATS_SERVER"]) <= set(names)
    assert main["env"][1] == {"name": "SGLANG_USE_AITER", "value": "1"} and main["env"][2] == {"name": "EMPTY"}
    # Operator additions the template leaves out.
    assert main["ports"] == [{"name": "http", "containerPort": 30000, "protocol": "TCP"}]
    assert [main[probe]["httpGet"]["path"] for probe in ("startupProbe", "livenessProbe", "readinessProbe")] == [
        "/health"
    ] * 3
    assert main["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", "15"]}}}
    # The template's capabilities on top of the operator's worker defaults.
    assert main["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK", "SYS_PTRACE", "SYS_RESOURCE"]},  # rdma: true
    }
    assert spec["serviceAccountName"] == "qwen-pd-register"
    assert spec["terminationGracePeriodSeconds"] == 120  # raised to cover the drain, never lowered
    # The template's pod-level fields and volumes; /dev/shm from the flat sharedMemory is kept.
    for field in ("hostNetwork", "dnsPolicy", "imagePullSecrets", "nodeSelector"):
        assert spec[field] == FULL_WORKER[field]
    assert [v["name"] for v in spec["volumes"]] == ["model", "dshm"]
    assert [m["mountPath"] for m in main["volumeMounts"]] == ["/models", "/dev/shm"]
    assert template["metadata"]["labels"]["infera.amd.com/service"] == "decode"


def test_template_wins_on_clashes(hooks) -> None:
    extra = copy.deepcopy(FULL_WORKER)
    main = extra["containers"][0]
    main["readinessProbe"] = {"tcpSocket": {"port": 30000}}
    main["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", "30"]}}}
    main["ports"] = [{"name": "http", "containerPort": 31000}]
    main["volumeMounts"].append({"name": "shm", "mountPath": "/dev/shm"})
    extra["volumes"].append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16384Mi"}})
    extra["serviceAccountName"] = "custom"
    extra["terminationGracePeriodSeconds"] = 900
    main["command"] = main["command"] + ["--drain-timeout", "600"]
    spec = pod(hooks.sync(pd_with("decode", extra).obj()), "qwen-pd-decode")["spec"]
    (merged,) = spec["containers"]
    assert merged["readinessProbe"] == {"tcpSocket": {"port": 30000}}
    assert merged["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "30"]
    assert merged["ports"] == [{"name": "http", "containerPort": 31000}]
    # The template's /dev/shm replaces the operator's, whose volume is dropped.
    assert [m["name"] for m in merged["volumeMounts"]] == ["model", "shm"]
    assert spec["volumes"] == [
        extra["volumes"][0],
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
    ]
    assert spec["serviceAccountName"] == "custom"
    assert spec["terminationGracePeriodSeconds"] == 900
    extra["terminationGracePeriodSeconds"] = 60
    spec = pod(hooks.sync(pd_with("decode", extra).obj()), "qwen-pd-decode")["spec"]
    assert spec["terminationGracePeriodSeconds"] == 665  # the template's 600 s drain needs more


def test_template_port_names_handlers_and_gpu_counts(hooks) -> None:
    """A template may name the port differently, use another preStop handler, or ask for more
    GPUs than the flat fields: the pod must still be valid and its probe and Service work."""
    extra = {
        "containers": [
            {
                "name": "main",
                "ports": [{"name": "engine", "containerPort": 30000}],
                "lifecycle": {"preStop": {"httpGet": {"path": "/drain", "port": 30000}}},
                "resources": {"limits": {"amd.com/gpu": 2}},
            }
        ]
    }
    obj = (
        pd_with("decode", extra)
        .extra_pod_spec("server", containers=[{"name": "main", "ports": [{"name": "api", "containerPort": 8000}]}])
        .obj()
    )
    answer = hooks.sync(obj)
    (main,) = pod(answer, "qwen-pd-decode")["spec"]["containers"]
    assert main["ports"] == [{"name": "engine", "containerPort": 30000}]
    assert main["readinessProbe"]["httpGet"]["port"] == 30000  # by number, whatever the name
    assert main["lifecycle"] == {"preStop": {"httpGet": {"path": "/drain", "port": 30000}}}  # one handler
    assert main["resources"]["requests"]["amd.com/gpu"] == main["resources"]["limits"]["amd.com/gpu"] == "2"
    (service,) = [c for c in answer["children"] if c["kind"] == "Service" and c["metadata"]["name"] == "qwen-pd-server"]
    assert service["spec"]["ports"][0]["targetPort"] == 8000


def test_partial_overlay_keeps_the_flat_fields(hooks) -> None:
    extra = {
        "nodeSelector": {"gpu.amd.com/family": "mi300x"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "main", "volumeMounts": [{"name": "model", "mountPath": "/models"}]}],
        "volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": "models"}}],
    }
    answer = hooks.sync(pd_with("prefill", extra).obj())
    spec = pod(answer, "qwen-pd-prefill")["spec"]
    baseline = pod(hooks.sync(parent(PD)), "qwen-pd-prefill")["spec"]
    (main,) = spec["containers"]
    (flat,) = baseline["containers"]
    for field in ("command", "args", "image", "resources", "env", "readinessProbe", "lifecycle", "ports"):
        assert main[field] == flat[field], field
    assert [m["mountPath"] for m in main["volumeMounts"]] == ["/models", "/dev/shm"]
    assert [v["name"] for v in spec["volumes"]] == ["model", "dshm"]
    assert spec["nodeSelector"] == extra["nodeSelector"] and spec["tolerations"] == extra["tolerations"]
    assert spec["terminationGracePeriodSeconds"] == baseline["terminationGracePeriodSeconds"]


def test_primary_is_main_or_infera_else_first(hooks) -> None:
    extra = {
        "containers": [
            {"name": "log-shipper", "image": "fluent-bit:3"},
            {"name": "infera", "env": [{"name": "X", "value": "y"}]},
        ]
    }
    spec = pod(hooks.sync(pd_with("prefill", extra).obj()), "qwen-pd-prefill")["spec"]
    assert [c["name"] for c in spec["containers"]] == ["log-shipper", "infera"]
    assert spec["containers"][0] == {"name": "log-shipper", "image": "fluent-bit:3"}
    assert spec["containers"][1]["command"][:3] == ["python3", "-m", "infera.engine.sglang"]
    extra = {"containers": [{"name": "engine", "image": "vendor/engine:v3"}]}
    (only,) = pod(hooks.sync(pd_with("prefill", extra).obj()), "qwen-pd-prefill")["spec"]["containers"]
    assert only["name"] == "engine" and only["image"] == "vendor/engine:v3"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"containers": "main"}, "spec.services.prefill.extraPodSpec.containers must be a list of objects"),
        ({"volumes": [1]}, "spec.services.prefill.extraPodSpec.volumes must be a list of objects"),
        (
            {"containers": [{"name": "main", "resources": {"limits": {"memory": "lots"}}}]},
            "spec.services.prefill.extraPodSpec.containers[0].resources.limits.memory: 'lots' is not a Kubernetes quantity",
        ),
        # The API server would drop an unknown field, and Metacontroller re-apply it on every sync.
        (
            {"nodeSelecter": {"a": "b"}, "": 1},
            "spec.services.prefill.extraPodSpec: '', 'nodeSelecter' are not fields of a Kubernetes PodSpec",
        ),
        (
            {"containers": [{"name": "main", "imagePullPolcy": "Always"}]},
            "spec.services.prefill.extraPodSpec.containers[0]: 'imagePullPolcy' is not a field of a Kubernetes Container",
        ),
        (
            {"containers": [{"image": "x"}, {"image": "sidecar"}]},
            "spec.services.prefill.extraPodSpec.containers[1] needs a name",
        ),
        ({"initContainers": [{"image": "x"}]}, "spec.services.prefill.extraPodSpec.initContainers[0] needs a name"),
        ({"volumes": [{"emptyDir": {}}]}, "spec.services.prefill.extraPodSpec.volumes[0] needs a name"),
    ],
)
def test_malformed_templates_fail_and_keep_children(hooks, extra: dict, message: str) -> None:
    status = hooks.sync(pd_with("prefill", extra).obj())["status"]
    assert status["state"] == "failed"
    assert status["message"].startswith(message), status["message"]


def test_template_fields_are_kubernetes_1_33s() -> None:
    from hooks.renderers.overlay import CONTAINER_FIELDS, POD_FIELDS

    assert POD_FIELDS == set(definition("podspec-v1", KUBERNETES_VERSION)["properties"])
    assert CONTAINER_FIELDS == set(definition("container-v1", KUBERNETES_VERSION)["properties"])


def test_null_template_fields_are_absent_fields(hooks) -> None:
    """As the API server stores them, so nothing is re-applied."""
    extra = {"hostNetwork": None, "containers": [{"name": "main", "workingDir": None, "image": "vendor/x:v1"}]}
    spec = pod(hooks.sync(pd_with("prefill", extra).obj()), "qwen-pd-prefill")["spec"]
    assert "hostNetwork" not in spec and "workingDir" not in spec["containers"][0]
    assert spec["containers"][0]["name"] == "main" and spec["containers"][0]["image"] == "vendor/x:v1"


def test_template_image_satisfies_the_image_rule(hooks) -> None:
    templated = graph().image(None)
    for name in ("server", "prefill", "decode"):
        templated.extra_pod_spec(name, containers=[{"name": "main", "image": f"vendor/{name}:v1"}])
    assert hooks.sync(templated.obj())["status"]["state"] == "initializing"
    status = hooks.sync(templated.extra_pod_spec("decode", nodeSelector={"a": "b"}).obj())["status"]
    assert status["state"] == "failed" and "services.decode has none" in status["message"]


def test_full_template_converges_without_churn(hooks) -> None:
    mc = Metacontroller(hooks, pd_with("decode", FULL_WORKER).obj())
    mc.converge()
    mc.mark_ready()
    mc.converge()
    assert mc.parent["status"]["state"] == "ready"
    assert mc.sync() == []


# --- the upstream operator's corpus ---------------------------------------------------------


def corpus() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{path}:{doc['metadata']['name']}", doc) for path, doc in upstream_corpus()]


CORPUS = corpus()
# Without the corpus, one placeholder case that skips naming what is missing.
CASES = CORPUS or [("(upstream corpus missing)", {})]


def test_corpus_is_present() -> None:
    need_upstream()
    assert len(CORPUS) == 14


@pytest.mark.parametrize(("name", "doc"), CASES, ids=[name for name, _ in CASES])
def test_upstream_inferadeployment_renders_and_keeps_its_template(hooks, name: str, doc: dict[str, Any]) -> None:
    need_upstream()
    need_schemas()
    answer = hooks.sync(parent(copy.deepcopy(doc)))  # every child validated against its schema
    assert answer["status"]["state"] == "initializing", answer["status"]
    rendered = children_by_key(answer)
    idep = doc["metadata"]["name"]
    for service, svc in doc["spec"]["services"].items():
        extra = svc.get("extraPodSpec")
        if not extra:
            continue
        workload = (
            rendered.get(("Deployment", f"{idep}-{service}")) or rendered[("LeaderWorkerSet", f"{idep}-{service}")]
        )
        templates = (
            [workload["spec"]["template"]]
            if workload["kind"] == "Deployment"
            else [workload["spec"]["leaderWorkerTemplate"][rank] for rank in ("leaderTemplate", "workerTemplate")]
        )
        for template in templates:
            spec = template["spec"]
            for field in (
                "nodeSelector",
                "hostNetwork",
                "affinity",
                "tolerations",
                "imagePullSecrets",
                "initContainers",
            ):
                if field in extra:
                    assert spec[field] == extra[field], (service, field)
            names = [v["name"] for v in spec.get("volumes", [])]
            assert [v["name"] for v in extra.get("volumes", [])] == names[: len(extra.get("volumes", []))]
            user = extra["containers"][0]
            (main,) = [c for c in spec["containers"] if c["name"] == user["name"]]
            for field in ("command", "image"):
                if field in user:
                    assert main[field] == user[field], (service, field)
            # Laid key by key over the operator's; privileged drops the escalation default.
            context = user.get("securityContext", {})
            expected: dict[str, Any] = {"allowPrivilegeEscalation": False}
            if svc["componentType"] == "server":
                expected |= {
                    "readOnlyRootFilesystem": True,
                    "runAsNonRoot": True,
                    "runAsUser": 65532,
                    "runAsGroup": 65532,
                }
            expected |= context
            expected["capabilities"] = {"drop": ["ALL"], **context.get("capabilities", {})}
            if context.get("privileged"):
                del expected["allowPrivilegeEscalation"]
            assert main["securityContext"] == expected, service


@pytest.mark.parametrize(("name", "doc"), CASES, ids=[name for name, _ in CASES])
def test_upstream_inferadeployment_converges(hooks, name: str, doc: dict[str, Any]) -> None:
    need_upstream()
    need_schemas()
    mc = Metacontroller(hooks, copy.deepcopy(doc))
    mc.converge()
    mc.mark_ready()
    mc.gateway_accepts()
    mc.converge()
    assert mc.parent["status"]["state"] == "ready", mc.parent["status"]
    assert mc.sync() == []


# --- a template's command is checked as the runtime will read it -----------------------------

SGLANG = ["python3", "-m", "infera.engine.sglang", "--host", "0.0.0.0", "--port", "30000", "--model-path", "/models/q"]


@pytest.mark.parametrize(
    ("spec", "command", "message"),
    [
        (
            {"discoveryBackend": "etcd", "etcdEndpoint": "etcd:2379"},
            SGLANG,
            "spec.services.prefill: the command discovers through kubernetes, but discoveryBackend is etcd: pass "
            "--discovery-backend etcd --etcd-endpoint etcd:2379",
        ),
        (
            {"discoveryBackend": "etcd", "etcdEndpoint": "etcd:2379"},
            [*SGLANG, "--discovery-backend", "etcd", "--etcd-endpoint", "e:1"],
            "spec.services.prefill: under etcd discovery a worker registers its --host (0.0.0.0) unless told otherwise: "
            "pass --advertise-host $(POD_IP)",
        ),
        (
            {"nats": {"deploy": False}},
            SGLANG,
            "spec.services.prefill: the command uses NATS (--request-transport nats, --kv-event-transport nats, the runtime's "
            "defaults unless set) but nats.deploy is false and it names no broker",
        ),
        (
            {"nats": {"deploy": False}},
            [*SGLANG, "--request-transport", "http"],
            "spec.services.prefill: the command uses NATS (--kv-event-transport nats",
        ),
        (
            {},
            ["python3", "-m", "infera.engine.sglang", "--host", "0.0.0.0", "--port", "8080", "--model-path", "/m"],
            "spec.services.prefill: the command listens on port 8080, but the service's port is 30000: "
            "set spec.services.prefill.port to 8080",
        ),
        (
            {},
            ["python3", "-m", "infera.engine.sglang", "--host", "0.0.0.0"],
            "spec.services.prefill: infera.engine.sglang requires --model-path",
        ),
    ],
    ids=["etcd-backend", "etcd-advertise", "nats-off", "nats-off-kv-events", "port", "model"],
)
def test_template_commands_must_work_in_their_graph(hooks, spec: dict, command: list[str], message: str) -> None:
    obj = (
        pd_with(
            "prefill", {"containers": [{"name": "main", "command": command}]}, args=["--disaggregation-mode", "prefill"]
        )
        .spec(**spec)
        .obj()
    )
    status = hooks.sync(obj)["status"]
    assert status["state"] == "failed" and status["message"].startswith(message), status["message"]


def test_a_template_that_says_it_all_is_accepted(hooks) -> None:
    """etcd, no managed NATS but a broker of its own, a port of its own, the role, in `sh -c`."""
    script = (
        "exec python3 -m infera.engine.sglang --host 0.0.0.0 --port 31000 --model-path /m --disaggregation-mode "
        "prefill --disaggregation-transfer-backend mori --discovery-backend etcd --etcd-endpoint e:1 "
        "--advertise-host $POD_IP --nats-server nats://nats.shared:4222 --kv-event-transport zmq"
    )
    template = {"containers": [{"name": "main", "command": ["/bin/sh", "-c", script]}]}
    obj = pd_with("prefill", template, port=31000, args=None).discovery("etcd", "e:1").nats(deploy=False).obj()
    spec = pod(hooks.sync(obj), "qwen-pd-prefill")["spec"]
    assert spec["containers"][0]["readinessProbe"]["httpGet"]["port"] == 31000


def test_a_missing_disaggregation_mode_says_what_to_add(hooks) -> None:
    obj = pd_with("decode", {"containers": [{"name": "main", "command": SGLANG}]}, args=["--tp-size", "1"]).obj()
    status = hooks.sync(obj)["status"]
    assert (
        "spec.services.decode: the command has no --disaggregation-mode, so the worker would serve as a mixed one: "
        "add --disaggregation-mode decode" in status["message"]
    )


def worker_template(command: list[str], **container: Any) -> dict[str, Any]:
    return {"containers": [{"name": "main", "command": command, **container}]}


SGLANG_PREFILL = [*SGLANG, "--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "mori"]
NATS_FROM_SECRET = {"name": "NATS_SERVER", "valueFrom": {"secretKeyRef": {"name": "nats", "key": "url"}}}


@pytest.mark.parametrize(
    ("spec", "template"),
    [
        # A broker of one's own, named where the runtime reads it (NATS_SERVER), from a Secret.
        (
            {"nats": {"deploy": False}},
            worker_template([*SGLANG_PREFILL, "--kv-event-transport", "zmq"], env=[NATS_FROM_SECRET]),
        ),
        (
            {"nats": {"deploy": False}},
            worker_template(
                [*SGLANG_PREFILL, "--kv-event-transport", "zmq"], envFrom=[{"secretRef": {"name": "engine"}}]
            ),
        ),
        # Flags passed to the script as its arguments, or in a variable the hook cannot read.
        (
            {},
            worker_template(["/bin/sh", "-c", 'exec python3 -m infera.engine.sglang "$@"', "--", *SGLANG_PREFILL[3:]]),
        ),
        (
            {},
            worker_template(
                ["/bin/sh", "-c", "exec python3 -m infera.engine.sglang $ENGINE_ARGS"],
                env=[{"name": "ENGINE_ARGS", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}],
            ),
        ),
        # What follows the engine's command line in the script is not its flags.
        (
            {},
            worker_template(
                [
                    "/bin/sh",
                    "-ec",
                    "python3 -m infera.engine.sglang " + " ".join(SGLANG_PREFILL[3:]) + "\necho --port 1",
                ]
            ),
        ),
        # Under etcd, a worker bound to its Pod IP registers it.
        (
            {"discoveryBackend": "etcd", "etcdEndpoint": "e:1"},
            worker_template(
                [
                    *SGLANG_PREFILL[:4],
                    "$(POD_IP)",
                    *SGLANG_PREFILL[5:],
                    "--discovery-backend",
                    "etcd",
                    "--etcd-endpoint",
                    "e:1",
                ]
            ),
        ),
        # kubelet expands a literal variable before the process sees it.
        (
            {},
            worker_template(
                [*SGLANG_PREFILL[:6], "$(PORT)", *SGLANG_PREFILL[7:]], env=[{"name": "PORT", "value": "30000"}]
            ),
        ),
    ],
    ids=[
        "nats-from-secret",
        "nats-from-envfrom",
        "script-arguments",
        "opaque-variable",
        "script-lines",
        "etcd-pod-ip-host",
        "expanded-port",
    ],
)
def test_templates_that_work_are_accepted(hooks, spec: dict, template: dict) -> None:
    obj = pd_with("prefill", template, args=None).spec(**spec).obj()
    status = hooks.sync(obj)["status"]
    assert status["state"] == "initializing", status["message"]


@pytest.mark.parametrize(
    ("template", "fields", "message"),
    [
        (
            worker_template(
                [*SGLANG_PREFILL[:6], "$(PORT)", *SGLANG_PREFILL[7:]], env=[{"name": "PORT", "value": "8080"}]
            ),
            {},
            "spec.services.prefill: the command listens on port 8080",
        ),
        (
            worker_template([*SGLANG_PREFILL, "--k8s-label-selector", "a=b", "--router-policy=kv-aware"]),
            {},
            "spec.services.prefill: --k8s-label-selector, --router-policy belong to the router; infera.engine.sglang exits on them",
        ),
        (
            worker_template([*SGLANG_PREFILL, "--kv-event-transport", "zmq"]),
            {},
            "the graph's processes do not share one KV-event plane: spec.services.decode (infera) uses nats, "
            "spec.services.prefill (main) uses zmq",
        ),
        (
            worker_template(SGLANG_PREFILL),
            {"numberOfNodes": 2},
            "spec.services.prefill: a rank of a 2-node group needs --nnodes, --node-rank, --dist-init-addr",
        ),
    ],
    ids=["expanded-port", "router-flags", "kv-plane", "rendezvous"],
)
def test_templates_that_would_fail_are_refused(hooks, template: dict, fields: dict, message: str) -> None:
    obj = pd_with("prefill", template, args=None, **fields).obj()
    status = hooks.hook("/sync", request_body(obj, composite=controller("lws")))["status"]
    assert status["state"] == "failed" and message in status["message"], status["message"]


def test_a_worker_without_probes_listens_where_it_likes(hooks) -> None:
    """It registers the port it listens on, and has no Service: nothing to miss."""
    template = worker_template([*SGLANG_PREFILL[:6], "31000", *SGLANG_PREFILL[7:]])
    obj = pd_with("prefill", template, skipReadinessProbe=True, args=None).obj()
    assert hooks.sync(obj)["status"]["state"] == "initializing"


def test_the_vllm_multi_node_recipe_is_accepted(hooks) -> None:
    """docs/pods.md: a Ray head and workers, each template's command given by a patch."""
    need_schemas()
    model_args = vllm_worker_args("decode")
    group = "/spec/leaderWorkerTemplate"
    head = (
        "ray start --head --port=6379 && exec python3 -m infera.engine.vllm --host 0.0.0.0 --port 30000 "
        + " ".join(shlex.quote(a) for a in model_args)
        + " --tensor-parallel-size 16 --distributed-executor-backend ray"
    )
    obj = (
        graph()
        .vllm()
        .nodes(decode=2)
        .service("decode", args=None)  # the patches give each rank its command line
        .patch(
            "LeaderWorkerSet",
            "qwen-pd-decode",
            {
                "op": "replace",
                "path": f"{group}/leaderTemplate/spec/containers/0/command",
                "value": ["/bin/sh", "-c", head],
            },
            {
                "op": "replace",
                "path": f"{group}/workerTemplate/spec/containers/0/command",
                "value": ["/bin/sh", "-c", "ray start --address=$(LWS_LEADER_ADDRESS):6379 --block"],
            },
        )
        .obj()
    )
    answer = hooks.hook("/sync", request_body(obj, composite=controller("lws")))
    assert answer["status"]["state"] == "initializing", answer["status"]["message"]
