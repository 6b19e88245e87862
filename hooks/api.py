"""The InferaDeployment v1alpha1 API: one typed source for hook validation and the CRD schema.

Attribute docstrings become the CRD's descriptions (`kubectl explain idep.spec...`), so they are
written for users. The CRD generator (hooks.crd) turns these models into a structural schema.
"""

import difflib
import functools
import hashlib
import ipaddress
import math
import re
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from hooks.quantity import QUANTITY_PATTERN, canonical_quantity, quantity_value
from hooks.vocabulary import DIGEST_LENGTH, MODELS_SUFFIX

GROUP = "infera.amd.com"
VERSION = "v1alpha1"
KIND = "InferaDeployment"
PLURAL = "inferadeployments"

# Pinned so that a NATS release never changes a running broker behind the user's back.
DEFAULT_NATS_IMAGE = "nats:2.10.24-alpine"
DEFAULT_GPU_TYPE = "amd.com/gpu"
DEFAULT_SERVER_PORT = 8000
DEFAULT_WORKER_PORT = 30000
DEFAULT_FRONTEND_PORT = 8000

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Gateway API's hostname: lower-case DNS names, optionally with a leading wildcard label.
HOSTNAME = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Kubernetes label/annotation keys: an optional DNS-subdomain prefix and a name.
QUALIFIED_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# Kubernetes 1.32+ (RelaxedEnvironmentVariableValidation, on by default): any printable ASCII but '='.
ENV_NAME = re.compile(r"[ -<>-~]+")
INT32_MAX = 2**31 - 1
# The API server's bound on one object's annotations, keys and values together.
MAX_ANNOTATIONS_BYTES = 256 * 1024


LABEL_VALUE = re.compile(LABEL_VALUE_PATTERN)


def shown(value: Any) -> str:
    """A value as a message quotes it: at most about 100 characters, whatever its size."""
    text = repr(value)
    return text if len(text) <= 100 else f"{text[:100]}... ({len(text):,} characters)"


def qualified_key_problem(key: str) -> str | None:
    """Why `key` is not a label or annotation key, or None."""
    if QUALIFIED_NAME.fullmatch(key) and len(key.rpartition("/")[0]) <= 253:
        return None
    return f"{shown(key)} is not a valid label or annotation key (e.g. example.com/team)"


def label_value_valid(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 63 and LABEL_VALUE.fullmatch(value) is not None


def annotations_bytes(annotations: dict[str, str]) -> int:
    """What the API server counts against MAX_ANNOTATIONS_BYTES."""
    return sum(len(key.encode()) + len(value.encode()) for key, value in annotations.items())


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


def env_name_problem(name: str) -> str | None:
    """Why `name` is not an environment variable name the API server accepts, or None."""
    if ENV_NAME.fullmatch(name):
        return None
    return f"{shown(name)} is not a valid environment variable name (printable ASCII characters other than '=')"


def is_extended_resource(name: str) -> bool:
    """Kubernetes' extended resources (devices such as amd.com/gpu): domain-prefixed, outside
    kubernetes.io, not a quota name. Their requests must equal their limits."""
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


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
# An image reference holds no whitespace (the API server refuses it around the name).
ImageReference = Annotated[str, Field(min_length=1, pattern=r"^\S*$")]
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
MODEL_SOURCE_RULE = "modelCache.source must be hf://<owner>/<repo> or hf://<owner>/<repo>@<revision>"
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


def cel(rule: str, message: str) -> dict[str, str]:
    return {"rule": rule, "message": message}


# Rules on the whole object: only there can CEL see metadata.name next to the spec.
GAIE_ON = "has(self.spec.gaie) && has(self.spec.gaie.enabled) && self.spec.gaie.enabled"
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
]


def with_validations(*rules: dict[str, str]) -> ConfigDict:
    validations: list[Any] = list(rules)
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": validations})


# In extraPodSpec, the container the operator completes: the one with one of these names, else the first.
PRIMARY_CONTAINER_NAMES = ("main", "infera")


def primary_index(containers: list[dict[str, Any]]) -> int | None:
    """The first container named main or infera, in order of appearance, else the first."""
    named = (index for index, container in enumerate(containers) if container.get("name") in PRIMARY_CONTAINER_NAMES)
    return next(named, 0 if containers else None)


class SpecError(ValueError):
    """The spec is well-typed but cannot be rendered; reported in status, never as an HTTP error."""


def _quantity(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("must be a Kubernetes quantity such as 4, 500m or 64Gi")
    quantity = canonical_quantity(str(value))
    if quantity.startswith("-"):
        raise ValueError(f"{value!r} must not be negative")
    return quantity


# A resource quantity; users may write `cpu: 4` unquoted, so integers are accepted too. Values
# are canonicalised on read because the API server stores `1000m` as `1` and anything else
# would be re-applied on every sync.
Quantity = Annotated[
    str,
    BeforeValidator(_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]


def open_object(description: str) -> Any:
    """An embedded Kubernetes type kept open in the CRD (it is validated when rendered)."""
    return WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True, "description": description})


def nesting(value: Any) -> int:
    """How many objects and lists deep `value` is (0 for a scalar), counted level by level, so
    that a value too deep for recursion is measured too."""
    depth, level = 0, [value]
    while level := [node for node in level if isinstance(node, (dict, list))]:
        depth += 1
        level = [item for node in level for item in (node.values() if isinstance(node, dict) else node)]
    return depth


# Kubernetes types nest about 15 levels deep (a PodSpec's affinity terms): an open object much
# deeper is a mistake, and would take the renderers' recursive steps past Python's limit.
MAX_OPEN_NESTING = 32


def _shallow(value: Any) -> Any:
    if (depth := nesting(value)) > MAX_OPEN_NESTING:
        raise ValueError(f"nests {depth} levels deep, past {MAX_OPEN_NESTING} (Kubernetes objects nest about 15)")
    return value


# With open_object: an open object no deeper than MAX_OPEN_NESTING.
SHALLOW = AfterValidator(_shallow)


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )


