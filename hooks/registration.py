"""Which child kinds the CompositeController registers, and what follows from that.

Metacontroller fails a whole sync whose answer holds a child of a kind it does not register,
and the bundle registers the optional kinds through kustomize components
(vocabulary.CHILD_KINDS says which). So, in one place:

- a default nobody asked for (the broker's NetworkPolicy, a disruption budget) is left out where
  the controller cannot create it, and a notice says what is missing and how to enable it;
- GAIE is all or nothing: its objects, its sidecars and the router's direct mode go together;
- any other child of an unregistered kind withholds its service (or plumbing part), whose
  observed children are kept as applied, and the status fails naming the component to enable.
"""

from collections.abc import Iterable
from typing import Any

from hooks import vocabulary
from hooks.api.graph import InferaDeployment
from hooks.contract import Registration
from hooks.encoding import EncodedChild
from hooks.immutable import kept_as_applied
from hooks.observed import service_of
from hooks.renderers import autoscaling, gaie, network

# A request that does not say which kinds are registered (a hand-written body).
EVERY_KIND = Registration()


def where_registered(kind: str) -> str:
    """Where the bundle registers `kind`: its CompositeController, or a kustomize component."""
    component = vocabulary.BY_KIND[kind].component if kind in vocabulary.BY_KIND else None
    if component is None:
        return "it in metacontroller/compositecontroller.yaml"
    return f"the kustomize component metacontroller/components/{component}"


def keeps_default(registration: Registration, child: dict[str, Any], asked_for: bool) -> bool:
    """Whether a child the graph can run without is answered: where the spec asks for it, or
    else where the controller can create it, rather than holding up what it would protect
    (defaults_left_out then says what is missing)."""
    return asked_for or registration.allows(child)


def gateway_registered(gateway: Iterable[dict[str, Any]], registration: Registration) -> bool:
    """Whether every GAIE object can be created: if not, the graph renders as with GAIE off, and
    the gateway objects are withheld for withhold_unregistered to name."""
    return all(map(registration.allows, gateway))


def withhold_unregistered(
    registration: Registration, children: list[EncodedChild], observed: list[dict[str, Any]]
) -> tuple[list[EncodedChild], list[str]]:
    """The answer without the services (or plumbing parts) that hold a child of an unregistered
    kind, whose `observed` children are kept exactly as applied instead; and one message per
    withheld child."""
    withheld = [child for child in children if not registration.registers(child.kind, child.api_version)]
    if not withheld:
        return children, []
    blocked = {child.service for child in withheld}
    answer = [child for child in children if child.service not in blocked]
    answer += kept_as_applied([child for child in observed if service_of(child) in blocked], observed)
    messages = [
        f"{child.kind} {child.name} cannot be created: this CompositeController does not "
        f"register {child.kind} ({child.api_version}); enable {where_registered(child.kind)}"
        for child in withheld
    ]
    return answer, messages


def defaults_left_out(idep: InferaDeployment, registration: Registration) -> list[str]:
    """Say that the default disruption budgets, or the broker's default NetworkPolicy, are
    missing, and why."""
    notices = []
    budget = vocabulary.BY_KIND["PodDisruptionBudget"]
    services = [
        service
        for service, svc in sorted(idep.spec.services.items())
        if svc.disruption_budget is None and autoscaling.budget_max_unavailable(svc) is not None
    ]
    if gaie.epp_disruption_budget(idep):
        services.append(vocabulary.EPP_SUFFIX)
    if services and not registration.registers(budget.kind, budget.api_version):
        notices.append(
            f"no PodDisruptionBudget for {', '.join(services)}: this CompositeController does not register "
            f"{budget.kind} ({budget.api_version}); enable {where_registered(budget.kind)}"
        )
    if network.asked_for(idep) or not idep.spec.nats.deploy:
        return notices
    policy = vocabulary.BY_KIND["NetworkPolicy"]
    unprotected = "no NetworkPolicy for the NATS broker, so any pod of the cluster may connect to it"
    if host_network := network.host_network_services(idep):
        notices.append(
            f"{unprotected}: {', '.join(host_network)} {'runs' if len(host_network) == 1 else 'run'} on the node's "
            f"network, which a policy cannot tell from the node's own traffic; set networkPolicy.isolate to broker "
            f"to have it anyway (then those pods reach the broker only from its node)"
        )
    elif not registration.registers(policy.kind, policy.api_version):
        notices.append(
            f"{unprotected}: this CompositeController does not register {policy.kind} ({policy.api_version}); "
            f"enable {where_registered(policy.kind)}"
        )
    return notices
