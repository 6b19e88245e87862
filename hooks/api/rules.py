"""The API's cross-field rules and their messages, and the limits they enforce. Each rule is checked
twice with the same words: by the API server (the CEL built here, at `kubectl apply`) and by the
hook (for objects stored before the CRD had the rule)."""

import math
import re
from typing import Any

from pydantic import ConfigDict

from hooks.kubernetes_names import DNS_LABEL, shown
from hooks.vocabulary import DIGEST_LENGTH, MODELS_SUFFIX

# The worker wrappers (infera.engine.<backend>.worker) give up on their engine after this many seconds.
READY_TIMEOUT_ENV = "INFERA_ENGINE_READY_TIMEOUT"


def ready_timeout(raw: str) -> float | None:
    """The seconds a worker wrapper waits for its engine with `raw` as READY_TIMEOUT_ENV, read as
    the wrappers read it (Python's float()); None unless a positive, finite number. The wrappers
    give up at once on 0, a negative number or nan, wait forever on inf, and wait their default
    1800 s on text float() refuses."""
    try:
        seconds = float(raw)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def ready_timeout_problem(raw: str) -> str | None:
    """Why READY_TIMEOUT_ENV written as `raw` would not give the engine the time it asks for, or
    None (also for a `$(VAR)` reference, which only kubelet expands)."""
    if "$" in raw or ready_timeout(raw) is not None:
        return None
    return (
        f"{READY_TIMEOUT_ENV} must be a positive, finite number of seconds such as 7200 (not {shown(raw)}): each "
        "worker gives up on its engine after that long, at once for 0, a negative number or nan, and after its "
        "default 1800 s for a value it cannot read"
    )


# Children are named <idep>-<service>. Services (and the label values derived from names) are
# DNS-1035 labels of at most 63 characters; StatefulSet and LeaderWorkerSet pods also carry a
# controller-revision-hash label `<name>-<hash>` that must fit in 63, so those names stay <= 52.
MAX_CHILD_NAME = 63
MAX_SET_NAME = 52
# A LeaderWorkerSet names each group's StatefulSet <name>-<group index>; leave room for 4 digits.
MAX_LWS_NAME = MAX_SET_NAME - len("-9999")
# Suffixes of the operator's own children: a service with one of these names would collide.
RESERVED_SERVICE_NAMES = ("nats", "disc", "epp")
MAX_SERVICES = 256
# spec.patches: bounded so that applying all of them (in place) takes well under a second.
MAX_PATCHES = 100
MAX_PATCH_OPERATIONS = 100

# Cross-field rules, enforced twice with the same message: by the API server (CEL, at
# `kubectl apply`) and by the hook (for objects stored before the CRD had the rule).
ETCD_ENDPOINT_RULE = "etcdEndpoint is required when discoveryBackend is etcd: set spec.etcdEndpoint, e.g. etcd:2379"
GAIE_REQUIRED_RULE = "gaie.tokenizerPath and gaie.gatewayName are required when gaie.enabled is true"
SERVER_ROLE_RULE = "role applies to workers only: remove role from a server (or set it to mixed)"
SERVER_GPU_RULE = "resources.gpu applies to workers only: the server (router) runs without a GPU"
SERVER_NODES_RULE = "numberOfNodes applies to workers only: a server runs on one node (scale it with replicas)"
SERVER_RDMA_RULE = "rdma applies to workers only: the server (router) moves no KV cache"
SERVER_HOST_BOOT_RULE = "hostBoot applies to workers only: a server's pods never mount the node's /boot"
ONE_WORKER_RULE = "services must contain at least one worker (componentType: worker)"
RESERVED_NAMES_RULE = (
    "service names nats, disc and epp are reserved for the operator's own children: rename the service"
)
CHILD_NAME_RULE = (
    f"<metadata.name>-<service> must be at most {MAX_CHILD_NAME} characters (it names the service's "
    "children): shorten the InferaDeployment or the service name"
)
MULTINODE_NAME_RULE = (
    f"<metadata.name>-<service> must be at most {MAX_LWS_NAME} characters for a multi-node service (each "
    "group's StatefulSet <name>-<group> must leave room for its pods' revision-hash label): shorten the "
    "InferaDeployment or the service name"
)
PARENT_NAME_RULE = (
    "metadata.name must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter): "
    "it starts the names of the graph's Services"
)

