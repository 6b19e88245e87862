"""The API's cross-field rules and their messages, and the limits they enforce. Each rule is checked
twice with the same words: by the API server (the CEL built here, at `kubectl apply`) and by the
hook (for objects stored before the CRD had the rule)."""

import math
import re
from typing import Any

from pydantic import ConfigDict

from hooks.api.name_rules import RULES as NAME_RULES
from hooks.api.names import MAX_GROUPS
from hooks.kubernetes_names import DNS_LABEL, shown
from hooks.vocabulary import MODELS_SUFFIX

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


# What the operator's own children are named after: a service of one of these names would have
# their names (and their service label). hooks/api/name_rules.py keeps other graphs' children apart.
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
# A multi-node service's group is one LeaderWorkerSet gang: it runs only once all of its pods are
# scheduled, each on a node of its own, and is recreated whole when one of them fails. Real ones
# span a few nodes, a rack at the most (docs/api.md); a bound well beyond them keeps a typo from
# replacing a running pool with a group that never schedules.
MAX_NODES = 64
NODES_RULE = (
    f"numberOfNodes must be at most {MAX_NODES}: a multi-node group is scheduled and restarted as one, and "
    "serves only once a node is free for each of its pods"
)
GROUPS_RULE = (
    f"replicas (and autoscaling.maxReplicas) must be at most {MAX_GROUPS} for a multi-node service: the "
    "LeaderWorkerSet controller names each group's StatefulSet <LeaderWorkerSet>-<group>, and the name leaves "
    f"room for {len(str(MAX_GROUPS - 1))} digits"
)
SERVER_RDMA_RULE = "rdma applies to workers only: the server (router) moves no KV cache"
SERVER_HOST_BOOT_RULE = "hostBoot applies to workers only: a server's pods never mount the node's /boot"
ONE_WORKER_RULE = "services must contain at least one worker (componentType: worker)"
RESERVED_NAMES_RULE = (
    "service names nats, disc and epp are reserved for the operator's own children: rename the service"
)
PARENT_NAME_RULE = (
    "metadata.name must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter): "
    "it starts the names of the graph's Services"
)

IMAGE_RULE = "every service needs an image: set spec.image or services.<name>.image"
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
BLUE_GREEN_DISCOVERY_RULE = (
    "rollout.strategy BlueGreen keeps generations apart by the label selector routers find workers with: "
    "it needs discoveryBackend kubernetes"
)
PLACEMENT_EMPTY_RULE = (
    "placement needs topologyKey (the node label that names a fabric domain), scheduler Kueue, or both"
)
PLACEMENT_MODE_RULE = "placement.mode needs placement.topologyKey: the node label whose value names a fabric domain"
PLACEMENT_KUEUE_RULE = (
    "placement.kueue is set exactly when placement.scheduler is Kueue: set kueue.queueName to the LocalQueue "
    "of the graph's namespace"
)
BLUE_GREEN_FRONT_DOOR_RULE = (
    "rollout.strategy BlueGreen moves the graph's front door from one generation to the next: it needs a "
    "server service or gaie.enabled"
)


def cel(rule: str, message: str) -> dict[str, str]:
    return {"rule": rule, "message": message}


# Rules on the whole object: only there can CEL see metadata.name next to the spec.
ROOT_VALIDATIONS = [
    # metadata.name is at most 253 characters, which bounds this rule's cost.
    cel(f"self.metadata.name.matches('{DNS_LABEL.pattern}')", PARENT_NAME_RULE),
    cel(f"!has(self.spec.modelCache) || !('{MODELS_SUFFIX}' in self.spec.services)", MODELS_NAME_RULE),
    *(rule.validation() for rule in NAME_RULES),
]


def with_validations(*rules: dict[str, str]) -> ConfigDict:
    validations: list[Any] = list(rules)
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": validations})


ENV_SOURCE_RULE = "valueFrom must set exactly one of fieldRef, resourceFieldRef, configMapKeyRef and secretKeyRef"
ENV_VALUE_RULE = "value and valueFrom cannot both be set"

SELECTOR_VALUES_RULE = "values must be non-empty with operator In or NotIn, and empty with Exists or DoesNotExist"
PEER_RULE = "a peer sets podSelector, namespaceSelector or both, or ipBlock alone"
