"""The workload of each service: a Deployment, or a LeaderWorkerSet for a multi-node pool."""

from hooks.api.graph import InferaDeployment
from hooks.api.services import ServiceSpec
from hooks.renderers import placement
from hooks.renderers.pods import pod_template
from hooks.vocabulary import BY_KIND, generation_labels, generation_metadata, selector_labels


def _metadata(idep: InferaDeployment, service: str, svc: ServiceSpec) -> dict:
    metadata = generation_metadata(idep, service)
    metadata["labels"] |= placement.workload_labels(idep, svc)
    if annotations := placement.workload_annotations(idep, svc):
        metadata["annotations"] = annotations
    return metadata


def deployment(idep: InferaDeployment, service: str, svc: ServiceSpec, replicas: int, model_dir: str | None) -> dict:
    spec: dict = {
        "replicas": replicas,
        # A generation's own pods only: two generations' Deployments must never share a pod.
        "selector": {"matchLabels": selector_labels(idep, service) | generation_labels(idep)},
        "template": pod_template(idep, service, svc, model_dir=model_dir),
    }
    if svc.is_worker:
        # A GPU node is usually full: a surge pod would wait forever for the GPU its predecessor
        # holds and the rollout would never finish. Replace one pod at a time instead.
        spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(idep, service, svc),
        "spec": spec,
    }


def leader_worker_set(
    idep: InferaDeployment, service: str, svc: ServiceSpec, replicas: int, model_dir: str | None
) -> dict:
    """One model instance spanning `numberOfNodes` pods; `replicas` counts such groups."""
    return {
        "apiVersion": BY_KIND["LeaderWorkerSet"].api_version,
        "kind": "LeaderWorkerSet",
        "metadata": _metadata(idep, service, svc),
        "spec": {
            "replicas": replicas,
            # Workers start with the leader: with LeaderReady the leader could never turn ready,
            # since its /health waits for the ranks that would wait for it.
            "startupPolicy": "LeaderCreated",
            # No spare GPUs for a surge group: replace one group at a time.
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "leaderWorkerTemplate": {
                "size": svc.number_of_nodes,
                # A rank that dies breaks the collective for the whole group: restart it as a unit.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": pod_template(idep, service, svc, leader=True, model_dir=model_dir),
                "workerTemplate": pod_template(idep, service, svc, leader=False, model_dir=model_dir),
            },
        },
    }


def workload(
    idep: InferaDeployment, service: str, svc: ServiceSpec, live: int | None = None, model_dir: str | None = None
) -> dict:
    """`live`: the replicas the service's workload has now, which an autoscaler may have set;
    `model_dir`: the model cache directory its workers mount."""
    build = leader_worker_set if svc.number_of_nodes > 1 else deployment
    return build(idep, service, svc, svc.desired_replicas(live), model_dir)
