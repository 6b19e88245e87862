"""The pod template of a server or worker service: command, env, resources, probes, metadata."""

import math

from hooks.api import EnvVar, InferaDeployment, ServiceSpec, SpecError, primary_index
from hooks.quantity import canonical_quantity
from hooks.renderers import discovery, nats, overlay
from hooks.renderers.common import COMPONENT_LABEL, GAIE_FRONTEND_LABEL, identity_labels

MAIN_CONTAINER = "main"
FRONTEND_CONTAINER = "frontend"
PORT_NAME = "http"
FRONTEND_PORT_NAME = "frontend"
SHM_VOLUME = "dshm"

# Seconds between the pod being marked terminating and SIGTERM: long enough for the router
# (which watches pods) to stop sending new requests to a worker before it begins to drain.
PRESTOP_DELAY_SECONDS = 10
# The worker's own drain timeout when neither --drain-timeout nor INFERA_DRAIN_TIMEOUT sets it.
DEFAULT_DRAIN_TIMEOUT_SECONDS = 30
# Headroom after the drain for the engine to exit and deregister before SIGKILL.
SHUTDOWN_SLACK_SECONDS = 20

# torch.distributed rendezvous port on the group leader of a multi-node (LeaderWorkerSet) pool.
DIST_INIT_PORT = 5000

# Engine health can stall for seconds under a full batch; a slow answer must not flap readiness.
WORKER_READINESS_PROBE = {
    "failureThreshold": 3,
    "periodSeconds": 10,
    "successThreshold": 1,
    "timeoutSeconds": 10,
}


def discovery_flags(idep: InferaDeployment) -> list[str]:
    if idep.spec.discovery_backend == "etcd":
        return ["--etcd-endpoint", idep.spec.etcd_endpoint or ""]
    return ["--discovery-backend", "kubernetes", "--k8s-label-selector", discovery.label_selector(idep)]


def transport_flags(idep: InferaDeployment) -> list[str]:
    url = nats.client_url(idep)
    return ["--kv-event-transport", "nats", "--nats-server", url] if url else []


def rendezvous_flags(idep: InferaDeployment, svc: ServiceSpec) -> list[str]:
    """How the ranks of a multi-node group find each other, for SGLang.

    The LeaderWorkerSet controller injects LWS_LEADER_ADDRESS and LWS_WORKER_INDEX into every
    pod, and Kubernetes expands `$(VAR)` in the command, so no shell wrapper is needed. A flag
    the user already passes in args is left to them. vLLM spans nodes with a Ray cluster whose
    leader and workers run different commands: nothing is injected for it (see the README).
    """
    if svc.number_of_nodes == 1 or idep.spec.backend_framework != "sglang":
        return []
    flags = {
        "--nnodes": str(svc.number_of_nodes),
        "--node-rank": "$(LWS_WORKER_INDEX)",
        "--dist-init-addr": f"$(LWS_LEADER_ADDRESS):{DIST_INIT_PORT}",
    }
    args = svc.args or []
    return [part for flag, value in flags.items() if _flag_value(args, flag) is None for part in (flag, value)]


def main_command(idep: InferaDeployment, svc: ServiceSpec) -> list[str]:
    """The injected part of the entrypoint; the service's `args` follow it."""
    module = f"infera.engine.{idep.spec.backend_framework}" if svc.is_worker else "infera.server"
    command = ["python3", "-m", module, "--host", "0.0.0.0", "--port", str(svc.effective_port)]
    command += discovery_flags(idep)
    if svc.is_worker and svc.role != "mixed":
        command += ["--disaggregation-mode", svc.role]
    if not svc.is_worker and idep.spec.gaie.enabled:
        command += ["--router-mode", "direct"]
    return command + transport_flags(idep) + rendezvous_flags(idep, svc)


def _field_env(name: str, field_path: str) -> dict:
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}}


def _env_var(var: EnvVar) -> dict:
    # An empty value is stored as absent by the API server, so it is emitted as absent.
    rendered: dict = {"name": var.name}
    if var.value:
        rendered["value"] = var.value
    if var.value_from is not None:
        rendered["valueFrom"] = var.value_from
    return rendered


