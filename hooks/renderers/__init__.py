"""Renderers: pure functions from a validated InferaDeployment to its desired children."""

from hooks.api import InferaDeployment, SpecError
from hooks.renderers import discovery, nats
from hooks.renderers.patches import apply_patches
from hooks.renderers.services import server_service
from hooks.renderers.workloads import workload


def _reject_unrendered(idep: InferaDeployment) -> None:
    """Fields the API accepts but this release cannot render yet fail loudly, never silently."""
    if idep.spec.gaie.enabled:
        raise SpecError("gaie.enabled (Inference Gateway) is not rendered by this release")


def render_children(idep: InferaDeployment) -> list[dict]:
    """Every desired child, in a stable order: plumbing first, then services by name, with
    spec.patches applied."""
    _reject_unrendered(idep)
    children = discovery.render(idep) + nats.render(idep)
    for service, svc in sorted(idep.spec.services.items()):
        children.append(workload(idep, service, svc))
        if not svc.is_worker:
            children.append(server_service(idep, service, svc))
    return apply_patches(idep, children)
