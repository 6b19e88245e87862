"""The InferaDeployment itself: its spec, the parent as the hook parses it, and how a validation
error is put in the API's words."""

import difflib
import functools
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from hooks.api.env import EnvVar
from hooks.api.fields import ApiModel, ImageReference, SpecError
from hooks.api.infrastructure import DownloaderSpec, GaieSpec, ModelCacheSpec, MonitoringSpec, NatsSpec, RolloutSpec
from hooks.api.name_rules import problems as name_problems
from hooks.api.network import NetworkPolicySpec
from hooks.api.placement import PlacementSpec
from hooks.api.rules import (
    BLUE_GREEN_DISCOVERY_RULE,
    BLUE_GREEN_FRONT_DOOR_RULE,
    ETCD_ENDPOINT_RULE,
    GAIE_IMAGE_RULE,
    GAIE_REQUIRED_RULE,
    IMAGE_RULE,
    MAX_PATCH_OPERATIONS,
    MAX_PATCHES,
    MAX_SERVICES,
    MODEL_CACHE_IMAGE_RULE,
    MODELS_NAME_RULE,
    ONE_WORKER_RULE,
    PARENT_NAME_RULE,
    RESERVED_NAMES_RULE,
    RESERVED_SERVICE_NAMES,
    VLLM_ROLE_RULE,
    cel,
    with_validations,
)
from hooks.api.services import ServiceSpec
from hooks.kubernetes_names import DNS_LABEL, DNS_LABEL_MAX, MAX_ANNOTATIONS_BYTES, annotations_bytes
from hooks.vocabulary import MODELS_SUFFIX

GROUP = "infera.amd.com"
VERSION = "v1alpha1"
KIND = "InferaDeployment"
PLURAL = "inferadeployments"


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
        cel(
            "!has(self.rollout) || !has(self.rollout.strategy) || self.rollout.strategy != 'BlueGreen' || "
            "(has(self.gaie) && has(self.gaie.enabled) && self.gaie.enabled) || "
            "self.services.exists(s, self.services[s].componentType == 'server')",
            BLUE_GREEN_FRONT_DOOR_RULE,
        ),
        cel(
            "!has(self.rollout) || !has(self.rollout.strategy) || self.rollout.strategy != 'BlueGreen' || "
            "!has(self.discoveryBackend) || self.discoveryBackend == 'kubernetes'",
            BLUE_GREEN_DISCOVERY_RULE,
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
    monitoring: MonitoringSpec | None = None
    """Scrape the graph's processes with the Prometheus Operator (a PodMonitor); needs the
    kustomize component metacontroller/components/monitoring."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """How a change to what the processes run reaches the pods: in place, or a generation at a time."""
    placement: PlacementSpec | None = None
    """Which fabric domain the workers of a generation share (docs/placement.md)."""

    @property
    def blue_green(self) -> bool:
        return self.rollout.strategy == "BlueGreen"

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
        if self.blue_green and self.discovery_backend != "kubernetes":
            raise ValueError(BLUE_GREEN_DISCOVERY_RULE)
        if self.blue_green and not (self.gaie.enabled or any(not s.is_worker for s in self.services.values())):
            raise ValueError(BLUE_GREEN_FRONT_DOOR_RULE)
        return self


class ParentMeta(BaseModel):
    """The parts of the parent's metadata the hook reads."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=DNS_LABEL_MAX)]

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
    # Which generation of the graph a render makes: "" for the children named and selected as
    # under RollingUpdate, else a BlueGreen generation's digest (hooks.generations).
    _generation: str = PrivateAttr(default="")

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
    def _names(self) -> "InferaDeployment":
        """Every name the graph's children get fits its kind's limit, and none is another graph's
        (hooks/api/name_rules.py, from the table in hooks/api/names.py)."""
        for problem in name_problems(self.name, self.spec):
            raise ValueError(problem)
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

    @property
    def graph_generation(self) -> str:
        # Read where pydantic keeps private attributes: through the model's __getattr__ it is
        # many times slower than a field, and a sync reads it at every child it names.
        return cast(dict[str, str], self.__pydantic_private__)["_generation"]

    def at_generation(self, generation: str) -> "InferaDeployment":
        """The same graph, rendering `generation`'s children."""
        if generation == self.graph_generation:
            return self
        copy = self.model_copy()
        copy._generation = generation
        return copy


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
