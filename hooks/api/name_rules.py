"""The rules derived from the table of child names (hooks/api/names.py), each checked twice with
the same words (by the API server as CEL, at `kubectl apply`, and by the hook, for objects stored
before the CRD had it):

- every name fits the limit of every kind that bears it (LENGTH_RULES);
- no service's name ends in what makes another graph's child of a kind the service's own
  children have (CLAIM_RULES): that child would be taken, or its name taken from it.

They stand apart from the table because they are what it is read for: the CRD's validations
(hooks/api/rules.py) and the problems the hook finds in a graph (hooks/api/graph.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

from hooks.api.names import ALWAYS, NAMES, PLACEHOLDER, PLACEHOLDERS, SERVICE, GraphSpec, Name, When
from hooks.kubernetes_names import DNS_LABEL_MAX


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
