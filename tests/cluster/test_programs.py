"""The control plane tier's programs are the pinned releases, built from the module proxy."""

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hooks.api import name_rules
from hooks.api.rules import AUTOSCALING_RANGE_RULE
from tests.support.controlplane import KUBERNETES_VERSION, programs, running_cluster
from tests.support.docs import readme_local_cluster
from tests.support.graphs import graph
from tests.support.pod_security import LEVELS, documented_levels, pod_templates, rendered
from tests.support.prerequisites import REPO, need, need_schemas


def version_of(program: str, *flags: str) -> str:
    return subprocess.run(
        [str(programs()[program]), *flags], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def test_the_kubernetes_programs_are_the_pinned_release() -> None:
    for program in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        assert version_of(program, "--version") == f"Kubernetes {KUBERNETES_VERSION}\n"
    assert f'"gitVersion": "{KUBERNETES_VERSION}"' in version_of("kubectl", "version", "--client", "-o", "json")


def test_etcd_is_the_release_kubernetes_uses() -> None:
    assert version_of("etcd", "--version").splitlines()[0] == "etcd Version: 3.6.8"


def kubectl_run(
    kubectl: list[str], *arguments: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*kubectl, *arguments], input=stdin, capture_output=True, text=True, timeout=timeout)


EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
INFERA_HOOKS = Path(sys.executable).with_name("infera-hooks")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One cluster for the module, with the CRDs every example's children need."""
    with running_cluster(tmp_path_factory.mktemp("cluster")) as kubeconfig:
        kubectl = [str(programs()["kubectl"]), "--kubeconfig", str(kubeconfig)]
        crds = [REPO / "crds" / "infera.amd.com_inferadeployments.yaml"] + [
            need_schemas() / name for name in ("lws.yaml", "inferencepool.yaml", "httproute.yaml", "podmonitor.yaml")
        ]
        for crd in crds:
            applied = kubectl_run(kubectl, "apply", "--server-side", "-f", str(crd))
            assert applied.returncode == 0, applied.stderr
        waited = kubectl_run(kubectl, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        assert waited.returncode == 0, waited.stderr
        yield kubeconfig


def test_a_real_api_server_establishes_the_crd_and_explains_it(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as kubeconfig:
        kubectl = [str(programs()["kubectl"]), "--kubeconfig", str(kubeconfig)]
        crd = REPO / "crds" / "infera.amd.com_inferadeployments.yaml"
        subprocess.run(
            [*kubectl, "apply", "--server-side", "-f", str(crd)], check=True, capture_output=True, timeout=60
        )
        established = "crd/inferadeployments.infera.amd.com"
        waited = kubectl_run(kubectl, "wait", "--for=condition=Established", established, "--timeout=60s", timeout=90)
        assert waited.returncode == 0, waited.stderr
        # The API server publishes an established CRD's OpenAPI schema a moment later.
        deadline = time.monotonic() + 60
        while (explained := kubectl_run(kubectl, "explain", "idep.spec.services")).returncode:
            assert time.monotonic() < deadline, explained.stderr
            time.sleep(1)
        assert explained.stdout.startswith(
            "GROUP:      infera.amd.com\nKIND:       InferaDeployment\nVERSION:    v1alpha1\n\n"
            "FIELD: services <map[string]Object>\n"
        )
        assert "  componentType\t<string> -required-\n  enum: server, worker\n" in explained.stdout

        # A rule of the CRD's, in the real API server's words.
        obj = (
            graph()
            .metadata(namespace="default")
            .autoscaling("decode", minReplicas=3, maxReplicas=2, metrics=[{}])
            .obj()
        )
        refused = subprocess.run(
            [*kubectl, "apply", "-f", "-"], input=json.dumps(obj), capture_output=True, text=True, timeout=60
        )
        assert (refused.returncode, refused.stderr) == (
            1,
            'The InferaDeployment "qwen-pd" is invalid: spec.services[decode].autoscaling: Invalid value: '
            f"{AUTOSCALING_RANGE_RULE}\n",
        )


def with_service(name: str, **fields: Any) -> dict[str, Any]:
    return graph().metadata(namespace="default").worker(name, **fields).obj()


def with_gateway(name: str) -> dict[str, Any]:
    return (
        graph(name)
        .metadata(namespace="default")
        .nats(deploy=False)
        .blue_green()
        .gaie(enabled=True, tokenizerPath="Qwen/Qwen3-0.6B", gatewayName="gw")
        .only()
        .worker("a")
        .server("b")
        .obj()
    )


def test_the_real_api_server_holds_names_to_the_names_table_in_the_hooks_words(cluster: Path) -> None:
    """The CRD's rules derived from hooks/api/names.py are within the API server's CEL cost
    budget (it would refuse the CRD otherwise), and refuse what the hook refuses, each in the
    hook's words: a messageExpression names the service."""
    kubectl = [str(programs()["kubectl"]), "--kubeconfig", str(cluster)]
    (nats,) = [rule for rule in name_rules.CLAIM_RULES if rule.tail == "-nats"]
    (generation,) = [rule for rule in name_rules.CLAIM_RULES if rule.tail == "-{generation}"]
    (pool,) = [rule for rule in name_rules.LENGTH_RULES if rule.name.template == "pool-{generation}"]
    refusals = [
        (with_service("b-nats"), f"spec.services: Invalid value: {nats.message('qwen-pd', 'b-nats')}"),
        (
            with_service("deadbeef"),
            f"spec.services: Invalid value: {generation.message('qwen-pd', 'deadbeef')}",
        ),
        (
            with_service("wide", numberOfNodes=1_000_000_000),
            "spec.services.wide.numberOfNodes: Invalid value: 1000000000: spec.services.wide.numberOfNodes in "
            "body should be less than or equal to 64",
        ),
        (with_gateway("g" * 50), f"<nil>: Invalid value: {pool.message}"),
    ]
    for obj, error in refusals:
        refused = kubectl_run(kubectl, "apply", "--dry-run=server", "-f", "-", stdin=json.dumps(obj))
        name = obj["metadata"]["name"]
        assert (refused.returncode, refused.stderr) == (1, f'The InferaDeployment "{name}" is invalid: {error}\n')
    for obj in (with_service("decode-pool"), with_service("router-metrics"), with_gateway("g" * 49)):
        accepted = kubectl_run(kubectl, "apply", "--dry-run=server", "-f", "-", stdin=json.dumps(obj))
        assert accepted.returncode == 0, accepted.stderr


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_every_child_an_example_renders_passes_the_real_api_servers_admission(cluster: Path, example: Path) -> None:
    """Validation, defaulting and admission as the API server runs them on create (a server-side
    dry run: nothing is stored, no controller acts)."""
    rendered = subprocess.run(
        [str(INFERA_HOOKS), "render", str(example), "-n", "default"], capture_output=True, text=True, timeout=60
    )
    assert rendered.returncode == 0, rendered.stderr
    applied = kubectl_run(
        [str(programs()["kubectl"]), "--kubeconfig", str(cluster)],
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        stdin=rendered.stdout,
    )
    assert applied.returncode == 0, applied.stderr
    assert all(line.endswith(" created (server dry run)") for line in applied.stdout.splitlines())
    assert len(applied.stdout.splitlines()) == len([doc for doc in yaml.safe_load_all(rendered.stdout) if doc])


def test_pod_security_admission_admits_each_pod_at_exactly_the_documented_level(cluster: Path, tmp_path: Path) -> None:
    """Every kind of pod the hook renders, created (server-side dry run) in namespaces that
    enforce each Pod Security level: the most restrictive level that admits it is the one
    docs/security.md (and the README) give it."""
    kubectl = [str(programs()["kubectl"]), "--kubeconfig", str(cluster)]
    admitted: dict[str, list[str]] = {}
    for level in LEVELS:
        namespace = f"pod-security-{level}"
        labels = {"pod-security.kubernetes.io/enforce": level, "pod-security.kubernetes.io/enforce-version": "v1.33"}
        manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}}
        children = rendered(tmp_path, namespace)
        # The pods' ServiceAccounts exist, so only Pod Security can refuse a pod.
        accounts = [child for child in children if child["kind"] == "ServiceAccount"]
        for obj in (manifest, *accounts):
            applied = kubectl_run(kubectl, "apply", "--server-side", "-f", "-", stdin=json.dumps(obj))
            assert applied.returncode == 0, applied.stderr
        for row, template in pod_templates(children).items():
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "judged", "namespace": namespace, **template["metadata"]},
                "spec": template["spec"],
            }
            created = kubectl_run(kubectl, "create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod))
            if created.returncode == 0:
                admitted.setdefault(row, []).append(level)
            else:
                assert "violates PodSecurity" in created.stderr, (row, level, created.stderr)
    assert {row: levels[0] for row, levels in admitted.items()} == documented_levels()
    # A level admits every pod a stricter one does.
    assert all(levels == list(LEVELS[LEVELS.index(levels[0]) :]) for levels in admitted.values()), admitted


def test_one_command_brings_up_a_cluster_a_person_can_try_and_one_tears_it_down(tmp_path: Path) -> None:
    """The README's try-it commands, as written: `up` prints a KUBECONFIG under which an
    example becomes Ready; `down` ends it, cluster and all."""
    up_command, down_command = readme_local_cluster()
    need((REPO / ".venv" / "bin" / "python").is_file(), "the README's commands run the test set-up's .venv")
    environment = {**os.environ, "INFERA_LOCALCLUSTER_DIR": str(tmp_path)}
    up = subprocess.Popen(
        ["bash", "-c", up_command], cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert up.stdout is not None
        line = up.stdout.readline()
        assert line.startswith("export KUBECONFIG="), (line, up.stderr.read() if up.poll() is not None else "")
        kubeconfig = line.removeprefix("export KUBECONFIG=").strip()
        kubectl = [str(programs()["kubectl"]), "--kubeconfig", kubeconfig]
        applied = kubectl_run(kubectl, "apply", "-f", str(REPO / "examples" / "pd-disaggregated.yaml"))
        assert applied.returncode == 0, applied.stderr
        waited = kubectl_run(kubectl, "wait", "--for=condition=Ready", "idep/qwen-pd", "--timeout=180s", timeout=200)
        assert waited.returncode == 0, waited.stderr
        assert kubectl_run(kubectl, "get", "idep").stdout.splitlines()[1].split()[:3] == ["qwen-pd", "sglang", "ready"]
    finally:
        down = subprocess.run(
            ["bash", "-c", down_command], cwd=REPO, env=environment, capture_output=True, text=True, timeout=180
        )
        up.wait(timeout=60)
    assert (down.returncode, up.returncode) == (0, 0), (down.stderr, up.stderr.read() if up.stderr else "")
    assert kubectl_run(kubectl, "get", "nodes", "--request-timeout=5s").returncode == 1  # the API server is gone
    assert not (tmp_path / "pid").exists()
