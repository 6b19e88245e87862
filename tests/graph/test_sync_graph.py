"""What an InferaDeployment becomes (docs/api.md, "What an InferaDeployment becomes"), through the hook app."""

import copy
from typing import Any

import pytest

from tests.support.argv import entry_point, flags
from tests.support.graphs import graph
from tests.support.pod_security import RESTRICTED_CONTAINER
from tests.support.requests import children_by_key, request_body

SELECTOR = "infera.amd.com/deployment=qwen-pd"
NATS_URL = "nats://qwen-pd-nats:4222"
NATS_OPTIONS = {"--request-transport": "nats", "--kv-event-transport": "nats", "--nats-server": NATS_URL}
READY_TIMEOUT_ENV = {"name": "INFERA_ENGINE_READY_TIMEOUT", "value": "7200"}
BOOT_MOUNT = {"name": "boot-config", "mountPath": "/boot", "readOnly": True}
IDENTITY_ENV = [
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
    {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
]


def container(answer: dict[str, Any], name: str) -> dict[str, Any]:
    (main,) = children_by_key(answer)[("Deployment", name)]["spec"]["template"]["spec"]["containers"]
    return main


def labels(service: str, idep: str = "qwen-pd") -> dict[str, str]:
    return {
        "app.kubernetes.io/managed-by": "infera-hooks",
        "infera.amd.com/deployment": idep,
        "infera.amd.com/service": service,
    }


def test_seed_pd_graph_children(hooks) -> None:
    answer = hooks.sync(graph().obj())
    assert sorted(children_by_key(answer)) == [
        ("Deployment", "qwen-pd-decode"),
        ("Deployment", "qwen-pd-prefill"),
        ("Deployment", "qwen-pd-server"),
        # Only the graph's pods may connect to the broker.
        ("NetworkPolicy", "qwen-pd-nats"),
        # Every worker pool gets a disruption budget; the single router does not need one.
        ("PodDisruptionBudget", "qwen-pd-decode"),
        ("PodDisruptionBudget", "qwen-pd-prefill"),
        # The routers' identity, and the workers'.
        ("Role", "qwen-pd-disc"),
        ("Role", "qwen-pd-register"),
        ("RoleBinding", "qwen-pd-disc"),
        ("RoleBinding", "qwen-pd-register"),
        ("Service", "qwen-pd-nats"),
        ("Service", "qwen-pd-server"),
        ("ServiceAccount", "qwen-pd-disc"),
        ("ServiceAccount", "qwen-pd-register"),
        ("StatefulSet", "qwen-pd-nats"),
    ]
    for child in answer["children"]:
        service = child["metadata"]["labels"]["infera.amd.com/service"]
        # The broker is labelled as upstream labels it, beside the identity labels.
        extra = {"infera.amd.com/component": "nats"} if service == "nats" else {}
        assert child["metadata"]["labels"] == labels(service) | extra
        assert "namespace" not in child["metadata"]  # Metacontroller places children in the parent's


def test_prefill_worker_deployment_is_exact(hooks) -> None:
    obj = graph().obj()
    prefill = children_by_key(hooks.sync(obj))[("Deployment", "qwen-pd-prefill")]
    (main,) = prefill["spec"]["template"]["spec"]["containers"]
    # The engine on the container's port, in its role, on the broker; no selector for a worker:
    # it registers by patching its own Pod. The user's args follow, unchanged.
    assert entry_point(main.pop("command")) == (
        "infera.engine.sglang",
        {
            "--host": "0.0.0.0",
            "--port": str(main["ports"][0]["containerPort"]),
            "--discovery-backend": "kubernetes",
            "--disaggregation-mode": "prefill",
            **NATS_OPTIONS,
        },
    )
    assert main.pop("args") == obj["spec"]["services"]["prefill"]["args"]
    assert prefill == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "qwen-pd-prefill", "labels": labels("prefill")},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"infera.amd.com/deployment": "qwen-pd", "infera.amd.com/service": "prefill"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": {**labels("prefill"), "infera.amd.com/component": "worker"}},
                "spec": {
                    "serviceAccountName": "qwen-pd-register",
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "terminationGracePeriodSeconds": 120,
                    "containers": [
                        {
                            "name": "infera",
                            "image": "rocm/infera:sglang-v0.1.1",
                            "ports": [{"name": "http", "containerPort": 30000, "protocol": "TCP"}],
                            "env": [READY_TIMEOUT_ENV, {"name": "NATS_SERVER", "value": NATS_URL}, *IDENTITY_ENV],
                            "resources": {
                                "requests": {"memory": "64Gi", "amd.com/gpu": "1"},
                                "limits": {"amd.com/gpu": "1"},
                            },
                            # Root (the engine writes into its image), without escalation; the
                            # example's rdma: true gives mori what it needs to pin memory.
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK", "SYS_PTRACE", "SYS_RESOURCE"]},
                            },
                            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, BOOT_MOUNT],
                            "startupProbe": {
                                "httpGet": {"path": "/health", "port": 30000, "scheme": "HTTP"},
                                "successThreshold": 1,
                                "periodSeconds": 10,
                                "timeoutSeconds": 10,
                                "failureThreshold": 750,  # (7200 s of model load + 300 s) / 10 s
                            },
                            "livenessProbe": {
                                "httpGet": {"path": "/health", "port": 30000, "scheme": "HTTP"},
                                "successThreshold": 1,
                                "periodSeconds": 20,
                                "timeoutSeconds": 10,
                                "failureThreshold": 9,
                            },
                            "readinessProbe": {
                                "httpGet": {"path": "/health", "port": 30000, "scheme": "HTTP"},
                                "successThreshold": 1,
                                "initialDelaySeconds": 15,
                                "periodSeconds": 15,
                                "timeoutSeconds": 10,
                                "failureThreshold": 6,
                            },
                            "lifecycle": {"preStop": {"exec": {"command": ["sleep", "15"]}}},
                        }
                    ],
                    "volumes": [
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}},
                        {"name": "boot-config", "hostPath": {"path": "/boot", "type": "Directory"}},
                    ],
                },
            },
        },
    }


