"""Least privilege for every pod the hook renders: the exact security context of each, how a
template changes it, and what a third-party scanner (checkov) still reports. The levels are
judged by the real API server in tests/cluster/test_programs.py."""

import json
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from hooks import cli
from tests.support.pod_security import RESTRICTED_CONTAINER, documented_levels, pod_templates, readme_levels, rendered
from tests.support.prerequisites import REPO, need_checkov
from tests.support.requests import parent

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
SECCOMP = {"seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED = RESTRICTED_CONTAINER
CLAIMS = SECCOMP | {"fsGroup": 65532}
RDMA_CAPABILITIES = ["IPC_LOCK", "SYS_PTRACE", "SYS_RESOURCE"]
ENGINE = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
RDMA = ENGINE | {"capabilities": {"drop": ["ALL"], "add": RDMA_CAPABILITIES}}
SCRATCH = {"name": "infera-tmp", "mountPath": "/tmp"}
MODEL = ["--model-path", "/models/q"]


def contexts(template: dict[str, Any]) -> tuple[dict | None, dict[str, dict | None]]:
    spec = template["spec"]
    return spec.get("securityContext"), {c["name"]: c.get("securityContext") for c in spec["containers"]}


def test_the_readme_sums_up_the_levels_the_docs_give() -> None:
    """The README names every level of docs/security.md's table and no other, and each pod the
    table puts at `restricted` in the words that lead up to that level."""
    summary, documented = readme_levels(), documented_levels()
    assert set(summary) == set(documented.values())
    assert [
        pods for pods, level in documented.items() if level == "restricted" and pods not in summary["restricted"]
    ] == []


def test_every_pod_has_the_security_context_its_component_needs(tmp_path: Path) -> None:
    templates = pod_templates(rendered(tmp_path))
    # Users on the operator's containers, seccomp for the whole pod, fsGroup where a claim must
    # be writable for the user's group.
    assert {row: contexts(template) for row, template in templates.items()} == {
        "server": (SECCOMP, {"infera": RESTRICTED}),
        "Endpoint Picker": (SECCOMP, {"epp": RESTRICTED}),
        "NATS broker": (CLAIMS, {"nats": RESTRICTED}),
        "model download Job": (CLAIMS, {"download": RESTRICTED}),
        "worker": (SECCOMP, {"infera": ENGINE, "infera-frontend": RESTRICTED}),
        "worker with `hostBoot: false`": (SECCOMP, {"infera": ENGINE, "infera-frontend": RESTRICTED}),
        "worker with `rdma: true`": (SECCOMP, {"infera": RDMA, "infera-frontend": RESTRICTED}),
    }
    # What the read-only processes may write: a scratch /tmp each (HOME for the routers); the
    # broker its claim. /boot only where hostBoot is left on.
    server, picker, nats = (templates[row]["spec"] for row in ("server", "Endpoint Picker", "NATS broker"))
    for spec in (server, picker):
        assert spec["volumes"] == [{"name": "infera-tmp", "emptyDir": {}}]
        assert spec["containers"][0]["volumeMounts"] == [SCRATCH]
        assert {"name": "HOME", "value": "/tmp"} in spec["containers"][0]["env"]
    assert nats["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "data-sec-nats-0"}}]
    assert nats["containers"][0]["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    volumes = {row: [v["name"] for v in templates[row]["spec"]["volumes"]] for row in templates if "worker" in row}
    assert volumes == {
        "worker": ["model-cache", "boot-config", "infera-tmp"],
        "worker with `hostBoot: false`": ["model-cache", "infera-tmp"],
        "worker with `rdma: true`": ["model-cache", "infera-tmp"],
    }
    sidecar = templates["worker"]["spec"]["containers"][1]
    assert sidecar["volumeMounts"] == [SCRATCH] and {"name": "HOME", "value": "/tmp"} in sidecar["env"]


def sync_pod(hooks, service: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of service `s` of a mixed graph, through the real hook."""
    idep = parent(
        {
            "apiVersion": "infera.amd.com/v1alpha1",
            "kind": "InferaDeployment",
            "metadata": {"name": "g"},
            "spec": {"image": "img:1", "services": {"s": service, "w": {"componentType": "worker", "args": MODEL}}},
        }
    )
    answer = hooks.sync(idep)
    assert answer["status"]["state"] != "failed", answer["status"]
    (deployment,) = [c for c in answer["children"] if (c["kind"], c["metadata"]["name"]) == ("Deployment", "g-s")]
    return deployment["spec"]["template"]["spec"]


def test_a_templates_security_context_is_laid_over_the_operators(hooks) -> None:
    """A container's fields merge key by key (the template wins), so a server runs as root only
    when its template's container says so; a pod-level context is the template's own."""
    root_server = {
        "componentType": "server",
        "args": ["--router-tokenizer-path", "Qwen/Qwen3-0.6B"],
        "extraPodSpec": {
            "securityContext": {"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]},
            "containers": [
                {
                    "name": "infera",
                    "securityContext": {"runAsUser": 0, "runAsNonRoot": False, "readOnlyRootFilesystem": False},
                    # A lone limit is the request too: no default request beside it.
                    "resources": {"limits": {"memory": "512Mi"}},
                }
            ],
        },
    }
    spec = sync_pod(hooks, root_server)
    assert spec["securityContext"] == root_server["extraPodSpec"]["securityContext"]
    (main,) = spec["containers"]
    assert main["securityContext"] == RESTRICTED | {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "readOnlyRootFilesystem": False,
    }
    assert main["resources"] == {"limits": {"memory": "512Mi"}, "requests": {"cpu": "500m"}}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        # rdma's capabilities stay beside the template's (the merge alone would replace them).
        (
            {"capabilities": {"add": ["NET_ADMIN"]}},
            RDMA | {"capabilities": {"drop": ["ALL"], "add": [*RDMA_CAPABILITIES, "NET_ADMIN"]}},
        ),
        # The API server refuses allowPrivilegeEscalation: false beside privileged or CAP_SYS_ADMIN.
        ({"privileged": True}, {"privileged": True, "capabilities": RDMA["capabilities"]}),
        (
            {"capabilities": {"add": ["CAP_SYS_ADMIN"]}},
            {"capabilities": {"drop": ["ALL"], "add": [*RDMA_CAPABILITIES, "CAP_SYS_ADMIN"]}},
        ),
    ],
    ids=["capabilities", "privileged", "sys-admin"],
)
def test_a_worker_templates_capabilities_and_privilege(hooks, template: dict, expected: dict) -> None:
    worker = {
        "componentType": "worker",
        "args": MODEL,
        "rdma": True,
        "extraPodSpec": {"containers": [{"name": "main", "securityContext": template}]},
    }
    spec = sync_pod(hooks, worker)
    assert (spec["containers"][0]["securityContext"], spec["securityContext"]) == (expected, SECCOMP)


@pytest.mark.parametrize(
    ("service", "message"),
    [({"rdma": True}, "rdma applies to workers only"), ({"hostBoot": False}, "hostBoot applies to workers only")],
)
def test_worker_settings_on_a_server_are_refused_naming_the_field(hooks, service: dict, message: str) -> None:
    idep = parent(
        {
            "apiVersion": "infera.amd.com/v1alpha1",
            "kind": "InferaDeployment",
            "metadata": {"name": "g"},
            "spec": {
                "image": "img:1",
                "services": {"s": {"componentType": "server", **service}, "w": {"componentType": "worker"}},
            },
        }
    )
    status = hooks.sync(idep)["status"]
    assert status["state"] == "failed" and message in status["message"], status


# What checkov must find passed on the server, NATS, the Endpoint Picker, the frontend sidecar
# and the download Job: privilege escalation, root, NET_RAW, capabilities, seccomp, a read-only
# root, requests and liveness.
MUST_PASS = {
    "CKV_K8S_8",  # liveness probe
    "CKV_K8S_10",  # CPU requests
    "CKV_K8S_12",  # memory requests
    "CKV_K8S_20",  # allowPrivilegeEscalation
    "CKV_K8S_22",  # read-only root filesystem
    "CKV_K8S_23",  # root containers
    "CKV_K8S_25",  # added capabilities
    "CKV_K8S_28",  # NET_RAW
    "CKV_K8S_31",  # seccomp
    "CKV_K8S_37",  # capabilities not dropped
    "CKV_K8S_40",  # a uid above the node's
}
NO_POLICY = "CKV2_K8S_6"
# What docs/security.md says a scanner still reports on every pod, and why.
BY_DESIGN = {
    "CKV_K8S_11",  # no CPU limit: requests only
    "CKV_K8S_13",  # no memory limit
    "CKV_K8S_15",  # imagePullPolicy not Always
    "CKV_K8S_43",  # an image by tag
    NO_POLICY,  # no NetworkPolicy (but the broker's, and every pod's of an isolated graph)
    "CKV_K8S_35",  # a Secret in the env: huggingface_hub reads HF_TOKEN there
    # checkov's etcd-server checks, which take any command naming etcd for one (--etcd-endpoints).
    "CKV_K8S_116",
    "CKV_K8S_117",
    "CKV_K8S_119",
}
TOKEN = "CKV_K8S_38"  # a ServiceAccount token: only where the API server is called
# A worker: root and a writable root; a token (registration); capabilities with rdma; no CPU
# or memory request, or no probes, where its spec leaves them out (resources, skipReadinessProbe).
WORKER = {TOKEN, "CKV_K8S_22", "CKV_K8S_23", "CKV_K8S_40", "CKV_K8S_25"} | {
    "CKV_K8S_8",
    "CKV_K8S_9",
    "CKV_K8S_10",
    "CKV_K8S_12",
}
ROUTERS = ("-server", "-epp", "-frontend")


def checkov(directory: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """checkov on the YAML files in `directory`: kind/name -> the ids of its failed checks, and
    of its passed ones."""
    scanned = subprocess.run(
        [str(need_checkov()), "--directory", str(directory), "--framework", "kubernetes", "--output", "json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert scanned.returncode in (0, 1), scanned.stderr  # 1: some check failed
    reports = json.loads(scanned.stdout)
    results: tuple[dict[str, set[str]], dict[str, set[str]]] = (defaultdict(set), defaultdict(set))
    for report in reports if isinstance(reports, list) else [reports]:
        for found, checks in zip(
            results, (report["results"]["failed_checks"], report["results"]["passed_checks"]), strict=True
        ):
            for check in checks:
                kind, _, name = check["resource"].split(".", 2)
                found[f"{kind}/{name}"].add(check["check_id"])
    return results


def frontend_pods(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each GAIE worker pod's frontend sidecar alone in its pod, for a scanner to judge apart
    from the engine beside it."""
    pods = []
    for child in children:
        if child["kind"] == "Deployment":
            spec = child["spec"]["template"]["spec"]
            sidecars = [c for c in spec["containers"] if c["name"] == "infera-frontend"]
            if sidecars:
                metadata = {
                    "name": f"{child['metadata']['name']}-frontend",
                    "namespace": child["metadata"]["namespace"],
                    "labels": child["spec"]["template"]["metadata"]["labels"],
                }
                pods.append(
                    {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {**spec, "containers": sidecars}}
                )
    return pods


def test_checkov_finds_on_the_routers_nats_and_the_job_nothing_and_on_workers_what_is_documented(
    tmp_path: Path,
) -> None:
    """Every example's render and the graph with every kind of pod, in a namespace."""
    scanned = tmp_path / "scanned"
    scanned.mkdir()
    graphs = [(example, cli.render(str(example), "infera", model_downloaded=True)) for example in EXAMPLES]
    children = {
        example.name: [doc for doc in yaml.safe_load_all(result.manifests) if doc] for example, result in graphs
    }
    children["sec.yaml"] = rendered(tmp_path, "infera")
    pods: dict[str, dict[str, Any]] = {}  # kind/name -> the pod spec checkov judges
    isolated: set[str] = set()  # the pods a rendered NetworkPolicy selects
    for name, objects in children.items():
        objects = [*objects, *frontend_pods(objects)]
        (scanned / name).write_text("---\n".join(yaml.safe_dump(obj) for obj in objects))
        selectors = [obj["spec"]["podSelector"]["matchLabels"] for obj in objects if obj["kind"] == "NetworkPolicy"]
        for obj in objects:
            if obj["kind"] in ("Deployment", "StatefulSet", "Job", "Pod"):
                spec = obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]
                labels = (obj["metadata"] if obj["kind"] == "Pod" else obj["spec"]["template"]["metadata"]).get(
                    "labels"
                )
                pods[f"{obj['kind']}/{obj['metadata']['name']}"] = spec
                if any(selector.items() <= (labels or {}).items() for selector in selectors):
                    isolated.add(f"{obj['kind']}/{obj['metadata']['name']}")
    failed, passed = checkov(scanned)
    # checkov judges the pods (named by their workload, then their labels) and finds a
    # NetworkPolicy for exactly those the hook rendered one for: every graph's broker, and every
    # pod of an isolated graph.
    judged = {
        verdict: {r.split("/", 1)[1].split(".")[0] for r, checks in found.items() if NO_POLICY in checks}
        for verdict, found in (("failed", failed), ("passed", passed))
    }
    workloads = {r.split("/", 1)[1] for r in pods}
    covered = {r.split("/", 1)[1] for r in isolated}
    assert judged == {"failed": workloads - covered, "passed": covered}
    assert {"sec-nats", "qwen-gaie-decode", "qwen-gaie-epp", "qwen-auto-server"} <= covered
    restricted = [r for r in pods if r.endswith((*ROUTERS, "-nats")) or r.startswith("Job/")]
    workers = [r for r in pods if r not in restricted]
    assert len(restricted) >= 20 and len(workers) >= 15 and set(pods) <= set(passed), (restricted, workers)
    # A token only where a process calls the API server (not under etcd discovery, say).
    calls_the_api = {r for r in restricted if pods[r].get("automountServiceAccountToken") is not False}
    assert calls_the_api and {r: failed[r] - BY_DESIGN for r in restricted} == {
        r: {TOKEN} if r in calls_the_api else set() for r in restricted
    }
    # checkov does not ask a Job for liveness.
    must_pass = {r: MUST_PASS - ({"CKV_K8S_8"} if r.startswith("Job/") else set()) for r in restricted}
    assert {r: must_pass[r] - passed[r] for r in restricted} == {r: set() for r in restricted}
    assert {r: failed[r] - BY_DESIGN - WORKER for r in workers} == {r: set() for r in workers}
    # Every finding docs/security.md explains is one checkov really makes.
    assert BY_DESIGN <= set().union(*failed.values())
    assert failed["Deployment/sec-rdma"] & WORKER == {
        "CKV_K8S_22",
        "CKV_K8S_23",
        "CKV_K8S_40",
        TOKEN,
        "CKV_K8S_25",
    }
