"""Every example users start from renders through the service into valid, ready-to-run children."""

from pathlib import Path

import pytest

from tests.conftest import REPO, parent

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def test_the_documented_examples_exist() -> None:
    assert {path.name for path in EXAMPLES} >= {
        "pd-disaggregated.yaml",
        "single-node-mixed.yaml",
        "etcd-discovery.yaml",
    }


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_example_renders_valid_children(hooks, path: Path) -> None:
    answer = hooks.sync(parent(path))
    assert answer["status"]["state"] == "initializing", answer["status"]
    services = parent(path)["spec"]["services"]
    names = {(c["kind"], c["metadata"]["name"]) for c in answer["children"]}
    idep = parent(path)["metadata"]["name"]
    assert {("Deployment", f"{idep}-{service}") for service in services} <= names


def test_examples_are_mentioned_in_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    for path in EXAMPLES:
        assert f"examples/{path.name}" in readme, f"README has no line for {path.name}"