# The pod fields an environment variable may read (the Downward API), besides metadata.labels['<key>']
# and metadata.annotations['<key>'].
ENV_FIELD_PATHS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
)
SUBSCRIPTED_FIELD_PATH = re.compile(r"metadata\.(labels|annotations)\['([^']*)'\]")
# The container resources an environment variable may read, and the divisors each accepts.
CPU_DIVISORS = ("1m", "1")
BYTE_DIVISORS = ("1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei")
ENV_RESOURCES = (
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
)
ENV_SOURCE_RULE = "valueFrom must set exactly one of fieldRef, resourceFieldRef, configMapKeyRef and secretKeyRef"
ENV_VALUE_RULE = "value and valueFrom cannot both be set"


class ObjectFieldSelector(ApiModel):
    """A field of the pod."""

    # A one-value Literal would become `const`, which CRD schemas do not support.
    api_version: Annotated[Literal["v1"], WithJsonSchema({"type": "string", "enum": ["v1"]})] = "v1"
    """Schema version of fieldPath; only v1 (the API server stores it when omitted)."""
    field_path: str
    """metadata.name, metadata.namespace, metadata.uid, metadata.labels['<key>'], metadata.annotations['<key>'], spec.nodeName, spec.serviceAccountName, status.hostIP(s) or status.podIP(s)."""

    @field_validator("field_path")
    @classmethod
    def _supported(cls, path: str) -> str:
        subscripted = SUBSCRIPTED_FIELD_PATH.fullmatch(path)
        if path in ENV_FIELD_PATHS or (subscripted and qualified_key_problem(subscripted.group(2)) is None):
            return path
        raise ValueError(
            f"{path!r} is not a pod field an environment variable can read ({', '.join(ENV_FIELD_PATHS)}, metadata.labels['<key>'], metadata.annotations['<key>'])"
        )


class ResourceFieldSelector(ApiModel):
    """A resource limit or request of a container."""

    container_name: str | None = None
    """The container; this one when unset."""
    resource: str
    """limits.cpu, limits.memory, limits.ephemeral-storage, requests.* of the same, or limits/requests.hugepages-<size>."""
    divisor: Quantity | None = None
    """Unit of the value: 1m or 1 for cpu; 1, 1k, 1Ki, 1M, 1Mi, ... for the others."""

    @model_validator(mode="after")
    def _supported(self) -> "ResourceFieldSelector":
        if not (
            self.resource in ENV_RESOURCES or self.resource.startswith(("limits.hugepages-", "requests.hugepages-"))
        ):
            raise ValueError(
                f"resource {self.resource!r} is not one an environment variable can read ({', '.join(ENV_RESOURCES)}, limits.hugepages-<size>, requests.hugepages-<size>)"
            )
        divisors = CPU_DIVISORS if self.resource.endswith(".cpu") else BYTE_DIVISORS
        if self.divisor is not None and self.divisor not in divisors:
            raise ValueError(f"divisor {self.divisor!r} is not one of {', '.join(divisors)} for {self.resource}")
        return self


class KeySelector(ApiModel):
    """A key of a ConfigMap or Secret in the InferaDeployment's namespace."""

    name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
    """Name of the ConfigMap or Secret."""
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]
    """The key to read."""
    optional: bool | None = None
    """Start the pod even when the object or key is missing."""


class EnvVarSource(ApiModel):
    """Where a variable's value comes from: exactly one source."""

    model_config = with_validations(
        cel(
            " + ".join(
                f"(has(self.{key}) ? 1 : 0)"
                for key in ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
            )
            + " == 1",
            ENV_SOURCE_RULE,
        )
    )

    field_ref: ObjectFieldSelector | None = None
    """A field of the pod, e.g. status.podIP."""
    resource_field_ref: ResourceFieldSelector | None = None
    """A resource limit or request of a container."""
    config_map_key_ref: KeySelector | None = None
    """A key of a ConfigMap."""
    secret_key_ref: KeySelector | None = None
    """A key of a Secret."""

    @model_validator(mode="after")
    def _one_source(self) -> "EnvVarSource":
        sources = (self.field_ref, self.resource_field_ref, self.config_map_key_ref, self.secret_key_ref)
        if sum(source is not None for source in sources) != 1:
            raise ValueError(ENV_SOURCE_RULE)
        return self


class EnvVar(ApiModel):
    """An environment variable, as in a Kubernetes container."""

    model_config = with_validations(cel("!has(self.value) || self.value == '' || !has(self.valueFrom)", ENV_VALUE_RULE))

    name: Annotated[str, Field(min_length=1, json_schema_extra={"pattern": f"^{ENV_NAME.pattern}$"})]
    """Name of the variable: printable ASCII characters other than '='."""
    value: str | None = None
    """Literal value; `$(VAR)` references to earlier variables are expanded by Kubernetes."""
    value_from: EnvVarSource | None = None
    """Source of the value (fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef)."""

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if problem := env_name_problem(name):
            raise ValueError(problem)
        return name

    @field_validator("value")
    @classmethod
    def _ready_timeout(cls, value: str | None, info: ValidationInfo) -> str | None:
        if (
            value is not None
            and info.data.get("name") == READY_TIMEOUT_ENV
            and (problem := ready_timeout_problem(value))
        ):
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _one_value(self) -> "EnvVar":
        if self.value and self.value_from is not None:
            raise ValueError(ENV_VALUE_RULE)
        # Without a value or a source the variable is set, to "": the wrapper then waits its
        # default while the startup probe waits what the operator set.
        if self.name == READY_TIMEOUT_ENV and self.value is None and self.value_from is None:
            raise ValueError(ready_timeout_problem(""))
        return self


