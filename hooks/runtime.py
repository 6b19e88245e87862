"""The runtime contract: the command line every process of the graph is started with, the
timing budgets (drain, grace, model load) the pods are sized from, and why. The environment
those processes get is renderers/env.py's; their probes and preStop are renderers/probes.py's.

The pods run the Infera runtime (AMD-AGI/Infera 5890f7f, the `rocm/infera` v0.1.1–v0.2.10
images). Each flag and variable here is read by one of its entry points, and only by the ones it
is given to: the worker wrappers hand every flag they do not know to the engine's strict parser,
so one flag too many crash-loops a GPU pod (exit 2, "unrecognized arguments").

| process | module | what it needs from the operator |
|---|---|---|
| server | `infera.server` | where workers register (selector or etcd), the KV-event and request transports |
| worker | `infera.engine.<backend>` | where to register and the address to advertise, the transports, its role (SGLang) |
| frontend | `infera.server --router-mode direct` | as the server; it sits beside a GAIE worker |
| epp | `infera.gaie` | as a router, plus the tokenizer and the pool's port it sends the gateway to |

Every entry point defaults to Kubernetes discovery and to NATS on 127.0.0.1, so both are always
spelled out: etcd discovery needs `--discovery-backend etcd`, and without the managed broker a
process told nothing would retry 127.0.0.1:4222 forever instead of serving.
"""

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from hooks.api.fields import SpecError
from hooks.api.graph import InferaDeployment
from hooks.api.rules import READY_TIMEOUT_ENV, ready_timeout
from hooks.api.services import ServiceSpec
from hooks.command_line import command_of, expand, flag_value, literal_values, opaque, process_words
from hooks.vocabulary import NATS_SUFFIX, child_name, graph_selector


class Process(StrEnum):
    SERVER = "server"
    WORKER = "worker"
    FRONTEND = "frontend"
    EPP = "epp"


SERVER_MODULE = "infera.server"
EPP_MODULE = "infera.gaie"
WORKER_MODULES = {"sglang": "infera.engine.sglang", "vllm": "infera.engine.vllm"}
SGLANG, VLLM = WORKER_MODULES["sglang"], WORKER_MODULES["vllm"]
MODULES = (SERVER_MODULE, EPP_MODULE, *WORKER_MODULES.values())
# Processes that watch the workers: they take the label selector; a worker does not.
ROUTERS = (Process.SERVER, Process.FRONTEND, Process.EPP)

# The Endpoint Picker's ext-proc and gRPC health ports (its own defaults, stated explicitly).
EPP_GRPC_PORT = 9002
EPP_HEALTH_PORT = 9003

# What else the SGLang worker binds in its pod by default (the GAIE sidecar shares the pod): its
# KV plane's ZMQ publisher and snapshot server, and a prefill engine's bootstrap server.
SGLANG_POD_PORTS = {"--kv-events-bind": 5557, "--kv-snapshot-port": 8801, "--disaggregation-bootstrap-port": 8998}

# The managed broker's client port, and the variable its token is read into in every pod that
# connects to it.
NATS_CLIENT_PORT = 4222
NATS_TOKEN_ENV = "INFERA_NATS_TOKEN"

# torch.distributed rendezvous port on the group leader of a multi-node (LeaderWorkerSet) pool.
DIST_INIT_PORT = 5000

# Seconds between the pod being marked terminating and SIGTERM: the router drops a worker the
# moment its Pod carries a deletionTimestamp, so requests stop arriving before the drain begins.
PRESTOP_SECONDS = 15
# The worker's own --drain-timeout default.
DEFAULT_DRAIN_SECONDS = 30
# A drain beyond an hour is a typo, and it becomes a grace period only `--force` can cut short.
MAX_DRAIN_SECONDS = 3600
# After the drain: stopping the KV plane and engine.stop(), which waits up to 30 s for the
# engine's process group before SIGKILL, plus the 10 s deregistration call.
TEARDOWN_SECONDS = 50
# Short drains still leave room for a slow engine exit.
MIN_GRACE_SECONDS = 120

