"""The loopback control plane's programs: kube-apiserver, kube-controller-manager,
kube-scheduler and kubectl, kwok and kwokctl, the LeaderWorkerSet controller and etcd, built
from the Go modules tests/controlplane/go.mod pins (published modules through the module proxy,
nothing vendored).

They are built once per machine into .cache/controlplane (tests/support/gobuild.py); a cold
build compiles Kubernetes on every core, about 8 minutes on two.
"""

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support import kubelet
from tests.support.gobuild import built

KUBERNETES_VERSION = "v1.36.3"
# The name each program is installed as, by main package.
PROGRAMS = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    "kwok": "sigs.k8s.io/kwok/cmd/kwok",
    "kwokctl": "sigs.k8s.io/kwok/cmd/kwokctl",
    "lws-controller": "sigs.k8s.io/lws/cmd",
    "etcd": "go.etcd.io/etcd/server/v3",
}
# What `--version` of a Kubernetes program says; without these a module build says v0.0.0-master.
VERSION_FLAGS = " ".join(
    f"-X k8s.io/component-base/version.{name}={value}"
    for name, value in (
        ("gitVersion", KUBERNETES_VERSION),
        ("gitMajor", KUBERNETES_VERSION[1:].split(".")[0]),
        ("gitMinor", KUBERNETES_VERSION.split(".")[1]),
        ("gitTreeState", "clean"),
    )
)


def programs() -> dict[str, Path]:
    """Each program's path, built first if this machine has not built these versions yet."""
    return built(
        "controlplane", PROGRAMS, VERSION_FLAGS, ": about 8 minutes on two cores when Go's build cache is cold"
    )


@contextmanager
def running_cluster(workdir: Path, name: str = "infera-test", audit_policy: Path | None = None) -> Iterator[Path]:
    """A kube-apiserver, kube-controller-manager, kube-scheduler and kwok on loopback, run by
    kwokctl from the programs built here (it downloads nothing when every program is named),
    auditing by `audit_policy` if given; the kubeconfig's path, until the cluster is deleted."""
    paths = programs()
    config = workdir / "kwokctl.yaml"
    options = {
        "runtime": "binary",
        "kubeVersion": KUBERNETES_VERSION,
        "etcdVersion": "3.6.8",
        "bindAddress": "127.0.0.1",  # kwokctl's default binds every interface
        # Where the data-plane sandbox's pods reach the API server, through its relay.
        "kubeApiserverCertSANs": [kubelet.NODE_IP],
        "kubeApiserverBinary": str(paths["kube-apiserver"]),
        "kubeControllerManagerBinary": str(paths["kube-controller-manager"]),
        "kubeSchedulerBinary": str(paths["kube-scheduler"]),
        "kwokControllerBinary": str(paths["kwok"]),
        "etcdBinary": str(paths["etcd"]),
        "kubectlBinary": str(paths["kubectl"]),
    }
    if audit_policy is not None:
        options["kubeAuditPolicy"] = str(audit_policy)
    # Aggregated APIs (a custom metrics API for the autoscaler) are reached at their Service's
    # endpoints: no ClusterIP answers here.
    apiserver_arguments = [
        {"key": "enable-aggregator-routing", "value": "true"},
        # kwokctl leaves the API server's default, a /24: 254 ClusterIPs, fewer than a fleet's
        # Services. The kubernetes Service keeps its 10.0.0.1.
        {"key": "service-cluster-ip-range", "value": "10.0.0.0/16"},
    ]
    if audit_policy is not None:
        # Its log rotates at 100 MB by default, which a fleet's writes pass: readers want one file.
        apiserver_arguments.append({"key": "audit-log-maxsize", "value": "100000"})
    apiserver = {"name": "kube-apiserver", "extraArgs": apiserver_arguments}
    config.write_text(
        json.dumps(
            {
                "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
                "kind": "KwokctlConfiguration",
                "options": options,
                "componentsPatches": [apiserver],
            }
        )
    )
    kubeconfig = workdir / "kubeconfig"
    environment = {**os.environ, "KWOK_WORKDIR": str(workdir / "kwok")}
    kwokctl = [str(paths["kwokctl"]), "--config", str(config), "--name", name]
    subprocess.run(
        [*kwokctl, "create", "cluster", "--kubeconfig", str(kubeconfig), "--wait", "3m"],
        env=environment,
        check=True,
        capture_output=True,
        timeout=300,
    )
    try:
        yield kubeconfig
    finally:
        subprocess.run([*kwokctl, "delete", "cluster"], env=environment, capture_output=True, timeout=120)
