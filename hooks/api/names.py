"""Every name the hook gives a child, and the names the LeaderWorkerSet controller makes of them:
the limit each kind's name has and why, and when a graph has children of each name.

Children are named <metadata.name>-<something>, so two graphs can arrive at the same name: graph
`a` with a service `b-nats` would own the Service `a-b-nats`, the broker of graph `a-b`. This is
the one table of those names (NAMES) and of each kind's limit (KIND_LIMITS), with each name's
condition in words, as CEL and as the hook reads a spec; hooks/api/name_rules.py derives from it
the rules that keep a graph's names within their limits and clear of other graphs'.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from hooks.kubernetes_names import DNS_LABEL_MAX, DNS_SUBDOMAIN_MAX
from hooks.vocabulary import (
    DIGEST_LENGTH,
    DISCOVERY_SUFFIX,
    DOWNLOAD_SUFFIX,
    EPP_SUFFIX,
    METRICS_SUFFIX,
    MODELS_SUFFIX,
    NATS_SUFFIX,
    POOL_SUFFIX,
    REGISTRATION_SUFFIX,
    ROUTE_SUFFIX,
    Service,
)


# What the table reads of a spec: protocols, not the API's types, which are built from its rules
# (hooks/api/name_rules.py derives the length and claim rules that hooks/api/rules.py takes).
class _Switch(Protocol):
    @property
    def deploy(self) -> bool: ...


class _Gateway(Protocol):
    @property
    def enabled(self) -> bool: ...


class GraphSpec(Protocol):
    @property
    def services(self) -> Mapping[str, Service]: ...

    @property
    def nats(self) -> _Switch: ...

    @property
    def gaie(self) -> _Gateway: ...

    @property
    def discovery_backend(self) -> str: ...

    @property
    def model_cache(self) -> object | None: ...

    @property
    def monitoring(self) -> object | None: ...

    @property
    def blue_green(self) -> bool: ...


# The groups of a multi-node service: the LeaderWorkerSet controller names each group's
# StatefulSet <LeaderWorkerSet>-<group>, and the table leaves room for the numbers 0 to 9999.
MAX_GROUPS = 10_000
# A StatefulSet's pods carry controller-revision-hash: <StatefulSet>-<hash>, a label value, and
# the hash takes up to 10 characters.
MAX_SET_NAME = DNS_LABEL_MAX - len("-") - 10


@dataclass(frozen=True)
class Limit:
    characters: int | None  # None: Kubernetes sets none
    why: str


DNS_SUBDOMAIN = Limit(DNS_SUBDOMAIN_MAX, "a DNS subdomain")
PATH_SEGMENT = Limit(None, "a path segment, of no set length")
# The limit of each kind's name, from the API server's validation and from what carries the name
# in a label value (at most 63 characters).
KIND_LIMITS = {
    "Service": Limit(DNS_LABEL_MAX, "a Service's name is a DNS-1035 label"),
    "Deployment": Limit(
        DNS_LABEL_MAX, "Kubernetes advises a DNS label for a Deployment's name, which its pods' hostnames come from"
    ),
    "StatefulSet": Limit(
        MAX_SET_NAME,
        "its pods carry it in the label controller-revision-hash with '-' and a hash of up to 10 "
        f"characters, at most {DNS_LABEL_MAX} in all",
    ),
    "LeaderWorkerSet": DNS_SUBDOMAIN,
    "Job": Limit(DNS_LABEL_MAX, f"its pods carry it as their job-name label, at most {DNS_LABEL_MAX} characters"),
    "InferencePool": Limit(
        DNS_LABEL_MAX,
        "Istio, a gateway that serves InferencePools, labels its Service for the pool with the pool's "
        f"name (istio.io/inferencepool-name), at most {DNS_LABEL_MAX} characters",
    ),
    "HTTPRoute": DNS_SUBDOMAIN,
    "PodMonitor": DNS_SUBDOMAIN,
    "PersistentVolumeClaim": DNS_SUBDOMAIN,
    "ServiceAccount": DNS_SUBDOMAIN,
    "NetworkPolicy": DNS_SUBDOMAIN,
    "HorizontalPodAutoscaler": DNS_SUBDOMAIN,
    "Role": PATH_SEGMENT,
    "RoleBinding": PATH_SEGMENT,
    "PodDisruptionBudget": PATH_SEGMENT,
}

# CEL on the whole object, where metadata.name is in reach beside the spec.
GAIE_ON = "has(self.spec.gaie) && has(self.spec.gaie.enabled) && self.spec.gaie.enabled"
BLUE_GREEN = "has(self.spec.rollout) && has(self.spec.rollout.strategy) && self.spec.rollout.strategy == 'BlueGreen'"
MULTI_NODE = "has(self.spec.services[s].numberOfNodes) && self.spec.services[s].numberOfNodes > 1"


def _always(_: Any) -> bool:
    return True


@dataclass(frozen=True)
class When:
    """When a graph has children of a name: in words, as CEL on the whole object (`s` is a
    service's name), and as the hook reads its spec and the service's."""

    words: str
    graph_cel: str = ""
    service_cel: str = ""
    graph: Callable[[GraphSpec], bool] = _always
    service: Callable[[Service], bool] = _always

    @property
    def cel(self) -> str:
        return " && ".join(f"({part})" for part in (self.graph_cel, self.service_cel) if part)


ALWAYS = When("")
MULTI = When(" for a multi-node service", service_cel=MULTI_NODE, service=lambda svc: svc.number_of_nodes > 1)
WITH_NATS = When(
    " while nats.deploy is true",
    "!has(self.spec.nats) || !has(self.spec.nats.deploy) || self.spec.nats.deploy",
    graph=lambda spec: spec.nats.deploy,
)
WITH_KUBERNETES_DISCOVERY = When(
    " while discoveryBackend is kubernetes",
    "!has(self.spec.discoveryBackend) || self.spec.discoveryBackend == 'kubernetes'",
    graph=lambda spec: spec.discovery_backend == "kubernetes",
)
WITH_GAIE = When(" while gaie.enabled is true", GAIE_ON, graph=lambda spec: spec.gaie.enabled)
WITH_MODEL_CACHE = When(
    " while modelCache is set", "has(self.spec.modelCache)", graph=lambda spec: spec.model_cache is not None
)
WITH_MONITORING = When(
    " while monitoring is set", "has(self.spec.monitoring)", graph=lambda spec: spec.monitoring is not None
)
BLUE_GREEN_GRAPH = When(" while rollout.strategy is BlueGreen", BLUE_GREEN, graph=lambda spec: spec.blue_green)
BLUE_GREEN_MULTI = When(
    " for a multi-node service while rollout.strategy is BlueGreen",
    BLUE_GREEN,
    MULTI_NODE,
    graph=lambda spec: spec.blue_green,
    service=lambda svc: svc.number_of_nodes > 1,
)
BLUE_GREEN_GAIE = When(
    " while gaie.enabled is true and rollout.strategy is BlueGreen",
    f"{GAIE_ON} && {BLUE_GREEN}",
    graph=lambda spec: spec.gaie.enabled and spec.blue_green,
)


@dataclass(frozen=True)
class Placeholder:
    """A part of a name that varies: as a pattern shows it, the most characters it takes, what
    it matches and what it is (a service's name is counted, and matched, apart)."""

    shown: str
    width: int = 0
    regex: str = ""
    words: str = ""


SERVICE = "{service}"
HEXADECIMAL = Placeholder("", DIGEST_LENGTH, f"[0-9a-f]{{{DIGEST_LENGTH}}}", f"{DIGEST_LENGTH} hexadecimal digits")
PLACEHOLDERS = {
    SERVICE: Placeholder("<service>"),
    "{generation}": replace(HEXADECIMAL, shown="<generation>"),
    "{digest}": replace(HEXADECIMAL, shown="<digest>"),
    "{group}": Placeholder("<group>", len(str(MAX_GROUPS - 1)), "[0-9]+", "a number"),
}
PLACEHOLDER = re.compile("|".join(re.escape(placeholder) for placeholder in PLACEHOLDERS))


@dataclass(frozen=True)
class Name:
    """Children named <metadata.name>-<template>: who makes them (None: the hook), of which
    kinds, and when the graph has them."""

    template: str
    kinds: tuple[str, ...]
    when: When
    what: str  # whose children they are, for messages
    made_by: str | None = None

    @property
    def pattern(self) -> str:
        return "<metadata.name>-" + PLACEHOLDER.sub(lambda m: PLACEHOLDERS[m.group()].shown, self.template)

    @property
    def per_service(self) -> bool:
        return self.template.startswith(SERVICE)

    @property
    def extra(self) -> int:
        """Characters besides metadata.name's and the service name's."""
        fixed = PLACEHOLDER.sub("", self.template)
        return len("-") + len(fixed) + sum(PLACEHOLDERS[p].width for p in PLACEHOLDER.findall(self.template))

    @property
    def limit(self) -> int | None:
        """The most characters every kind of it allows (None: Kubernetes sets no limit)."""
        limits = [KIND_LIMITS[kind].characters for kind in self.kinds]
        return min((limit for limit in limits if limit is not None), default=None)

    @property
    def bound_kinds(self) -> list[str]:
        """The kinds whose limit is the name's."""
        return [kind for kind in self.kinds if KIND_LIMITS[kind].characters == self.limit]

    @property
    def why(self) -> str:
        return "; ".join(dict.fromkeys(KIND_LIMITS[kind].why for kind in self.bound_kinds))

    def regex(self, graph: str, services: list[str]) -> re.Pattern[str]:
        """What the names of this graph's children of this name match."""
        parts = [
            (f"(?:{'|'.join(map(re.escape, services))})" if part == SERVICE else PLACEHOLDERS[part].regex)
            if part in PLACEHOLDERS
            else re.escape(part)
            for part in re.split(f"({PLACEHOLDER.pattern})", self.template)
        ]
        return re.compile(f"{re.escape(graph)}-{''.join(parts)}")


LWS_CONTROLLER = "the LeaderWorkerSet controller"
# Every name, in the order the docs list them.
NAMES = (
    Name(
        SERVICE,
        ("Deployment", "Service", "NetworkPolicy", "HorizontalPodAutoscaler", "PodDisruptionBudget"),
        ALWAYS,
        "a service",
    ),
    Name(SERVICE, ("LeaderWorkerSet",), MULTI, "a multi-node service"),
    Name(SERVICE, ("StatefulSet", "Service"), MULTI, "the leaders of a multi-node service", LWS_CONTROLLER),
    Name(f"{SERVICE}-{{group}}", ("StatefulSet",), MULTI, "each group of a multi-node service", LWS_CONTROLLER),
    Name(
        f"{SERVICE}-{{generation}}", ("Deployment", "LeaderWorkerSet"), BLUE_GREEN_GRAPH, "each generation of a service"
    ),
    Name(
        f"{SERVICE}-{{generation}}",
        ("StatefulSet", "Service"),
        BLUE_GREEN_MULTI,
        "the leaders of each generation of a multi-node service",
        LWS_CONTROLLER,
    ),
    Name(
        f"{SERVICE}-{{generation}}-{{group}}",
        ("StatefulSet",),
        BLUE_GREEN_MULTI,
        "each group of each generation of a multi-node service",
        LWS_CONTROLLER,
    ),
    Name(NATS_SUFFIX, ("StatefulSet", "Service", "NetworkPolicy"), WITH_NATS, "the NATS broker"),
    Name(
        DISCOVERY_SUFFIX, ("ServiceAccount", "Role", "RoleBinding"), WITH_KUBERNETES_DISCOVERY, "the routers' account"
    ),
    Name(
        REGISTRATION_SUFFIX,
        ("ServiceAccount", "Role", "RoleBinding"),
        WITH_KUBERNETES_DISCOVERY,
        "the workers' account",
    ),
    Name(
        EPP_SUFFIX,
        (
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "NetworkPolicy",
            "ServiceAccount",
            "Role",
            "RoleBinding",
        ),
        WITH_GAIE,
        "the Endpoint Picker",
    ),
    Name(
        f"{EPP_SUFFIX}-{{generation}}",
        ("Deployment", "Service", "PodDisruptionBudget"),
        BLUE_GREEN_GAIE,
        "each generation's Endpoint Picker",
    ),
    Name(POOL_SUFFIX, ("InferencePool",), WITH_GAIE, "the gateway"),
    Name(f"{POOL_SUFFIX}-{{generation}}", ("InferencePool",), BLUE_GREEN_GAIE, "each generation's gateway"),
    Name(ROUTE_SUFFIX, ("HTTPRoute",), WITH_GAIE, "the gateway"),
    Name(METRICS_SUFFIX, ("PodMonitor",), WITH_MONITORING, "the monitoring"),
    Name(MODELS_SUFFIX, ("PersistentVolumeClaim",), WITH_MODEL_CACHE, "the model cache"),
    Name(f"{DOWNLOAD_SUFFIX}-{{digest}}", ("Job",), WITH_MODEL_CACHE, "the model cache's download"),
)
