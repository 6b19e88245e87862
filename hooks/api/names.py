"""Every name the hook gives a child, and the names the LeaderWorkerSet controller makes of them:
the limit each kind's name has and why, and the rules derived from this one table.

Children are named <metadata.name>-<something>, so two graphs can arrive at the same name: graph
`a` with a service `b-nats` would own the Service `a-b-nats`, the broker of graph `a-b`. Two
rules follow from the table, each checked twice with the same words (by the API server as CEL,
at `kubectl apply`, and by the hook, for objects stored before the CRD had it):

- every name fits the limit of every kind that bears it (LENGTH_RULES);
- no service's name ends in what makes another graph's child of a kind the service's own
  children have (CLAIM_RULES): that child would be taken, or its name taken from it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
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
# (hooks/api/rules.py takes its length and claim rules from here).
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


def listed(words: list[str] | tuple[str, ...]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    return " and ".join(filter(None, [", ".join(words[:-1]), words[-1]]))


def cel_string(text: str) -> str:
    """`text` as a CEL string literal (JSON's escapes are CEL's)."""
    return json.dumps(text)


# Where the API server says a rule on the services' names failed (on the whole object, where the
# rules are, it would say <nil>).
SERVICES = ".spec.services"


def _cel_guard(cel: str) -> str:
    return f"!({cel}) || " if cel else ""


@dataclass(frozen=True)
class LengthRule:
    """The names `name` stands for fit their limit: <metadata.name>-<service> (metadata.name, for
    a name of the graph's own) is at most `longest` characters."""

    name: Name

    @property
    def longest(self) -> int:
        limit = self.name.limit
        assert limit is not None
        return limit - self.name.extra + (len("-") if self.name.per_service else 0)

    @property
    def message(self) -> str:
        name = self.name
        subject = "<metadata.name>-<service>" if name.per_service else "metadata.name"
        made = f" which {name.made_by} makes," if name.made_by else ""
        fix = ": shorten the InferaDeployment or the service name" if name.per_service else ""
        return (
            f"{subject} must be at most {self.longest} characters{name.when.words} (the {listed(name.bound_kinds)} "
            f"of {name.what}, {name.pattern},{made} must fit in {name.limit}: {name.why}){fix}"
        )

    def validation(self) -> dict[str, str]:
        guard = _cel_guard(self.name.when.cel)
        fits = f"size(self.metadata.name) + {self.name.extra}"
        if not self.name.per_service:
            return {"rule": f"{guard}{fits} <= {self.name.limit}", "message": self.message}
        rule = f"self.spec.services.all(s, {guard}{fits} + size(s) <= {self.name.limit})"
        return {"rule": rule, "message": self.message, "fieldPath": SERVICES}

    def problems(self, graph: str, spec: GraphSpec) -> Iterator[str]:
        if not self.name.when.graph(spec):
            return
        if self.name.per_service:
            named = [
                f"{graph}-{service}" for service, svc in sorted(spec.services.items()) if self.name.when.service(svc)
            ]
        else:
            named = [graph]
        for subject in named:
            if len(subject) > self.longest:
                yield f"{self.message} ({subject} has {len(subject)})"


def _length_rules() -> tuple[LengthRule, ...]:
    """A rule for each name whose limit a graph can outgrow, unless another name under the same
    condition holds it to as little or less."""
    rules: list[LengthRule] = []
    for name in NAMES:
        if name.limit is None:
            continue
        rule = LengthRule(name)
        # metadata.name is a DNS label: a name of a few characters more fits a subdomain.
        if not name.per_service and rule.longest >= DNS_LABEL_MAX:
            continue
        alike = [other for other in rules if (other.name.when, other.name.per_service) == (name.when, name.per_service)]
        if any(other.longest <= rule.longest for other in alike):
            continue
        rules = [other for other in rules if other not in alike] + [rule]
    return tuple(rules)


LENGTH_RULES = _length_rules()


@dataclass(frozen=True)
class ClaimRule:
    """No service's name ends in `tail` where that makes its children's name one that `other`
    (another graph's children, or this graph's under another service) has, in a kind of `kinds`
    that both have: one graph's child would stand where the other's should. `when` says which
    services' children share the kind."""

    tail: str  # a template's end: -nats, -{generation}
    other: Name
    kinds: tuple[str, ...]
    when: When

    @property
    def regex(self) -> re.Pattern[str]:
        """What the end of a service's name matches: a placeholder may also be the whole name."""
        ending = "".join(
            PLACEHOLDERS[part].regex if part in PLACEHOLDERS else re.escape(part)
            for part in re.split(f"({PLACEHOLDER.pattern})", self.tail.removeprefix("-"))
        )
        return re.compile(f"(^|-){ending}$" if self.tail[1:].startswith("{") else f"-{ending}$")

    def message(self, graph: str, service: str) -> str:
        ending = PLACEHOLDER.sub(lambda m: PLACEHOLDERS[m.group()].shown, self.tail)
        varying = [PLACEHOLDERS[part].words for part in PLACEHOLDER.findall(self.tail)]
        if varying:
            ending += f" ({listed(varying)})"
        return (
            f"service name '{service}' ends in {ending}{self.when.words}: its children, {graph}-{service}, would "
            f"have the name of the {listed(self.kinds)} of {self.other.what} ({self.other.pattern}) in another "
            "InferaDeployment (or this one), and one would stand in for the other; rename the service"
        )

    def validation(self) -> dict[str, str]:
        literal = not PLACEHOLDER.search(self.tail)
        matches = f"s.endsWith({cel_string(self.tail)})" if literal else f"s.matches({cel_string(self.regex.pattern)})"
        claimed = f"{self.when.service_cel} && {matches}" if self.when.service_cel else matches
        first = f"self.spec.services.filter(s, {claimed})[0]"
        # The message, with the graph's name and the first such service put in by CEL.
        pieces = re.split("(\x00[a-z]+\x00)", self.message("\x00graph\x00", "\x00service\x00"))
        expressions = {"\x00graph\x00": "self.metadata.name", "\x00service\x00": first}
        return {
            "rule": f"self.spec.services.all(s, {_cel_guard(self.when.service_cel)}!{matches})",
            "message": self.message("<metadata.name>", "<service>"),
            "messageExpression": " + ".join(expressions.get(piece) or cel_string(piece) for piece in pieces if piece),
            "fieldPath": SERVICES,
        }

    def problems(self, graph: str, spec: GraphSpec) -> Iterator[str]:
        for service, svc in sorted(spec.services.items()):
            if self.when.service(svc) and self.regex.search(service):
                yield self.message(graph, service)


def _claim_rules() -> tuple[ClaimRule, ...]:
    """A rule for each end of a name that a service's own children could arrive at with a kind
    they have, unless it ends in a shorter such end."""
    services = [name for name in NAMES if name.template == SERVICE]
    candidates = []
    for other in NAMES:
        if other.template == SERVICE:
            continue
        owners = [own for own in services if set(own.kinds) & set(other.kinds)]
        if not owners:
            continue
        tail = other.template.removeprefix(SERVICE) if other.per_service else f"-{other.template}"
        kinds = tuple(kind for kind in other.kinds if any(kind in own.kinds for own in owners))
        # Every service has such children when a name every service has is of one of the kinds.
        when = next((own.when for own in owners if not own.when.service_cel), owners[0].when)
        candidates.append(ClaimRule(tail, other, kinds, when))
    rules: list[ClaimRule] = []
    for rule in sorted(candidates, key=lambda candidate: len(candidate.tail)):
        if not any(rule.tail.endswith(kept.tail) and kept.when in (rule.when, ALWAYS) for kept in rules):
            rules.append(rule)
    return tuple(rules)


CLAIM_RULES = _claim_rules()


# In the order the hook checks them, and the CRD lists them.
RULES: tuple[ClaimRule | LengthRule, ...] = (*CLAIM_RULES, *LENGTH_RULES)


def problems(graph: str, spec: GraphSpec) -> Iterator[str]:
    """Why the graph's names break a rule of the table, each in the words of its CEL twin."""
    for rule in RULES:
        yield from rule.problems(graph, spec)