def test_decode_worker_gets_its_role(hooks) -> None:
    command = container(hooks.sync(graph().obj()), "qwen-pd-decode")["command"]
    assert command[command.index("--disaggregation-mode") + 1] == "decode"


def test_server_deployment_and_service(hooks) -> None:
    answer = hooks.sync(graph().obj())
    server = children_by_key(answer)[("Deployment", "qwen-pd-server")]
    assert "strategy" not in server["spec"]  # routers hold no GPU: the default surge rollout is fine
    pod = server["spec"]["template"]["spec"]
    assert "terminationGracePeriodSeconds" not in pod
    (main,) = pod["containers"]
    assert entry_point(main["command"]) == (
        "infera.server",
        {
            "--host": "0.0.0.0",
            "--port": str(main["ports"][0]["containerPort"]),
            "--discovery-backend": "kubernetes",
            "--k8s-label-selector": SELECTOR,
            **NATS_OPTIONS,
        },
    )
    assert main["ports"][0]["containerPort"] == 8000
    assert flags(main["args"]) == {"--router-policy": "kv-aware", "--router-tokenizer-path": "Qwen/Qwen3-0.6B"}
    assert main["env"] == [
        {"name": "HOME", "value": "/tmp"},  # its user has no home on the read-only root
        {"name": "NATS_SERVER", "value": NATS_URL},
        *IDENTITY_ENV,
        {"name": "INFERA_K8S_LABEL_SELECTOR", "value": SELECTOR},
    ]
    assert main["resources"] == {"requests": {"cpu": "4", "memory": "8Gi"}}
    # Ready once it serves HTTP, restarted when hung; no GPU, no /boot, no drain; restricted,
    # writing only to its scratch /tmp.
    assert main["readinessProbe"] == {
        "httpGet": {"path": "/health", "port": 8000, "scheme": "HTTP"},
        "successThreshold": 1,
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }
    assert main["livenessProbe"] == {
        "httpGet": {"path": "/health", "port": 8000, "scheme": "HTTP"},
        "successThreshold": 1,
        "periodSeconds": 20,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }
    assert main["securityContext"] == RESTRICTED_CONTAINER
    assert main["volumeMounts"] == [{"name": "infera-tmp", "mountPath": "/tmp"}]
    assert pod["volumes"] == [{"name": "infera-tmp", "emptyDir": {}}]
    assert not {"startupProbe", "lifecycle"} & set(main)
    assert children_by_key(answer)[("Service", "qwen-pd-server")]["spec"] == {
        "type": "ClusterIP",
        "selector": {"infera.amd.com/deployment": "qwen-pd", "infera.amd.com/service": "server"},
        "ports": [{"name": "http", "port": 8000, "targetPort": 8000, "protocol": "TCP"}],
    }