IMAGE_RULE = "every service needs an image: set spec.image or services.<name>.image"
GAIE_NAME_RULE = (
    f"metadata.name must be at most {MAX_CHILD_NAME - len('-epp')} characters while gaie.enabled is true "
    f"(the Endpoint Picker Service <metadata.name>-epp must fit in {MAX_CHILD_NAME})"
)
GAIE_IMAGE_RULE = (
    "gaie.enabled needs an image for the Endpoint Picker and frontend sidecar: set gaie.eppImage or spec.image"
)
VLLM_ROLE_RULE = (
    "a vLLM prefill or decode worker takes its role from kv_role in --kv-transfer-config (vLLM has no "
    "--disaggregation-mode): pass --kv-transfer-config in its args or its extraPodSpec command"
)
MODEL_SOURCE = re.compile(
    r"hf://([A-Za-z0-9][A-Za-z0-9._-]*)/([A-Za-z0-9][A-Za-z0-9._-]*)(?:@([A-Za-z0-9][A-Za-z0-9._/-]*))?"
)

MAX_MODEL_CACHE_NAME = MAX_CHILD_NAME - len("-download-") - DIGEST_LENGTH
MODEL_CACHE_NAME_RULE = (
    f"metadata.name must be at most {MAX_MODEL_CACHE_NAME} characters while modelCache is set (the download "
    f"Job <metadata.name>-download-<digest> names its pods' job-name label, at most {MAX_CHILD_NAME})"
)
MODELS_NAME_RULE = "service name models is reserved while modelCache is set (the model cache's own children)"
# Where the cache would hide what the engine needs: GPU devices, the kernel's files, the image's
# programs and libraries, the runtime's sockets, the scratch space engines write (/tmp) and the
# ROCm runtime the GPU engine loads. A mount at a parent of one (/opt, /var) hides it too.
SYSTEM_PATHS = (
    "/dev",
    "/proc",
    "/sys",
    "/etc",
    "/boot",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/run",
    "/var/run",
    "/tmp",
    "/opt/rocm",
)
MOUNT_PATH_RULE = (
    "modelCache.mountPath must be an absolute path without . or .. segments, neither in nor above a directory "
    f"the engine needs from its image and node ({', '.join(SYSTEM_PATHS)}): e.g. /models"
)
MODEL_CACHE_IMAGE_RULE = "modelCache needs an image for its download Job: set modelCache.downloader.image or spec.image"
AUTOSCALING_RANGE_RULE = "autoscaling.maxReplicas must be at least minReplicas"
UNEVICTABLE = "no pod could ever be evicted and every node drain would wait forever"
MAX_UNAVAILABLE_RULE = (
    "disruptionBudget.maxUnavailable must be a positive integer or a percentage from 1% to 100%: with 0 "
    f"{UNEVICTABLE} (set enabled: false for no budget)"
)
MAX_UNAVAILABLE_PERCENT = re.compile(r"([1-9][0-9]?|100)%")
NATS_STORAGE_RULE = "nats.storageSize must be more than 0: JetStream keeps its streams in a claim of that size"
NATS_TOKEN_OPTIONAL_RULE = (
    "optional must not be true: without its Secret the broker would start open, or refuse every client"
)
NATS_TOKEN_DEPLOY_RULE = (
    "nats.tokenSecretRef applies to the managed broker: remove it, or set nats.deploy to true (a broker of your "
    "own takes its token in NATS_SERVER, from spec.envs)"
)
NATS_NAME_RULE = (
    f"metadata.name must be at most {MAX_SET_NAME - len('-nats')} characters while nats.deploy is true "
    f"(the NATS StatefulSet <metadata.name>-nats must fit in {MAX_SET_NAME})"
)