# A cold start of a large model is weight loading, bounded by storage: minutes from local NVMe,
# over an hour from a shared filesystem. The wrapper gives up after READY_TIMEOUT_ENV
# (INFERA_ENGINE_READY_TIMEOUT; its default, 1800 s, is too short for that), so the operator
# raises it to this budget and sizes the startup probe to outlast it.
MODEL_LOAD_SECONDS = 7200
# A load beyond a day is a typo; past it the startup probe's failureThreshold (an int32 the API
# server checks) would soon overflow and every apply of the workload would be refused.
MAX_MODEL_LOAD_SECONDS = 86400
# The wrapper's own start (imports, preflight, spawning the engine) before its clock runs.
STARTUP_SLACK_SECONDS = 300
STARTUP_PERIOD_SECONDS = 10

DRAIN_ENV = "INFERA_DRAIN_TIMEOUT"
# What a router watches workers with: the flag, else the variable (its default). The routers'
# parsers take any unambiguous prefix of a flag for it (argparse's allow_abbrev), and
# --k8s-namespace shares "--k8s-": every prefix from "--k8s-l" on is the selector.
SELECTOR_FLAG = "--k8s-label-selector"
SELECTOR_ABBREVIATION = "--k8s-l"
SELECTOR_ENV = "INFERA_K8S_LABEL_SELECTOR"
NATS_ENV = "NATS_SERVER"


def client_url(idep: InferaDeployment) -> str | None:
    """Where servers and workers publish KV events, when the managed broker is deployed. With a
    token, the URL carries it as its user (nats-py sends a lone user as the token; the port must
    be written out, or it rebuilds the URL without it)."""
    if not idep.spec.nats.deploy:
        return None
    token = f"$({NATS_TOKEN_ENV})@" if idep.spec.nats.token_secret_ref else ""
    return f"nats://{token}{child_name(idep, NATS_SUFFIX)}:{NATS_CLIENT_PORT}"


def worker_module(idep: InferaDeployment) -> str:
    return WORKER_MODULES[idep.spec.backend_framework]


def discovery_flags(idep: InferaDeployment, process: Process) -> list[str]:
    """Where workers register and routers look for them. A worker registers by patching its own
    Pod (it has no use for a selector) or in etcd, where it must advertise its Pod IP: the
    wrappers use POD_IP only under Kubernetes discovery and would otherwise publish 0.0.0.0."""
    if idep.spec.discovery_backend == "etcd":
        flags = ["--discovery-backend", "etcd", "--etcd-endpoint", idep.spec.etcd_endpoint or ""]
        return flags + (["--advertise-host", "$(POD_IP)"] if process == Process.WORKER else [])
    flags = ["--discovery-backend", "kubernetes"]
    return flags + ([SELECTOR_FLAG, graph_selector(idep)] if process in ROUTERS else [])


def transport_flags(idep: InferaDeployment, process: Process) -> list[str]:
    """The managed broker carries both requests and KV events; without it, requests go over
    HTTP and KV events over each worker's ZMQ socket. The EPP only reads KV events."""
    url = client_url(idep)
    kv_events = ["--kv-event-transport", "nats", "--nats-server", url] if url else ["--kv-event-transport", "zmq"]
    if process == Process.EPP:
        return kv_events
    return ["--request-transport", "nats" if url else "http"] + kv_events


def role_flags(idep: InferaDeployment, svc: ServiceSpec) -> list[str]:
    """SGLang's own --disaggregation-mode; vLLM's role is the kv_role the user configures."""
    if svc.role == "mixed" or idep.spec.backend_framework != "sglang":
        return []
    return ["--disaggregation-mode", svc.role]