def test_nats_statefulset_and_headless_service(hooks) -> None:
    answer = hooks.sync(graph().nats(deploy=True, storageSize="8Gi", storageClassName="fast").obj())
    statefulset = children_by_key(answer)[("StatefulSet", "qwen-pd-nats")]
    spec = statefulset["spec"]
    assert spec["replicas"] == 1 and spec["serviceName"] == "qwen-pd-nats"
    (nats,) = spec["template"]["spec"]["containers"]
    assert nats["image"] == "nats:2.10.24-alpine"  # pinned, never :latest
    assert "--jetstream" in nats["command"]
    assert nats["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "monitor", "scheme": "HTTP"}
    assert spec["volumeClaimTemplates"] == [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "8Gi"}},
                "storageClassName": "fast",
                "volumeMode": "Filesystem",
            },
            "status": {"phase": "Pending"},
        }
    ]
    service = children_by_key(answer)[("Service", "qwen-pd-nats")]["spec"]
    assert service["clusterIP"] == "None"
    assert [p["port"] for p in service["ports"]] == [4222, 8222]


def test_discovery_identities_are_least_privilege(hooks) -> None:
    """Routers list and watch the graph's pods; workers patch their own Pod's registration;
    neither may touch the InferaDeployment unless a router serves the scaling API."""
    answer = children_by_key(hooks.sync(graph().obj()))
    assert answer[("Role", "qwen-pd-disc")]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}
    ]
    assert answer[("Role", "qwen-pd-register")]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}
    ]
    for account in ("qwen-pd-disc", "qwen-pd-register"):
        binding = answer[("RoleBinding", account)]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "ml"}]
    accounts = {
        name: answer[("Deployment", name)]["spec"]["template"]["spec"]["serviceAccountName"]
        for name in ("qwen-pd-server", "qwen-pd-prefill", "qwen-pd-decode")
    }
    assert accounts == {
        "qwen-pd-server": "qwen-pd-disc",
        "qwen-pd-prefill": "qwen-pd-register",
        "qwen-pd-decode": "qwen-pd-register",
    }


def test_the_scaling_api_gets_its_graph_and_nothing_more(hooks) -> None:
    obj = graph().add_args("server", "--enable-scaling-api").obj()
    answer = children_by_key(hooks.sync(obj))
    assert answer[("Role", "qwen-pd-disc")]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["infera.amd.com"],
            "resources": ["inferadeployments"],
            "resourceNames": ["qwen-pd"],
            "verbs": ["get", "patch"],
        },
    ]
    assert answer[("Role", "qwen-pd-register")]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}
    ]


