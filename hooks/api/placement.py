"""spec.placement: which fabric domain a graph's workers share, and which scheduler places them
(docs/placement.md)."""

from typing import Annotated, Literal

from pydantic import Field, model_validator

from hooks.api.fields import ApiModel, QualifiedKey
from hooks.api.rules import PLACEMENT_EMPTY_RULE, PLACEMENT_KUEUE_RULE, PLACEMENT_MODE_RULE, cel, with_validations
from hooks.kubernetes_names import DNS_SUBDOMAIN

# The API server defaults scheduler before it validates; a rule read without defaults holds too.
KUEUE_CHOSEN = "has(self.scheduler) && self.scheduler == 'Kueue'"


class KueueSpec(ApiModel):
    """Where Kueue admits the graph's workers."""

    # A LocalQueue's name, carried as a label value: a DNS subdomain of at most 63 characters.
    queue_name: Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_SUBDOMAIN)]
    """The LocalQueue, in the graph's namespace, that admits its worker workloads."""


class PlacementSpec(ApiModel):
    """Which fabric domain the workers of a generation share, and who places them."""

    model_config = with_validations(
        cel(f"has(self.topologyKey) || {KUEUE_CHOSEN}", PLACEMENT_EMPTY_RULE),
        cel("!has(self.mode) || has(self.topologyKey)", PLACEMENT_MODE_RULE),
        cel(f"({KUEUE_CHOSEN}) == has(self.kueue)", PLACEMENT_KUEUE_RULE),
    )

    topology_key: Annotated[QualifiedKey, Field(min_length=1, max_length=317)] | None = None
    """A node label whose value names a fabric domain (a rack, an RDMA rail block, an NVLink or
    XGMI domain): every worker of a generation runs on nodes of one value."""
    mode: Annotated[Literal["Required", "Preferred"], Field(json_schema_extra={"maxLength": 9})] | None = None
    """Required (the default with topologyKey): a worker waits Pending rather than run outside its
    generation's domain. Preferred: the scheduler tries the domain first and spills over."""
    scheduler: Annotated[Literal["Default", "Kueue"], Field(json_schema_extra={"maxLength": 7})] = "Default"
    """Default: the cluster's kube-scheduler, steered by pod affinity. Kueue: Kueue admits each
    worker workload from kueue.queueName (a multi-node group whole), placing it with its
    topology-aware scheduling."""
    kueue: KueueSpec | None = None
    """Required with scheduler Kueue."""

    @property
    def required(self) -> bool:
        return self.mode != "Preferred"

    @property
    def affinity_key(self) -> str | None:
        """The topologyKey the cluster's scheduler places by: None under Kueue, or without one."""
        return self.topology_key if self.scheduler == "Default" else None

    @model_validator(mode="after")
    def _consistent(self) -> "PlacementSpec":
        if self.topology_key is None and self.scheduler != "Kueue":
            raise ValueError(PLACEMENT_EMPTY_RULE)
        if self.mode is not None and self.topology_key is None:
            raise ValueError(PLACEMENT_MODE_RULE)
        if (self.scheduler == "Kueue") != (self.kueue is not None):
            raise ValueError(PLACEMENT_KUEUE_RULE)
        return self
