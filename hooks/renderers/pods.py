"""The pod template of a server or worker service: containers, volumes, metadata, and the
rollout defaults the template leaves unset. What the processes are told is hooks.runtime's."""

from hooks import runtime
from hooks.api.fields import primary_index
from hooks.api.graph import InferaDeployment
from hooks.api.services import ServiceSpec
from hooks.quantity import canonical_quantity
from hooks.renderers import autoscaling, discovery, model_cache, overlay, placement, probes, security
from hooks.renderers.env import service_env
from hooks.renderers.gaie import ROUTER_REQUESTS, frontend_sidecar
from hooks.vocabulary import (
    COMPONENT_LABEL,
    GAIE_FRONTEND_LABEL,
    GENERATION_LABEL,
    generation_labels,
    identity_labels,
    selector_labels,
)

# As the upstream operator names them: scripts run `kubectl logs -c infera`.
PRIMARY_CONTAINER = "infera"
PORT_NAME = "http"
SHM_VOLUME = "dshm"
# The node's kernel config, read by the runtime's GPU-direct checks (engine images ship none, and
# kvd silently falls back to bouncing loads through the CPU).
BOOT_VOLUME = "boot-config"


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
    # Only the operator decides which pods the InferencePool and the routers select.
    labels.pop(GAIE_FRONTEND_LABEL, None)
    labels.pop(GENERATION_LABEL, None)
    labels |= identity_labels(idep, service) | generation_labels(idep)
    labels[COMPONENT_LABEL] = svc.component_type
    annotations = {k: v for k, v in idep.metadata.annotations.items() if k.startswith("infera")}
    annotations |= svc.pod_annotations or {}
    metadata: dict = {"labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    return metadata


def _mounts_and_volumes(
    idep: InferaDeployment, svc: ServiceSpec, model_dir: str | None
) -> tuple[list[dict], list[dict]]:
    mounts: list[dict] = []
    volumes: list[dict] = []
    if svc.is_worker and idep.spec.model_cache is not None and model_dir is not None:
        mounts.append(model_cache.worker_mount(idep.spec.model_cache, model_dir))
        volumes.append(model_cache.worker_volume(idep))
    if svc.resources.shared_memory:
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": svc.resources.shared_memory}})
    if not svc.is_worker:
        mounts.append(security.scratch_mount())
        volumes.append(security.scratch_volume())
    # As upstream, on the pods rendered from the flat fields; a template decides for itself.
    if svc.is_worker and svc.host_boot and svc.extra_pod_spec is None:
        mounts.append({"name": BOOT_VOLUME, "mountPath": "/boot", "readOnly": True})
        volumes.append({"name": BOOT_VOLUME, "hostPath": {"path": "/boot", "type": "Directory"}})
    return mounts, volumes


def primary_container(idep: InferaDeployment, svc: ServiceSpec, mounts: list[dict]) -> dict:
    command = runtime.worker_command(idep, svc) if svc.is_worker else runtime.server_command(idep, svc)
    container: dict = {
        "name": PRIMARY_CONTAINER,
        "image": svc.image or idep.spec.image,
        "command": command,
        "ports": [{"name": PORT_NAME, "containerPort": svc.effective_port, "protocol": "TCP"}],
        "env": service_env(idep, svc),
    }
    if svc.args:
        container["args"] = list(svc.args)
    resources = _resources(svc)
    if resources:
        container["resources"] = resources
    container["securityContext"] = (
        security.worker_container(svc.rdma) if svc.is_worker else security.restricted_container()
    )
    if mounts:
        container["volumeMounts"] = mounts
    return container


def _complete_primary(svc: ServiceSpec, spec: dict, leader: bool) -> None:
    """What the primary container (rendered, or the template's) must have and does not set:
    probes, the worker's preStop delay and a grace period its drain fits in."""
    primary = spec["containers"][primary_index(spec["containers"])]
    started = runtime.entry_point(primary)
    argv = started.argv if started else []
    env = primary.get("env") or []
    port = svc.effective_port
    if not svc.is_worker:
        if not svc.skip_readiness_probe:
            primary.setdefault("readinessProbe", probes.router_readiness("/health", port))
            primary.setdefault("livenessProbe", probes.router_liveness(port))
        # A router's share where neither the flat fields nor a template size it (a template's
        # lone limit is its request too, as the API server defaults it); a worker's needs are
        # its model's.
        resources = primary.setdefault("resources", {})
        for name, quantity in ROUTER_REQUESTS.items():
            if name not in (resources.get("requests") or {}) and name not in (resources.get("limits") or {}):
                resources.setdefault("requests", {})[name] = quantity
        return
    # Only the pod that serves HTTP (rank 0 of a group) answers /health; the other ranks
    # restart with their group (RecreateGroupOnPodRestart).
    if leader and not svc.skip_readiness_probe:
        for name, probe in probes.worker_probes(port, env).items():
            primary.setdefault(name, probe)
    lifecycle = primary.setdefault("lifecycle", {})
    lifecycle.setdefault("preStop", probes.prestop())
    # A template's own grace period is only ever raised.
    spec["terminationGracePeriodSeconds"] = max(
        runtime.grace_seconds(argv, env), spec.get("terminationGracePeriodSeconds") or 0
    )


def pod_template(
    idep: InferaDeployment, service: str, svc: ServiceSpec, leader: bool = True, model_dir: str | None = None
) -> dict:
    """The pod of a single-node service, or of one rank of a multi-node group (`leader`: rank 0),
    with the service's extraPodSpec laid over it. A worker mounts the model cache's directory
    `model_dir` (a source's digest) when given."""
    mounts, volumes = _mounts_and_volumes(idep, svc, model_dir)
    spec: dict = {
        "containers": [primary_container(idep, svc, mounts)],
        # Always set: were it dropped (etcd discovery), the API server's deprecated
        # `serviceAccount` alias would keep pointing pods at a deleted discovery account.
        "serviceAccountName": discovery.service_account_name(idep, svc) or "default",
        "securityContext": security.pod_context(),
    }
    if volumes:
        spec["volumes"] = volumes
    # Routers across nodes, so that one node's loss leaves the front door open (a template's own
    # constraints replace these).
    if not svc.is_worker and svc.most_replicas > 1:
        spec["topologySpreadConstraints"] = autoscaling.spread_over_nodes(
            selector_labels(idep, service) | generation_labels(idep)
        )
    metadata = pod_metadata(idep, service, svc)
    # The serving pod of each worker replica (rank 0 of a group) joins the InferencePool.
    if idep.spec.gaie.enabled and svc.is_worker and leader:
        spec["containers"].append(frontend_sidecar(idep))
        spec.setdefault("volumes", []).append(security.scratch_volume())
        metadata["labels"][GAIE_FRONTEND_LABEL] = "true"
    if svc.extra_pod_spec is not None:
        where = f"spec.services.{service}.extraPodSpec"
        spec = overlay.normalize(overlay.overlay(spec, svc.extra_pod_spec, where), where)
        security.settle_template(spec, spec["containers"][primary_index(spec["containers"])], svc.rdma)
    # After the template: one that names an account of its own keeps kubelet's default.
    discovery.unmount_unused_token(idep, spec)
    _complete_primary(svc, spec, leader)
    template = {"metadata": metadata, "spec": spec}
    # After the template too: its own affinity terms stand beside the placement's.
    placement.place(idep, service, svc, template)
    return template