def test_etcd_discovery(hooks) -> None:
    answer = hooks.sync(graph().discovery("etcd", "etcd.infra:2379").obj())
    kinds = {kind for kind, _ in children_by_key(answer)}
    assert kinds == {"Deployment", "NetworkPolicy", "PodDisruptionBudget", "Service", "StatefulSet"}  # no RBAC objects
    etcd = {"--discovery-backend": "etcd", "--etcd-endpoint": "etcd.infra:2379"}
    # Workers advertise their Pod IP (kubelet expands it): the runtime reads POD_IP only under
    # Kubernetes discovery and would register 0.0.0.0.
    server = entry_point(container(answer, "qwen-pd-server")["command"])[1]
    assert server.items() >= (etcd | {"--request-transport": "nats"}).items()
    for name in ("qwen-pd-prefill", "qwen-pd-decode"):
        worker = entry_point(container(answer, name)["command"])[1]
        assert worker.items() >= (etcd | {"--advertise-host": "$(POD_IP)"}).items()
    for name in ("qwen-pd-server", "qwen-pd-prefill", "qwen-pd-decode"):
        main = container(answer, name)
        assert "--k8s-label-selector" not in main["command"]
        assert [v["name"] for v in main["env"] if v["name"] not in ("INFERA_ENGINE_READY_TIMEOUT", "HOME")] == [
            "NATS_SERVER",
            "POD_NAME",
            "POD_NAMESPACE",
            "POD_IP",
        ]
        assert "INFERA_K8S_LABEL_SELECTOR" not in [v["name"] for v in main["env"]]
        pod = children_by_key(answer)[("Deployment", name)]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "default"  # never dropped: see pods.pod_template


def test_nats_off(hooks) -> None:
    answer = hooks.sync(graph().nats(deploy=False).obj())
    assert not [key for key in children_by_key(answer) if key[1] == "qwen-pd-nats"]
    for name in ("qwen-pd-server", "qwen-pd-prefill", "qwen-pd-decode"):
        main = container(answer, name)
        # Said explicitly: told nothing, every process would retry nats://127.0.0.1:4222 forever.
        options = entry_point(main["command"])[1]
        assert (options["--request-transport"], options["--kv-event-transport"]) == ("http", "zmq")
        assert "--nats-server" not in options
        assert "NATS_SERVER" not in [v["name"] for v in main["env"]]


def test_vllm_backend(hooks) -> None:
    answer = hooks.sync(graph().vllm().obj())
    module, options = entry_point(container(answer, "qwen-pd-prefill")["command"])
    assert module == "infera.engine.vllm"
    assert "--disaggregation-mode" not in options  # vLLM has none: the role is kv_role
    assert entry_point(container(answer, "qwen-pd-server")["command"])[0] == "infera.server"


@pytest.mark.parametrize(
    ("role", "args", "message"),
    [
        ("prefill", ["--model", "m"], "services.decode: a vLLM prefill or decode worker takes its role from kv_role"),
        (
            "prefill",
            ["--model", "m", "--kv-transfer-config", '{"kv_role":"kv_consumer"}'],
            "services.decode: --kv-transfer-config has kv_role 'kv_consumer', with which the worker registers as decode, "
            "not prefill: set kv_role to kv_producer",
        ),
        # kv_both registers a mixed worker: the router would never split prefill from decode.
        (
            "prefill",
            ["--model", "m", "--kv-transfer-config", '{"kv_role":"kv_both"}'],
            "kv_role 'kv_both', with which the worker registers as mixed, not prefill: set kv_role to kv_producer",
        ),
        (
            "decode",
            ["--model", "m", '--kv-transfer-config={"kv_connector":"NixlConnector"}'],
            "services.decode: --kv-transfer-config has no kv_role, with which the worker registers as mixed, not decode",
        ),
        (
            "decode",
            ["--model", "m", "--kv-transfer-config", "kv_role=kv_consumer"],
            "services.decode: --kv-transfer-config must be a JSON object, got 'kv_role=kv_consumer'",
        ),
        (
            "mixed",
            ["--model", "m", "--kv-transfer-config", '{"kv_role":"kv_producer"}'],
            "registers as prefill, not mixed: set kv_role to kv_both",
        ),
        (
            "decode",
            ["--kv-transfer-config", '{"kv_role":"kv_consumer"}'],
            "services.decode: infera.engine.vllm requires --model",
        ),
    ],
)
def test_vllm_role_comes_from_kv_role(hooks, role: str, args: list[str], message: str) -> None:
    obj = graph().vllm().service("decode", role=role, args=args).replicas(prefill=0).obj()  # prefill still validated
    status = hooks.sync(obj)["status"]
    assert status["state"] == "failed" and message in status["message"], status["message"]


def test_sglang_role_must_not_be_contradicted(hooks) -> None:
    obj = graph().add_args("decode", "--disaggregation-mode", "prefill").obj()
    status = hooks.sync(obj)["status"]
    assert status["state"] == "failed"
    assert "services.decode: --disaggregation-mode prefill contradicts role decode" in status["message"]


