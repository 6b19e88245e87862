"""Names and labels every child shares."""

from hooks.api import InferaDeployment

DEPLOYMENT_LABEL = "infera.amd.com/deployment"
SERVICE_LABEL = "infera.amd.com/service"
COMPONENT_LABEL = "infera.amd.com/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "infera-hooks"
# On the worker pods that carry the GAIE frontend sidecar: the InferencePool selects on it.
GAIE_FRONTEND_LABEL = "infera.amd.com/gaie-frontend"

# Suffixes of the plumbing children; a service of the same name would collide with them.
NATS_SUFFIX = "nats"
DISCOVERY_SUFFIX = "disc"
EPP_SUFFIX = "epp"


def child_name(idep: InferaDeployment, suffix: str) -> str:
    return f"{idep.name}-{suffix}"


def selector_labels(idep: InferaDeployment, service: str) -> dict[str, str]:
    """The immutable selector of a workload: only identity, so later label edits never touch it."""
    return {DEPLOYMENT_LABEL: idep.name, SERVICE_LABEL: service}


def identity_labels(idep: InferaDeployment, service: str) -> dict[str, str]:
    return {**selector_labels(idep, service), MANAGED_BY_LABEL: MANAGED_BY}


def object_metadata(idep: InferaDeployment, service: str, name: str | None = None) -> dict:
    return {"name": name or child_name(idep, service), "labels": identity_labels(idep, service)}
