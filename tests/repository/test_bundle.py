"""`kubectl apply -k .`: what the install bundle renders, validated object by object."""

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hooks.api.graph import GROUP, KIND, PLURAL, VERSION
from hooks.server import GRACEFUL_TIMEOUT_SECONDS
from hooks.vocabulary import CHILD_KINDS, REGISTRATION_SUFFIX
from tests.support.checkout import copy_checkout
from tests.support.docs import readme_overlay_script
from tests.support.prerequisites import REPO, need_kubectl, need_runtime, need_schemas
from tests.support.schemas import validate_object

# What the base bundle and each component register: the kinds the hook renders, from its one table.
CORE, LWS, GAIE = (
    [(kind.api_version, kind.resource) for kind in CHILD_KINDS if kind.component == component]
    for component in (None, "lws", "gaie")
)


@pytest.fixture(scope="module")
def bundle() -> dict[tuple[str, str], dict[str, Any]]:
    kubectl = need_kubectl()
    rendered = subprocess.run([kubectl, "kustomize", str(REPO)], capture_output=True, text=True, check=True).stdout
    objects = [doc for doc in yaml.safe_load_all(rendered) if doc]
    return {(obj["kind"], obj["metadata"]["name"]): obj for obj in objects}


def test_bundle_contents(bundle) -> None:
    assert sorted(bundle) == [
        ("CompositeController", "inferadeployment-controller"),
        ("CustomResourceDefinition", "inferadeployments.infera.amd.com"),
        ("Deployment", "infera-hooks"),
        ("Namespace", "infera-system"),
        ("NetworkPolicy", "infera-hooks"),
        ("PodDisruptionBudget", "infera-hooks"),
        ("Service", "infera-hooks"),
        ("ServiceAccount", "infera-hooks"),
        ("ValidatingAdmissionPolicy", "infera-registration-own-pod-only"),
        ("ValidatingAdmissionPolicy", "infera-scaling-api-replicas-only"),
        ("ValidatingAdmissionPolicyBinding", "infera-registration-own-pod-only"),
        ("ValidatingAdmissionPolicyBinding", "infera-scaling-api-replicas-only"),
    ]
    cluster_scoped = ("CompositeController", "CustomResourceDefinition", "Namespace", "ValidatingAdmissionPolicy")
    for (kind, _), obj in bundle.items():
        if not kind.startswith(cluster_scoped):
            assert obj["metadata"]["namespace"] == "infera-system"


def test_every_bundle_object_validates(bundle) -> None:
    need_schemas()  # the CompositeController is checked against Metacontroller's own CRD
    for obj in bundle.values():
        validate_object(obj)


