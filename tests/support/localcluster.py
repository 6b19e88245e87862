"""The bundle on a loopback cluster, as a person would run it: `kubectl apply -k` of a test
overlay, `infera-hooks serve` on loopback, and Metacontroller's part played by the stand-in
driver (tests/support/composite_driver.py), or by a Metacontroller binary of your own.

    python -m tests.support.localcluster up     # prints the KUBECONFIG; Ctrl-C tears it down
    python -m tests.support.localcluster up --metacontroller PATH   # the real one instead
    python -m tests.support.localcluster down   # tears down the one `up` started, from elsewhere
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster import Cluster, running_cluster_with_nodes, running_lws
from tests.support.composite_driver import CompositeDriver
from tests.support.prerequisites import REPO, need_schemas
from tests.support.service import RunningServer, running_server, stop_process

CONTROLLER = "inferadeployment-controller"
METACONTROLLER_USER = "system:serviceaccount:metacontroller:metacontroller"
# How long Metacontroller's identity (driver or binary) keeps its token: a day of `up`.
IDENTITY_HOURS = 24
# Where `up` keeps its cluster, logs and pid (gitignored); a test moves it.
WORKDIR = Path(os.environ.get("INFERA_LOCALCLUSTER_DIR", REPO / ".cache" / "localcluster"))


@dataclass
class Installed:
    cluster: Cluster
    driver: CompositeDriver | None  # None when a real Metacontroller runs
    hooks_url: str


# The kustomize components the test overlay enables, and so the kinds its CompositeController registers.
COMPONENTS = ("lws", "gaie", "monitoring")


def overlay(directory: Path, hooks_url: str) -> Path:
    """The test overlay: the bundle with the lws, gaie and monitoring components, whose only change is the
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
        "components": [f"{bundle}/metacontroller/components/{name}" for name in COMPONENTS],
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
def running_metacontroller(
    cluster: Cluster, binary: Path, workdir: Path, arguments: Sequence[str] = ()
) -> Iterator[subprocess.Popen]:
    """Metacontroller itself, as its production manifest runs it (plus `arguments`), with its
    ServiceAccount's token; its log in `workdir`."""
    kubeconfig = cluster.kubeconfig_for(
        workdir / "metacontroller-kubeconfig", "metacontroller", "metacontroller", hours=IDENTITY_HOURS
    )
    with (workdir / "metacontroller.log").open("ab") as log:
        process = subprocess.Popen(
            [
                str(binary),
                f"--kubeconfig={kubeconfig}",
                "--zap-log-level=4",
                "--discovery-interval=20s",
                # Loopback, on ports of the kernel's choosing: nothing here scrapes them.
                "--metrics-address=127.0.0.1:0",
                "--health-probe-bind-address=127.0.0.1:0",
                *arguments,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        stop_process(process)


@contextmanager
def installed_hooks(workdir: Path, schemas: Path) -> Iterator[tuple[Cluster, RunningServer]]:
    """A loopback cluster with kwok GPU nodes and the LeaderWorkerSet controller, the Gateway
    API, Inference Extension, Prometheus Operator and Metacontroller CRDs from `schemas`, and the
    bundle installed through the test overlay, its hooks served; nothing drives them yet."""
    with (
        running_cluster_with_nodes(workdir) as cluster,
        running_lws(cluster, workdir),
        running_server(workdir) as hooks,
    ):
        crds = (
            "metacontroller-crds.yaml",
            "inferencepool.yaml",
            "httproute.yaml",
            "podmonitor.yaml",
            "prometheusrule.yaml",
        )
        for crd in crds:
            _succeeded(cluster, "apply", "--server-side", "-f", str(schemas / crd))
        cluster.apply(*metacontroller_identity())
        # Outside the checkout: kustomize refuses an overlay inside the bundle it builds on,
        # and `up` keeps its workdir under .cache.
        with tempfile.TemporaryDirectory(prefix="infera-overlay-") as directory:
            _succeeded(cluster, "apply", "-k", str(overlay(Path(directory) / "overlay", hooks.url)))
        _succeeded(cluster, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        yield cluster, hooks


@contextmanager
def installed_bundle(workdir: Path, schemas: Path, metacontroller: Path | None = None) -> Iterator[Installed]:
    """The installed bundle (installed_hooks) driven by the `metacontroller` binary if given,
    else by the stand-in driver."""
    with installed_hooks(workdir, schemas) as (cluster, hooks):
        if metacontroller is not None:
            with running_metacontroller(cluster, metacontroller, workdir):
                yield Installed(cluster, None, hooks.url)
            return
        driver = CompositeDriver(
            cluster.as_token(cluster.token("metacontroller", "metacontroller", hours=IDENTITY_HOURS)), CONTROLLER
        )
        driver.start(interval=1.0)
        try:
            yield Installed(cluster, driver, hooks.url)
        finally:
            driver.stop()


def up(metacontroller: Path | None) -> int:
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
        with installed_bundle(workdir, need_schemas(), metacontroller) as installed:
            print(f"export KUBECONFIG={installed.cluster.kubeconfig}", flush=True)
            print(
                "then: kubectl apply -f examples/pd-disaggregated.yaml && kubectl get idep -w\n"
                f"(logs: {workdir}; Ctrl-C, or `python -m tests.support.localcluster down`, tears it down)",
                file=sys.stderr,
                flush=True,
            )
            errors = installed.driver.errors if installed.driver else []  # the driver appends to it
            while not stopped.wait(5):
                for error in errors:
                    print(f"driver: {error}", file=sys.stderr, flush=True)
                errors.clear()
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
    parser.add_argument(
        "--metacontroller",
        type=Path,
        metavar="PATH",
        help="a Metacontroller binary to run instead of the stand-in driver (build it from the "
        "v4.17.2 tag of github.com/metacontroller/metacontroller: go build ./pkg/cmd/metacontroller)",
    )
    arguments = parser.parse_args()
    return up(arguments.metacontroller) if arguments.command == "up" else down()


if __name__ == "__main__":
    sys.exit(main())
