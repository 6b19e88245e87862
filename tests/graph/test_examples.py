"""Every example users start from renders through the hook app into valid, ready-to-run children."""

import re
from pathlib import Path

import kubernetes_validate
import pytest

from tests.support.prerequisites import REPO
from tests.support.requests import parent, request_body
from tests.support.schemas import KUBERNETES_VERSION, UPSTREAM_KINDS, validate_object

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def test_the_documented_examples_exist() -> None:
    assert {path.name for path in EXAMPLES} >= {
        "pd-disaggregated.yaml",
        "single-node-mixed.yaml",
        "etcd-discovery.yaml",
        "gaie-pd.yaml",
        "multinode-tp.yaml",
        "pd-1p1d-mooncake.yaml",
        "pd-vllm-moriio.yaml",
        "pd-autoscaling.yaml",
        "pd-model-cache.yaml",
        "gated-model-cache.yaml",
        "pd-monitored.yaml",
        "pd-blue-green.yaml",
        "multinode-kueue.yaml",
    }


# The routers' and the workers' identities under kubernetes discovery.
IDENTITIES = {(kind, account) for kind in ("ServiceAccount", "Role", "RoleBinding") for account in ("disc", "register")}
PLUMBING = IDENTITIES | {("StatefulSet", "nats"), ("Service", "nats"), ("NetworkPolicy", "nats")}


def budgets(*pools: str) -> set[tuple[str, str]]:
    """Every worker pool's PodDisruptionBudget."""
    return {("PodDisruptionBudget", pool) for pool in pools}


def isolated(*parts: str) -> set[tuple[str, str]]:
    """The NetworkPolicies of an isolated graph's parts (`networkPolicy.isolate: graph`)."""
    return {("NetworkPolicy", part) for part in parts}


# The generation examples/pd-blue-green.yaml renders (tests/golden/pd-blue-green.yaml).
GENERATION = "8d8de081"