def test_the_registration_policy_names_the_runtimes_annotation_and_the_workers_accounts(
    bundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What it holds a worker to is what the runtime patches (the real API server's verdicts
    are in cluster/test_graphs.py)."""
    monkeypatch.syspath_prepend(str(need_runtime()))
    from infera.common.discovery_k8s import WORKER_INFO_ANNOTATION

    spec = bundle[("ValidatingAdmissionPolicy", "infera-registration-own-pod-only")]["spec"]
    assert {v["name"]: v["expression"] for v in spec["variables"]}["registration"] == f"'{WORKER_INFO_ANNOTATION}'"
    (condition,) = spec["matchConditions"]
    assert f"endsWith('-{REGISTRATION_SUFFIX}')" in condition["expression"]


def test_composite_controller_registers_exactly_the_core_kinds(bundle) -> None:
    spec = bundle[("CompositeController", "inferadeployment-controller")]["spec"]
    assert spec["generateSelector"] is True
    assert spec["parentResource"] == {"apiVersion": "infera.amd.com/v1alpha1", "resource": "inferadeployments"}
    assert [(c["apiVersion"], c["resource"]) for c in spec["childResources"]] == CORE
    assert all(c["updateStrategy"] == {"method": "InPlace"} for c in spec["childResources"])
    for hook in ("sync", "finalize", "customize"):
        assert spec["hooks"][hook]["version"] == "v2"
        assert spec["hooks"][hook]["webhook"]["url"] == f"http://infera-hooks.infera-system/{hook}"
        assert spec["hooks"][hook]["webhook"]["timeout"] == "10s"


def test_hook_deployment_is_locked_down_and_probed(bundle) -> None:
    deployment = bundle[("Deployment", "infera-hooks")]
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    # A reserved domain until you name your registry: a pull fails loudly, and no registry a node
    # searches for short names can serve someone else's image under it.
    assert container["image"] == "registry.example.com/infera-hooks:0.1.0"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert set(container["resources"]) == {"requests", "limits"}
    # Endpoints go first, then SIGTERM; the pause and the graceful drain fit in the grace period.
    assert container["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", "5"]}}}
    assert pod["terminationGracePeriodSeconds"] > 5 + GRACEFUL_TIMEOUT_SECONDS
    service = bundle[("Service", "infera-hooks")]["spec"]
    assert service["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]


def test_bundle_crd_is_the_generated_one(bundle) -> None:
    committed = yaml.safe_load((REPO / "crds" / "infera.amd.com_inferadeployments.yaml").read_text())
    assert bundle[("CustomResourceDefinition", "inferadeployments.infera.amd.com")] == committed


def render_overlay(tmp_path: Path, kustomization: str) -> list[dict[str, Any]]:
    """Render a user's kustomization placed next to a checkout named infera-hooks."""
    kubectl = need_kubectl()
    (tmp_path / "infera-hooks").symlink_to(REPO, target_is_directory=True)
    overlay = tmp_path / "my-install"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(kustomization)
    rendered = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


@pytest.mark.parametrize(
    ("components", "registered"),
    [(["lws"], CORE + LWS), (["gaie"], CORE + GAIE), (["lws", "gaie"], CORE + LWS + GAIE)],
    ids=["lws", "gaie", "both"],
)
def test_components_add_their_kinds(tmp_path: Path, components: list[str], registered: list) -> None:
    need_schemas()
    listed = "".join(f"  - ../infera-hooks/metacontroller/components/{c}\n" for c in components)
    objects = render_overlay(
        tmp_path,
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - ../infera-hooks\ncomponents:\n{listed}",
    )
    for obj in objects:
        validate_object(obj)
    (composite,) = [obj for obj in objects if obj["kind"] == "CompositeController"]
    children = composite["spec"]["childResources"]
    assert [(c["apiVersion"], c["resource"]) for c in children] == registered
    assert all(c["updateStrategy"] == {"method": "InPlace"} for c in children)


def test_readme_overlay_works_wherever_the_clone_is(tmp_path: Path) -> None:
    """The README's overlay script, run from a clone under any name: it writes an overlay beside
    the clone that builds with both components."""
    kubectl = need_kubectl()
    clone = copy_checkout(tmp_path / "any name for a clone")
    subprocess.run(["bash", "-c", readme_overlay_script()], cwd=clone, check=True, capture_output=True)
    rendered = subprocess.run(
        [kubectl, "kustomize", str(tmp_path / "infera-install")], capture_output=True, text=True, check=True
    ).stdout
    objects = [doc for doc in yaml.safe_load_all(rendered) if doc]
    (composite,) = [obj for obj in objects if obj["kind"] == "CompositeController"]
    assert [(c["apiVersion"], c["resource"]) for c in composite["spec"]["childResources"]] == CORE + LWS + GAIE


def test_a_component_alone_renders_nothing() -> None:
    """Why the README says components only work inside an overlay."""
    kubectl = need_kubectl()
    alone = subprocess.run(
        [kubectl, "kustomize", str(REPO / "metacontroller" / "components" / "lws")], capture_output=True, text=True
    )
    assert (alone.returncode, alone.stdout.strip()) == (0, "")


def test_the_readme_image_step_names_your_image(tmp_path: Path) -> None:
    """Setting `newName` under `images` in kustomization.yaml, as the README says, is all it takes."""
    kubectl = need_kubectl()
    clone = copy_checkout(tmp_path / "clone")
    kustomization = (clone / "kustomization.yaml").read_text()
    edited = re.sub(r"newName: \S+", "newName: registry.internal:5000/ml/infera-hooks", kustomization)
    assert edited != kustomization
    (clone / "kustomization.yaml").write_text(edited)
    rendered = subprocess.run([kubectl, "kustomize", str(clone)], capture_output=True, text=True, check=True).stdout
    (deployment,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment"]
    assert (
        deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        == "registry.internal:5000/ml/infera-hooks:0.1.0"
    )


def test_network_policy_and_disruption_budget(bundle) -> None:
    policy = bundle[("NetworkPolicy", "infera-hooks")]["spec"]
    deployment = bundle[("Deployment", "infera-hooks")]
    assert policy["podSelector"] == deployment["spec"]["selector"]
    assert policy["ingress"] == [
        {
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "metacontroller"}}}],
            "ports": [{"port": 8080, "protocol": "TCP"}],
        }
    ]
    budget = bundle[("PodDisruptionBudget", "infera-hooks")]["spec"]
    assert budget == {"minAvailable": 1, "selector": deployment["spec"]["selector"]}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    for hook in ("sync", "finalize", "customize"):
        assert bundle[("CompositeController", "inferadeployment-controller")]["spec"]["hooks"][hook]["webhook"][
            "etag"
        ] == {"enabled": True}


