"""Preflight: refuse, before any pod starts, a graph whose processes the runtime would refuse at
start-up or that would not work together.

It reads each rendered container's command line as the process will get it: kubelet expands
`$(VAR)` from the container's literal variables, a `sh -c` script is split as the shell splits
it (its `$VAR` from the same variables, `"$@"` from the arguments after the script), and the
Infera module is found after any wrapper (`infera-exec`, `exec`). The operator's own flags pass
by construction; what this catches is in `args`, an `extraPodSpec` command or a patch. A word
the hook cannot know (a variable from a Secret, `$ENGINE_ARGS`) may carry any flag, so a
command holding one is only checked for what it does say, never for what it seems to lack.
Under rollout.strategy BlueGreen it first holds the graph to hooks/generation_isolation.py.
"""

import json
import re

from hooks.api.fields import SpecError, primary_index
from hooks.api.graph import InferaDeployment
from hooks.api.rules import VLLM_ROLE_RULE
from hooks.api.services import ServiceSpec
from hooks.generation_isolation import ROUTER_MODULES, check_isolation
from hooks.observed import pod_templates, service_of
from hooks.runtime import (
    EPP_MODULE,
    SERVER_MODULE,
    SGLANG,
    SGLANG_POD_PORTS,
    VLLM,
    WORKER_MODULES,
    EntryPoint,
    entry_point,
    kv_plane,
)
from hooks.vocabulary import DEPLOYMENT_LABEL

# Where each entry point listens when its command gives no --port, and SGLang's bind address.
DEFAULT_PORTS = {SERVER_MODULE: 8000, SGLANG: 30000, VLLM: 8000}
SGLANG_DEFAULT_HOST = "127.0.0.1"
UNREACHABLE_HOSTS = ("127.0.0.1", "localhost", "::1")
UNROUTABLE_HOSTS = ("", "0.0.0.0", "::", *UNREACHABLE_HOSTS)

# vLLM has no --disaggregation-mode: the worker registers in the role its kv_role maps to
# (infera/engine/vllm/args.py), and the router splits prefill and decode only between workers
# registered as such: kv_both makes a mixed worker.
KV_ROLE_REGISTERS = {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "mixed"}
KV_ROLES = {
    role: tuple(k for k, r in KV_ROLE_REGISTERS.items() if r == role) for role in ("mixed", "prefill", "decode")
}


def listening_ports(entry: EntryPoint, leader: bool) -> list[int]:
    """The ports the process binds that its command line tells (defaults included)."""

    def port(flag: str, default: int) -> list[int]:
        value = entry.known(flag)
        value = value.rsplit(":", 1)[-1] if value else None
        return [int(value)] if value and value.isdigit() else [default] if entry.lacks(flag) else []

    if entry.module == EPP_MODULE:
        return port("--grpc-port", 9002) + port("--grpc-health-port", 9003)
    ports = port("--port", DEFAULT_PORTS[entry.module])
    if entry.module == SGLANG:
        if entry.known("--kv-events") != "off":
            ports += port("--kv-events-bind", SGLANG_POD_PORTS["--kv-events-bind"])
            ports += port("--kv-snapshot-port", SGLANG_POD_PORTS["--kv-snapshot-port"])
        if entry.known("--disaggregation-mode") == "prefill":
            ports += port("--disaggregation-bootstrap-port", SGLANG_POD_PORTS["--disaggregation-bootstrap-port"])
        rendezvous = entry.known("--dist-init-addr")
        if leader and rendezvous and rendezvous.rsplit(":", 1)[-1].isdigit():
            ports.append(int(rendezvous.rsplit(":", 1)[-1]))
    return ports


