"""The bundle on a loopback cluster, as a person would run it: `kubectl apply -k` of a test
overlay, `infera-hooks serve` on loopback, and Metacontroller's part played by the stand-in
driver (tests/support/composite_driver.py).

    python -m tests.support.localcluster up     # prints the KUBECONFIG; Ctrl-C tears it down
    python -m tests.support.localcluster down   # tears down the one `up` started, from elsewhere
"""

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster import Cluster, running_cluster_with_nodes, running_lws
from tests.support.composite_driver import CompositeDriver
from tests.support.prerequisites import REPO, need_schemas
from tests.support.service import running_server

CONTROLLER = "inferadeployment-controller"
METACONTROLLER_USER = "system:serviceaccount:metacontroller:metacontroller"
# Where `up` keeps its cluster, logs and pid (gitignored); a test moves it.
WORKDIR = Path(os.environ.get("INFERA_LOCALCLUSTER_DIR", REPO / ".cache" / "localcluster"))


@dataclass
class Installed:
    cluster: Cluster
    driver: CompositeDriver
    hooks_url: str


def overlay(directory: Path, hooks_url: str) -> Path:
    """The test overlay: the bundle with the lws and gaie components, whose only change is the
    CompositeController's hook URLs, pointed at the loopback `infera-hooks serve`."""
    directory.mkdir()
    bundle = os.path.relpath(REPO, directory)
    patch = [
        {"op": "replace", "path": f"/spec/hooks/{hook}/webhook/url", "value": f"{hooks_url}/{hook}"}
        for hook in ("sync", "finalize", "customize")
    ]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [bundle],
        "components": [f"{bundle}/metacontroller/components/{name}" for name in ("lws", "gaie")],
        "patches": [{"target": {"kind": "CompositeController", "name": CONTROLLER}, "patch": json.dumps(patch)}],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return directory


def metacontroller_identity() -> list[dict[str, Any]]:
    """Metacontroller's namespace, ServiceAccount and cluster-wide role, as its own manifests
    install them: it reads and writes every kind a controller registers."""
    meta = {"name": "metacontroller"}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": meta},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "namespace": "metacontroller"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": meta,
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "metacontroller"},
            "subjects": [{"kind": "ServiceAccount", "name": "metacontroller", "namespace": "metacontroller"}],
        },
    ]


def _succeeded(cluster: Cluster, *arguments: str) -> None:
    done = cluster.kubectl(*arguments)
    if done.returncode:
        raise RuntimeError(f"kubectl {' '.join(arguments)}: {done.stderr}")


@contextmanager
def installed_bundle(workdir: Path, schemas: Path) -> Iterator[Installed]:
    """A loopback cluster with kwok GPU nodes and the LeaderWorkerSet controller, the Gateway
    API, Inference Extension and Metacontroller CRDs from `schemas`, and the bundle installed
    through the test overlay, its hooks served and driven."""
    with (
        running_cluster_with_nodes(workdir) as cluster,
        running_lws(cluster, workdir),
        running_server(workdir) as hooks,
    ):
        for crd in ("metacontroller-crds.yaml", "inferencepool.yaml", "httproute.yaml"):
            _succeeded(cluster, "apply", "--server-side", "-f", str(schemas / crd))
        cluster.apply(*metacontroller_identity())
        _succeeded(cluster, "apply", "-k", str(overlay(workdir / "overlay", hooks.url)))
        _succeeded(cluster, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        driver = CompositeDriver(cluster.as_token(cluster.token("metacontroller", "metacontroller")), CONTROLLER)
        driver.start(interval=1.0)
        try:
            yield Installed(cluster, driver, hooks.url)
        finally:
            driver.stop()


def up() -> int:
    if (WORKDIR / "pid").exists():
        print(
            f"already up (pid {(WORKDIR / 'pid').read_text()}): python -m tests.support.localcluster down",
            file=sys.stderr,
        )
        return 1
    WORKDIR.mkdir(parents=True, exist_ok=True)
    workdir = WORKDIR / time.strftime("%Y%m%d-%H%M%S")
    workdir.mkdir()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    (WORKDIR / "pid").write_text(str(os.getpid()))
    try:
        with installed_bundle(workdir, need_schemas()) as installed:
            print(f"export KUBECONFIG={installed.cluster.kubeconfig}", flush=True)
            print(
                "then: kubectl apply -f examples/pd-disaggregated.yaml && kubectl get idep -w\n"
                f"(hook log: {workdir}; Ctrl-C, or `python -m tests.support.localcluster down`, tears it down)",
                file=sys.stderr,
                flush=True,
            )
            while not stopped.wait(5):
                for error in installed.driver.errors:
                    print(f"driver: {error}", file=sys.stderr, flush=True)
                installed.driver.errors.clear()
    finally:
        (WORKDIR / "pid").unlink(missing_ok=True)
    print("torn down", file=sys.stderr)
    return 0


def down() -> int:
    pid_file = WORKDIR / "pid"
    if not pid_file.exists():
        print("nothing is up", file=sys.stderr)
        return 0
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pid_file.unlink()
        return 0
    while pid_file.exists():
        time.sleep(0.5)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.localcluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down"])
    return up() if parser.parse_args().command == "up" else down()


if __name__ == "__main__":
    sys.exit(main())