def rendezvous_flags(idep: InferaDeployment, svc: ServiceSpec) -> list[str]:
    """How the ranks of a multi-node SGLang group find each other.

    The LeaderWorkerSet controller injects LWS_LEADER_ADDRESS and LWS_WORKER_INDEX into every
    pod and kubelet expands `$(VAR)` in the command, so no shell wrapper is needed. A flag the
    user already passes in args is left to them. vLLM spans nodes with a Ray cluster whose
    leader and workers run different commands: nothing is injected for it (docs/pods.md,
    "Multi-node worker pools").
    """
    if svc.number_of_nodes == 1 or idep.spec.backend_framework != "sglang":
        return []
    flags = {
        "--nnodes": str(svc.number_of_nodes),
        "--node-rank": "$(LWS_WORKER_INDEX)",
        "--dist-init-addr": f"$(LWS_LEADER_ADDRESS):{DIST_INIT_PORT}",
    }
    args = svc.args or []
    return [part for flag, value in flags.items() if flag_value(args, flag) is None for part in (flag, value)]


def _listen(port: int) -> list[str]:
    return ["--host", "0.0.0.0", "--port", str(port)]


def server_command(idep: InferaDeployment, svc: ServiceSpec) -> list[str]:
    """The router; behind an Inference Gateway it trusts the EPP's pick (direct mode)."""
    command = ["python3", "-m", SERVER_MODULE, *_listen(svc.effective_port), *discovery_flags(idep, Process.SERVER)]
    if idep.spec.gaie.enabled:
        command += ["--router-mode", "direct"]
    return command + transport_flags(idep, Process.SERVER)


def worker_command(idep: InferaDeployment, svc: ServiceSpec) -> list[str]:
    return [
        "python3",
        "-m",
        worker_module(idep),
        *_listen(svc.effective_port),
        *discovery_flags(idep, Process.WORKER),
        *role_flags(idep, svc),
        *transport_flags(idep, Process.WORKER),
        *rendezvous_flags(idep, svc),
    ]


def frontend_command(idep: InferaDeployment) -> list[str]:
    """The GAIE frontend: a router in direct mode beside the engine, where the gateway sends the
    requests its Endpoint Picker assigned to this pod."""
    gaie = idep.spec.gaie
    return [
        "python3",
        "-m",
        SERVER_MODULE,
        *_listen(gaie.frontend_port),
        "--router-mode",
        "direct",
        "--router-tokenizer-path",
        gaie.tokenizer_path or "",
        *discovery_flags(idep, Process.FRONTEND),
        *transport_flags(idep, Process.FRONTEND),
    ]


def epp_command(idep: InferaDeployment) -> list[str]:
    """The Endpoint Picker answers the gateway with <pod IP>:<destination port>: that must be
    the frontend sidecars' port, the pool's target port, not the engine's."""
    gaie = idep.spec.gaie
    return [
        "python3",
        "-m",
        EPP_MODULE,
        "--grpc-port",
        str(EPP_GRPC_PORT),
        "--grpc-health-port",
        str(EPP_HEALTH_PORT),
        "--destination-port",
        str(gaie.frontend_port),
        "--router-tokenizer-path",
        gaie.tokenizer_path or "",
        *discovery_flags(idep, Process.EPP),
        *transport_flags(idep, Process.EPP),
    ]


# Values the runtime reads from a command line and environment.


@dataclass(frozen=True)
class EntryPoint:
    """An Infera entry point as a container starts it."""

    module: str
    argv: list[str]
    # A word the hook cannot expand stands where a flag could: what the command lacks is unknown.
    opaque: bool
    env: list[dict]
    env_from: bool  # variables from a ConfigMap or Secret, unknown here

    def flag(self, name: str) -> str | None:
        return flag_value(self.argv, name)

    def known(self, name: str) -> str | None:
        """The flag's value when the hook can read it."""
        value = self.flag(name)
        return value if value is not None and "$" not in value else None

    def lacks(self, *names: str) -> bool:
        """Certainly none of these flags: the command says everything it passes."""
        return not self.opaque and all(self.flag(name) is None for name in names)

    def named(self, variable: str) -> bool:
        return self.env_from or any(var.get("name") == variable for var in self.env)

    def label_selector(self) -> str | None:
        """The label selector a router watches workers with, as its parser reads it: the flag in
        any spelling it takes (the last wins), else the variable written out; None when unknown."""
        value = flag_value(self.argv, SELECTOR_FLAG, SELECTOR_ABBREVIATION)
        value = literal_values(self.env).get(SELECTOR_ENV) if value is None else value
        return value if value is not None and "$" not in value else None


