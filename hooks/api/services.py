"""One service of the graph: the router or a pool of GPU workers, with its resources, autoscaler
and disruption budget."""

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from hooks.api.env import EnvVar
from hooks.api.fields import SHALLOW, ApiModel, ImageReference, MaxUnavailable, Quantity, open_object, primary_index
from hooks.api.names import MAX_GROUPS
from hooks.api.rules import (
    AUTOSCALING_RANGE_RULE,
    GROUPS_RULE,
    MAX_NODES,
    NODES_RULE,
    SERVER_GPU_RULE,
    SERVER_HOST_BOOT_RULE,
    SERVER_NODES_RULE,
    SERVER_RDMA_RULE,
    SERVER_ROLE_RULE,
    cel,
    with_validations,
)
from hooks.kubernetes_names import (
    INT32_MAX,
    LABEL_VALUE_PATTERN,
    QUALIFIED_NAME,
    is_extended_resource,
    qualified_key_problem,
    shown,
)

DEFAULT_GPU_TYPE = "amd.com/gpu"
DEFAULT_SERVER_PORT = 8000
DEFAULT_WORKER_PORT = 30000


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
        cel(
            f"!has(self.numberOfNodes) || self.numberOfNodes == 1 || ((!has(self.replicas) || self.replicas <= "
            f"{MAX_GROUPS}) && (!has(self.autoscaling) || self.autoscaling.maxReplicas <= {MAX_GROUPS}))",
            GROUPS_RULE,
        ),
    )

    # maxLength bounds the CEL cost estimate of rules comparing these strings.
    component_type: Annotated[Literal["server", "worker"], Field(json_schema_extra={"maxLength": 6})]
    """server: the OpenAI-compatible router (no GPU). worker: a GPU engine pool."""
    role: Annotated[Literal["mixed", "prefill", "decode"], Field(json_schema_extra={"maxLength": 7})] = "mixed"
    """Disaggregation role of a worker pool."""
    replicas: Annotated[int, Field(ge=0, le=INT32_MAX)] = 1
    """Pods (single-node) or groups (multi-node)."""
    number_of_nodes: Annotated[int, Field(ge=1, json_schema_extra={"maximum": MAX_NODES})] = 1
    """Nodes per replica, at most 64. 1: a Deployment; more: a LeaderWorkerSet spanning that many nodes."""
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

    @field_validator("number_of_nodes")
    @classmethod
    def _nodes(cls, nodes: int) -> int:
        # Here rather than as le=: pydantic's words would not say why.
        if nodes > MAX_NODES:
            raise ValueError(NODES_RULE)
        return nodes

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
        if self.number_of_nodes > 1 and max(self.replicas, self.most_replicas) > MAX_GROUPS:
            raise ValueError(GROUPS_RULE)
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
    def fewest_replicas(self) -> int:
        """The fewest replicas the service runs: its autoscaler's minimum, or `replicas`."""
        return self.autoscaling.min_replicas if self.autoscaling else self.replicas

    @property
    def most_replicas(self) -> int:
        """The most replicas the service runs: its autoscaler's maximum, or `replicas`."""
        return self.autoscaling.max_replicas if self.autoscaling else self.replicas

    @property
    def effective_port(self) -> int:
        if self.port is not None:
            return self.port
        return DEFAULT_WORKER_PORT if self.is_worker else DEFAULT_SERVER_PORT
