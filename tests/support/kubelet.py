"""What kubelet and the LeaderWorkerSet controller make of a rendered pod template: each
container's environment and the argv its process is started with.

- env, in order: the LeaderWorkerSet variables (for a group's pods), then the container's own,
  the downward API resolved to this pod's facts, and `$(VAR)` in a value expanded against the
  variables defined before it;
- command and args: `$(VAR)` expanded against the whole environment, `$$` an escaped `$`, an
  unknown name left as written (kubelet's rules, k8s.io/kubernetes/third_party/forked/golang/expansion).

hooks/command_line.py reads command lines too (for the runtime module to size grace periods and
preflight to refuse what would not start); this module repeats those rules on purpose, so a
test judging the hook does not share its mistakes.
"""

import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REFERENCE = re.compile(r"\$\$|\$\(([^)]*)\)")
# The node of the data-plane sandbox (tests/support/e2e/sandbox.py) on its pod network, where pods reach
# the cluster's services; pods are numbered from .10 up.
NODE_IP = "10.42.0.1"
POD_NETWORK = "10.42.0"


def expand(text: str, env: dict[str, str]) -> str:
    def replace(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return REFERENCE.sub(replace, text)


@dataclass(frozen=True)
class PodFacts:
    """What the downward API and the LeaderWorkerSet controller know about one pod."""

    name: str
    namespace: str
    ip: str
    node: str = "gpu-node-1"
    lws: dict[str, str] = field(default_factory=dict)  # LWS_* variables of a group's pod
    services: dict[str, str] = field(default_factory=dict)  # kubelet's service variables


def lws_facts(lws_name: str, namespace: str, size: int, group: int, index: int) -> dict[str, str]:
    """The variables the LeaderWorkerSet controller injects into every container of a group."""
    return {
        "LWS_LEADER_ADDRESS": f"{lws_name}-{group}.{lws_name}.{namespace}",
        "LWS_GROUP_SIZE": str(size),
        "LWS_WORKER_INDEX": str(index),
    }


def _field(path: str, pod: PodFacts, labels: dict[str, str]) -> str:
    if path.startswith("metadata.labels['"):
        return labels.get(path[len("metadata.labels['") : -2], "")
    return {
        "metadata.name": pod.name,
        "metadata.namespace": pod.namespace,
        "status.podIP": pod.ip,
        "status.hostIP": "192.168.0.10",
        "spec.nodeName": pod.node,
    }[path]


def container_env(
    container: dict[str, Any], pod: PodFacts, labels: dict[str, str], secrets: dict[str, dict[str, str]] | None = None
) -> dict[str, str]:
    """The variables kubelet gives the container (the image's own are not among them: `$(VAR)`
    never expands to one of those), with the keys of `secrets` (by name) where a variable reads
    one."""
    env = {**pod.services, **pod.lws}
    for var in container.get("env") or []:
        source = var.get("valueFrom")
        secret = (source or {}).get("secretKeyRef") or {}
        if source is None:
            env[var["name"]] = expand(str(var.get("value", "")), env)
        elif "fieldRef" in source:
            env[var["name"]] = _field(source["fieldRef"]["fieldPath"], pod, labels)
        elif secret.get("key") in (secrets or {}).get(secret.get("name"), {}):
            env[var["name"]] = (secrets or {})[secret["name"]][secret["key"]]
        else:  # a Secret, ConfigMap or resource value: present, its content unknown here
            env[var["name"]] = f"<{next(iter(source))}>"
    return env


def service_env(name: str, ip: str, ports: list[dict[str, Any]]) -> dict[str, str]:
    """The variables kubelet gives every container for a ClusterIP Service that exists when it
    starts (enableServiceLinks, the default), e.g. E2E_SERVER_SERVICE_HOST."""
    prefix = name.upper().replace("-", "_")
    first = ports[0]
    env = {
        f"{prefix}_SERVICE_HOST": ip,
        f"{prefix}_SERVICE_PORT": str(first["port"]),
        f"{prefix}_PORT": f"{first.get('protocol', 'TCP').lower()}://{ip}:{first['port']}",
    }
    for port in ports:
        protocol, number = port.get("protocol", "TCP"), port["port"]
        if port.get("name"):
            env[f"{prefix}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(number)
        stem = f"{prefix}_PORT_{number}_{protocol}"
        env |= {
            stem: f"{protocol.lower()}://{ip}:{number}",
            f"{stem}_PROTO": protocol.lower(),
            f"{stem}_PORT": str(number),
            f"{stem}_ADDR": ip,
        }
    return env


def container_argv(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    return [expand(part, env) for part in list(container.get("command") or []) + list(container.get("args") or [])]


SHELLS = ("sh", "bash", "dash", "ash")
# Stands for python3 on a shell's PATH: records the argv and environment it is started with, one
# JSON line each.
RECORDER = (
    f"#!{sys.executable}\nimport json, os, sys\n"
    "open(os.environ['ARGV_LOG'], 'a').write(json.dumps([sys.argv[1:], dict(os.environ)]) + '\\n')\n"
)


def python_processes(argv: list[str], env: dict[str, str]) -> list[tuple[list[str], dict[str, str]]]:
    """The arguments and environment `python3` gets when kubelet starts `argv` under `env`: for
    `sh -c '<script>' ...` the real shell runs the script (with `python3` recording instead of
    running), so quoting, variables, `"$@"`, `exec` and what the script exports are the shell's
    own; otherwise `argv` itself."""
    if not (len(argv) >= 2 and argv[0].rsplit("/", 1)[-1] in SHELLS):
        return [(argv, env)]
    with tempfile.TemporaryDirectory() as scratch:
        stub = Path(scratch) / "python3"
        stub.write_text(RECORDER)
        stub.chmod(0o755)
        log = Path(scratch) / "argv.log"
        log.touch()
        shell_env = {**env, "PATH": scratch, "ARGV_LOG": str(log)}
        shell = Path("/bin") / argv[0].rsplit("/", 1)[-1]
        subprocess.run(
            [str(shell if shell.exists() else "/bin/sh"), *argv[1:]],
            env=shell_env,
            cwd=scratch,
            capture_output=True,
            timeout=10,
            check=False,
        )
        started = []
        for line in log.read_text().splitlines():
            args, recorded = json.loads(line)
            recorded = {key: value for key, value in recorded.items() if key not in ("PATH", "ARGV_LOG")}
            started.append((["python3", *args], recorded | ({"PATH": env["PATH"]} if "PATH" in env else {})))
        return started


@dataclass(frozen=True)
class Pod:
    """One pod a rendered workload creates (for a LeaderWorkerSet, one per rank of group 0)."""

    owner: str  # kind/name of the workload
    template: dict[str, Any]
    facts: PodFacts

    @property
    def labels(self) -> dict[str, str]:
        return (self.template.get("metadata") or {}).get("labels") or {}

    @property
    def spec(self) -> dict[str, Any]:
        return self.template["spec"]


def pods(children: list[dict[str, Any]], namespace: str) -> list[Pod]:
    """A pod of every template in the answer, each with its own name and IP."""
    found: list[Pod] = []

    def add(owner: str, template: dict[str, Any], name: str, lws: dict[str, str] | None = None) -> None:
        facts = PodFacts(name=name, namespace=namespace, ip=f"{POD_NETWORK}.{len(found) + 10}", lws=lws or {})
        found.append(Pod(owner, template, facts))

    for child in children:
        kind, name, spec = child["kind"], child["metadata"]["name"], child.get("spec") or {}
        if kind == "Deployment":
            add(f"{kind}/{name}", spec["template"], f"{name}-5d8f7c9b6-x2k4p")
        elif kind == "StatefulSet":
            add(f"{kind}/{name}", spec["template"], f"{name}-0")
        elif kind == "LeaderWorkerSet":
            group = spec["leaderWorkerTemplate"]
            size = group["size"]
            leader = group.get("leaderTemplate") or group["workerTemplate"]
            add(f"{kind}/{name}", leader, f"{name}-0", lws_facts(name, namespace, size, 0, 0))
            for index in range(1, size):
                add(
                    f"{kind}/{name}",
                    group["workerTemplate"],
                    f"{name}-0-{index}",
                    lws_facts(name, namespace, size, 0, index),
                )
    return found
