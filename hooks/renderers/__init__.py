"""Renderers: pure functions from a validated InferaDeployment to its desired children."""

from hooks.api import InferaDeployment
from hooks.renderers import discovery, gaie, nats
from hooks.renderers.patches import apply_patches
from hooks.renderers.services import server_service
from hooks.renderers.workloads import workload


def render_children(idep: InferaDeployment) -> list[dict]:
    """Every desired child, in a stable order: plumbing first, then services by name, with
    spec.patches applied."""
    children = discovery.render(idep) + nats.render(idep) + gaie.render(idep)
    for service, svc in sorted(idep.spec.services.items()):
        children.append(workload(idep, service, svc))
        if not svc.is_worker:
            children.append(server_service(idep, service, svc))
    return apply_patches(idep, children)
