"""The Inference Gateway front door: Endpoint Picker (Deployment + Service), InferencePool and
HTTPRoute, and the frontend sidecar the gateway routes to, which the pod renderer adds to every
serving worker pod."""

from typing import Any

from hooks import runtime
from hooks.api.graph import InferaDeployment
from hooks.renderers import autoscaling, discovery, probes, security
from hooks.renderers.env import operator_env
from hooks.renderers.patches import target_name
from hooks.runtime import EPP_GRPC_PORT, EPP_HEALTH_PORT, Process
from hooks.vocabulary import (
    BY_KIND,
    DEPLOYMENT_LABEL,
    EPP_SUFFIX,
    GAIE_FRONTEND_LABEL,
    generation_labels,
    generation_metadata,
    generation_name,
    identity_labels,
    object_metadata,
    pool_name,
    route_name,
    selector_labels,
)

FRONTEND_CONTAINER = "infera-frontend"
FRONTEND_PORT_NAME = "frontend"
# The server, the picker and the frontend are routers: a tokenizer in memory and the scoring
# of each request. Requests, no limits: a burst may use what the node has spare (patches can set
# limits, or other requests).
ROUTER_REQUESTS = {"cpu": "500m", "memory": "1Gi"}


def gaie_image(idep: InferaDeployment) -> str | None:
    return idep.spec.gaie.epp_image or idep.spec.image


def frontend_sidecar(idep: InferaDeployment) -> dict[str, Any]:
    port = idep.spec.gaie.frontend_port
    return {
        "name": FRONTEND_CONTAINER,
        "image": gaie_image(idep),
        "command": runtime.frontend_command(idep),
        "ports": [{"name": FRONTEND_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "env": operator_env(idep, Process.FRONTEND),
        # All gateway traffic enters through the sidecar: it must outlive the endpoint's removal
        # from the InferencePool just as the engine does.
        "lifecycle": {"preStop": probes.prestop()},
        "readinessProbe": probes.router_readiness("/v1/models", port),
        "livenessProbe": probes.router_liveness(port),
        "resources": {"requests": dict(ROUTER_REQUESTS)},
        # Restricted in a worker's pod, which is not: its own user, its own scratch.
        "securityContext": security.restricted_container(),
        "volumeMounts": [security.scratch_mount()],
    }


def _pickers(idep: InferaDeployment) -> dict[str, str]:
    """The labels that select the Endpoint Pickers of the generation being rendered."""
    return selector_labels(idep, EPP_SUFFIX) | generation_labels(idep)


def epp_deployment(idep: InferaDeployment) -> dict:
    container = {
        "name": "epp",
        "image": gaie_image(idep),
        "command": runtime.epp_command(idep),
        "ports": [
            {"name": "grpc-ext-proc", "containerPort": EPP_GRPC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"},
        ],
        "env": operator_env(idep, Process.EPP),
        "readinessProbe": probes.epp_readiness(),
        "livenessProbe": probes.epp_liveness(),
        "resources": {"requests": dict(ROUTER_REQUESTS)},
        "securityContext": security.restricted_container(),
        "volumeMounts": [security.scratch_mount()],
    }
    spec: dict = {
        "containers": [container],
        "serviceAccountName": discovery.service_account_name(idep) or "default",
        "securityContext": security.pod_context(),
        "volumes": [security.scratch_volume()],
    }
    discovery.unmount_unused_token(idep, spec)
    replicas = idep.spec.gaie.epp_replicas
    if replicas > 1:
        spec["topologySpreadConstraints"] = autoscaling.spread_over_nodes(_pickers(idep))
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": generation_metadata(idep, EPP_SUFFIX),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": _pickers(idep)},
            "template": {
                "metadata": {"labels": identity_labels(idep, EPP_SUFFIX) | generation_labels(idep)},
                "spec": spec,
            },
        },
    }