class NatsSpec(ApiModel):
    """The operator-managed NATS JetStream broker that carries KV-cache events."""

    model_config = with_validations(
        cel("!has(self.tokenSecretRef) || !has(self.deploy) || self.deploy", NATS_TOKEN_DEPLOY_RULE)
    )

    deploy: bool = True
    """Create a single-node JetStream NATS (StatefulSet + headless Service) for this graph."""
    image: ImageReference | None = None
    """NATS server image. Defaults to a NATS 2.x tag pinned by this operator release."""
    storage_size: Annotated[
        Quantity,
        Field(
            json_schema_extra={
                # Bounds the CEL cost estimate of the rule's regular expression.
                "maxLength": 64,
                "x-kubernetes-validations": [
                    # The digits before any suffix hold one that is not 0, and no sign says less.
                    cel("type(self) == int ? self > 0 : self.matches('^[+]?[0-9.]*[1-9]')", NATS_STORAGE_RULE)
                ],
            }
        ),
    ] = "4Gi"
    """Size of the JetStream PersistentVolumeClaim."""
    storage_class_name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)] | None = None
    """StorageClass of the JetStream PVC; the cluster default when unset."""
    retain_storage: bool = False
    """Keep the JetStream PVC when the InferaDeployment is deleted (by default it is deleted too)."""
    token_secret_ref: Annotated[
        KeySelector | None,
        Field(
            json_schema_extra={
                "x-kubernetes-validations": [cel("!has(self.optional) || !self.optional", NATS_TOKEN_OPTIONAL_RULE)]
            }
        ),
    ] = None
    """A token the broker requires of every client, from a Secret of the InferaDeployment's
    namespace; every process of the graph gets it in its NATS URL, so it may hold only letters,
    digits and -._~ (and the runtime logs that URL)."""

    @field_validator("token_secret_ref")
    @classmethod
    def _required_token(cls, ref: KeySelector | None) -> KeySelector | None:
        if ref is not None and ref.optional:
            raise ValueError(NATS_TOKEN_OPTIONAL_RULE)
        return ref

    @model_validator(mode="after")
    def _token_of_the_managed_broker(self) -> "NatsSpec":
        if self.token_secret_ref is not None and not self.deploy:
            raise ValueError(NATS_TOKEN_DEPLOY_RULE)
        return self

    @field_validator("storage_size")
    @classmethod
    def _positive(cls, size: str) -> str:
        if quantity_value(size) <= 0:
            raise ValueError(NATS_STORAGE_RULE)
        return size

    @property
    def effective_image(self) -> str:
        return self.image or DEFAULT_NATS_IMAGE


class GaieSpec(ApiModel):
    """Gateway API Inference Extension front door: EPP, InferencePool, HTTPRoute and a frontend
    sidecar in every worker pod."""

    model_config = with_validations(
        cel(
            "!has(self.enabled) || !self.enabled || (has(self.tokenizerPath) && has(self.gatewayName))",
            GAIE_REQUIRED_RULE,
        )
    )

    enabled: bool = False
    """Create the Endpoint Picker, InferencePool and HTTPRoute and inject the frontend sidecar."""
    epp_image: ImageReference | None = None
    """Image of the Endpoint Picker and the frontend sidecar; defaults to spec.image."""
    tokenizer_path: Annotated[str, Field(min_length=1)] | None = None
    """Tokenizer (HF model id or local path) the EPP uses for token-aware scoring. Required when enabled."""
    gateway_name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)] | None = None
    """The existing Gateway the HTTPRoute attaches to. Required when enabled."""
    gateway_namespace: Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL.pattern)] | None = None
    """Namespace of the Gateway; defaults to the InferaDeployment's namespace."""
    hostnames: (
        Annotated[list[Annotated[str, Field(min_length=1, max_length=253, pattern=HOSTNAME)]], Field(max_length=16)]
        | None
    ) = None
    """Restrict the HTTPRoute to these hostnames."""
    frontend_port: Annotated[int, Field(ge=1, le=65535)] = DEFAULT_FRONTEND_PORT
    """Port of the frontend sidecar in every worker pod, and the InferencePool's target port."""
    model_name: str | None = None
    """Informational: the served model id (the Endpoint Picker takes no model name; workers register
    theirs, e.g. with --served-model-name). Accepted for compatibility with the upstream operator."""


def _unset_if_empty(value: Any) -> Any:
    """An empty list or map as absent, as the API server stores a NetworkPolicy's (Metacontroller
    would re-apply one written out on every sync)."""
    return value or None


UNSET_IF_EMPTY = AfterValidator(_unset_if_empty)


def _qualified_key(key: str) -> str:
    if problem := qualified_key_problem(key):
        raise ValueError(problem)
    return key


# A label key or value, as the API server checks them.
QualifiedKey = Annotated[str, AfterValidator(_qualified_key)]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
SELECTOR_VALUES_RULE = "values must be non-empty with operator In or NotIn, and empty with Exists or DoesNotExist"
PEER_RULE = "a peer sets podSelector, namespaceSelector or both, or ipBlock alone"


class LabelSelectorRequirement(ApiModel):
    """A label key, an operator and values, as in a Kubernetes label selector."""

    model_config = with_validations(
        cel(
            "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
            SELECTOR_VALUES_RULE,
        )
    )

    key: Annotated[QualifiedKey, Field(min_length=1, max_length=317)]
    """The label key."""
    operator: Annotated[Literal["In", "NotIn", "Exists", "DoesNotExist"], Field(json_schema_extra={"maxLength": 12})]
    """In, NotIn, Exists or DoesNotExist."""
    values: Annotated[list[LabelValue] | None, UNSET_IF_EMPTY] = None
    """The values for In and NotIn."""

    @model_validator(mode="after")
    def _values_fit_operator(self) -> "LabelSelectorRequirement":
        if (self.operator in ("In", "NotIn")) != bool(self.values):
            raise ValueError(SELECTOR_VALUES_RULE)
        return self


class LabelSelector(ApiModel):
    """Selects by labels, as a Kubernetes label selector: every one of matchLabels and
    matchExpressions must hold; an empty selector selects everything."""

    match_labels: Annotated[dict[QualifiedKey, LabelValue] | None, UNSET_IF_EMPTY] = None
    """Labels that must have these values."""
    match_expressions: Annotated[list[LabelSelectorRequirement] | None, UNSET_IF_EMPTY] = None
    """Requirements on labels."""


def _network(cidr: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise ValueError(f"{shown(cidr)} is not a CIDR such as 10.0.0.0/8 or fd00::/8") from None


class IPBlock(ApiModel):
    """Addresses outside the cluster's pod network, as a CIDR with exceptions."""

    cidr: Annotated[str, Field(min_length=1, max_length=64)]
    """A CIDR, e.g. 10.0.0.0/8."""
    except_: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=64)]] | None, Field(alias="except"), UNSET_IF_EMPTY
    ] = None
    """CIDRs within cidr to leave out."""

    @model_validator(mode="after")
    def _exceptions_inside(self) -> "IPBlock":
        network = _network(self.cidr)
        for cidr in self.except_ or []:
            excepted = _network(cidr)
            if excepted.version != network.version or not (excepted.subnet_of(network) and excepted != network):  # type: ignore[arg-type]
                raise ValueError(f"except {shown(cidr)} must be a strict subset of cidr {shown(self.cidr)}")
        return self


