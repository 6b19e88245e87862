"""kube-state-metrics, built from its Go module (tests/kube-state-metrics/go.mod pins the
release the component's image names), run on loopback against a cluster as the
kube-state-metrics component deploys it: its ServiceAccount's identity, its arguments and its
configuration file."""

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.cluster import Cluster
from tests.support.gobuild import built
from tests.support.loopback import free_port, wait_ready
from tests.support.prerequisites import REPO
from tests.support.requests import load_yaml
from tests.support.service import stop_process

COMPONENT = REPO / "metacontroller" / "components" / "kube-state-metrics"
CONFIG = COMPONENT / "custom-resource-state.yaml"
# Where the component's Deployment mounts CONFIG.
MOUNTED_CONFIG = "/etc/infera-kube-state-metrics/custom-resource-state.yaml"
IDENTITY_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")


def program() -> Path:
    return built(
        "kube-state-metrics",
        {"kube-state-metrics": "k8s.io/kube-state-metrics/v2"},
        cold_build=": about 3 minutes on two cores when Go's build cache is cold",
    )["kube-state-metrics"]


def deployed_arguments() -> list[str]:
    """The container's arguments in the component's Deployment, its configuration read from the checkout."""
    (deployment,) = [d for d in load_yaml(COMPONENT / "kube-state-metrics.yaml") if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return [argument.replace(MOUNTED_CONFIG, str(CONFIG)) for argument in container["args"]]


@contextmanager
def running_kube_state_metrics(cluster: Cluster, workdir: Path) -> Iterator[str]:
    """The component's identity applied and kube-state-metrics serving as it: the URL of its metrics."""
    documents = load_yaml(COMPONENT / "kube-state-metrics.yaml")
    cluster.apply(*(document for document in documents if document["kind"] in IDENTITY_KINDS))
    kubeconfig = cluster.kubeconfig_for(
        workdir / "kube-state-metrics-kubeconfig", "infera-system", "infera-kube-state-metrics"
    )
    port, telemetry = free_port(), free_port()
    with (workdir / "kube-state-metrics.log").open("wb") as log:
        process = subprocess.Popen(
            [
                str(program()),
                *deployed_arguments(),
                f"--kubeconfig={kubeconfig}",
                "--host=127.0.0.1",
                f"--port={port}",
                "--telemetry-host=127.0.0.1",
                f"--telemetry-port={telemetry}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(process, f"http://127.0.0.1:{telemetry}/readyz", workdir / "kube-state-metrics.log")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(process)
