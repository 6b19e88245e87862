"""Small inline InferaDeployments for the renderer tests, parsed as every hook parses them."""

from typing import Any

from hooks.api.graph import InferaDeployment
from tests.support.requests import parent
from tests.support.schemas import validate_object

WORKER: dict[str, Any] = {"componentType": "worker"}
SERVER: dict[str, Any] = {"componentType": "server"}
GAIE: dict[str, Any] = {"enabled": True, "tokenizerPath": "tok", "gatewayName": "gw", "frontendPort": 8100}


def build(
    services: dict[str, dict[str, Any]] | None = None, metadata: dict[str, Any] | None = None, **spec: Any
) -> InferaDeployment:
    """InferaDeployment `g` (namespace ml unless given), parsed as every hook parses it."""
    body = {"image": "img:1", "services": services or {"worker": WORKER}}
    body |= {key: value for key, value in spec.items() if value is not None}
    return InferaDeployment.from_parent(parent({"metadata": {"name": "g", **(metadata or {})}, "spec": body}))


def selector(service: str) -> dict[str, str]:
    return {"infera.amd.com/deployment": "g", "infera.amd.com/service": service}


def labels(service: str) -> dict[str, str]:
    return {**selector(service), "app.kubernetes.io/managed-by": "infera-hooks"}


def valid(*objects: dict[str, Any]) -> None:
    for obj in objects:
        validate_object(obj)