class NetworkPolicyPeer(ApiModel):
    """Who may connect, as a Kubernetes NetworkPolicy peer: pods by their labels (in this
    namespace, or in the namespaces namespaceSelector selects), or addresses (ipBlock)."""

    model_config = with_validations(
        cel(
            "has(self.ipBlock) ? !has(self.podSelector) && !has(self.namespaceSelector) : "
            "has(self.podSelector) || has(self.namespaceSelector)",
            PEER_RULE,
        )
    )

    pod_selector: LabelSelector | None = None
    """Pods with these labels: in this namespace, or with namespaceSelector in those namespaces."""
    namespace_selector: LabelSelector | None = None
    """Every pod of the namespaces with these labels (kubernetes.io/metadata.name is a namespace's name)."""
    ip_block: IPBlock | None = None
    """Addresses, e.g. a load balancer's; not with the selectors."""

    @model_validator(mode="after")
    def _one_kind(self) -> "NetworkPolicyPeer":
        selectors = self.pod_selector is not None or self.namespace_selector is not None
        if selectors == (self.ip_block is not None):
            raise ValueError(PEER_RULE)
        return self


Peers = Annotated[list[NetworkPolicyPeer], Field(min_length=1, max_length=32)]


class NetworkPolicySpec(ApiModel):
    """NetworkPolicies that admit to the graph's pods only the traffic it needs. A cluster whose
    network plugin does not enforce NetworkPolicies ignores them."""

    isolate: Annotated[Literal["none", "broker", "graph"], Field(json_schema_extra={"maxLength": 6})] = "broker"
    """broker: only the graph's own pods may connect to the NATS broker (it carries the prompts
    with the NATS request transport). graph: that, and the workers, Endpoint Picker and servers
    admit only the graph's own traffic and the peers named here. none: no NetworkPolicy."""
    server_from: Peers | None = None
    """With isolate graph: who may connect to the servers' port. Unset: any source."""
    gateway_from: Peers | None = None
    """With isolate graph and GAIE: who may connect to the Endpoint Picker and the frontend
    sidecars. Unset: the pods of the Gateway's namespace."""
    metrics_from: Peers | None = None
    """Who may scrape metrics (a Prometheus): admitted to the servers' and workers' ports (which
    serve /metrics beside their API) and to the broker's monitoring port. Unset: no one outside
    the graph."""


class ResourcesSpec(ApiModel):
    """Compute resources of each pod of a service."""

    gpu: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None
    """GPUs per pod, set as both request and limit of `gpuType`. 0 or unset: no GPU."""
    gpu_type: str = DEFAULT_GPU_TYPE
    """Extended resource name of the GPU."""

    @field_validator("gpu_type")
    @classmethod
    def _extended_resource(cls, name: str) -> str:
        if is_extended_resource(name) and QUALIFIED_NAME.fullmatch(name):
            return name
        raise ValueError(
            f"{shown(name)} is not an extended resource name: a domain outside kubernetes.io, '/' and a name, e.g. amd.com/gpu"
        )

    cpu: Quantity | None = None
    """CPU request, e.g. 8 or 500m."""
    memory: Quantity | None = None
    """Memory request, e.g. 64Gi."""
    shared_memory: Quantity | None = None
    """Size of an in-memory emptyDir mounted at /dev/shm (torch, NCCL and RDMA staging)."""


class PatchTarget(ApiModel):
    """The rendered child a patch applies to."""

    kind: Annotated[str, Field(min_length=1)]
    """Kind of the child, e.g. Deployment."""
    name: Annotated[str, Field(min_length=1)]
    """Name of the child, e.g. mygraph-decode."""


class JsonPatchOperation(ApiModel):
    """One RFC 6902 operation."""

    op: Literal["add", "remove", "replace", "move", "copy", "test"]
    """The operation."""
    path: str
    """JSON pointer to the target location, e.g. /spec/template/spec/nodeSelector."""
    # nullable: without it the API server would drop an explicit `value: null`.
    value: Annotated[Any, WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True, "nullable": True})] = None
    """Value for add, replace and test."""
    from_: Annotated[str | None, Field(alias="from")] = None
    """Source location for move and copy."""


class ChildPatch(ApiModel):
    """An RFC 6902 JSON patch applied to one rendered child (kustomize's JSON6902 shape)."""

    target: PatchTarget
    """Which child to patch."""
    patch: Annotated[list[JsonPatchOperation], Field(max_length=MAX_PATCH_OPERATIONS)]
    """The operations, applied in order."""


def max_unavailable_valid(value: Any) -> bool:
    """A PodDisruptionBudget's maxUnavailable that lets a pod go: a positive int32 or 1% to 100%."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return False
    if isinstance(value, int):
        return 1 <= value <= INT32_MAX
    return MAX_UNAVAILABLE_PERCENT.fullmatch(value) is not None


def _max_unavailable(value: Any) -> int | str:
    if not max_unavailable_valid(value):
        raise ValueError(MAX_UNAVAILABLE_RULE)
    return value


# A PodDisruptionBudget's maxUnavailable: pods, or a percentage of the pool.
MaxUnavailable = Annotated[
    int | str,
    BeforeValidator(_max_unavailable),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            # "100%" at most: bounds the CEL cost estimate of the rule's regular expression.
            "maxLength": 4,
            "x-kubernetes-validations": [
                cel(
                    f"type(self) == int ? self >= 1 && self <= {INT32_MAX} : "
                    f"self.matches('^{MAX_UNAVAILABLE_PERCENT.pattern}$')",
                    MAX_UNAVAILABLE_RULE,
                )
            ],
        }
    ),
]


class AutoscalingSpec(ApiModel):
    """A HorizontalPodAutoscaler owns the service's replica count within these bounds."""

    model_config = with_validations(
        cel("!has(self.minReplicas) || self.minReplicas <= self.maxReplicas", AUTOSCALING_RANGE_RULE)
    )

    min_replicas: Annotated[int, Field(ge=1, le=INT32_MAX)] = 1
    """The fewest replicas (pods, or groups of a multi-node pool)."""
    max_replicas: Annotated[int, Field(ge=1, le=INT32_MAX)]
    """The most replicas."""
    metrics: Annotated[
        list[Annotated[dict[str, Any], open_object("An autoscaling/v2 MetricSpec."), SHALLOW]],
        Field(min_length=1, max_length=32),
    ]
    """What to scale on: autoscaling/v2 MetricSpecs (Pods, Object, External or Resource), passed to the
    HorizontalPodAutoscaler as written. Required: CPU use says nothing about a GPU engine's load."""
    behavior: Annotated[
        dict[str, Any] | None, open_object("An autoscaling/v2 HorizontalPodAutoscalerBehavior."), SHALLOW
    ] = None
    """How fast to scale (autoscaling/v2 HorizontalPodAutoscalerBehavior). Default: up at once, down
    one replica a minute after ten quiet minutes, since a new worker takes minutes to load its model."""

    @model_validator(mode="after")
    def _range(self) -> "AutoscalingSpec":
        if self.min_replicas > self.max_replicas:
            raise ValueError(AUTOSCALING_RANGE_RULE)
        return self