def entry_point(container: dict[str, Any]) -> EntryPoint | None:
    """The Infera entry point a container runs (after any wrapper, `infera-exec` or `exec`), with
    its arguments; None for anything else."""
    words = process_words(container) or []
    for index in range(len(words) - 1):
        if words[index] == "-m" and words[index + 1] in MODULES:
            argv = command_of(words[index + 2 :])
            env = list(container.get("env") or [])
            return EntryPoint(words[index + 1], argv, opaque(argv), env, bool(container.get("envFrom")))
    return None


def kv_plane(entry: EntryPoint) -> str | None:
    """Where the process reads or writes KV events (nats or zmq); None when it does not, or the
    command does not say."""
    if entry.module in WORKER_MODULES.values():
        if "--no-enable-kv-events" in entry.argv:
            return None
    elif (entry.known("--router-policy") or "kv-aware") != "kv-aware":
        return None
    transport = entry.known("--kv-event-transport")
    return transport or (None if entry.opaque else "nats")


def _literal_env(env: list[dict], name: str) -> str | None:
    """A variable's value when it is written literally (a valueFrom is resolved only by kubelet)."""
    return next((var.get("value") for var in env if var.get("name") == name and "valueFrom" not in var), None)


def _seconds(source: str, raw: str) -> float | None:
    """A number of seconds; None when a variable reference makes it unknowable here."""
    if "$" in raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        raise SpecError(f"{source} must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise SpecError(f"{source} must be a non-negative number of seconds, got {raw!r}")
    return seconds


def drain_seconds(argv: list[str], env: list[dict]) -> int:
    """The worker's drain timeout: --drain-timeout, else INFERA_DRAIN_TIMEOUT (the flag's default),
    else 30 s; rounded up and clamped to an hour."""
    flag = flag_value(argv, "--drain-timeout")
    for source, raw in (
        ("--drain-timeout", flag and expand(flag, literal_values(env))),
        (DRAIN_ENV, _literal_env(env, DRAIN_ENV)),
    ):
        if raw is not None:
            seconds = _seconds(source, raw)
            if seconds is not None:
                return min(math.ceil(seconds), MAX_DRAIN_SECONDS)
    return DEFAULT_DRAIN_SECONDS


def grace_seconds(argv: list[str], env: list[dict]) -> int:
    """terminationGracePeriodSeconds that SIGKILL never cuts short: the preStop delay, the drain,
    then the teardown, with a floor for slow engine exits."""
    return max(MIN_GRACE_SECONDS, PRESTOP_SECONDS + drain_seconds(argv, env) + TEARDOWN_SECONDS)


SCALING_API_FLAG = "--enable-scaling-api"
SCALING_API_ENV = "INFERA_ENABLE_SCALING_API"


def scaling_api_enabled(argv: list[str], env: list[dict]) -> bool:
    """Whether the router serves the scaling API: the flag (a store_true), else the variable
    that is its default, true for 1, true or yes in any case (infera/server/args.py)."""
    value = _literal_env(env, SCALING_API_ENV)
    return SCALING_API_FLAG in argv or (value or "").lower() in ("1", "true", "yes")


def ready_timeout_seconds(env: list[dict]) -> int:
    """How long the wrapper waits for the engine, at most a day; a value it cannot read leaves its
    default."""
    raw = _literal_env(env, READY_TIMEOUT_ENV)
    seconds = None if raw is None else ready_timeout(raw)
    return MODEL_LOAD_SECONDS if seconds is None else min(math.ceil(seconds), MAX_MODEL_LOAD_SECONDS)
