"""Cyclonus (github.com/mattfenwick/cyclonus), a NetworkPolicy engine of Kubernetes' network
policy tooling, judging whether rendered NetworkPolicies admit a connection.

Its `analyze --mode query-traffic` reads the policies and a list of connections (each with its
source and destination pod's namespace, namespace labels and pod labels, the port and its
protocol) and says of each whether the policies allow it. Built from tests/netpol/go.mod into
.cache/netpol (tests/support/gobuild.py).
"""

import json
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.gobuild import built

CYCLONUS = {"cyclonus": "github.com/mattfenwick/cyclonus/cmd/cyclonus"}
VERDICT = re.compile(r"^\| IS ALLOWED\? \|\s+(TRUE|FALSE)\s+\|", re.M)


@dataclass(frozen=True)
class Endpoint:
    """A pod, as a NetworkPolicy sees it: its namespace (and that namespace's labels), labels, IP."""

    namespace: str
    labels: tuple[tuple[str, str], ...]
    ip: str

    def peer(self) -> dict[str, Any]:
        return {
            "Internal": {
                "PodLabels": dict(self.labels),
                "NamespaceLabels": {"kubernetes.io/metadata.name": self.namespace},
                "Namespace": self.namespace,
            },
            "IP": self.ip,
        }


@dataclass(frozen=True)
class Traffic:
    source: Endpoint
    destination: Endpoint
    port: int
    protocol: str = "TCP"


def cyclonus() -> Path:
    return built("netpol", CYCLONUS, cold_build=": about 3 minutes on two cores when Go's build cache is cold")[
        "cyclonus"
    ]


def allowed(policies: list[dict[str, Any]], namespace: str, traffic: list[Traffic]) -> list[bool]:
    """Whether the policies (rendered children, in `namespace`) allow each connection."""
    program = cyclonus()
    items = [{**policy, "metadata": {**policy["metadata"], "namespace": namespace}} for policy in policies]
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        (directory / "policies").mkdir()
        # One NetworkPolicyList: Cyclonus reads one policy, or one list, per file.
        listed = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicyList", "items": items}
        (directory / "policies" / "list.json").write_text(json.dumps(listed))
        queries = [
            {
                "Source": t.source.peer(),
                "Destination": t.destination.peer(),
                "ResolvedPort": t.port,
                "ResolvedPortName": "",
                "Protocol": t.protocol,
            }
            for t in traffic
        ]
        (directory / "traffic.json").write_text(json.dumps(queries))
        done = subprocess.run(
            [
                str(program),
                "analyze",
                "--mode",
                "query-traffic",
                "--policy-path",
                str(directory / "policies"),
                "--traffic-path",
                str(directory / "traffic.json"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    verdicts = VERDICT.findall(done.stdout)
    if done.returncode or len(verdicts) != len(traffic):
        raise AssertionError(
            f"cyclonus answered {len(verdicts)} of {len(traffic)} ({done.returncode}):\n{done.stderr[-3000:]}"
        )
    return [verdict == "TRUE" for verdict in verdicts]