class DisruptionBudgetSpec(ApiModel):
    """The PodDisruptionBudget that bounds how many of the service's pods a node drain evicts at once."""

    enabled: bool = True
    """false: no PodDisruptionBudget for this service."""
    max_unavailable: MaxUnavailable = 1
    """Pods that may be evicted at once: a number, or a percentage of the pool's pods."""


class ServiceSpec(ApiModel):
    """One component of the graph: the router server or a pool of GPU workers."""

    model_config = with_validations(
        cel("self.componentType == 'worker' || !has(self.role) || self.role == 'mixed'", SERVER_ROLE_RULE),
        cel(
            "self.componentType == 'worker' || !has(self.resources) || !has(self.resources.gpu) || self.resources.gpu == 0",
            SERVER_GPU_RULE,
        ),
        cel("self.componentType == 'worker' || !has(self.numberOfNodes) || self.numberOfNodes == 1", SERVER_NODES_RULE),
        cel("self.componentType == 'worker' || !has(self.rdma) || !self.rdma", SERVER_RDMA_RULE),
        cel("self.componentType == 'worker' || !has(self.hostBoot) || self.hostBoot", SERVER_HOST_BOOT_RULE),
    )

    # maxLength bounds the CEL cost estimate of rules comparing these strings.
    component_type: Annotated[Literal["server", "worker"], Field(json_schema_extra={"maxLength": 6})]
    """server: the OpenAI-compatible router (no GPU). worker: a GPU engine pool."""
    role: Annotated[Literal["mixed", "prefill", "decode"], Field(json_schema_extra={"maxLength": 7})] = "mixed"
    """Disaggregation role of a worker pool."""
    replicas: Annotated[int, Field(ge=0, le=INT32_MAX)] = 1
    """Pods (single-node) or groups (multi-node)."""
    number_of_nodes: Annotated[int, Field(ge=1, le=INT32_MAX)] = 1
    """Nodes per replica. 1: a Deployment; more: a LeaderWorkerSet spanning that many nodes."""
    image: ImageReference | None = None
    """Container image of this service; defaults to spec.image."""
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """Port the service listens on. Defaults: server 8000, worker 30000."""
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    """GPU, CPU, memory and shared memory of each pod."""
    rdma: bool = False
    """The engine pins and shares memory for RDMA or the kvd arena (mori, Mooncake, kvd): its
    container gets IPC_LOCK, SYS_PTRACE and SYS_RESOURCE, the capabilities those transports need.
    Workers only; their pods then pass no Pod Security Standard but privileged."""
    host_boot: bool = True
    """Mount the node's /boot read-only, where the runtime's GPU-direct checks read the kernel
    config (engine images ship none). A hostPath volume, which the baseline Pod Security Standard
    forbids: false lets the pods run at baseline, and kvd's storage tier then finds no kernel
    P2PDMA support and loads through the CPU instead of GPU-direct. Workers rendered from the flat
    fields only (a template mounts what it lists)."""
    args: list[str] | None = None
    """Flags appended after the injected ones (a repeated flag overrides the injected value)."""
    env: list[EnvVar] | None = None
    """Extra environment variables of this service; they win over spec.envs."""
    skip_readiness_probe: bool = False
    """Do not inject the health probes (readiness and liveness, and a worker's startup probe): for
    engines that do not serve /health on the service port."""
    extra_pod_spec: Annotated[
        dict[str, Any] | None,
        open_object("A full Kubernetes PodSpec used as the base of this service's pods."),
        SHALLOW,
    ] = None
    """A full Kubernetes PodSpec used as the base of this service's pods."""
    pod_labels: dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]] | None = None
    """Labels copied onto this service's pods; they win over the InferaDeployment's."""
    pod_annotations: dict[str, str] | None = None
    """Annotations copied onto this service's pods; they win over the InferaDeployment's."""
    autoscaling: AutoscalingSpec | None = None
    """Hand the replica count to a HorizontalPodAutoscaler; `replicas` is then only the count a new
    workload starts with (kept within minReplicas and maxReplicas)."""
    disruption_budget: DisruptionBudgetSpec | None = None
    """The PodDisruptionBudget of the service's pods. On by default for worker pools, and for
    servers that keep more than one replica; maxUnavailable defaults to 1."""

    @field_validator("pod_labels", "pod_annotations")
    @classmethod
    def _qualified_keys(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        for key in metadata or {}:
            if problem := qualified_key_problem(key):
                raise ValueError(problem)
        return metadata

    @model_validator(mode="after")
    def _server_rules(self) -> "ServiceSpec":
        if not self.is_worker and self.role != "mixed":
            raise ValueError(SERVER_ROLE_RULE)
        if not self.is_worker and self.resources.gpu:
            raise ValueError(SERVER_GPU_RULE)
        if not self.is_worker and self.number_of_nodes > 1:
            raise ValueError(SERVER_NODES_RULE)
        if not self.is_worker and self.rdma:
            raise ValueError(SERVER_RDMA_RULE)
        if not self.is_worker and not self.host_boot:
            raise ValueError(SERVER_HOST_BOOT_RULE)
        return self

    @property
    def is_worker(self) -> bool:
        return self.component_type == "worker"

    @property
    def template_image(self) -> str | None:
        """The image of extraPodSpec's primary container, if it sets one."""
        containers = (self.extra_pod_spec or {}).get("containers")
        if not isinstance(containers, list) or not all(isinstance(c, dict) for c in containers):
            return None
        index = primary_index(containers)
        return None if index is None else containers[index].get("image")

    def desired_replicas(self, live: int | None) -> int:
        """The workload's replicas: `replicas`, unless an autoscaler owns the count; then the count
        it set (`live`, observed on the workload) or, before the workload exists, `replicas`,
        either kept within [minReplicas, maxReplicas]."""
        if self.autoscaling is None:
            return self.replicas
        count = self.replicas if live is None else live
        return min(max(count, self.autoscaling.min_replicas), self.autoscaling.max_replicas)

    @property
    def budget_max_unavailable(self) -> int | str | None:
        """The disruption budget's maxUnavailable, or None for no budget: a worker pool has one
        unless disabled; a server only when it always keeps more than one replica (a budget over
        a single router would only say what a drain does anyway)."""
        budget = self.disruption_budget or DisruptionBudgetSpec()
        if not budget.enabled or (not self.is_worker and self.fewest_replicas <= 1):
            return None
        return budget.max_unavailable

    @property
    def fewest_replicas(self) -> int:
        """The fewest replicas the service runs: its autoscaler's minimum, or `replicas`."""
        return self.autoscaling.min_replicas if self.autoscaling else self.replicas

    @property
    def effective_port(self) -> int:
        if self.port is not None:
            return self.port
        return DEFAULT_WORKER_PORT if self.is_worker else DEFAULT_SERVER_PORT


class DownloaderSpec(ApiModel):
    """What downloads the model into the cache."""

    image: ImageReference | None = None
    """Image of the download Job; defaults to spec.image (the runtime ships huggingface_hub)."""
    command: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None = None
    """Command that writes the model to $INFERA_MODEL_DIR (it gets INFERA_MODEL_REPO, INFERA_MODEL_REVISION
    and HF_TOKEN); default: huggingface_hub's snapshot_download."""


class ModelCacheSpec(ApiModel):
    """Weights downloaded once into a PersistentVolumeClaim that every worker mounts read-only;
    worker pods are created only once the download is complete."""

    source: Annotated[str, Field(max_length=256, pattern=f"^{MODEL_SOURCE.pattern}$")]
    """hf://<owner>/<repo>[@<revision>]."""
    size: Quantity
    """Storage requested for the claim; a larger value expands it."""
    storage_class_name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)] | None = None
    """StorageClass of the claim; the cluster default when unset."""
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] | None = None
    """Default ReadWriteMany when the worker pods together may be more than one, else ReadWriteOnce."""
    mount_path: Annotated[str, Field(min_length=2, max_length=256, pattern=r"^/[A-Za-z0-9._/-]*[A-Za-z0-9._-]$")] = (
        "/models"
    )
    """Where every worker sees the cache, read-only: the model is at <mountPath>/<repo>."""
    token_secret_ref: KeySelector | None = None
    """The Hugging Face token for a gated repository, given to the download as HF_TOKEN."""
    downloader: DownloaderSpec | None = None
    """A downloader of your own (image, command)."""
    retain_storage: bool = False
    """Keep the claim, and the weights, when the InferaDeployment is deleted."""

    @field_validator("size")
    @classmethod
    def _positive(cls, size: str) -> str:
        if quantity_value(size) <= 0:
            raise ValueError("modelCache.size must be more than 0")
        return size

    @field_validator("mount_path")
    @classmethod
    def _free_path(cls, path: str) -> str:
        segments = path.split("/")[1:]
        # In or above a system path: one of the two is a prefix of the other, segment by segment.
        clashes = (
            f"{path}/".startswith(f"{system}/") or f"{system}/".startswith(f"{path}/") for system in SYSTEM_PATHS
        )
        if any(s in (".", "..", "") for s in segments) or any(clashes):
            raise ValueError(MOUNT_PATH_RULE)
        return path

    @property
    def repo(self) -> str:
        match = MODEL_SOURCE.fullmatch(self.source)
        assert match is not None
        return f"{match.group(1)}/{match.group(2)}"

    @property
    def revision(self) -> str | None:
        match = MODEL_SOURCE.fullmatch(self.source)
        assert match is not None
        return match.group(3)

    @property
    def model_name(self) -> str:
        """The directory the model is in, under mountPath: the repository's name."""
        return self.repo.rsplit("/", 1)[1]

    @property
    def digest(self) -> str:
        """Names the download and the directory it writes: a new source or revision, a new one."""
        return hashlib.sha256(f"{self.repo}@{self.revision or ''}".encode()).hexdigest()[:DIGEST_LENGTH]