EXPECTED = {
    "pd-disaggregated.yaml": (
        "qwen-pd",
        PLUMBING
        | {("Deployment", "server"), ("Service", "server"), ("Deployment", "prefill"), ("Deployment", "decode")}
        | budgets("prefill", "decode"),
    ),
    "pd-autoscaling.yaml": (
        "qwen-auto",
        PLUMBING
        | {("Deployment", "server"), ("Service", "server"), ("Deployment", "prefill"), ("Deployment", "decode")}
        | {("HorizontalPodAutoscaler", "decode")}
        | budgets("prefill", "decode")
        | isolated("server", "prefill", "decode"),
    ),
    # Before the download completes, workers wait: only the router, the claim and the Job.
    "pd-model-cache.yaml": (
        "qwen-cache",
        PLUMBING
        | {("Deployment", "server"), ("Service", "server"), ("PersistentVolumeClaim", "models")}
        | {("Job", "download-322e2c4c")},
    ),
    "gated-model-cache.yaml": (
        "llama-gated",
        PLUMBING
        | {
            ("Deployment", "server"),
            ("Service", "server"),
            ("PersistentVolumeClaim", "models"),
            ("Job", "download-68cd046b"),
        },
    ),
    "single-node-mixed.yaml": (
        "qwen-mixed",
        PLUMBING | {("Deployment", "server"), ("Service", "server"), ("Deployment", "worker")} | budgets("worker"),
    ),
    "etcd-discovery.yaml": (
        "llama-etcd",
        {("Deployment", "server"), ("Service", "server"), ("Deployment", "worker")} | budgets("worker"),
    ),
    "gaie-pd.yaml": (
        "qwen-gaie",
        PLUMBING
        | {
            ("Deployment", "prefill"),
            ("Deployment", "decode"),
            ("Deployment", "epp"),
            ("Service", "epp"),
            # The picker's own identity.
            ("ServiceAccount", "epp"),
            ("Role", "epp"),
            ("RoleBinding", "epp"),
            ("InferencePool", "pool"),
            ("HTTPRoute", "route"),
        }
        | budgets("prefill", "decode")
        | isolated("prefill", "decode", "epp"),
    ),
    "pd-1p1d-mooncake.yaml": (
        "qwen-1p1d",
        PLUMBING
        | {("Deployment", "server"), ("Service", "server"), ("Deployment", "prefill"), ("Deployment", "decode")}
        | budgets("prefill", "decode"),
    ),
    "pd-vllm-moriio.yaml": (
        "llama-pd",
        {
            ("Deployment", "server"),
            ("Service", "server"),
            ("Deployment", "prefill"),
            ("Deployment", "decode"),
        }
        | IDENTITIES
        | budgets("prefill", "decode"),
    ),
    # Under BlueGreen a generation's workloads carry its name (GENERATION: the spec's digest).
    "pd-blue-green.yaml": (
        "qwen-bg",
        PLUMBING
        | {("Deployment", f"{s}-{GENERATION}") for s in ("server", "prefill", "decode")}
        | {("Service", "server")}
        # Two routers: a drain keeps one.
        | budgets("prefill", "decode", "server"),
    ),
    "pd-monitored.yaml": (
        "qwen-mon",
        PLUMBING
        | {("Deployment", "server"), ("Service", "server"), ("Deployment", "prefill"), ("Deployment", "decode")}
        | {
            ("Deployment", "epp"),
            ("Service", "epp"),
            ("ServiceAccount", "epp"),
            ("Role", "epp"),
            ("RoleBinding", "epp"),
        }
        | {("InferencePool", "pool"), ("HTTPRoute", "route"), ("PodMonitor", "metrics")}
        # Two routers and two pickers: each pair keeps one through a drain.
        | budgets("prefill", "decode", "server", "epp"),
    ),
    "multinode-tp.yaml": (
        "llama-tp",
        PLUMBING | {("Deployment", "server"), ("Service", "server"), ("LeaderWorkerSet", "worker")} | budgets("worker"),
    ),
    "multinode-kueue.yaml": (
        "llama-kueue",
        PLUMBING | {("Deployment", "server"), ("Service", "server"), ("LeaderWorkerSet", "worker")} | budgets("worker"),
    ),
}


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_example_renders_exactly_its_children(hooks, path: Path) -> None:
    assert path.name in EXPECTED, f"add {path.name} to EXPECTED"
    idep, expected = EXPECTED[path.name]
    answer = hooks.sync(parent(path))  # validates every child against its schema
    assert answer["status"]["state"] == "initializing", answer["status"]
    assert sorted((c["kind"], c["metadata"]["name"]) for c in answer["children"]) == sorted(
        (kind, f"{idep}-{suffix}") for kind, suffix in expected
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_the_checks_judge_core_kinds_as_kubernetes_validate_does(hooks, path: Path) -> None:
    """The tests check core kinds with kubernetes-validate's schemas through a validator built
    once; the library's own call judges every child of every example, and a broken copy, alike."""
    for child in hooks.hook_raw("/sync", request_body(parent(path)))["children"]:
        if child["kind"] in UPSTREAM_KINDS:
            continue
        kubernetes_validate.validate(child, KUBERNETES_VERSION, strict=True)
        validate_object(child)
        broken = {**child, "noSuchField": 1}
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
        with pytest.raises(AssertionError, match="noSuchField"):
            validate_object(broken)


def test_examples_are_listed_in_the_readme() -> None:
    listed = re.findall(r"^\| `(examples/[^`]+)` \|", (REPO / "README.md").read_text(), flags=re.M)
    assert sorted(listed) == sorted(f"examples/{path.name}" for path in EXAMPLES)


def test_mooncake_recipe(hooks) -> None:
    """Prefill and decode in one fabric domain, the router anywhere; KV over RoCE, RPC on the
    pod network."""
    answer = hooks.sync(parent(REPO / "examples" / "pd-1p1d-mooncake.yaml"))
    pods = {
        c["metadata"]["name"]: c["spec"]["template"]["spec"] for c in answer["children"] if c["kind"] == "Deployment"
    }
    workers = {"infera.amd.com/deployment": "qwen-1p1d", "infera.amd.com/component": "worker"}
    term = {"labelSelector": {"matchLabels": workers}, "topologyKey": "infera.amd.com/fabric-domain"}
    placed = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    assert {name: (pod.get("nodeSelector"), pod.get("affinity")) for name, pod in pods.items()} == {
        "qwen-1p1d-server": (None, None),
        "qwen-1p1d-prefill": (None, placed),
        "qwen-1p1d-decode": (None, placed),
    }
    for name in ("qwen-1p1d-prefill", "qwen-1p1d-decode"):
        pod = pods[name]
        (main,) = pod["containers"]
        assert "hostNetwork" not in pod  # pod IPs; Mooncake's RPC rides the pod network
        assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}} in main[
            "env"
        ]
        assert "readinessProbe" not in main
        flags = main["command"] + main["args"]
        assert flags[flags.index("--disaggregation-transfer-backend") + 1] == "mooncake"
        assert "--disaggregation-ib-device" not in flags and "--tp-size" in flags
        assert main["securityContext"] == {  # rdma: true
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK", "SYS_PTRACE", "SYS_RESOURCE"]},
        }
        assert {m["mountPath"] for m in main["volumeMounts"]} == {"/models", "/dev/infiniband", "/dev/shm"}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["model"]["hostPath"]["path"] == "/mnt/models"  # the same path on both nodes
        assert volumes["infiniband"]["hostPath"]["path"] == "/dev/infiniband"
