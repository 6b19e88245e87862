"""A one-machine cluster for the data plane of a rendered InferaDeployment (tests only).

`python -m tests.support.e2e.sandbox WORKDIR` runs, inside `unshare --user --map-root-user --mount --net`
(see `run`), the scenario named in WORKDIR/graph.json against the children the hook rendered
there. What a cluster provides is rebuilt as small as it can be and as faithful as it must be:

- **Pod network.** Every pod gets its own network namespace with an address on a bridge
  (10.42.0.0/24), as a CNI would: pods may all listen on 0.0.0.0 and the same port, as the
  rendered commands do. The "node" (this process) is 10.42.0.1 and runs the cluster services:
  a fake Kubernetes API server (tests/support/e2e/kube_api.py), an etcd, or a relay to a real
  kube-apiserver outside (`graph.json`'s `api`: a Unix socket, which no network namespace
  hides; TLS passes through, so pods verify the real server's certificate).
- **Files.** The sandbox runs in a root of its own (a tmpfs of bind mounts of the machine's
  directories, then `pivot_root`), so it can give every process the cluster's `/etc/hosts` (Service
  names and the LeaderWorkerSet leader address resolve to pod IPs) without touching the machine.
  Each container has a mount namespace of its own (tests/support/e2e/container_init.py sets it up): its
  volumes at their mount paths (an emptyDir or a StatefulSet's claim is a directory of the
  pod's, a hostPath the node's own), its pod's ServiceAccount token at
  `/var/run/secrets/kubernetes.io/serviceaccount`, and, as its securityContext asks, a
  read-only root filesystem and its user (runAsUser, runAsGroup; runAsNonRoot refuses a root
  user as kubelet does). Not emulated: capabilities, no_new_privs and seccomp (a container run
  as root keeps the sandbox's), nor file ownership and fsGroup (the container's user owns what
  this machine's user owns, so only a read-only mount stops a write).
- **Containers as kubelet starts them.** The command and args of each container, with `$(VAR)`
  expanded and the downward API resolved (tests/support/kubelet.py), run unedited in the pod's network
  and in a PID namespace of their own (the command is PID 1, as in a container). The image is
  not pulled: this machine's virtualenv, with the Infera runtime and the stand-in engine on
  PYTHONPATH, stands for it. kubelet's service variables (KUBERNETES_SERVICE_HOST/PORT) and
  HOSTNAME are set as kubelet sets them.
- **Readiness** is the rendered startup, liveness and readiness probes' checks (httpGet,
  tcpSocket, grpc), polled until they all pass; their timing fields (initial delays, periods)
  are not replayed, to keep the tests fast.
- **Stopping a pod** is kubelet's: the pod is marked for deletion, each container's preStop hook
  runs, then SIGTERM to PID 1, then SIGKILL once the rendered grace period has passed since the
  stop began.
"""

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any

from tests.support import kubelet
from tests.support.e2e.connections import ConnectionLog
from tests.support.prerequisites import REPO, need, need_runtime
from tests.support.runtime import STANDINS

NODE_IP = kubelet.NODE_IP
SUBNET_BITS = 24
# The node's own link address. A bridge without one takes the lowest of its ports' and changes
# it when that port goes: a pod removed mid-scenario (a drained generation) would then move the
# node's address under every other pod, whose neighbour entry for the node, kept fresh by the
# traffic coming in, sends every reply to an address nobody has until their connections die.
# A node's bridge keeps one address, as this one does.
NODE_MAC = "02:00:0a:2a:00:01"
API_PORT = 6443
ETCD_PORT = 2379
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN = "e2e-service-account-token"
LOG_TAIL_LINES = 40
SCENARIO_TIMEOUT = 150
OLD_ROOT = ".old-root"
# In the work directory: the pod network's connections and listeners (Cluster.write_network).
NETWORK_RECORD = "network.json"

# A machine of its own: user (as root inside), mount, network and PID namespaces.
UNSHARE = ["unshare", "--user", "--map-root-user", "--mount", "--net", "--pid", "--fork"]