class InferaDeploymentSpec(ApiModel):
    """The desired inference graph."""

    model_config = with_validations(
        cel(
            "!has(self.discoveryBackend) || self.discoveryBackend != 'etcd' || has(self.etcdEndpoint)",
            ETCD_ENDPOINT_RULE,
        ),
        cel(
            "!has(self.gaie) || !has(self.gaie.enabled) || !self.gaie.enabled || has(self.gaie.eppImage) || has(self.image)",
            GAIE_IMAGE_RULE,
        ),
        cel(
            "!has(self.modelCache) || has(self.image) || "
            "(has(self.modelCache.downloader) && has(self.modelCache.downloader.image))",
            MODEL_CACHE_IMAGE_RULE,
        ),
        cel(
            "has(self.image) || self.services.all(s, has(self.services[s].image) || has(self.services[s].extraPodSpec))",
            IMAGE_RULE,
        ),
        # Only where the flag cannot be anywhere; the hook reads the command lines themselves
        # (a CEL look into every args list would exceed the API server's cost budget).
        cel(
            "!has(self.backendFramework) || self.backendFramework != 'vllm' || self.services.all(s, "
            "!has(self.services[s].role) || self.services[s].role == 'mixed' || "
            "has(self.services[s].args) || has(self.services[s].extraPodSpec))",
            VLLM_ROLE_RULE,
        ),
    )

    backend_framework: Literal["sglang", "vllm"] = "sglang"
    """Engine of the workers: runs the module infera.engine.<backendFramework>."""
    image: ImageReference | None = None
    """Default container image of every service."""
    discovery_backend: Annotated[Literal["kubernetes", "etcd"], Field(json_schema_extra={"maxLength": 10})] = (
        "kubernetes"
    )
    """How the server finds workers: kubernetes (watches this graph's pods) or etcd."""
    etcd_endpoint: Annotated[str, Field(min_length=1)] | None = None
    """External etcd for discovery, e.g. etcd:2379. Required when discoveryBackend is etcd."""
    nats: NatsSpec = Field(default_factory=NatsSpec)
    """The managed NATS JetStream broker for KV events."""
    gaie: GaieSpec = Field(default_factory=GaieSpec)
    """Gateway API Inference Extension integration."""
    envs: list[EnvVar] | None = None
    """Environment variables of every service."""
    services: Annotated[
        dict[str, ServiceSpec],
        Field(
            min_length=1,
            max_length=MAX_SERVICES,
            json_schema_extra={
                "x-kubernetes-validations": [
                    cel("self.exists(s, self[s].componentType == 'worker')", ONE_WORKER_RULE),
                    cel(" && ".join(f"!('{name}' in self)" for name in RESERVED_SERVICE_NAMES), RESERVED_NAMES_RULE),
                ]
            },
        ),
    ]
    """The graph's components by name; pods and children are named <idep>-<service>."""
    patches: Annotated[list[ChildPatch], Field(max_length=MAX_PATCHES)] | None = None
    """RFC 6902 patches applied to rendered children, for what the API does not model."""
    model_cache: ModelCacheSpec | None = None
    """Download the model once into a claim the workers mount; workers wait for it."""
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    """Which of the graph's pods admit only the traffic the graph needs."""

    @property
    def model_access_mode(self) -> str:
        """The claim's access mode: several pods, possibly on several nodes, need ReadWriteMany."""
        assert self.model_cache is not None
        if self.model_cache.access_mode:
            return self.model_cache.access_mode
        pods = sum(
            (svc.autoscaling.max_replicas if svc.autoscaling else svc.replicas) * svc.number_of_nodes
            for svc in self.services.values()
            if svc.is_worker
        )
        return "ReadWriteMany" if pods > 1 else "ReadWriteOnce"

    @field_validator("services")
    @classmethod
    def _service_names(cls, services: dict[str, ServiceSpec]) -> dict[str, ServiceSpec]:
        for name in services:
            if not DNS_LABEL.fullmatch(name):
                raise ValueError(
                    f"service name {name!r} must be a DNS label: lower-case letters, digits "
                    "and '-', starting with a letter"
                )
        return services

    def _gaie_rules(self) -> None:
        if not (self.gaie.tokenizer_path and self.gaie.gateway_name):
            raise ValueError(GAIE_REQUIRED_RULE)
        if not (self.gaie.epp_image or self.image):
            raise ValueError(GAIE_IMAGE_RULE)
        for name, service in sorted(self.services.items()):
            if service.is_worker and service.effective_port == self.gaie.frontend_port:
                raise ValueError(
                    f"gaie.frontendPort {self.gaie.frontend_port} is also services.{name}'s port: the frontend "
                    "sidecar shares the worker pod, so choose another frontendPort or services port"
                )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> "InferaDeploymentSpec":
        if self.discovery_backend == "etcd" and not self.etcd_endpoint:
            raise ValueError(ETCD_ENDPOINT_RULE)
        if not any(s.is_worker for s in self.services.values()):
            raise ValueError(ONE_WORKER_RULE)
        reserved = sorted(set(self.services) & set(RESERVED_SERVICE_NAMES))
        if reserved:
            raise ValueError(f"{RESERVED_NAMES_RULE} (found {', '.join(reserved)})")
        if self.gaie.enabled:
            self._gaie_rules()
        if self.model_cache is not None and MODELS_SUFFIX in self.services:
            raise ValueError(MODELS_NAME_RULE)
        if self.model_cache is not None and not (self.image or (self.model_cache.downloader or DownloaderSpec()).image):
            raise ValueError(MODEL_CACHE_IMAGE_RULE)
        for name, service in self.services.items():
            if not (service.image or self.image or service.template_image):
                raise ValueError(f"{IMAGE_RULE} (services.{name} has none)")
        return self


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(ApiModel):
    """A metav1.Condition."""

    type: str
    """Condition type in CamelCase, e.g. Ready."""
    status: ConditionStatus
    """Whether the condition holds."""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """The metadata.generation the condition was computed from."""
    last_transition_time: Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
    """When the status last changed."""
    reason: str
    """CamelCase machine-readable reason."""
    message: str
    """Human-readable detail."""


