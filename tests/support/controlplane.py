"""The loopback control plane's programs: kube-apiserver, kube-controller-manager,
kube-scheduler and kubectl, kwok and kwokctl, the LeaderWorkerSet controller and etcd, built
from the Go modules tests/controlplane/go.mod pins (published modules through the module proxy,
nothing vendored).

They are built once per machine into .cache/controlplane/<key>/bin (gitignored), the key a
digest of go.mod, go.sum, the programs and the Go version, so a version change builds afresh
and a repeated run builds nothing. A cold build compiles Kubernetes on every core (about 8
minutes on two), saying so on stderr; Go's own caches stay where Go keeps them.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support import kubelet
from tests.support.prerequisites import REPO, need

TOOLS = REPO / "tests" / "controlplane"
CACHE = REPO / ".cache" / "controlplane"
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


def go() -> str | None:
    """Go on PATH, or where its release tarball installs."""
    return shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").is_file() else None)


def _built_name(package: str) -> str:
    """What `go build -o DIR` names a package's binary: its last path element, or the one
    before a major-version suffix (`cmd` for LWS, `server` for etcd)."""
    parts = package.split("/")
    return parts[-2] if re.fullmatch(r"v[0-9]+", parts[-1]) else parts[-1]


def _key(go_binary: str) -> str:
    version = subprocess.run([go_binary, "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout
    digest = hashlib.sha256(version.encode())
    for name in ("go.mod", "go.sum"):
        digest.update((TOOLS / name).read_bytes())
    digest.update(repr(sorted(PROGRAMS.items())).encode() + VERSION_FLAGS.encode())
    return digest.hexdigest()[:16]


def programs() -> dict[str, Path]:
    """Each program's path, built first if this machine has not built these versions yet."""
    go_binary = go()
    need(go_binary is not None, "Go (1.26 or newer) builds the control plane's programs: install it from go.dev/dl")
    assert go_binary is not None
    bin_dir = CACHE / _key(go_binary) / "bin"
    paths = {name: bin_dir / name for name in PROGRAMS}
    if all(path.is_file() for path in paths.values()):
        return paths
    building = bin_dir.with_name("bin.partial")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    print(
        f"building the control plane ({', '.join(PROGRAMS)}) into {bin_dir}: about 8 minutes on two cores "
        "when Go's build cache is cold",
        file=sys.stderr,
        flush=True,
    )
    started = time.monotonic()
    environment = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false"}
    subprocess.run(
        [
            go_binary,
            "build",
            "-trimpath",
            "-ldflags",
            f"-s -w {VERSION_FLAGS}",
            "-o",
            str(building),
            *PROGRAMS.values(),
        ],
        cwd=TOOLS,
        env=environment,
        check=True,
    )
    for name, package in PROGRAMS.items():
        (building / _built_name(package)).rename(building / name)
    shutil.rmtree(bin_dir, ignore_errors=True)  # a build interrupted after its rename began
    building.rename(bin_dir)
    print(f"built the control plane in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return paths


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
    routing = {"name": "kube-apiserver", "extraArgs": [{"key": "enable-aggregator-routing", "value": "true"}]}
    config.write_text(
        json.dumps(
            {
                "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
                "kind": "KwokctlConfiguration",
                "options": options,
                "componentsPatches": [routing],
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
