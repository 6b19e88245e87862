"""A graph with every kind of pod the hook renders, and the Pod Security levels the docs give
each (docs/security.md, and the README's short table)."""

import copy
import itertools
import re
from pathlib import Path
from typing import Any

import yaml

from hooks import cli
from tests.support.docs import DOCS, README, section

LEVELS = ("restricted", "baseline", "privileged")
# The securityContext of every container the hook renders restricted.
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "runAsGroup": 65532,
}
WORKER = {
    "componentType": "worker",
    "resources": {"gpu": 1, "cpu": "8", "memory": "32Gi"},
    "args": ["--model-path", "/models/Qwen3-0.6B"],
}
# Every pod: a GAIE graph with a model cache, a default worker, one without /boot, one with RDMA.
GRAPH = {
    "apiVersion": "infera.amd.com/v1alpha1",
    "kind": "InferaDeployment",
    "metadata": {"name": "sec"},
    "spec": {
        "image": "rocm/infera:v0.2.10",
        "modelCache": {"source": "hf://Qwen/Qwen3-0.6B", "size": "20Gi"},
        "gaie": {"enabled": True, "tokenizerPath": "Qwen/Qwen3-0.6B", "gatewayName": "gw"},
        "services": {
            "server": {"componentType": "server", "args": ["--router-tokenizer-path", "Qwen/Qwen3-0.6B"]},
            "worker": WORKER,
            "lean": {**WORKER, "hostBoot": False},
            "rdma": {**WORKER, "hostBoot": False, "rdma": True},
        },
    },
}
# The docs' rows, and the child whose pod template each is about.
ROWS = {
    "server": ("Deployment", "sec-server"),
    "Endpoint Picker": ("Deployment", "sec-epp"),
    "NATS broker": ("StatefulSet", "sec-nats"),
    "model download Job": ("Job", None),
    "worker": ("Deployment", "sec-worker"),
    "worker with `hostBoot: false`": ("Deployment", "sec-lean"),
    "worker with `rdma: true`": ("Deployment", "sec-rdma"),
}


def rendered(directory: Path, namespace: str | None = None) -> list[dict[str, Any]]:
    """The graph's children, its workers included (as once the model is downloaded)."""
    path = directory / "graph.yaml"
    path.write_text(yaml.safe_dump(GRAPH))
    result = cli.render(str(path), namespace, model_downloaded=True)
    assert not result.failed, result.report
    return [doc for doc in yaml.safe_load_all(result.manifests) if doc]


def pod_templates(children: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The docs' row -> the pod its child's controller creates (a StatefulSet's with the volumes
    of its claims)."""
    templates = {}
    for row, (kind, name) in ROWS.items():
        (child,) = [c for c in children if c["kind"] == kind and name in (None, c["metadata"]["name"])]
        template = copy.deepcopy(child["spec"]["template"])
        for claim in child["spec"].get("volumeClaimTemplates", []):
            claim_name = f"{claim['metadata']['name']}-{child['metadata']['name']}-0"
            volume = {"name": claim["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim_name}}
            template["spec"].setdefault("volumes", []).append(volume)
        templates[row] = template
    return templates


def table(text: str) -> list[list[str]]:
    """The cells of the first Markdown table in `text`, without its header."""
    lines = text.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("|"))
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def documented_levels() -> dict[str, str]:
    """docs/security.md's table: pods -> level."""
    return {pods: level for pods, level, _ in table((DOCS / "security.md").read_text())}


def readme_levels() -> dict[str, str]:
    """The README's summary of the levels (a sentence in "Install on a cluster"): each level it
    names in backticks, with the words that lead up to it since the previous level."""
    summary = " ".join(section(README, "Install on a cluster").split())
    parts = re.split(r"`(restricted|baseline|privileged)`", summary)
    return {level: parts[index - 1].rsplit(". ", 1)[-1] for index, level in enumerate(parts) if index % 2}
