"""`infera-hooks render` is a preview for review, `kubectl diff`-style checks and CI linting of
specs, like `helm template`: only the children on stdout, byte-identical between runs, a status
line per InferaDeployment and a line per skipped document on stderr, and an exit code that says
whether every spec is valid. Input errors are one line on stderr, in the API's words."""

import copy
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from hooks import reconcile
from hooks.api.graph import InferaDeployment
from hooks.contract import parse_request
from tests.support.prerequisites import REPO, need_kubectl
from tests.support.requests import EXAMPLES, PD, load_yaml
from tests.support.schemas import validate_object

MODEL_CACHE = EXAMPLES / "pd-model-cache.yaml"


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    executable = Path(sys.executable).with_name("infera-hooks")
    command = [str(executable)] if executable.exists() else [sys.executable, "-m", "hooks"]
    return subprocess.run([*command, *args], input=stdin, capture_output=True, text=True, timeout=60)


def render(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return run("render", *args, stdin=stdin)


def test_render_prints_only_the_children_the_same_way_every_time() -> None:
    first, second = render(str(PD)), render(str(PD))
    assert first.returncode == 0 and first.stdout == second.stdout
    documents = list(yaml.safe_load_all(first.stdout))
    expected = reconcile.sync(parse_request({"parent": load_yaml(PD)[0], "children": {}}))
    assert documents == expected["children"]
    assert first.stderr == "qwen-pd: initializing: creating 3 services\n"


def test_rendered_graph_builds_with_kustomize_and_validates(tmp_path: Path) -> None:
    kubectl = need_kubectl()
    out = tmp_path / "out"
    out.mkdir()
    result = render(str(PD), "--namespace", "team-a")
    (out / "graph.yaml").write_text(result.stdout)
    (out / "kustomization.yaml").write_text("resources:\n  - graph.yaml\n")
    built = subprocess.run([kubectl, "kustomize", str(out)], capture_output=True, text=True, check=True, timeout=60)
    documents = list(yaml.safe_load_all(built.stdout))
    assert len(documents) == 15
    for document in documents:
        assert document["metadata"]["namespace"] == "team-a"
        validate_object(document)
    # The graph is rendered in that namespace, not only labelled with it.
    bindings = [document for document in documents if document["kind"] == "RoleBinding"]
    assert [binding["subjects"] for binding in bindings] == [
        [{"kind": "ServiceAccount", "name": f"qwen-pd-{account}", "namespace": "team-a"}]
        for account in ("disc", "register")
    ]


def test_render_reads_standard_input() -> None:
    assert render("-", stdin=PD.read_text()).stdout == render(str(PD)).stdout


def test_an_invalid_spec_exits_non_zero_with_the_hooks_message() -> None:
    text = PD.read_text().replace("componentType: server", "componentType: router", 1)
    result = render("-", stdin=text)
    parent = yaml.safe_load(text)
    message = reconcile.sync(parse_request({"parent": parent, "children": {}}))["status"]["message"]
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == f"qwen-pd: failed: {message}\n"


def test_file_and_yaml_errors_are_one_line() -> None:
    missing = render("/no/such/file.yaml")
    assert (missing.returncode, missing.stdout, missing.stderr) == (
        1,
        "",
        "infera-hooks render: /no/such/file.yaml: No such file or directory\n",
    )
    broken = render("-", stdin="a: [\n")
    assert (broken.returncode, broken.stderr) == (
        1,
        "infera-hooks render: -: not valid YAML (line 2, column 1): expected the node content, but found '<stream end>'\n",
    )
    nothing = render("-", stdin="kind: ConfigMap\n")
    assert nothing.stderr == "infera-hooks render: -: no InferaDeployment found\n"


def _shared_objects(node: object, seen: dict[int, object]) -> list[object]:
    """Dicts and lists reachable twice in one tree."""
    if not isinstance(node, dict | list):
        return []
    if id(node) in seen:
        return [node]
    seen[id(node)] = node
    values = node.values() if isinstance(node, dict) else node
    return [shared for value in values for shared in _shared_objects(value, seen)]


def test_no_two_places_in_a_graph_share_an_object() -> None:
    """A shared dict would be changed twice by one in-place patch, and it is printed as a YAML
    alias (`&id001`) that kubectl apply users do not expect."""
    for example in sorted((REPO / "examples").glob("*.yaml")):
        for parent in load_yaml(example):
            if parent.get("kind") != "InferaDeployment":
                continue
            answer = reconcile.sync(parse_request({"parent": parent, "children": {}}))
            assert answer["status"]["state"] == "initializing", answer["status"]["message"]
            assert _shared_objects(answer["children"], {}) == [], example.name


GOLDEN = REPO / "tests" / "golden"


def test_examples_render_as_recorded() -> None:
    """What every example renders is kept in tests/golden, so a change to any child shows up as
    a diff in review, and a release that must not touch running graphs can prove it does not."""
    examples = sorted((REPO / "examples").glob("*.yaml"))
    assert sorted(path.name for path in GOLDEN.glob("*.yaml")) == [path.name for path in examples]
    for example in examples:
        assert render(str(example)).stdout == (GOLDEN / example.name).read_text(), (
            f"{example.name} renders differently from tests/golden/{example.name}; if the change is intended, "
            f"regenerate: infera-hooks render examples/{example.name} > tests/golden/{example.name}"
        )


def test_an_api_version_that_is_not_served_is_refused() -> None:
    settings = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\n---\n"
    wrong = render("-", stdin=settings + PD.read_text().replace("infera.amd.com/v1alpha1", "infera.amd.com/v1"))
    assert (wrong.returncode, wrong.stdout, wrong.stderr) == (
        1,
        "",
        "infera-hooks render: -: document 2 (InferaDeployment qwen-pd): apiVersion infera.amd.com/v1 is not served: "
        "use infera.amd.com/v1alpha1\n",
    )
    missing = render("-", stdin=PD.read_text().replace("apiVersion: infera.amd.com/v1alpha1\n", ""))
    assert (missing.returncode, missing.stdout, missing.stderr) == (
        1,
        "",
        "infera-hooks render: -: document 1 (InferaDeployment qwen-pd): apiVersion is missing: use "
        "infera.amd.com/v1alpha1\n",
    )


def as_read_back(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """An InferaDeployment as `kubectl get -o yaml` prints it after a while in the cluster: what
    the API server and kubectl add to metadata, and the status of syncs past."""
    read = copy.deepcopy(obj)
    read["metadata"].update(
        namespace=namespace,
        uid="8d1f6c1e-4b1a-4c3e-9a55-0b6f5d2b9f10",
        resourceVersion="48213",
        generation=3,
        creationTimestamp="2026-11-30T09:12:44Z",
        finalizers=["metacontroller.io/compositecontroller-infera"],
        annotations={"kubectl.kubernetes.io/last-applied-configuration": json.dumps(obj) + "\n"},
        managedFields=[
            {
                "apiVersion": obj["apiVersion"],
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:services": {}}},
                "manager": "kubectl-client-side-apply",
                "operation": "Update",
                "time": "2026-11-30T09:12:44Z",
            }
        ],
    )
    read["status"] = {
        "observedGeneration": 2,
        "state": "failed",
        "message": "invalid spec: spec.services.decode.replcas: unknown field; did you mean replicas?",
        "conditions": [
            {
                "type": "SpecValid",
                "status": "False",
                "reason": "InvalidSpec",
                "message": "invalid spec",
                "observedGeneration": 2,
                "lastTransitionTime": "2026-11-30T09:20:00Z",
            }
        ],
    }
    return read


@pytest.mark.parametrize(
    "list_kind", [("v1", "List"), ("infera.amd.com/v1alpha1", "InferaDeploymentList")], ids=lambda kind: kind[1]
)
def test_a_list_read_back_from_the_cluster_renders_as_its_specs(list_kind: tuple[str, str]) -> None:
    """What `kubectl get idep -o yaml` prints previews the same graphs as the files applied:
    neither server-written metadata nor a previous run's status changes a child."""
    (pd,), (cached,) = load_yaml(PD), load_yaml(MODEL_CACHE)
    items = [as_read_back(pd, "team-a"), {"apiVersion": "v1", "kind": "ConfigMap"}, as_read_back(cached, "team-a")]
    api_version, kind = list_kind
    listed = yaml.safe_dump({"apiVersion": api_version, "kind": kind, "items": items, "metadata": {}})
    result = render("-", stdin=listed)
    bare = [render(str(path), "-n", "team-a") for path in (PD, MODEL_CACHE)]
    assert result.returncode == 0
    assert result.stdout == "---\n".join(each.stdout for each in bare)
    assert result.stderr == (
        f"infera-hooks render: -: skipped document 1 item 2 (ConfigMap): not an InferaDeployment\n"
        f"{bare[0].stderr}{bare[1].stderr}"
    )


def test_every_skipped_document_is_named_with_why() -> None:
    others = (
        "---\n---\n"  # an empty first document
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\n---\n"
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n---\n"
        "replicas: 2\n---\n"
    )
    result = render("-", stdin=others + PD.read_text())
    assert (result.returncode, result.stdout) == (0, render(str(PD)).stdout)
    assert result.stderr == (
        "infera-hooks render: -: skipped document 1: empty\n"
        "infera-hooks render: -: skipped document 2 (ConfigMap settings): not an InferaDeployment\n"
        "infera-hooks render: -: skipped document 3 (Namespace team-a): not an InferaDeployment\n"
        "infera-hooks render: -: skipped document 4 (no kind): not an InferaDeployment\n"
        "qwen-pd: initializing: creating 3 services\n"
    )
    nothing = render("-", stdin="apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\n")
    assert (nothing.returncode, nothing.stdout, nothing.stderr) == (
        1,
        "",
        "infera-hooks render: -: no InferaDeployment found\n",
    )


@pytest.mark.parametrize(
    ("document", "error"),
    [
        ("just text\n", "document 1 is the scalar 'just text', not a Kubernetes object"),
        ("- kind: InferaDeployment\n", "document 1 is a list, not a Kubernetes object"),
        ("apiVersion: v1\nkind: List\nitems: {}\n", "document 1 (List): items must be a list"),
    ],
    ids=["scalar", "list", "list items"],
)
def test_a_document_that_is_no_object_fails_the_run(document: str, error: str) -> None:
    """kubectl refuses such a file too; it is most likely mangled, and a lint must not pass it."""
    result = render("-", stdin=document + "---\n" + PD.read_text())
    assert (result.returncode, result.stdout, result.stderr) == (1, "", f"infera-hooks render: -: {error}\n")


@pytest.mark.parametrize(
    ("name", "error"),
    [
        (None, "metadata.name is missing"),
        ('""', "metadata.name is missing"),
        ("42", "metadata.name must be a string, not 42"),
    ],
    ids=["absent", "empty", "a number"],
)
def test_a_bad_name_is_said_in_the_apis_words(name: str | None, error: str) -> None:
    line = "  name: qwen-pd\n"
    text = PD.read_text().replace(line, f"  name: {name}\n" if name else "  labels: {}\n")
    described = "InferaDeployment 42" if name == "42" else "InferaDeployment"
    result = render("-", stdin=text)
    assert (result.returncode, result.stdout, result.stderr) == (
        1,
        "",
        f"infera-hooks render: -: document 1 ({described}): {error}\n",
    )


def test_an_unknown_field_is_met_with_the_field_it_likely_misspells() -> None:
    top = render("-", stdin=PD.read_text().replace("  backendFramework:", "  backendFramwork:"))
    assert (top.returncode, top.stdout, top.stderr) == (
        1,
        "",
        "qwen-pd: failed: invalid spec: spec.backendFramwork: unknown field; did you mean backendFramework?\n",
    )
    outside = render("-", stdin=PD.read_text().replace("spec:", "sepc:", 1))
    assert (outside.returncode, outside.stdout, outside.stderr) == (
        1,
        "",
        "infera-hooks render: -: document 1 (InferaDeployment qwen-pd): sepc: unknown field; did you mean spec?\n",
    )
    nested = yaml.safe_load(PD.read_text())
    nested["spec"]["services"]["decode"]["replcas"] = nested["spec"]["services"]["decode"].pop("replicas")
    result = render("-", stdin=yaml.safe_dump(nested))
    assert (result.returncode, result.stderr) == (
        1,
        "qwen-pd: failed: invalid spec: spec.services.decode.replcas: unknown field; did you mean replicas?\n",
    )


def test_model_downloaded_previews_the_workers_on_the_cache() -> None:
    """Without the flag a model-cache graph shows no worker pools (they wait for the download);
    with it, the graph the hook renders once the download Job is complete."""
    waiting = list(yaml.safe_load_all(render(str(MODEL_CACHE)).stdout))
    result = render(str(MODEL_CACHE), "--model-downloaded")
    assert result.returncode == 0
    assert result.stderr == (
        "qwen-cache: pending: hf://Qwen/Qwen3-0.6B is in the model cache; not created yet: Deployment "
        "qwen-cache-decode, PodDisruptionBudget qwen-cache-decode, Deployment qwen-cache-prefill, "
        "PodDisruptionBudget qwen-cache-prefill (if they stay missing, another object holds the name, which "
        "`kubectl get` shows, or Metacontroller's create fails: its log says why, e.g. a quota or an admission "
        "policy); decode 0/2 ready; prefill 0/1 ready; server 0/1 ready; waiting on 3 of 3 services; NATS broker "
        "0/1 ready\n"
    )
    documents = list(yaml.safe_load_all(result.stdout))
    keys = [(child["kind"], child["metadata"]["name"]) for child in documents]
    workers = [("Deployment", "qwen-cache-decode"), ("Deployment", "qwen-cache-prefill")]
    assert not any((child["kind"], child["metadata"]["name"]) in workers for child in waiting)
    assert all(key in keys for key in workers) and len(keys) == len(set(keys))
    # The same download Job, kept as applied: previewing it does not retry or replace it.
    (job,) = [child for child in documents if child["kind"] == "Job"]
    assert job in waiting
    cache = InferaDeployment.from_parent(load_yaml(MODEL_CACHE)[0]).spec.model_cache
    assert cache is not None
    by_key = dict(zip(keys, documents, strict=True))
    for worker in workers:
        pod = by_key[worker]["spec"]["template"]["spec"]
        (engine,) = [container for container in pod["containers"] if container["name"] == "infera"]
        assert {"name": "model-cache", "mountPath": cache.mount_path, "subPath": cache.digest, "readOnly": True} in (
            engine["volumeMounts"]
        )
        assert {
            "name": "model-cache",
            "persistentVolumeClaim": {"claimName": "qwen-cache-models", "readOnly": True},
        } in pod["volumes"]
    for document in documents:
        validate_object(document)


def test_the_worker_pools_a_fresh_graph_leaves_out_are_checked_all_the_same() -> None:
    """A worker pool waits for the download, but a mistake in it fails now, not after the
    download: with the flag or without."""
    text = MODEL_CACHE.read_text().replace(
        "      role: decode\n",
        "      role: decode\n      extraPodSpec: {containers: [{name: main, ports: [{containerPort: 70000}]}]}\n",
    )
    refused = (
        "qwen-cache: failed: spec.services.decode.extraPodSpec: the API server would refuse Deployment qwen-cache-decode "
        "made from it: spec.template.spec.containers[0].ports[0].containerPort: 70000 is not a port number (1-65535)\n"
    )
    # Nothing is created, not even the download Job, so the flag has no download to complete.
    for flags in ([], ["--model-downloaded"]):
        result = render("-", *flags, stdin=text)
        assert (result.returncode, result.stdout, result.stderr) == (1, "", refused)


def test_model_downloaded_changes_nothing_without_a_model_cache() -> None:
    result = render(str(PD), "--model-downloaded")
    assert (result.returncode, result.stdout) == (0, render(str(PD)).stdout)
    assert result.stderr == (
        f"infera-hooks render: {PD}: document 1 (InferaDeployment qwen-pd): --model-downloaded has no effect "
        "without spec.modelCache\n"
        "qwen-pd: initializing: creating 3 services\n"
    )


def test_version_is_the_installed_distributions() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    result = run("--version")
    assert (result.returncode, result.stdout, result.stderr) == (0, f"infera-hooks {project['version']}\n", "")