def test_server_needs_a_tokenizer(hooks) -> None:
    obj = graph().args("server", "--router-policy", "round-robin").obj()
    status = hooks.sync(obj)["status"]
    assert status["state"] == "failed"
    assert "services.server: infera.server requires --router-tokenizer-path" in status["message"]


def test_custom_ports_gpu_type_and_images(hooks) -> None:
    obj = (
        graph()
        .service("server", port=9000)
        .service("decode", port=31000, image="example.com/engine:v2", replicas=3)
        .resources("decode", gpu=8, gpuType="nvidia.com/gpu", cpu="16000m", memory="1024Gi")
        .obj()
    )
    answer = hooks.sync(obj)
    server = container(answer, "qwen-pd-server")
    assert entry_point(server["command"])[1]["--port"] == "9000"
    assert server["ports"] == [{"name": "http", "containerPort": 9000, "protocol": "TCP"}]
    assert children_by_key(answer)[("Service", "qwen-pd-server")]["spec"]["ports"][0]["port"] == 9000
    main = container(answer, "qwen-pd-decode")
    assert main["image"] == "example.com/engine:v2"
    assert entry_point(main["command"])[1]["--port"] == "31000"
    assert main["ports"][0]["containerPort"] == 31000
    # Canonical quantities, exactly as the API server stores them (16000m -> 16, 1024Gi -> 1Ti).
    assert main["resources"] == {
        "requests": {"cpu": "16", "memory": "1Ti", "nvidia.com/gpu": "8"},
        "limits": {"nvidia.com/gpu": "8"},
    }
    assert main["volumeMounts"] == [BOOT_MOUNT]
    assert children_by_key(answer)[("Deployment", "qwen-pd-decode")]["spec"]["replicas"] == 3


def test_envs_precedence_and_no_empty_values(hooks) -> None:
    obj = (
        graph()
        .envs(
            {"name": "HF_HOME", "value": "/models"},
            {"name": "SHARED", "value": "all"},
            {"name": "EMPTY", "value": ""},
        )
        .env("decode", {"name": "SHARED", "value": "decode"}, {"name": "POD_IP", "value": "10.0.0.1"})
        .obj()
    )
    env = container(hooks.sync(obj), "qwen-pd-decode")["env"]
    assert env == [
        READY_TIMEOUT_ENV,
        {"name": "HF_HOME", "value": "/models"},
        {"name": "SHARED", "value": "decode"},
        {"name": "EMPTY"},
        {"name": "NATS_SERVER", "value": NATS_URL},
        IDENTITY_ENV[0],
        IDENTITY_ENV[1],
        {"name": "POD_IP", "value": "10.0.0.1"},
    ]