class AutoscalingStatus(ApiModel):
    """The service's HorizontalPodAutoscaler: its bounds and what it reports."""

    min_replicas: int
    """spec.services.<name>.autoscaling.minReplicas."""
    max_replicas: int
    """spec.services.<name>.autoscaling.maxReplicas."""
    current_replicas: int
    """Replicas the autoscaler last saw (0 until it reports)."""
    desired_replicas: int
    """Replicas the autoscaler last asked for (0 until it reports)."""


class ServiceStatus(ApiModel):
    """Replica counts of one service's workload, as the workload reports them."""

    kind: str
    """Workload kind: Deployment or LeaderWorkerSet."""
    replicas: int
    """Replicas the workload has now (pods, or groups for a LeaderWorkerSet), from its status."""
    ready_replicas: int
    """Ready replicas (pods, or groups for a LeaderWorkerSet)."""
    autoscaling: AutoscalingStatus | None = None
    """Set while spec.services.<name>.autoscaling is."""


class GaieStatus(ApiModel):
    """State of the Inference Gateway objects; set only when spec.gaie.enabled."""

    epp_replicas: int
    """Desired Endpoint Picker replicas."""
    epp_ready_replicas: int
    """Ready Endpoint Picker replicas."""
    inference_pool_name: str | None = None
    """The generated InferencePool."""
    http_route_name: str | None = None
    """The generated HTTPRoute."""
    inference_pool_ready: bool | None = None
    """The InferencePool exists and, when it reports conditions, is Accepted."""
    http_route_accepted: bool | None = None
    """A parent Gateway reports the HTTPRoute Accepted."""
    ready: bool | None = None
    """EPP ready, pool ready and route accepted."""


State = Literal["initializing", "pending", "ready", "failed", "terminating"]
ModelPhase = Literal["Downloading", "Ready", "Failed"]


