"""Metacontroller v4.17.2, the program that drives the hooks on the loopback control plane: built
from its release source (SHARED/metacontroller/source, which tests/support/fetch_shared.py
fetches and checks against tests/metacontroller/SHA256SUMS) into .cache/metacontroller,
installed from its own manifests/production, and run out of cluster under its ServiceAccount.
"""

import hashlib
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster import Cluster
from tests.support.gobuild import built
from tests.support.loopback import free_port, wait_ready
from tests.support.prerequisites import FETCH, REPO, SHARED, need
from tests.support.service import stop_process

SOURCE = SHARED / "metacontroller" / "source"
SUMS = REPO / "tests" / "metacontroller" / "SHA256SUMS"
USER = "system:serviceaccount:metacontroller:metacontroller"
# How long its identity keeps its token: a day of `localcluster up`.
IDENTITY_HOURS = 24
# What the cluster tier adds to the production flags: its informers resync every parent each
# RESYNC_SECONDS (every 30 minutes by default), so that a graph at steady state is synced, and
# seen to write nothing, within seconds.
RESYNC_SECONDS = 5
TEST_ARGUMENTS = (f"--cache-flush-interval={RESYNC_SECONDS}s",)


def sums() -> dict[str, str]:
    """Path in the release's tree -> sha256 of the file, for every file the build and install use."""
    return {path: digest for digest, path in (line.split("  ", 1) for line in SUMS.read_text().splitlines())}


def need_source() -> Path:
    """The release's source tree, every file as SHA256SUMS pins it."""
    need((SOURCE / "go.mod").is_file(), f"Metacontroller v4.17.2's source is not at {SOURCE}: {FETCH}")
    changed = [
        path
        for path, digest in sums().items()
        if not (SOURCE / path).is_file() or hashlib.sha256((SOURCE / path).read_bytes()).hexdigest() != digest
    ]
    assert not changed, f"{SOURCE} is not Metacontroller v4.17.2's release: {', '.join(changed[:5])} differ"
    return SOURCE


def merge_program() -> Path:
    """tests/metacontroller/merge: Metacontroller's own 3-way merge, on [observed, lastApplied,
    desired] cases as JSON on stdin. Its module is made in .cache from our main.go, with
    Metacontroller's tree (and its go.sum) as the dependency it replaces."""
    source = need_source()
    module = REPO / ".cache" / "metacontroller-merge-module"
    (module / "merge").mkdir(parents=True, exist_ok=True)
    (module / "merge" / "main.go").write_bytes((REPO / "tests" / "metacontroller" / "merge" / "main.go").read_bytes())
    go_mod = f"module mergecheck\n\ngo 1.26\n\nrequire metacontroller v0.0.0\n\nreplace metacontroller => {source}\n"
    (module / "go.mod").write_text(go_mod)  # as written here, whatever the last build added
    (module / "go.sum").write_bytes((source / "go.sum").read_bytes())
    return built("metacontroller-merge", {"merge": "./merge"}, module=module, goflags="-mod=mod")["merge"]


def binary() -> Path:
    return built(
        "metacontroller",
        {"metacontroller": "./pkg/cmd/metacontroller"},
        cold_build=": about 4 minutes on two cores when Go's build cache is cold",
        module=need_source(),
    )["metacontroller"]


def production(cluster: Cluster) -> list[dict[str, Any]]:
    """manifests/production as `kubectl apply -k` installs it: its namespace, CRDs and RBAC, and
    the StatefulSet that runs the program (which this tier runs on loopback instead)."""
    built_manifests = cluster.kubectl("kustomize", str(need_source() / "manifests" / "production"))
    assert built_manifests.returncode == 0, built_manifests.stderr
    return [doc for doc in yaml.safe_load_all(built_manifests.stdout) if doc]


def production_arguments(manifests: list[dict[str, Any]]) -> list[str]:
    """The flags its production StatefulSet runs it with."""
    (statefulset,) = [doc for doc in manifests if doc["kind"] == "StatefulSet"]
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


@dataclass
class Running:
    process: subprocess.Popen[bytes]
    log: Path
    # Its command line and its readiness probe's URL, which `restart` runs and waits on again.
    command: list[str]
    ready_url: str
    # Byte ranges of its log whose errors a test caused on purpose (see `erring`).
    expected: list[tuple[int, int]] = field(default_factory=list)

    def errors(self) -> list[str]:
        """Its log's error lines, but for those a test caused on purpose."""
        found, offset = [], 0
        for line in self.log.read_bytes().splitlines(keepends=True):
            if line.startswith(b'{"level":"error"') and not any(a <= offset < b for a, b in self.expected):
                found.append(line.decode(errors="replace").rstrip())
            offset += len(line)
        return found

    @contextmanager
    def erring(self) -> Iterator[None]:
        """Errors it logs meanwhile are the test's doing: `errors` leaves them out."""
        start = self.log.stat().st_size
        try:
            yield
        finally:
            self.expected.append((start, self.log.stat().st_size))

    def restart(self) -> int:
        """Stops it as the kubelet stops its pod's container (SIGTERM; SIGKILL 30 s later) and
        starts it again with the same command line, identity and ports, on the same log, so
        `errors` covers both processes (a restart of the pod would start it so, with nothing but
        what the cluster holds). The stopped process's exit status, once the new one is ready."""
        stop_process(self.process)
        stopped = self.process.returncode
        self.process = _start(self.command, self.log)
        wait_ready(self.process, self.ready_url, self.log)
        return stopped


def install(cluster: Cluster) -> list[dict[str, Any]]:
    """Its namespace, CRDs and RBAC from manifests/production; the manifests."""
    manifests = production(cluster)
    cluster.apply(*(doc for doc in manifests if doc["kind"] != "StatefulSet"))
    established = cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    assert established.returncode == 0, established.stderr
    return manifests


@contextmanager
def running(
    cluster: Cluster, manifests: list[dict[str, Any]], workdir: Path, arguments: Sequence[str] = ()
) -> Iterator[Running]:
    """The program with its production flags and its ServiceAccount's token, its metrics and
    health probes on loopback ports of their own (their defaults, :9999 and :8081, listen on
    every interface and would clash between clusters), and `arguments` after them; its log in
    `workdir`."""
    kubeconfig = cluster.kubeconfig_for(
        workdir / "metacontroller-kubeconfig", "metacontroller", "metacontroller", hours=IDENTITY_HOURS
    )
    metrics, health = free_port(), free_port()
    command = [
        str(binary()),
        *production_arguments(manifests),
        f"--kubeconfig={kubeconfig}",
        f"--metrics-address=127.0.0.1:{metrics}",
        f"--health-probe-bind-address=127.0.0.1:{health}",
        *arguments,
    ]
    log_path = workdir / "metacontroller.log"
    controller = Running(_start(command, log_path), log_path, command, f"http://127.0.0.1:{health}/readyz")
    try:
        wait_ready(controller.process, controller.ready_url, log_path)
        yield controller
    finally:
        stop_process(controller.process)  # the one running now, after any restart


def _start(command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """The program, its output appended to `log_path`."""
    with log_path.open("ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