@pytest.mark.parametrize(
    ("args", "env", "grace"),
    [
        ([], [], 120),  # 15 s preStop + 30 s default drain + 50 s teardown is under the floor
        (["--drain-timeout", "300"], [], 365),
        (["--drain-timeout=100.5"], [], 166),  # rounded up
        ([], [{"name": "INFERA_DRAIN_TIMEOUT", "value": "120"}], 185),
        (["--drain-timeout", "200"], [{"name": "INFERA_DRAIN_TIMEOUT", "value": "120"}], 265),  # the flag wins
        (["--drain-timeout", "1e9"], [], 3665),  # clamped to an hour
        # As kubelet expands it; a value from a ConfigMap is unknowable here, and the variable then counts.
        (
            ["--drain-timeout", "$(DRAIN)"],
            [{"name": "DRAIN", "value": "900"}, {"name": "INFERA_DRAIN_TIMEOUT", "value": "90"}],
            965,
        ),
        (
            ["--drain-timeout", "$(DRAIN)"],
            [
                {"name": "DRAIN", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
                {"name": "INFERA_DRAIN_TIMEOUT", "value": "90"},
            ],
            155,
        ),
    ],
)
def test_grace_period_covers_the_drain(hooks, args: list[str], env: list[dict], grace: int) -> None:
    obj = graph().add_args("decode", *args).env("decode", *env).obj()
    pod = children_by_key(hooks.sync(obj))[("Deployment", "qwen-pd-decode")]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == grace


def test_skip_readiness_probe(hooks) -> None:
    obj = graph().service("decode", skipReadinessProbe=True).service("server", skipReadinessProbe=True).obj()
    answer = hooks.sync(obj)
    probes = {"startupProbe", "livenessProbe", "readinessProbe"}
    assert not probes & set(container(answer, "qwen-pd-decode"))
    assert not probes & set(container(answer, "qwen-pd-server"))
    assert probes <= set(container(answer, "qwen-pd-prefill"))


def test_startup_budget_follows_the_wrappers_model_load_timeout(hooks) -> None:
    obj = graph().env("decode", {"name": "INFERA_ENGINE_READY_TIMEOUT", "value": "14400"}).obj()
    main = container(hooks.sync(obj), "qwen-pd-decode")
    assert main["startupProbe"]["failureThreshold"] == 1470  # (14400 + 300) / 10: never under the wrapper's wait
    assert {"name": "INFERA_ENGINE_READY_TIMEOUT", "value": "14400"} in main["env"]


def test_pod_metadata_propagation(hooks) -> None:
    obj = (
        graph()
        .metadata(
            labels={
                "infera.amd.com/team": "search",
                "inferaTier": "gold",
                "team": "not-propagated",
                "infera.amd.com/service": "spoofed",
            },
            annotations={"infera.amd.com/owner": "alice", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
        )
        .service(
            "decode",
            podLabels={"inferaTier": "silver", "rack": "r7", "infera.amd.com/deployment": "spoofed"},
            podAnnotations={"infera.amd.com/owner": "bob", "prometheus.io/scrape": "true"},
        )
        .obj()
    )
    answer = hooks.sync(obj)
    template = children_by_key(answer)[("Deployment", "qwen-pd-decode")]["spec"]["template"]["metadata"]
    assert template == {
        "labels": {
            "infera.amd.com/team": "search",  # infera* label of the InferaDeployment reaches the pods
            "inferaTier": "silver",  # the service's podLabels win over the InferaDeployment's
            "rack": "r7",
            **labels("decode"),  # identity labels win over both
            "infera.amd.com/component": "worker",
        },
        "annotations": {"infera.amd.com/owner": "bob", "prometheus.io/scrape": "true"},
    }
    prefill = children_by_key(answer)[("Deployment", "qwen-pd-prefill")]["spec"]["template"]["metadata"]
    assert prefill["labels"]["inferaTier"] == "gold"
    assert "team" not in prefill["labels"]
    assert prefill["annotations"] == {"infera.amd.com/owner": "alice"}
    # Child objects themselves carry only identity labels: selectors and names never drift.
    assert children_by_key(answer)[("Deployment", "qwen-pd-decode")]["metadata"]["labels"] == labels("decode")


def test_v1_and_v2_requests_answer_the_same(hooks) -> None:
    obj = graph().obj()
    first = hooks.sync(obj, version="v2")
    deployment = copy.deepcopy(children_by_key(first)[("Deployment", "qwen-pd-server")])
    deployment["metadata"]["namespace"] = "ml"
    deployment["status"] = {"replicas": 1, "readyReplicas": 1}
    # The parent already holds this status, so no condition changes and no clock is read.
    obj["status"] = hooks.sync(obj, [deployment])["status"]
    v1 = hooks.sync(obj, [deployment], version="v1")
    v2 = hooks.sync(obj, [deployment], version="v2")
    assert v1 == v2
    assert v2["status"]["services"]["server"] == {"kind": "Deployment", "replicas": 1, "readyReplicas": 1}


def test_same_request_gives_byte_identical_answers(hooks) -> None:
    obj = graph().obj()
    # The status the parent already has, so no condition changes and no clock is read.
    obj["status"] = hooks.sync(obj)["status"]
    body = request_body(obj)
    replies = {hooks.post("/sync", body).body for _ in range(6)}  # spread over both workers
    assert len(replies) == 1