def test_auth_and_tls_components(tmp_path: Path) -> None:
    need_schemas()
    objects = render_overlay(
        tmp_path,
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../infera-hooks\n"
        "components:\n  - ../infera-hooks/metacontroller/components/auth\n  - ../infera-hooks/metacontroller/components/tls\n",
    )
    for obj in objects:
        validate_object(obj)
    by_kind = {(obj["kind"], obj["metadata"]["name"]): obj for obj in objects}
    container = by_kind[("Deployment", "infera-hooks")]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == [
        "serve",
        "--bind",
        "0.0.0.0:8080",
        "--workers",
        "2",
        "--auth-token-file",
        "/var/run/secrets/infera-hooks/auth/token",
        "--certfile=/var/run/secrets/infera-hooks/tls/tls.crt",
        "--keyfile=/var/run/secrets/infera-hooks/tls/tls.key",
    ]
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert by_kind[("Service", "infera-hooks")]["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "http", "protocol": "TCP"}
    ]
    hooks = by_kind[("CompositeController", "inferadeployment-controller")]["spec"]["hooks"]
    for hook in ("sync", "finalize", "customize"):
        webhook = hooks[hook]["webhook"]
        assert webhook["url"] == f"https://infera-hooks.infera-system.svc/{hook}"
        assert webhook["authorization"] == {
            "type": "Bearer",
            "secretRef": {"name": "infera-hooks-auth", "namespace": "infera-system", "key": "token"},
        }
        assert webhook["caBundle"] == {
            "secretRef": {"name": "infera-hooks-tls", "namespace": "infera-system", "key": "ca.crt"}
        }


def test_the_kube_state_metrics_component_runs_a_restricted_exporter_of_inferadeployments(tmp_path: Path) -> None:
    """What the component adds, valid against Kubernetes' schemas; the exporter itself is run
    against the real control plane (cluster/test_graphs.py)."""
    need_schemas()
    (tmp_path / "base").mkdir()
    (tmp_path / "with").mkdir()
    base = render_overlay(
        tmp_path / "base",
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../infera-hooks\n",
    )
    objects = render_overlay(
        tmp_path / "with",
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../infera-hooks\n"
        "components:\n  - ../infera-hooks/metacontroller/components/kube-state-metrics\n",
    )
    for obj in objects:
        validate_object(obj)
    added = {(obj["kind"], obj["metadata"]["name"]): obj for obj in objects if obj not in base}
    (config_name,) = [name for kind, name in added if kind == "ConfigMap"]
    assert config_name.startswith("infera-kube-state-metrics-")  # a new name, so a new rollout, per change
    assert sorted(added) == sorted(
        [("ConfigMap", config_name)]
        + [(kind, "infera-kube-state-metrics") for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
        + [("Deployment", "infera-kube-state-metrics"), ("Service", "infera-kube-state-metrics")]
    )
    config = yaml.safe_load(added[("ConfigMap", config_name)]["data"]["custom-resource-state.yaml"])
    (resource,) = config["spec"]["resources"]
    assert resource["groupVersionKind"] == {"group": GROUP, "version": VERSION, "kind": KIND}
    assert added[("ClusterRole", "infera-kube-state-metrics")]["rules"] == [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["list", "watch"]},
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
    ]
    pod = added[("Deployment", "infera-kube-state-metrics")]["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "config", "configMap": {"name": config_name}}]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    # The image is the release the control plane tier builds from its Go module.
    module = (REPO / "tests" / "kube-state-metrics" / "go.mod").read_text()
    version = re.search(r"k8s\.io/kube-state-metrics/v2 (v[0-9.]+)", module).group(1)
    assert container["image"] == f"registry.k8s.io/kube-state-metrics/kube-state-metrics:{version}"