class ModelCacheStatus(ApiModel):
    """The model cache's download; set only when spec.modelCache is."""

    phase: ModelPhase
    """Downloading, Ready (the download Job completed) or Failed."""
    source: str
    """The source the phase is about."""
    job: str
    """The download Job of that source."""
    message: str
    """What the download is doing, or why it failed."""


class InferaDeploymentStatus(ApiModel):
    """The observed state of the graph, written by the hook on every sync."""

    observed_generation: int | None = None
    """The metadata.generation last reconciled (written by Metacontroller)."""
    state: State | None = None
    """initializing, pending, ready, failed, or terminating during teardown."""
    message: str | None = None
    """One line for people: what the graph is waiting on, or what is wrong."""
    ready_services: str | None = None
    """Ready services out of all services, e.g. 2/3."""
    conditions: list[Condition] | None = None
    """Standard conditions (Ready, SpecValid, ...)."""
    services: dict[str, ServiceStatus] | None = None
    """Per-service workload status by service name."""
    gaie: GaieStatus | None = None
    """Inference Gateway status when spec.gaie.enabled."""
    model_cache: ModelCacheStatus | None = None
    """The model cache's download when spec.modelCache is set."""


class ParentMeta(BaseModel):
    """The parts of the parent's metadata the hook reads."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=MAX_CHILD_NAME)]

    @field_validator("name")
    @classmethod
    def _dns_label(cls, name: str) -> str:
        # Child Service names start with it, so a DNS subdomain (with dots) is not enough.
        if not DNS_LABEL.fullmatch(name):
            raise ValueError(PARENT_NAME_RULE)
        return name

    namespace: str = "default"
    uid: str = ""
    generation: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class InferaDeployment(BaseModel):
    """A parsed parent: identity plus validated spec."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    metadata: ParentMeta
    spec: InferaDeploymentSpec

    @classmethod
    def from_parent(cls, parent: dict[str, Any]) -> "InferaDeployment":
        """The parent as Metacontroller sends it, validated: the one way every hook parses it.
        Raises SpecError naming each bad field by its API path (`spec.services.decode.replicas`)."""
        try:
            return cls.model_validate({"metadata": parent.get("metadata"), "spec": parent.get("spec") or {}})
        except ValidationError as error:
            problems = []
            for item in error.errors():
                path = ".".join(str(part) for part in item["loc"])
                message = _problem(item)
                problems.append(f"{path}: {message}" if path else message)
            raise SpecError(f"invalid spec: {'; '.join(problems)}") from None

    @model_validator(mode="after")
    def _name_lengths(self) -> "InferaDeployment":
        for service, svc in sorted(self.spec.services.items()):
            child = f"{self.name}-{service}"
            if len(child) > MAX_CHILD_NAME:
                raise ValueError(f"{CHILD_NAME_RULE} ({child} has {len(child)})")
            if svc.number_of_nodes > 1 and len(child) > MAX_LWS_NAME:
                raise ValueError(f"{MULTINODE_NAME_RULE} ({child} has {len(child)})")
        if self.spec.nats.deploy and len(self.name) + len("-nats") > MAX_SET_NAME:
            raise ValueError(NATS_NAME_RULE)
        if self.spec.gaie.enabled and len(self.name) + len("-epp") > MAX_CHILD_NAME:
            raise ValueError(GAIE_NAME_RULE)
        if self.spec.model_cache is not None and len(self.name) > MAX_MODEL_CACHE_NAME:
            raise ValueError(MODEL_CACHE_NAME_RULE)
        return self

    @model_validator(mode="after")
    def _pod_annotation_sizes(self) -> "InferaDeployment":
        inherited = {k: v for k, v in self.metadata.annotations.items() if k.startswith("infera")}
        for service, svc in sorted(self.spec.services.items()):
            annotations = inherited | (svc.pod_annotations or {})
            size = annotations_bytes(annotations)
            if size > MAX_ANNOTATIONS_BYTES:
                raise ValueError(
                    f"spec.services.{service}.podAnnotations: the pods would carry {size:,} bytes of annotations "
                    f"(with the InferaDeployment's infera* annotations); the API server allows at most {MAX_ANNOTATIONS_BYTES:,}"
                )
        return self

    @property
    def name(self) -> str:
        return self.metadata.name


def _problem(error: ErrorDetails) -> str:
    """One validation error in the API's words."""
    if error["type"] == "value_error":
        # Our own rules already say what is wrong; pydantic would prefix "Value error, ".
        return str(error["ctx"]["error"])
    if error["type"] == "extra_forbidden":
        return unknown_field(str(error["loc"][-1]), known_fields(error["loc"][:-1]))
    return error["msg"]


def unknown_field(name: str, known: Iterable[str]) -> str:
    """What to say of a field the API does not have (pydantic says "Extra inputs are not
    permitted"): the known field at that place it most likely misspells, if one is close."""
    by_lower = {field.lower(): field for field in known}
    # Case-blind, so that tokenizerpath finds tokenizerPath as surely as tokenizerPth does.
    close = difflib.get_close_matches(name.lower(), by_lower, n=1)
    return f"unknown field; did you mean {by_lower[close[0]]}?" if close else "unknown field"


def known_fields(path: Sequence[str | int]) -> list[str]:
    """The field names (by alias) an InferaDeployment has at `path`, e.g. ("spec", "services",
    "decode") for a ServiceSpec's; none where the path leads to no object of the API's."""
    node = _api_schema()
    for part in path:
        node = _resolved(node)
        properties = node.get("properties") or {}
        if part in properties:
            node = properties[part]
        elif isinstance(node.get("additionalProperties"), dict):  # a map: `part` is a key
            node = node["additionalProperties"]
        elif isinstance(node.get("items"), dict):  # a list: `part` is an index
            node = node["items"]
        else:
            return []
    return sorted(_resolved(node).get("properties") or {})


@functools.cache
def _api_schema() -> dict[str, Any]:
    """The model's JSON Schema, built once and only when a spec names an unknown field."""
    return InferaDeployment.model_json_schema(by_alias=True)


def _resolved(node: dict[str, Any]) -> dict[str, Any]:
    """The schema behind a reference, or behind an optional field (anyOf with null)."""
    while True:
        if "$ref" in node:
            node = _api_schema()["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        elif "anyOf" in node:
            node = next((option for option in node["anyOf"] if option.get("type") != "null"), {})
        else:
            return node