def sh(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")


def wait_until(what: str, check: Any, timeout: float, interval: float = 0.1) -> Any:
    """Poll `check` until it returns something truthy; AssertionError naming `what` after `timeout`.
    A connection or decoding error counts as not yet (the last one is reported); an
    AssertionError (a container that exited, say) ends the wait at once."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = check()
        except (OSError, ValueError) as error:
            result, last_error = None, error
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what}"
                + (f" (last: {last_error!r})" if last_error else "")
            )
        time.sleep(interval)


# --- the root: the machine's directories, and what a cluster mounts over them ----------------


def within(root: Path, path: str) -> Path:
    """`path` as seen from `root`, following symlinks there (an absolute one from `root`), as
    /var/run -> /run."""
    current = root
    for part in Path(path).relative_to("/").parts:
        current = current / part
        while current.is_symlink():
            target = os.readlink(current)
            current = root / target.lstrip("/") if target.startswith("/") else current.parent / target
    return current


def build_root(root: Path, mounts: dict[str, Path]) -> None:
    """A tmpfs at `root` holding bind mounts of every top-level directory of the machine (and
    its symlinks), a fresh /run, the /proc of this PID namespace, and `mounts` (path inside ->
    file or directory outside)."""
    sh("mount", "-t", "tmpfs", "sandbox-root", str(root))
    for entry in os.scandir("/"):
        target = root / entry.name
        if entry.is_symlink():
            target.symlink_to(os.readlink(entry.path))
        elif entry.name in ("run", "proc"):
            target.mkdir()
            sh("mount", "-t", "tmpfs" if entry.name == "run" else "proc", f"sandbox-{entry.name}", str(target))
        elif entry.is_dir():
            target.mkdir()
            sh("mount", "--rbind", entry.path, str(target))
    for inside, outside in mounts.items():
        target = within(root, inside)
        if outside.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
        sh("mount", "--bind", str(outside), str(target))


# --- pods ---------------------------------------------------------------------------------


@dataclass
class Container:
    name: str
    spec: dict[str, Any]
    env: dict[str, str]
    argv: list[str]
    log: Path
    setup: dict[str, Any]  # what tests/support/e2e/container_init.py sets up
    process: subprocess.Popen | None = None

    @property
    def init_pid(self) -> int | None:
        """PID 1 of the container's PID namespace (unshare's only child)."""
        if self.process is None:
            return None
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
            return int(children[0]) if children else None
        return None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def enter(self) -> list[str]:
        """nsenter into the container, as its user: where `kubectl exec` and an exec hook run."""
        assert self.init_pid is not None, f"{self.name} is not running"
        # Entering its user namespace with the caller's credentials makes the caller its user.
        user = ["--user", "--preserve-credentials"] if self.setup["user"] else []
        return ["nsenter", f"--target={self.init_pid}", *user, "--mount", "--net", "--pid", "--"]

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(lines[-LOG_TAIL_LINES:])


def account_name(pod: "Pod") -> str:
    return str(pod.pod.spec.get("serviceAccountName") or "default")


@dataclass
class Pod:
    """One pod: a network namespace held by a sleeping process, and its containers."""

    pod: kubelet.Pod
    index: int
    containers: list[Container] = field(default_factory=list)
    holder: subprocess.Popen | None = None
    stop_began: float | None = None  # time.monotonic() when kubelet began to stop it
    stopped_in: float | None = None  # seconds from the start of a stop to its last container's exit
    # (port, protocol) of every socket its processes listened on beyond loopback, when it stopped.
    listening: set[tuple[int, str]] = field(default_factory=set)

    @property
    def name(self) -> str:
        return self.pod.facts.name

    @property
    def ip(self) -> str:
        return self.pod.facts.ip

    @property
    def labels(self) -> dict[str, str]:
        return self.pod.labels

    def netns(self) -> str:
        assert self.holder is not None
        return f"/proc/{self.holder.pid}/ns/net"

    def container(self, name: str) -> Container:
        return next(c for c in self.containers if c.name == name)


class Cluster:
    """The graph's pods on this machine, and the cluster services they use."""

    def __init__(self, workdir: Path, graph: dict[str, Any]) -> None:
        self.workdir = workdir
        self.idep = graph["idep"]
        self.children = graph["children"]
        self.name = self.idep["metadata"]["name"]
        self.namespace = self.idep["metadata"]["namespace"]
        self.spec = self.idep["spec"]
        self.shared = Path(graph["shared"])
        # A real API server's: its Unix socket, CA, a token per pod (of its account, bound to
        # it), the names its controllers gave each workload's pods (by kind/name of the workload).
        self.api: dict[str, Any] | None = graph.get("api")
        self.by_key = {(c["kind"], c["metadata"]["name"]): c for c in self.children}
        self.pods: dict[str, Pod] = {}
        self.kube: Any = None
        self.etcd: subprocess.Popen | None = None
        self.stop_relay: Callable[[], None] | None = None
        self.connections: ConnectionLog | None = None
        # The namespace's Secrets, by name: their keys and values.
        self.secrets: dict[str, dict[str, str]] = graph.get("secrets", {})

    # -- set-up ------------------------------------------------------------------------------

    def plan_pods(self) -> None:
        """A pod per template (tests/support/kubelet.py gives each its name and an address on the bridge),
        with the service variables kubelet gives its containers."""
        planned = kubelet.pods(self.children, self.namespace)
        backends = {name: pod.facts.ip for name, pod in self.service_backends(planned).items()}
        services = {
            "KUBERNETES_SERVICE_HOST": NODE_IP,
            "KUBERNETES_SERVICE_PORT": str(API_PORT),
            **kubelet.service_env("kubernetes", NODE_IP, [{"name": "https", "port": API_PORT}]),
        }
        for child in self.children:
            if (
                child["kind"] == "Service"
                and child["spec"].get("clusterIP") != "None"
                and child["metadata"]["name"] in backends
            ):
                services |= kubelet.service_env(
                    child["metadata"]["name"], backends[child["metadata"]["name"]], child["spec"]["ports"]
                )
        real_names = {owner: iter(names) for owner, names in (self.api or {}).get("pod_names", {}).items()}
        for index, pod in enumerate(planned):
            name = next(real_names[pod.owner], None) if self.api else pod.facts.name
            if name is None:
                raise AssertionError(f"the API server has no pod left for {pod.owner} (pods: {self.api['pod_names']})")
            facts = kubelet.PodFacts(name, pod.facts.namespace, pod.facts.ip, lws=pod.facts.lws, services=services)
            self.pods[facts.name] = Pod(kubelet.Pod(pod.owner, pod.template, facts), index)

    def service_backends(self, pods: list[kubelet.Pod]) -> dict[str, kubelet.Pod]:
        """The pod each Service sends to (one replica per workload here): its address stands for
        the Service's ClusterIP, and for a headless Service's DNS answer."""
        backends = {}
        for child in self.children:
            if child["kind"] == "Service":
                selector = child["spec"].get("selector") or {}
                chosen = next((p for p in pods if selector.items() <= p.labels.items()), None)
                if chosen:
                    backends[child["metadata"]["name"]] = chosen
        return backends

    def hosts(self) -> str:
        """What cluster DNS would answer: Services by name, the LeaderWorkerSet leaders, the node."""
        lines = ["127.0.0.1 localhost", f"{NODE_IP} kubernetes kubernetes.default kubernetes.default.svc"]
        if self.spec.get("discoveryBackend") == "etcd":
            lines.append(f"{NODE_IP} {self.spec['etcdEndpoint'].split('//')[-1].rsplit(':', 1)[0]}")
        for name, pod in self.service_backends([p.pod for p in self.pods.values()]).items():
            lines.append(f"{pod.facts.ip} {name} {name}.{self.namespace} {name}.{self.namespace}.svc")
        for pod in self.pods.values():
            if pod.pod.facts.lws.get("LWS_WORKER_INDEX") == "0":
                lines.append(f"{pod.ip} {pod.pod.facts.lws['LWS_LEADER_ADDRESS']}")
        return "\n".join(lines) + "\n"

    def image_env(self, pod: Pod) -> dict[str, str]:
        """The image's environment (this machine's virtualenv stands for the image) and the
        container's HOSTNAME; kubelet's own variables come on top of these."""
        return {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "PYTHONPATH": f"{self.shared / 'upstream' / 'runtime'}:{STANDINS}",
            "INFERA_SHARED_DIR": str(self.shared),
            "PYTHONUNBUFFERED": "1",
            "HOME": str(self.workdir / "home"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": str(self.workdir / "hf"),
            "HOSTNAME": pod.name,
            **{k: v for k, v in os.environ.items() if k.startswith("STANDIN_")},
        }

    def setup(self) -> None:
        """Network, files and cluster services, as a node has them before the first pod."""
        sh("ip", "link", "set", "lo", "up")
        sh("ip", "link", "add", "cni0", "address", NODE_MAC, "type", "bridge")
        sh("ip", "addr", "add", f"{NODE_IP}/{SUBNET_BITS}", "dev", "cni0")
        sh("ip", "link", "set", "cni0", "up")
        self.connections = ConnectionLog("cni0")
        self.plan_pods()
        files = self.workdir / "files"
        files.mkdir()
        (files / "hosts").write_text(self.hosts())
        self.accounts.mkdir()
        mounts = {"/etc/hosts": files / "hosts"}
        root = self.workdir / "root"
        root.mkdir()
        build_root(root, mounts)
        # pivot_root rather than chroot: a chrooted process may not create a user namespace,
        # which a container that runs as its own user needs.
        (root / OLD_ROOT).mkdir()
        sh("pivot_root", str(root), str(root / OLD_ROOT))
        os.chdir("/")
        sh("umount", "--lazy", f"/{OLD_ROOT}")
        os.makedirs(SERVICE_ACCOUNT_DIR)
        (self.workdir / "home").mkdir(exist_ok=True)
        if self.spec.get("discoveryBackend") == "etcd":
            self.start_etcd()
        elif self.api is not None:
            api_socket = self.api["socket"]
            self.stop_relay = serve_relay(
                socket.create_server((NODE_IP, API_PORT)), lambda: unix_connection(api_socket)
            )
            for pod_name, token in self.api["tokens"].items():
                directory = self.accounts / pod_name
                directory.mkdir()
                (directory / "token").write_text(token)
                (directory / "ca.crt").write_text(self.api["ca"])
                (directory / "namespace").write_text(self.namespace)
        else:
            from tests.support.e2e.kube_api import KubeAPI

            self.kube = KubeAPI(NODE_IP, API_PORT, token=TOKEN)
            for pod_name in self.pods:
                self.kube.write_service_account(self.accounts / pod_name, namespace=self.namespace)

    @property
    def accounts(self) -> Path:
        """A directory per pod: its ServiceAccount's token, bound to it, as kubelet mounts it."""
        return self.workdir / "files" / "serviceaccounts"

    def token_dir(self, pod: Pod) -> Path | None:
        """The token kubelet mounts into the pod: none with automountServiceAccountToken false,
        nor under etcd discovery, where the sandbox has no API server."""
        if pod.pod.spec.get("automountServiceAccountToken") is False or self.spec.get("discoveryBackend") == "etcd":
            return None
        directory = self.accounts / pod.name
        if not directory.is_dir():
            raise AssertionError(f"{pod.name}: no token was given for it (ServiceAccount {account_name(pod)})")
        return directory

    def start_etcd(self) -> None:
        data = self.workdir / "etcd"
        url = f"http://{NODE_IP}:{ETCD_PORT}"
        log = (self.workdir / "etcd.log").open("wb")
        self.etcd = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "etcd"),
                "--data-dir",
                str(data),
                "--listen-client-urls",
                url,
                "--advertise-client-urls",
                url,
                "--listen-peer-urls",
                "http://127.0.0.1:2380",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_until("etcd", lambda: http_ok(f"{url}/health"), 20)

    # -- pods ----------------------------------------------------------------------------------

    def start_pod(self, pod: Pod) -> None:
        pod.holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"])
        wait_until(
            f"{pod.name}'s network namespace",
            lambda: os.readlink(pod.netns()) != os.readlink("/proc/self/ns/net"),
            5,
            0.01,
        )
        host_side = f"veth{pod.index}"
        sh("ip", "link", "add", host_side, "type", "veth", "peer", "name", "eth0", "netns", str(pod.holder.pid))
        sh("ip", "link", "set", host_side, "master", "cni0", "up")
        inside = ["nsenter", f"--net={pod.netns()}"]
        sh(*inside, "ip", "link", "set", "lo", "up")
        sh(*inside, "ip", "addr", "add", f"{pod.ip}/{SUBNET_BITS}", "dev", "eth0")
        sh(*inside, "ip", "link", "set", "eth0", "up")
        sh(*inside, "ip", "route", "add", "default", "via", NODE_IP)
        if self.kube is not None:
            self.kube.add_pod(self.pod_object(pod))
        unsupported = [k for k in ("initContainers", "ephemeralContainers") if pod.pod.spec.get(k)]
        unsupported += [f"{c['name']}.envFrom" for c in pod.pod.spec["containers"] if c.get("envFrom")]
        if unsupported:
            raise AssertionError(f"{pod.name}: the sandbox does not run {', '.join(unsupported)}")
        for spec in pod.pod.spec["containers"]:
            given = kubelet.container_env(spec, pod.pod.facts, pod.labels, self.secrets)
            container = Container(
                spec["name"],
                spec,
                {**self.image_env(pod), **given},
                kubelet.container_argv(spec, given),
                self.workdir / "logs" / f"{pod.name}.{spec['name']}.log",
                self.container_setup(pod, spec),
            )
            container.log.parent.mkdir(exist_ok=True)
            with container.log.open("wb") as log:
                container.process = subprocess.Popen(
                    [
                        *inside,
                        "unshare",
                        "--pid",
                        "--fork",
                        "--kill-child",
                        "--mount",
                        "--",
                        # Its own mount namespace set up, then `exec`: the command is PID 1.
                        sys.executable,
                        "-I",
                        str(REPO / "tests" / "support" / "e2e" / "container_init.py"),
                        json.dumps(container.setup),
                        "--",
                        *container.argv,
                    ],
                    env=container.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=spec.get("workingDir", "/"),
                    start_new_session=True,
                )
            pod.containers.append(container)

    def container_setup(self, pod: Pod, container: dict[str, Any]) -> dict[str, Any]:
        """What tests/support/e2e/container_init.py does for `container` of `pod`."""
        volumes = {volume["name"]: volume for volume in pod.pod.spec.get("volumes") or []}
        mounts = []
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"])
            if volume is not None and "hostPath" in volume:
                source = Path(volume["hostPath"]["path"])
            # An emptyDir, or a StatefulSet's claim (the pod template lists no volume for it).
            elif volume is None or "emptyDir" in volume:
                source = self.workdir / "volumes" / pod.name / mount["name"]
                source.mkdir(parents=True, exist_ok=True)
            else:
                raise AssertionError(f"{pod.name}: the sandbox does not mount volume {volume}")
            source /= mount.get("subPath", "")
            mounts.append([str(source), mount["mountPath"], bool(mount.get("readOnly"))])
        token_dir = self.token_dir(pod)
        if token_dir is not None:
            mounts.append([str(token_dir), SERVICE_ACCOUNT_DIR, True])
        pod_context = pod.pod.spec.get("securityContext") or {}
        context = {**pod_context, **(container.get("securityContext") or {})}
        uid = context.get("runAsUser")
        if context.get("runAsNonRoot") and not uid:
            # kubelet's CreateContainerConfigError (the images declare no USER: they run as root).
            raise AssertionError(f"{pod.name}/{container['name']}: runAsNonRoot, and the image would run as root")
        return {
            "read_only_root": bool(context.get("readOnlyRootFilesystem")),
            "mounts": mounts,
            "image_paths": [str(REPO), sys.prefix, str(self.shared), str(self.workdir)],
            "user": [uid, context.get("runAsGroup", 0)] if uid else None,
        }

    def pod_object(self, pod: Pod) -> dict[str, Any]:
        template = pod.pod.template
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod.name,
                "namespace": self.namespace,
                "labels": dict(pod.labels),
                "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
            },
            "spec": {
                "serviceAccountName": account_name(pod),
                "containers": pod.pod.spec["containers"],
            },
            "status": {"phase": "Running", "podIP": pod.ip, "podIPs": [{"ip": pod.ip}]},
        }

    def start(self) -> None:
        for pod in self.pods.values():
            self.start_pod(pod)

    def probe(self, pod: Pod, container: Container, probe: dict[str, Any]) -> bool:
        if not container.running():
            raise AssertionError(
                f"{pod.name}/{container.name} exited ({container.process.returncode}):\n{container.tail()}"
            )
        ports = {p.get("name"): p["containerPort"] for p in container.spec.get("ports") or []}
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = ports.get(get["port"], get["port"])
            return http_ok(f"{get.get('scheme', 'HTTP').lower()}://{pod.ip}:{port}{get.get('path', '/')}")
        if "tcpSocket" in probe:
            port = ports.get(probe["tcpSocket"]["port"], probe["tcpSocket"]["port"])
            with contextlib.suppress(OSError), socket.create_connection((pod.ip, port), timeout=1):
                return True
            return False
        if "grpc" in probe:
            return grpc_serving(pod.ip, probe["grpc"]["port"], probe["grpc"].get("service", ""))
        raise AssertionError(f"{pod.name}/{container.name}: a probe the sandbox does not run: {probe}")

    def ready(self, pod: Pod) -> bool:
        """Every container's startup, liveness and readiness probes pass (a container without
        probes is ready once it runs): a liveness check the real process fails would have
        kubelet restart it."""
        for container in pod.containers:
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                probe = container.spec.get(kind)
                if probe is not None and not self.probe(pod, container, probe):
                    return False
            if not container.running():
                raise AssertionError(f"{pod.name}/{container.name} exited:\n{container.tail()}")
        return True

    def wait_ready(self, pods: list[Pod] | None = None, timeout: float = 60) -> None:
        for pod in pods or list(self.pods.values()):
            wait_until(f"pod {pod.name} to be ready", lambda pod=pod: self.ready(pod), timeout, 0.2)

    def stop_pod(self, pod: Pod) -> None:
        """kubelet's graceful deletion: deletionTimestamp, each container's preStop (in the
        container's namespaces), SIGTERM to PID 1, SIGKILL when the grace period has passed since
        the stop began (2 s more if a preStop hook ran past it)."""
        grace = pod.pod.spec.get("terminationGracePeriodSeconds", 30)
        if pod.holder is not None:
            pod.listening |= listening(pod.holder.pid)
        began = pod.stop_began = time.monotonic()
        if self.kube is not None:
            self.kube.mark_deleting(self.namespace, pod.name)

        def stop(container: Container) -> None:
            handler = (container.spec.get("lifecycle") or {}).get("preStop") or {}
            left = lambda: grace - (time.monotonic() - began)  # noqa: E731
            if set(handler) - {"exec"}:
                raise AssertionError(
                    f"{pod.name}/{container.name}: a preStop handler the sandbox does not run: {handler}"
                )
            if handler and container.init_pid:
                hook = subprocess.Popen(
                    [*container.enter(), *handler["exec"]["command"]],
                    env=container.env,
                )
                with contextlib.suppress(subprocess.TimeoutExpired):
                    hook.wait(timeout=max(0.0, left()))
                hook.kill()
            if container.init_pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(container.init_pid, signal.SIGTERM)
            try:
                container.process.wait(timeout=max(2.0 if left() <= 0 else 0.0, left()))
            except subprocess.TimeoutExpired:
                self.kill(container)

        threads = [threading.Thread(target=stop, args=(c,)) for c in pod.containers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        pod.stopped_in = time.monotonic() - began
        self.remove_pod(pod)

    def kill(self, container: Container) -> None:
        """SIGKILL to PID 1 takes the container's whole PID namespace down with it."""
        for pid in (container.init_pid, container.process.pid if container.process else None):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if container.process:
            container.process.wait(timeout=10)

    def remove_pod(self, pod: Pod) -> None:
        """Once: a stop and the teardown after a failed scenario may both get here."""
        holder, pod.holder = pod.holder, None
        if holder is None:
            return
        pod.listening |= listening(holder.pid)
        for container in pod.containers:
            if container.running():
                self.kill(container)
        if self.kube is not None:
            self.kube.remove_pod(self.namespace, pod.name)
        holder.kill()
        holder.wait(timeout=10)

    def teardown(self) -> None:
        for pod in self.pods.values():
            with contextlib.suppress(Exception):
                self.remove_pod(pod)
        if self.connections is not None:
            self.connections.stop()
        if self.kube is not None:
            self.kube.stop()
        if self.stop_relay is not None:
            self.stop_relay()
        if self.etcd is not None:
            self.etcd.kill()
            self.etcd.wait(timeout=10)

    def report(self) -> str:
        parts = []
        for pod in self.pods.values():
            for container in pod.containers:
                parts.append(
                    f"--- {pod.name}/{container.name} (pid {container.process.pid if container.process else '-'}, "
                    f"exit {container.process.poll() if container.process else '-'})\n{container.tail()}"
                )
        return "\n".join(parts)

    def write_network(self, path: Path) -> None:
        """What crossed the pod network (tests/support/e2e/connections.py), and what each pod listened on
        and is, as a NetworkPolicy sees it: its labels and address."""
        if self.connections is None:
            return
        record = {
            "node": NODE_IP,
            "pods": {
                pod.name: {"ip": pod.ip, "labels": pod.labels, "listening": sorted(pod.listening)}
                for pod in self.pods.values()
            },
            "connections": sorted(astuple(connection) for connection in self.connections.seen),
        }
        path.write_text(json.dumps(record))

    # -- what a scenario uses --------------------------------------------------------------------

    def pod_of(self, service: str, rank: int = 0) -> Pod:
        pods = [p for p in self.pods.values() if p.labels.get("infera.amd.com/service") == service]
        return sorted(pods, key=lambda p: p.name)[rank]

    def url(self, service: str) -> str:
        """The Service of a server, by the name cluster DNS resolves."""
        svc = self.by_key[("Service", f"{self.name}-{service}")]
        return f"http://{self.name}-{service}:{svc['spec']['ports'][0]['port']}"


def listening(holder: int) -> set[tuple[int, str]]:
    """The TCP and UDP ports bound in a pod's network namespace on an address other pods reach."""
    done = subprocess.run(
        ["nsenter", f"--net=/proc/{holder}/ns/net", "ss", "-Hlntu"], capture_output=True, text=True, timeout=10
    )
    ports = set()
    for line in done.stdout.splitlines():
        protocol, *_, local, _ = line.split()
        address, _, port = local.rpartition(":")
        if address.strip("[]").split("%")[0] not in ("127.0.0.1", "::1") and not address.startswith("127."):
            ports.add((int(port), protocol.upper()))
    return ports


def unix_connection(path: str) -> socket.socket:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
    except OSError:
        connection.close()
        raise
    return connection


def serve_relay(listener: socket.socket, connect: Callable[[], socket.socket]) -> Callable[[], None]:
    """Every connection `listener` accepts, joined byte for byte to a new one from `connect()`
    until either side closes (a watch stays open as long as its client keeps it); a far side
    that refuses is said on stderr. Returns what stops it: no more accepts, every pair closed."""
    pairs: list[socket.socket] = []

    def copy(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)

    def join(accepted: socket.socket) -> None:
        with accepted:
            try:
                far = connect()
            except OSError as error:
                print(f"relay: the far side refused: {error!r}", file=sys.stderr, flush=True)
                return
            with far:
                # `connect()` may bound its connect with a timeout; a reply may take as long as
                # the client waits for it, as through kube-proxy.
                far.settimeout(None)
                pairs.extend((accepted, far))
                back = threading.Thread(target=copy, args=(far, accepted), daemon=True)
                back.start()
                copy(accepted, far)
                back.join()

    def accept() -> None:
        with contextlib.suppress(OSError):  # stopped
            while True:
                threading.Thread(target=join, args=(listener.accept()[0],), daemon=True).start()

    accepting = threading.Thread(target=accept, daemon=True)
    accepting.start()

    def stop() -> None:
        # shutdown() wakes the blocked accept(), which close() alone does not.
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        accepting.join(timeout=5)
        for connection in list(pairs):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    return stop


def http_ok(url: str) -> bool:
    with contextlib.suppress(OSError):
        with urllib.request.urlopen(url, timeout=2) as response:
            return 200 <= response.status < 400
    return False


def grpc_serving(host: str, port: int, service: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"{host}:{port}") as channel, contextlib.suppress(grpc.RpcError):
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
        return reply.status == health_pb2.HealthCheckResponse.SERVING
    return False


# --- running a scenario -----------------------------------------------------------------------


def need_sandbox() -> None:
    """Skip (or, under INFERA_REQUIRE_ALL, fail) where the sandbox cannot run: the runtime, the
    tools and the namespaces it needs."""
    need_runtime()
    missing = [tool for tool in ("unshare", "nsenter", "ip", "ss") if shutil.which(tool) is None]
    need(not missing, f"{', '.join(missing)} not on PATH (util-linux, iproute2)")
    probe = subprocess.run(
        [
            *UNSHARE,
            "sh",
            "-c",
            "ip link add probe0 type bridge && ip link add probe1 type veth peer name probe2",
        ],
        capture_output=True,
        text=True,
    )
    need(
        probe.returncode == 0,
        "user, mount, network and PID namespaces with bridges and veth pairs are not "
        f"available here: {probe.stderr.strip()}",
    )


class Deadline(Exception):
    """The scenario ran out of its time: raised in it, so the report is still printed."""


def scenario_named(name: str) -> Callable[["Cluster"], None]:
    """A scenario of tests/support/e2e/scenarios.py by its name, or of another module of
    tests/support/e2e/ as `module:name`."""
    import importlib

    module, _, function = name.rpartition(":")
    return getattr(importlib.import_module(f"tests.support.e2e.{module or 'scenarios'}"), function)


def main(workdir: Path) -> int:
    graph = json.loads((workdir / "graph.json").read_text())
    cluster = Cluster(workdir, graph)

    def out_of_time(signum: int, frame: Any) -> None:
        raise Deadline(f"the scenario ran out of its {graph['deadline']} s")

    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(int(graph["deadline"]))
    try:
        cluster.setup()
        scenario_named(graph["scenario"])(cluster)
        print(f"scenario {graph['scenario']} passed")
        return 0
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        print(cluster.report())
        return 1
    finally:
        signal.alarm(0)
        cluster.teardown()
        cluster.write_network(workdir / NETWORK_RECORD)


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="infera-e2e-") as directory:
        yield Path(directory)


def die_with_parent() -> None:
    """In the child before exec: SIGKILL when the test process dies (prctl PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def run(
    directory: Path, timeout: float = SCENARIO_TIMEOUT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """The scenario in its own user, mount, network and PID namespaces: nothing leaves the
    machine, and every process it started dies with it (or with the test process). The scenario
    has `timeout` minus a margin to fail with its report before this gives up on it; if it
    does give up, an AssertionError carries every process's last log lines."""
    graph_file = directory / "graph.json"
    graph_file.write_text(json.dumps({**json.loads(graph_file.read_text()), "deadline": timeout - 15}))
    try:
        return subprocess.run(
            [
                *UNSHARE,
                "--kill-child",
                "--",
                sys.executable,
                "-m",
                "tests.support.e2e.sandbox",
                str(directory),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            preexec_fn=die_with_parent,
        )
    except subprocess.TimeoutExpired:
        logs = "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}"
            for log in sorted((directory / "logs").glob("*.log"))
        )
        raise AssertionError(f"the sandbox did not end within {timeout:.0f} s\n{logs}") from None


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
