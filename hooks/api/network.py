"""The NetworkPolicies a graph asks for, and the peers (label selectors, CIDRs) they admit."""

import ipaddress
from typing import Annotated, Literal

from pydantic import Field, model_validator

from hooks.api.fields import UNSET_IF_EMPTY, ApiModel, LabelValue, QualifiedKey
from hooks.api.rules import PEER_RULE, SELECTOR_VALUES_RULE, cel, with_validations
from hooks.kubernetes_names import shown


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