def check_graph(idep: InferaDeployment, children: list[dict]) -> None:
    """SpecError naming the first process of the rendered graph that would not start or work."""
    if idep.spec.blue_green:
        check_isolation(idep, children)
    planes: dict[str, str] = {}
    selectors: list[tuple[str, str]] = []  # (where, selector) of every router watching pods
    workers: list[dict[str, str]] = []  # labels of every pod a worker registers from
    for child in children:
        service = service_of(child)
        svc = idep.spec.services.get(service or "")
        for template, leader in pod_templates(child):
            containers = template["spec"]["containers"]
            bound: dict[int, str] = {}
            for index, container in enumerate(containers):
                entry = entry_point(container)
                if entry is None:
                    continue
                where = f"spec.services.{service}" if svc else f"{child['kind']} {child['metadata']['name']}"
                if svc and index == primary_index(containers):
                    check_process(where, idep, svc, entry, leader)
                plane = kv_plane(entry)
                if plane:
                    planes.setdefault(plane, f"{where} ({container['name']})")
                if entry.module in WORKER_MODULES.values() and leader:
                    workers.append((template.get("metadata") or {}).get("labels") or {})
                elif entry.module in ROUTER_MODULES and idep.spec.discovery_backend == "kubernetes":
                    selector = entry.label_selector()
                    if selector:
                        selectors.append((f"{where} ({container['name']})", selector))
                for port in listening_ports(entry, leader):
                    if port in bound:
                        raise SpecError(
                            f"{where}: containers {bound[port]} and {container['name']} would both listen on port "
                            f"{port} in one pod"
                            + (": choose another gaie.frontendPort" if idep.spec.gaie.enabled else "")
                        )
                    bound[port] = container["name"]
    for where, selector in selectors:
        terms = [term.split("=", 1) for term in selector.split(",")]
        # Equality terms only: a set-based selector is left to the API server.
        if all(len(term) == 2 and re.fullmatch(r"[\w./-]+", term[0]) for term in terms):
            wanted = {key: value for key, value in terms}
            if not all(wanted.items() <= labels.items() for labels in workers):
                raise SpecError(
                    f"{where}: its label selector {selector!r} misses the graph's worker pods, so it would never "
                    f"see them register: use {DEPLOYMENT_LABEL}={idep.name}"
                )
    if len(planes) > 1:
        raise SpecError(
            "the graph's processes do not share one KV-event plane: "
            + ", ".join(f"{where} uses {plane}" for plane, where in sorted(planes.items()))
            + ": KV-aware routing would not see some workers' caches (set --kv-event-transport alike)"
        )


def check_process(where: str, idep: InferaDeployment, svc: ServiceSpec, entry: EntryPoint, leader: bool) -> None:
    worker = entry.module in WORKER_MODULES.values()
    _check_role(where, svc.role, entry)
    _check_required(where, entry)
    if worker:
        _check_worker(where, svc, entry)
    # A worker's port is its probes' (it registers whatever it listens on); a server's is its Service's.
    if not worker or (leader and not svc.skip_readiness_probe):
        listens = entry.known("--port") or (str(DEFAULT_PORTS[entry.module]) if entry.lacks("--port") else None)
        if entry.module in DEFAULT_PORTS and listens and listens != str(svc.effective_port):
            raise SpecError(
                f"{where}: the command listens on port {listens}, but the service's port is {svc.effective_port}: "
                f"set {where}.port to {listens} ({'its probes' if worker else 'its Service and probe'} follow it)"
            )
    _check_discovery(where, idep, entry)
    _check_nats(where, idep, entry)


def _check_required(where: str, entry: EntryPoint) -> None:
    required = {SERVER_MODULE: ("--router-tokenizer-path",), SGLANG: ("--model-path", "--model"), VLLM: ("--model",)}
    names = required.get(entry.module, ())
    if names and entry.lacks(*names):
        what = (
            "the tokenizer of the served model, e.g. Qwen/Qwen3-0.6B"
            if entry.module == SERVER_MODULE
            else "the model to serve"
        )
        raise SpecError(f"{where}: {entry.module} requires {names[0]} ({what}): add it to args")


def _check_role(where: str, role: str, entry: EntryPoint) -> None:
    """The worker must register in its service's role: SGLang's --disaggregation-mode, vLLM's kv_role."""
    if entry.module == VLLM:
        _check_kv_role(where, role, entry)
    if entry.module != SGLANG:
        return
    mode, wanted = entry.known("--disaggregation-mode"), "null" if role == "mixed" else role
    if mode is not None and mode != wanted:
        raise SpecError(
            f"{where}: --disaggregation-mode {mode} contradicts role {role}: "
            + ("remove it" if role == "mixed" else f"use --disaggregation-mode {role}")
        )
    if mode is None and role != "mixed" and entry.lacks("--disaggregation-mode"):
        raise SpecError(
            f"{where}: the command has no --disaggregation-mode, so the worker would serve as a mixed one: "
            f"add --disaggregation-mode {role}"
        )


