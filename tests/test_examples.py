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
        "gaie-pd.yaml",
        "multinode-tp.yaml",
    }


PLUMBING = {("ServiceAccount", "disc"), ("Role", "disc"), ("RoleBinding", "disc"), ("StatefulSet", "nats"), ("Service", "nats")}
EXPECTED = {
    "pd-disaggregated.yaml": ("qwen-pd", PLUMBING | {("Deployment", "server"), ("Service", "server"),
                                                     ("Deployment", "prefill"), ("Deployment", "decode")}),
    "single-node-mixed.yaml": ("qwen-mixed", PLUMBING | {("Deployment", "server"), ("Service", "server"),
                                                         ("Deployment", "worker")}),
    "etcd-discovery.yaml": ("llama-etcd", {("Deployment", "server"), ("Service", "server"), ("Deployment", "worker")}),
    "gaie-pd.yaml": ("qwen-gaie", PLUMBING | {("Deployment", "prefill"), ("Deployment", "decode"), ("Deployment", "epp"),
                                              ("Service", "epp"), ("InferencePool", "pool"), ("HTTPRoute", "route")}),
    "multinode-tp.yaml": ("llama-tp", PLUMBING | {("Deployment", "server"), ("Service", "server"),
                                                  ("LeaderWorkerSet", "worker")}),
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


def test_examples_are_mentioned_in_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    for path in EXAMPLES:
        assert f"examples/{path.name}" in readme, f"README has no line for {path.name}"
