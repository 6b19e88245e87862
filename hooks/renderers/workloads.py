"""The workload of each single-node service: a Deployment."""

from hooks.api import InferaDeployment, ServiceSpec
from hooks.renderers.common import object_metadata, selector_labels
from hooks.renderers.pods import pod_template


def deployment(idep: InferaDeployment, service: str, svc: ServiceSpec) -> dict:
    spec: dict = {
        "replicas": svc.replicas,
        "selector": {"matchLabels": selector_labels(idep, service)},
        "template": pod_template(idep, service, svc),
    }
    if svc.is_worker:
        # A GPU node is usually full: a surge pod would wait forever for the GPU its predecessor
        # holds and the rollout would never finish. Replace one pod at a time instead.
        spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_metadata(idep, service),
        "spec": spec,
    }