def epp_disruption_budget(idep: InferaDeployment) -> list[dict]:
    """With two or more pickers, a drain takes one at a time: the gateway always has one."""
    if not idep.spec.gaie.enabled or idep.spec.gaie.epp_replicas < 2:
        return []
    return [autoscaling.pod_disruption_budget(generation_metadata(idep, EPP_SUFFIX), _pickers(idep), 1)]


def epp_service(idep: InferaDeployment) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": generation_metadata(idep, EPP_SUFFIX),
        "spec": {
            "type": "ClusterIP",
            "selector": _pickers(idep),
            # No appProtocol: the picker serves gRPC over TLS (a self-signed certificate, its
            # default), which Inference Gateways dial with verification off; h2c would be a lie.
            "ports": [
                {"name": "grpc-ext-proc", "port": EPP_GRPC_PORT, "targetPort": "grpc-ext-proc", "protocol": "TCP"}
            ],
        },
    }


def inference_pool(idep: InferaDeployment) -> dict:
    return {
        "apiVersion": BY_KIND["InferencePool"].api_version,
        "kind": "InferencePool",
        "metadata": generation_metadata(idep, EPP_SUFFIX) | {"name": pool_name(idep)},
        "spec": {
            # Exactly the worker pods that carry the frontend sidecar (of the pool's generation):
            # never the EPP or a server.
            "selector": {
                "matchLabels": {DEPLOYMENT_LABEL: idep.name, GAIE_FRONTEND_LABEL: "true"} | generation_labels(idep)
            },
            "targetPorts": [{"number": idep.spec.gaie.frontend_port}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": generation_name(idep, EPP_SUFFIX),
                "port": {"number": EPP_GRPC_PORT},
            },
        },
    }


def http_route(idep: InferaDeployment) -> dict:
    """`idep` at the serving generation: under BlueGreen the route is the front door that moves."""
    gaie = idep.spec.gaie
    spec: dict = {
        "parentRefs": [
            {
                "group": "gateway.networking.k8s.io",
                "kind": "Gateway",
                "name": gaie.gateway_name,
                "namespace": gaie.gateway_namespace or idep.metadata.namespace,
            }
        ],
        # Written with the CRD's defaults filled in: Metacontroller replaces the rules list
        # wholesale, so a rule missing a defaulted field would be re-applied on every sync.
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [
                    {
                        "group": "inference.networking.k8s.io",
                        "kind": "InferencePool",
                        "name": pool_name(idep),
                        "weight": 1,
                    }
                ],
            }
        ],
    }
    if gaie.hostnames:
        spec["hostnames"] = list(gaie.hostnames)
    return {
        "apiVersion": BY_KIND["HTTPRoute"].api_version,
        "kind": "HTTPRoute",
        "metadata": object_metadata(idep, EPP_SUFFIX, route_name(idep)),
        "spec": spec,
    }


def render(idep: InferaDeployment, front: InferaDeployment | None = None) -> list[dict]:
    """The gateway objects of `idep`'s generation, and the route to `front`'s (the serving one,
    by default `idep`'s)."""
    if not idep.spec.gaie.enabled:
        return []
    return [epp_deployment(idep), epp_service(idep), inference_pool(idep), http_route(front or idep)]


def without_gateway(idep: InferaDeployment, gateway: list[dict]) -> InferaDeployment:
    """The same graph with GAIE off (and without patches aimed at its objects, `gateway`): what to
    run while the cluster's CompositeController cannot create the gateway objects."""
    # By kind and name: a worker service called `pool` renders a Deployment named like the pool.
    gateway_children = {(child["kind"], target_name(child)) for child in gateway}
    patches = [p for p in idep.spec.patches or [] if (p.target.kind, p.target.name) not in gateway_children] or None
    spec = idep.spec.model_copy(
        update={"gaie": idep.spec.gaie.model_copy(update={"enabled": False}), "patches": patches}
    )
    return idep.model_copy(update={"spec": spec})
