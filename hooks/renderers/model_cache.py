"""The model cache: a PersistentVolumeClaim `<idep>-models`, a download Job per source, and the
read-only mount every worker pod gets once a download is complete.

Each source (repository and revision) downloads into its own directory of the claim, named by
its digest, and a marker is written there last: a download cut short is resumed, never used.
A Job's pod template cannot change, so a Job is only ever created: an observed one is answered
as last applied.
"""

from typing import Any

from hooks.api.graph import InferaDeployment
from hooks.api.infrastructure import ModelCacheSpec
from hooks.renderers import security
from hooks.vocabulary import (
    BY_KIND,
    COMPONENT_LABEL,
    DEPLOYMENT_LABEL,
    MODEL_VOLUME,
    MODELS_SUFFIX,
    child_name,
    download_job_name,
    identity_labels,
    object_metadata,
)

CACHE_PATH = "/cache"  # where the download Job mounts the whole claim
MARKER = ".complete"
# Runs the download unless its directory holds the marker, then writes the marker: last, and
# only if the download succeeded. `$@` is the downloader's command.
DOWNLOAD_WRAPPER = (
    'set -eu; [ -e "$INFERA_MODEL_DIR/../' + MARKER + '" ] && exit 0; mkdir -p "$INFERA_MODEL_DIR"; '
    '"$@"; touch "$INFERA_MODEL_DIR/../' + MARKER + '"'
)
# huggingface_hub comes with the runtime (a dependency of transformers): resumes a partial download.
SNAPSHOT_DOWNLOAD = (
    "import os; from huggingface_hub import snapshot_download; "
    'snapshot_download(os.environ["INFERA_MODEL_REPO"], revision=os.environ.get("INFERA_MODEL_REVISION") or None, '
    'local_dir=os.environ["INFERA_MODEL_DIR"])'
)
# A download streams files to the claim and hashes them. Requests, no limits: it may use what
# the node has spare.
DOWNLOAD_REQUESTS = {"cpu": "500m", "memory": "512Mi"}
# A retry after a network error resumes where it stopped; a bad token or repository fails them all.
BACKOFF_LIMIT = 4


def claim_name(idep: InferaDeployment) -> str:
    return child_name(idep, MODELS_SUFFIX)


def access_mode(idep: InferaDeployment) -> str:
    """The claim's access mode: several pods, possibly on several nodes, need ReadWriteMany."""
    cache = _cache(idep)
    if cache.access_mode:
        return cache.access_mode
    pods = sum(
        (svc.autoscaling.max_replicas if svc.autoscaling else svc.replicas) * svc.number_of_nodes
        for svc in idep.spec.services.values()
        if svc.is_worker
    )
    return "ReadWriteMany" if pods > 1 else "ReadWriteOnce"


def persistent_volume_claim(idep: InferaDeployment) -> dict[str, Any]:
    cache = _cache(idep)
    spec: dict[str, Any] = {
        "accessModes": [access_mode(idep)],
        "resources": {"requests": {"storage": cache.size}},
    }
    if cache.storage_class_name:
        spec["storageClassName"] = cache.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": object_metadata(idep, MODELS_SUFFIX, claim_name(idep)),
        "spec": spec,
    }


def download_job(idep: InferaDeployment) -> dict[str, Any]:
    """The current source's download, hardened: any user id, no privilege, no capabilities, a
    read-only root filesystem with a scratch /tmp (HF_HOME)."""
    cache = _cache(idep)
    env: list[dict[str, Any]] = [
        {"name": "INFERA_MODEL_REPO", "value": cache.repo},
        {"name": "INFERA_MODEL_DIR", "value": f"{CACHE_PATH}/{cache.digest}/{cache.model_name}"},
        {"name": "HF_HOME", "value": "/tmp/hf"},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
    ]
    if cache.revision:
        env.insert(1, {"name": "INFERA_MODEL_REVISION", "value": cache.revision})
    if cache.token_secret_ref:
        env.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": cache.token_secret_ref.model_dump(by_alias=True, exclude_none=True)},
            }
        )
    downloader = cache.downloader
    command = (downloader.command if downloader and downloader.command else None) or [
        "python3",
        "-c",
        SNAPSHOT_DOWNLOAD,
    ]
    container = {
        "name": "download",
        "image": (downloader.image if downloader else None) or idep.spec.image,
        "command": ["sh", "-c", DOWNLOAD_WRAPPER, "download", *command],
        "env": env,
        "resources": {"requests": dict(DOWNLOAD_REQUESTS)},
        "securityContext": security.restricted_container(),
        "volumeMounts": [{"name": MODEL_VOLUME, "mountPath": CACHE_PATH}, security.scratch_mount()],
    }
    return {
        "apiVersion": BY_KIND["Job"].api_version,
        "kind": "Job",
        "metadata": object_metadata(idep, MODELS_SUFFIX, download_job_name(idep, cache.digest)),
        # No ttlSecondsAfterFinished: a finished Job the hook still answers would be deleted and
        # created again, downloading again, in a loop.
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "template": {
                "metadata": {"labels": identity_labels(idep, MODELS_SUFFIX)},
                "spec": {
                    **_beside_the_worker(idep),
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,  # a download never calls the API server
                    "securityContext": security.pod_context(claims=True),
                    "containers": [container],
                    "volumes": [
                        {"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": claim_name(idep)}},
                        security.scratch_volume(),
                    ],
                },
            },
        },
    }


def _beside_the_worker(idep: InferaDeployment) -> dict[str, Any]:
    """A single-node claim is mounted on one node only: a download for a new source prefers the
    node its worker runs on (the claim is already attached there)."""
    if access_mode(idep) != "ReadWriteOnce":
        return {}
    worker = {"matchLabels": {DEPLOYMENT_LABEL: idep.name, COMPONENT_LABEL: "worker"}}
    term = {"weight": 100, "podAffinityTerm": {"labelSelector": worker, "topologyKey": "kubernetes.io/hostname"}}
    return {"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}}


def worker_volume(idep: InferaDeployment) -> dict[str, Any]:
    return {"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": claim_name(idep), "readOnly": True}}


def worker_mount(cache: ModelCacheSpec, digest: str) -> dict[str, Any]:
    """The source's directory (`digest`) at mountPath: the model is at <mountPath>/<repo name>."""
    return {"name": MODEL_VOLUME, "mountPath": cache.mount_path, "subPath": digest, "readOnly": True}


def _cache(idep: InferaDeployment) -> ModelCacheSpec:
    assert idep.spec.model_cache is not None
    return idep.spec.model_cache
