"""`infera-hooks render` is a preview you can pipe into kubectl, like `helm template`: only the
children on stdout, byte-identical between runs, the status summary on stderr, and an exit code
that says whether the spec is valid."""

import subprocess
import sys
from pathlib import Path

import yaml

from hooks import reconcile
from hooks.contract import parse_request
from tests.support.prerequisites import REPO, need_kubectl
from tests.support.requests import PD, load_yaml
from tests.support.schemas import validate_object


def render(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    executable = Path(sys.executable).with_name("infera-hooks")
    command = [str(executable)] if executable.exists() else [sys.executable, "-m", "hooks"]
    return subprocess.run([*command, "render", *args], input=stdin, capture_output=True, text=True, timeout=60)


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
    assert len(documents) == 11
    for document in documents:
        assert document["metadata"]["namespace"] == "team-a"
        validate_object(document)
    # The graph is rendered in that namespace, not only labelled with it.
    (binding,) = [document for document in documents if document["kind"] == "RoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "qwen-pd-disc", "namespace": "team-a"}]


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