def _check_kv_role(where: str, role: str, entry: EntryPoint) -> None:
    allowed, config = KV_ROLES[role], entry.flag("--kv-transfer-config")
    if config is None:
        if role != "mixed" and entry.lacks("--kv-transfer-config"):
            example = f'{{"kv_connector":"MooncakeConnector","kv_role":"{allowed[0]}"}}'
            raise SpecError(
                f"{where}: {VLLM_ROLE_RULE}, with kv_role {allowed[0]}, e.g. --kv-transfer-config '{example}'"
            )
        return
    if "$" in config:
        return
    try:
        parsed = json.loads(config)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise SpecError(f"{where}: --kv-transfer-config must be a JSON object, got {config!r}")
    kv_role = parsed.get("kv_role")
    if kv_role in allowed or (kv_role is None and role == "mixed"):
        return
    raise SpecError(
        f"{where}: --kv-transfer-config has {f'kv_role {kv_role!r}' if kv_role else 'no kv_role'}, with which the "
        f"worker registers as {KV_ROLE_REGISTERS.get(str(kv_role), 'mixed')}, not {role}: set kv_role to {' or '.join(allowed)}"
    )


def _check_worker(where: str, svc: ServiceSpec, entry: EntryPoint) -> None:
    """What only a worker gets wrong: a router's flags (the wrapper hands them to the engine's
    strict parser), SGLang's loopback default, a multi-node rank outside its group."""
    router_flags = sorted(
        {word.split("=")[0] for word in entry.argv if word.startswith(("--k8s-label-selector", "--router-"))}
    )
    if router_flags:
        raise SpecError(
            f"{where}: {', '.join(router_flags)} belong to the router; {entry.module} exits on them: remove them"
        )
    if entry.module != SGLANG:
        return
    host = entry.known("--host") or (SGLANG_DEFAULT_HOST if entry.lacks("--host") else None)
    if host in UNREACHABLE_HOSTS:
        raise SpecError(
            f"{where}: SGLang would bind {host}, where its probes, router and peers cannot reach it: pass --host 0.0.0.0"
        )
    rendezvous = ("--nnodes", "--node-rank", "--dist-init-addr")
    missing = [flag for flag in rendezvous if entry.lacks(flag)]
    if svc.number_of_nodes > 1 and missing:
        raise SpecError(
            f"{where}: a rank of a {svc.number_of_nodes}-node group needs {', '.join(missing)} "
            "(e.g. --nnodes N --node-rank $(LWS_WORKER_INDEX) --dist-init-addr $(LWS_LEADER_ADDRESS):5000)"
        )


def _check_discovery(where: str, idep: InferaDeployment, entry: EntryPoint) -> None:
    backend = entry.known("--discovery-backend") or ("kubernetes" if entry.lacks("--discovery-backend") else None)
    wanted = idep.spec.discovery_backend
    if backend is None:
        return
    if backend != wanted:
        flags = f"--discovery-backend {wanted}" + (
            f" --etcd-endpoint {idep.spec.etcd_endpoint}" if wanted == "etcd" else ""
        )
        raise SpecError(
            f"{where}: the command discovers through {backend}, but discoveryBackend is {wanted}: pass {flags}"
        )
    if wanted != "etcd":
        return
    if entry.lacks("--etcd-endpoint"):
        raise SpecError(f"{where}: --discovery-backend etcd needs --etcd-endpoint {idep.spec.etcd_endpoint}")
    # A worker registers --advertise-host, else its --host, which must then be routable.
    host = entry.flag("--host")
    if entry.module in WORKER_MODULES.values() and entry.lacks("--advertise-host") and (host or "") in UNROUTABLE_HOSTS:
        raise SpecError(
            f"{where}: under etcd discovery a worker registers its --host ({host or 'unset'}) unless told otherwise: "
            "pass --advertise-host $(POD_IP)"
        )


def _check_nats(where: str, idep: InferaDeployment, entry: EntryPoint) -> None:
    """Without the managed broker, a process that uses NATS must be told where one is, or it
    retries nats://127.0.0.1:4222 forever instead of serving."""
    if idep.spec.nats.deploy or entry.flag("--nats-server") or entry.named("NATS_SERVER"):
        return
    uses = []
    transport = entry.known("--request-transport") or ("nats" if entry.lacks("--request-transport") else None)
    if entry.module != EPP_MODULE and transport == "nats":
        uses.append("--request-transport nats")
    if kv_plane(entry) == "nats":
        uses.append("--kv-event-transport nats")
    if uses:
        raise SpecError(
            f"{where}: the command uses NATS ({', '.join(uses)}, the runtime's defaults unless set) but nats.deploy "
            "is false and it names no broker: pass --request-transport http --kv-event-transport zmq, or --nats-server"
        )