# Under BlueGreen a generation's workloads, Endpoint Picker and InferencePool are named
# <name>-<generation>: the generation's digest takes this many more characters.
GENERATION_SUFFIX = len("-") + DIGEST_LENGTH
BLUE_GREEN_NAME_RULE = (
    f"<metadata.name>-<service> must be at most {MAX_CHILD_NAME - GENERATION_SUFFIX} characters "
    f"({MAX_LWS_NAME - GENERATION_SUFFIX} for a multi-node service, and <metadata.name>-epp as much with "
    "gaie.enabled) while rollout.strategy is BlueGreen: each generation's children are named "
    "<metadata.name>-<service>-<generation>; shorten the InferaDeployment or the service name"
)
BLUE_GREEN_DISCOVERY_RULE = (
    "rollout.strategy BlueGreen keeps generations apart by the label selector routers find workers with: "
    "it needs discoveryBackend kubernetes"
)
BLUE_GREEN_FRONT_DOOR_RULE = (
    "rollout.strategy BlueGreen moves the graph's front door from one generation to the next: it needs a "
    "server service or gaie.enabled"
)


def cel(rule: str, message: str) -> dict[str, str]:
    return {"rule": rule, "message": message}


# Rules on the whole object: only there can CEL see metadata.name next to the spec.
GAIE_ON = "has(self.spec.gaie) && has(self.spec.gaie.enabled) && self.spec.gaie.enabled"
BLUE_GREEN = "has(self.spec.rollout) && has(self.spec.rollout.strategy) && self.spec.rollout.strategy == 'BlueGreen'"
ROOT_VALIDATIONS = [
    # metadata.name is at most 253 characters, which bounds this rule's cost.
    cel(f"self.metadata.name.matches('{DNS_LABEL.pattern}')", PARENT_NAME_RULE),
    cel(f"self.spec.services.all(s, size(self.metadata.name) + 1 + size(s) <= {MAX_CHILD_NAME})", CHILD_NAME_RULE),
    cel(
        "self.spec.services.all(s, !has(self.spec.services[s].numberOfNodes) || "
        f"self.spec.services[s].numberOfNodes <= 1 || size(self.metadata.name) + 1 + size(s) <= {MAX_LWS_NAME})",
        MULTINODE_NAME_RULE,
    ),
    cel(
        "(has(self.spec.nats) && has(self.spec.nats.deploy) && !self.spec.nats.deploy) || "
        f"size(self.metadata.name) + {len('-nats')} <= {MAX_SET_NAME}",
        NATS_NAME_RULE,
    ),
    cel(f"!({GAIE_ON}) || size(self.metadata.name) + {len('-epp')} <= {MAX_CHILD_NAME}", GAIE_NAME_RULE),
    cel(f"!has(self.spec.modelCache) || size(self.metadata.name) <= {MAX_MODEL_CACHE_NAME}", MODEL_CACHE_NAME_RULE),
    cel(f"!has(self.spec.modelCache) || !('{MODELS_SUFFIX}' in self.spec.services)", MODELS_NAME_RULE),
    cel(
        f"!({BLUE_GREEN}) || (self.spec.services.all(s, size(self.metadata.name) + 1 + size(s) + "
        f"{GENERATION_SUFFIX} <= ((has(self.spec.services[s].numberOfNodes) && "
        f"self.spec.services[s].numberOfNodes > 1) ? {MAX_LWS_NAME} : {MAX_CHILD_NAME})) && "
        f"(!({GAIE_ON}) || size(self.metadata.name) + {len('-epp') + GENERATION_SUFFIX} <= {MAX_CHILD_NAME}))",
        BLUE_GREEN_NAME_RULE,
    ),
]


def with_validations(*rules: dict[str, str]) -> ConfigDict:
    validations: list[Any] = list(rules)
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": validations})


ENV_SOURCE_RULE = "valueFrom must set exactly one of fieldRef, resourceFieldRef, configMapKeyRef and secretKeyRef"
ENV_VALUE_RULE = "value and valueFrom cannot both be set"

SELECTOR_VALUES_RULE = "values must be non-empty with operator In or NotIn, and empty with Exists or DoesNotExist"
PEER_RULE = "a peer sets podSelector, namespaceSelector or both, or ipBlock alone"
