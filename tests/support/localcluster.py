"""The bundle on a loopback cluster, as a person would run it: Metacontroller v4.17.2 installed
from its own manifests (tests/support/metacontroller.py), `kubectl apply -k` of a test overlay,
and `infera-hooks serve` on loopback.

    python -m tests.support.localcluster up     # prints the KUBECONFIG; Ctrl-C tears it down
    python -m tests.support.localcluster down   # tears down the one `up` started, from elsewhere
"""

import argparse
import json
import os
import signal
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

from tests.support import metacontroller
from tests.support.cluster import Cluster, running_cluster_with_nodes, running_lws
from tests.support.prerequisites import REPO, need_schemas
from tests.support.service import RunningServer, running_server

CONTROLLER = "inferadeployment-controller"
# Where `up` keeps its cluster, logs and pid (gitignored); a test moves it.
WORKDIR = Path(os.environ.get("INFERA_LOCALCLUSTER_DIR", REPO / ".cache" / "localcluster"))


@dataclass
class Installed:
    cluster: Cluster
    metacontroller: metacontroller.Running
    hooks: RunningServer

    @property
    def hooks_url(self) -> str:
        return self.hooks.url


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


def _succeeded(cluster: Cluster, *arguments: str) -> None:
    done = cluster.kubectl(*arguments)
    if done.returncode:
        raise RuntimeError(f"kubectl {' '.join(arguments)}: {done.stderr}")


@contextmanager
def installed_hooks(workdir: Path, schemas: Path) -> Iterator[tuple[Cluster, RunningServer, list[dict[str, Any]]]]:
    """A loopback cluster with kwok GPU nodes and the LeaderWorkerSet controller, Metacontroller's
    CRDs and RBAC from its production manifests (returned), the Gateway API, Inference Extension
    and Prometheus Operator CRDs from `schemas`, and the bundle installed through the test
    overlay, its hooks served; Metacontroller is not running yet."""
    with (
        running_cluster_with_nodes(workdir) as cluster,
        running_lws(cluster, workdir),
        running_server(workdir) as hooks,
    ):
        manifests = metacontroller.install(cluster)
        for crd in ("inferencepool.yaml", "httproute.yaml", "podmonitor.yaml", "prometheusrule.yaml"):
            _succeeded(cluster, "apply", "--server-side", "-f", str(schemas / crd))
        # Outside the checkout: kustomize refuses an overlay inside the bundle it builds on,
        # and `up` keeps its workdir under .cache.
        with tempfile.TemporaryDirectory(prefix="infera-overlay-") as directory:
            _succeeded(cluster, "apply", "-k", str(overlay(Path(directory) / "overlay", hooks.url)))
        _succeeded(cluster, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        yield cluster, hooks, manifests


@contextmanager
def installed_bundle(workdir: Path, schemas: Path, arguments: Sequence[str] = ()) -> Iterator[Installed]:
    """The installed bundle (installed_hooks) driven by Metacontroller, run with its production
    flags and `arguments`."""
    with (
        installed_hooks(workdir, schemas) as (cluster, hooks, manifests),
        metacontroller.running(cluster, manifests, workdir, arguments) as controller,
    ):
        yield Installed(cluster, controller, hooks)


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
                f"(logs: {workdir}; Ctrl-C, or `python -m tests.support.localcluster down`, tears it down)",
                file=sys.stderr,
                flush=True,
            )
            while not stopped.wait(5):
                pass  # a timed wait, so that the signal handler runs
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
