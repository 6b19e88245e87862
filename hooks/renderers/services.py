"""The ClusterIP Service in front of each server."""

from hooks.api.graph import InferaDeployment
from hooks.api.services import ServiceSpec
from hooks.renderers.pods import PORT_NAME
from hooks.vocabulary import generation_labels, object_metadata, selector_labels


def server_service(idep: InferaDeployment, service: str, svc: ServiceSpec) -> dict:
    """`idep` at the serving generation: under BlueGreen the Service is the front door that moves."""
    port = svc.effective_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(idep, service),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(idep, service) | generation_labels(idep),
            # By number: an extraPodSpec may name the container port differently.
            "ports": [{"name": PORT_NAME, "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }
