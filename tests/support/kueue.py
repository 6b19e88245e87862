"""Kueue on a loopback cluster: its controller built from the Go module tests/kueue/go.mod pins,
its CRDs and admission webhooks from that module's own manifests (called by URL, as
tests/support/cluster.py registers the LeaderWorkerSet controller's), and its
topology-aware scheduling on."""

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster import Cluster
from tests.support.gobuild import built
from tests.support.loopback import controller_configuration, free_port, loopback_certificate, wait_ready
from tests.support.prerequisites import go_module

KUEUE_MODULE = "sigs.k8s.io/kueue@v0.17.0"
# The integrations a graph's workloads use: single-node pools are Deployments (whose pods
# Kueue admits one by one), multi-node pools LeaderWorkerSets (admitted a group at a time).
FRAMEWORKS = ["pod", "deployment", "leaderworkerset.x-k8s.io/leaderworkerset"]
# Kueue's own kinds, and the kinds of those integrations: the webhooks the tests register.
WEBHOOK_RESOURCES = {
    "pods", "deployments", "leaderworkersets", "clusterqueues", "localqueues", "resourceflavors", "topologies",
    "cohorts", "workloads", "workloadpriorityclasses",
}  # fmt: skip
# As Kueue's kustomization keeps its Pod-based webhooks out of the system namespaces.
SYSTEM_NAMESPACES = {
    "matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kueue-system"]}
    ]
}


# Kueue reads its metrics server's certificate from /etc/kueue/metrics/certs, a path it does not
# let a configuration change (where it does not manage certificates itself, which it can only do
# for a webhook Service). In a mount namespace of its own, /etc is a tmpfs of links to the real
# /etc's entries and to the loopback certificate: nothing outside the namespace changes.
# $1: the work directory; the rest: Kueue's command line.
_WITH_METRICS_CERTIFICATE = """
set -e
work=$1; shift
mkdir -p "$work/etc"
mount --rbind /etc "$work/etc"
mount -t tmpfs tmpfs /etc
for entry in "$work"/etc/* "$work"/etc/.[!.]*; do
    if [ -e "$entry" ]; then ln -s "$entry" "/etc/${entry##*/}"; fi
done
mkdir -p /etc/kueue/metrics
ln -s "$work/kueue-certs" /etc/kueue/metrics/certs
exec "$@"
"""


def programs() -> dict[str, Path]:
    return built("kueue", {"kueue": "sigs.k8s.io/kueue/cmd/kueue"}, cold_build=": about 6 minutes on two cores")


def _webhooks(module: Path, url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, each webhook of a kind the tests use called at `url`."""
    configurations = list(
        yaml.safe_load_all((module / "config" / "components" / "webhook" / "manifests.yaml").read_text())
    )
    for configuration in configurations:
        kept = []
        for webhook in configuration["webhooks"]:
            if not {resource for rule in webhook["rules"] for resource in rule["resources"]} & WEBHOOK_RESOURCES:
                continue
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"{url}{path}", "caBundle": ca_bundle}
            if webhook["name"].removeprefix("m").removeprefix("v") in ("pod.kb.io", "deployment.kb.io"):
                webhook["namespaceSelector"] = SYSTEM_NAMESPACES
            kept.append(webhook)
        configuration["webhooks"] = kept
        configuration["metadata"]["name"] = f"kueue-{configuration['metadata']['name']}"
    return configurations


@contextmanager
def running_kueue(cluster: Cluster, workdir: Path) -> Iterator[None]:
    """The Kueue controller as a loopback process, until the block ends."""
    module = go_module(KUEUE_MODULE)
    bases = module / "config" / "components" / "crd" / "bases"
    crds = sorted(bases.glob("*.yaml"))
    for crd in crds:
        applied = cluster.kubectl("apply", "--server-side", "-f", str(crd))
        assert applied.returncode == 0, applied.stderr
    # Kueue looks its kinds up once, as it starts.
    names = [f"crd/{yaml.safe_load(crd.read_text())['metadata']['name']}" for crd in crds]
    established = cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names, timeout=90)
    assert established.returncode == 0, established.stderr
    certs = workdir / "kueue-certs"
    ca_bundle = loopback_certificate(certs)
    webhook_port, health_port = free_port(), free_port()
    config = workdir / "kueue-config.yaml"
    configuration = controller_configuration("config.kueue.x-k8s.io/v1beta2", certs, webhook_port, health_port)
    configuration |= {"namespace": "kueue-system", "integrations": {"frameworks": FRAMEWORKS}}
    config.write_text(yaml.safe_dump(configuration))
    log_path = workdir / "kueue-controller.log"
    log = log_path.open("w")
    kueue = [
        str(programs()["kueue"]),
        "--config", str(config),
        "--kubeconfig", str(cluster.kubeconfig),
        # Its visibility API would need the API server's aggregation layer.
        "--feature-gates", "VisibilityOnDemand=false",
    ]  # fmt: skip
    process = subprocess.Popen(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", _WITH_METRICS_CERTIFICATE,
         "kueue", str(workdir), *kueue],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    webhooks = _webhooks(module, f"https://127.0.0.1:{webhook_port}", ca_bundle)
    try:
        wait_ready(process, f"http://127.0.0.1:{health_port}/readyz", log_path, seconds=120)
        cluster.apply(*webhooks)
        yield
    finally:
        # Before the process goes: a webhook that fails closed would refuse every pod after it.
        for configuration in webhooks:
            cluster.kubectl("delete", configuration["kind"], configuration["metadata"]["name"], "--ignore-not-found")
        with contextlib.suppress(ProcessLookupError):  # it may have failed to start
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        log.close()