def _last_wins(env: list[dict]) -> list[dict]:
    """A name set twice keeps its first position and its last value, so users override what the
    operator injects without producing duplicate names (which the API server only warns about)."""
    by_name: dict[str, dict] = {}
    for var in env:
        by_name[var["name"]] = var
    return list(by_name.values())


def operator_env(idep: InferaDeployment, router: bool) -> list[dict]:
    """spec.envs, NATS_SERVER, pod identity, and for routers (infera.server) the selector."""
    env = [_env_var(v) for v in idep.spec.envs or []]
    url = nats.client_url(idep)
    if url:
        env.append({"name": "NATS_SERVER", "value": url})
    env += [
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        # Workers advertise their pod IP to the router, so no hostNetwork is needed.
        _field_env("POD_IP", "status.podIP"),
    ]
    if router and idep.spec.discovery_backend == "kubernetes":
        env.append({"name": "INFERA_K8S_LABEL_SELECTOR", "value": discovery.label_selector(idep)})
    return _last_wins(env)


def container_env(idep: InferaDeployment, svc: ServiceSpec) -> list[dict]:
    """The operator's env, then the service's own env, which wins."""
    return _last_wins(operator_env(idep, router=not svc.is_worker) + [_env_var(v) for v in svc.env or []])


def _flag_value(args: list[str], flag: str) -> str | None:
    """The value argparse would see for `flag` (the last occurrence wins)."""
    value = None
    for index, arg in enumerate(args):
        if arg == flag:
            value = args[index + 1] if index + 1 < len(args) else ""
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def drain_timeout_seconds(flags: list[str], env: list[dict]) -> int:
    """The engine's drain timeout: --drain-timeout in its command line, else INFERA_DRAIN_TIMEOUT."""
    source, raw = "--drain-timeout", _flag_value(flags, "--drain-timeout")
    if raw is None:
        source = "INFERA_DRAIN_TIMEOUT"
        raw = next((v.get("value") for v in env if v["name"] == source and "valueFrom" not in v), None)
    if raw is None:
        return DEFAULT_DRAIN_TIMEOUT_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        raise SpecError(f"{source} must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise SpecError(f"{source} must be a non-negative number of seconds, got {raw!r}")
    return math.ceil(seconds)


def _resources(svc: ServiceSpec) -> dict:
    spec = svc.resources
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if spec.cpu:
        requests["cpu"] = spec.cpu
    if spec.memory:
        requests["memory"] = spec.memory
    if spec.gpu:
        # Extended resources cannot be overcommitted: Kubernetes requires request == limit.
        requests[spec.gpu_type] = limits[spec.gpu_type] = canonical_quantity(str(spec.gpu))
    resources = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return resources


def pod_metadata(idep: InferaDeployment, service: str, svc: ServiceSpec) -> dict:
    """infera* labels/annotations of the parent, then the service's own, then identity."""
    labels = {k: v for k, v in idep.metadata.labels.items() if k.startswith("infera")}
    labels |= svc.pod_labels or {}
    # Only the operator decides which pods the InferencePool selects.
    labels.pop(GAIE_FRONTEND_LABEL, None)
    labels |= identity_labels(idep, service)
    labels[COMPONENT_LABEL] = svc.component_type
    annotations = {k: v for k, v in idep.metadata.annotations.items() if k.startswith("infera")}
    annotations |= svc.pod_annotations or {}
    metadata: dict = {"labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    return metadata


def main_container(idep: InferaDeployment, svc: ServiceSpec, env: list[dict], leader: bool) -> dict:
    container: dict = {
        "name": MAIN_CONTAINER,
        "image": svc.image or idep.spec.image,
        "command": main_command(idep, svc),
        "ports": [{"name": PORT_NAME, "containerPort": svc.effective_port, "protocol": "TCP"}],
        "env": env,
    }
    if svc.args:
        container["args"] = list(svc.args)
    resources = _resources(svc)
    if resources:
        container["resources"] = resources
    if svc.resources.shared_memory:
        container["volumeMounts"] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    if svc.is_worker:
        # Only the pod that serves HTTP (rank 0 of a group) can answer /health.
        if leader and not svc.skip_readiness_probe:
            container["readinessProbe"] = {
                # By number: an extraPodSpec may name the port differently.
                "httpGet": {"path": "/health", "port": svc.effective_port, "scheme": "HTTP"},
                **WORKER_READINESS_PROBE,
            }
        container["lifecycle"] = {
            "preStop": {"exec": {"command": ["sleep", str(PRESTOP_DELAY_SECONDS)]}}
        }
    return container


def gaie_image(idep: InferaDeployment) -> str | None:
    return idep.spec.gaie.epp_image or idep.spec.image


def frontend_sidecar(idep: InferaDeployment) -> dict:
    """The GAIE frontend: an infera.server in direct mode next to the engine, where the
    Inference Gateway sends the requests its Endpoint Picker assigned to this pod."""
    gaie = idep.spec.gaie
    port = gaie.frontend_port
    command = ["python3", "-m", "infera.server", "--host", "0.0.0.0", "--port", str(port), "--router-mode", "direct"]
    command += ["--router-tokenizer-path", gaie.tokenizer_path or ""]
    command += discovery_flags(idep) + transport_flags(idep)
    return {
        "name": FRONTEND_CONTAINER,
        "image": gaie_image(idep),
        "command": command,
        "ports": [{"name": FRONTEND_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "env": operator_env(idep, router=True),
        # All gateway traffic enters through the sidecar: it must outlive the endpoint's removal
        # from the InferencePool just as the engine does.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_DELAY_SECONDS)]}}},
        "readinessProbe": {
            "httpGet": {"path": "/v1/models", "port": port, "scheme": "HTTP"},
            "failureThreshold": 3,
            "periodSeconds": 10,
            "successThreshold": 1,
            "timeoutSeconds": 5,
        },
    }


def pod_template(idep: InferaDeployment, service: str, svc: ServiceSpec, leader: bool = True) -> dict:
    """The pod of a single-node service, or of one rank of a multi-node group (`leader`: rank 0),
    with the service's extraPodSpec laid over it."""
    spec: dict = {
        "containers": [main_container(idep, svc, container_env(idep, svc), leader)],
        # Always set: were it dropped (etcd discovery), the API server's deprecated
        # `serviceAccount` alias would keep pointing pods at the deleted discovery account.
        "serviceAccountName": discovery.service_account_name(idep) or "default",
    }
    if svc.resources.shared_memory:
        spec["volumes"] = [
            {
                "name": SHM_VOLUME,
                "emptyDir": {"medium": "Memory", "sizeLimit": svc.resources.shared_memory},
            }
        ]
    metadata = pod_metadata(idep, service, svc)
    # The serving pod of each worker replica (rank 0 of a group) joins the InferencePool.
    if idep.spec.gaie.enabled and svc.is_worker and leader:
        spec["containers"].append(frontend_sidecar(idep))
        metadata["labels"][GAIE_FRONTEND_LABEL] = "true"
    if svc.extra_pod_spec is not None:
        where = f"services.{service}.extraPodSpec"
        spec = overlay.normalize(overlay.overlay(spec, svc.extra_pod_spec, where), where)
    if svc.is_worker:
        # SIGKILL must not cut a drain short: the pre-stop delay, the drain itself, then slack.
        # A template's own grace period is only ever raised.
        primary = spec["containers"][primary_index(spec["containers"])]
        flags = list(primary.get("command") or []) + list(primary.get("args") or [])
        needed = PRESTOP_DELAY_SECONDS + drain_timeout_seconds(flags, primary.get("env") or []) + SHUTDOWN_SLACK_SECONDS
        spec["terminationGracePeriodSeconds"] = max(needed, spec.get("terminationGracePeriodSeconds") or 0)
    return {"metadata": metadata, "spec": spec}
