"""The InferaDeployment's status, as the hook writes it on every sync."""

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import Field, WithJsonSchema

from hooks.api.fields import ApiModel

ConditionStatus = Literal["True", "False", "Unknown"]
# Every hook takes the time its conditions are stamped with from one of these: a test passes its own.
Clock = Callable[[], datetime]
# A condition's time, as the API server stores it.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def utc_now() -> datetime:
    return datetime.now(UTC)


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


RolloutPhase = Literal["Stable", "Progressing", "Stalled", "Switching", "Draining"]


class PoolProgress(ApiModel):
    """One service of the incoming generation, as its workload reports it."""

    replicas: int
    """Replicas its workload is asked for (pods, or groups for a LeaderWorkerSet)."""
    ready_replicas: int
    """Replicas ready on its current template."""


class RolloutStatus(ApiModel):
    """Where a change to what the processes run stands; set under BlueGreen (and while a graph
    leaves it)."""

    strategy: str
    """spec.rollout.strategy."""
    phase: RolloutPhase
    """Stable (one generation), Progressing (a new generation starts beside the serving one),
    Stalled (it is not ready within progressDeadlineSeconds; the old one keeps serving),
    Switching (the front door moves to it) or Draining (the old generation is being removed)."""
    serving_generation: str
    """The generation the front door selects ("" for pods made under RollingUpdate)."""
    incoming_generation: str | None = None
    """The spec's generation while it is not yet serving."""
    pools: dict[str, PoolProgress] | None = None
    """The incoming generation's services, while it is not yet serving."""
    message: str
    """What the rollout waits on."""


class PlacementStatus(ApiModel):
    """Where the workers run; set while spec.placement is."""

    nodes: dict[str, list[str]]
    """The nodes each worker service's pods run on, by service (pods that wait for a node are
    in the message)."""
    summary: str
    """The same on one line, as `kubectl get idep -o wide` shows it: `decode: node-1; prefill: node-1`."""


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
    rollout: RolloutStatus | None = None
    """The rollout under BlueGreen."""
    placement: PlacementStatus | None = None
    """Where the workers run, while spec.placement is set."""
