"""spec.placement on the worker pods: the fabric domain a generation's workers share, told to the
cluster's scheduler as pod affinity, or to Kueue as a queue and its topology annotations
(docs/placement.md). Servers and the Endpoint Picker move no KV cache: they go anywhere."""

from typing import Any

from hooks.api.fields import SpecError
from hooks.api.graph import InferaDeployment
from hooks.api.placement import PlacementSpec
from hooks.api.services import ServiceSpec
from hooks.contract import field_at
from hooks.pod_rules import selects
from hooks.vocabulary import COMPONENT_LABEL, DEPLOYMENT_LABEL, generation_labels

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
# Kueue places the pod sets of one group (a LeaderWorkerSet's leader and workers) in one domain.
PODSET_GROUP = "kueue.x-k8s.io/podset-group-name"
# LeaderWorkerSet places each group in a domain of that label's of its own: its pod webhook gives
# the leader affinity to its group and anti-affinity to every other, its controller the ranks
# the leader's domain.
EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/exclusive-topology"
# As a preferred term weighs with the scheduler's other scores: the most it may.
PREFERRED_WEIGHT = 100


def generation_workers(idep: InferaDeployment) -> dict[str, str]:
    """The labels of every worker pod of the generation rendered: the router pairs any prefill
    with any decode worker of it, so all of them share the domain; under BlueGreen a new
    generation chooses its own."""
    return {DEPLOYMENT_LABEL: idep.name, COMPONENT_LABEL: "worker"} | generation_labels(idep)


def workload_labels(idep: InferaDeployment, svc: ServiceSpec) -> dict[str, str]:
    """Under Kueue, the queue a worker workload waits in (Kueue manages only what carries it)."""
    placement = idep.spec.placement
    if placement is None or placement.kueue is None or not svc.is_worker:
        return {}
    return {QUEUE_LABEL: placement.kueue.queue_name}


def workload_annotations(idep: InferaDeployment, svc: ServiceSpec) -> dict[str, str]:
    """For the cluster's scheduler, a multi-node pool's groups each in a domain of their own.

    Not pod affinity: the scheduler places a group's leader before its ranks exist, so affinity
    could put two leaders in a domain with room for one group and leave both groups short of a
    node forever. LeaderWorkerSet's exclusive topology keeps every other group out of a leader's
    domain, so a group that fits a domain always completes there."""
    key = idep.spec.placement.affinity_key if idep.spec.placement else None
    return {EXCLUSIVE_TOPOLOGY: key} if key is not None and svc.number_of_nodes > 1 else {}


def place(idep: InferaDeployment, service: str, svc: ServiceSpec, template: dict[str, Any]) -> None:
    """Lay spec.placement onto a worker's pod template (its extraPodSpec already laid over it):
    pod affinity beside the template's own terms, or Kueue's annotations."""
    placement = idep.spec.placement
    if placement is None or not svc.is_worker:
        return
    key = placement.affinity_key
    if placement.scheduler == "Kueue":
        _annotate_for_kueue(placement, service, svc, template["metadata"])
    elif key is not None and svc.number_of_nodes == 1:
        if placement.required:
            _refuse_repelling(idep, service, template["spec"], key)
        _add_pod_affinity(idep, placement, template["spec"], key)


def _annotate_for_kueue(placement: PlacementSpec, service: str, svc: ServiceSpec, metadata: dict[str, Any]) -> None:
    # Kueue ignores pod affinity when it places a pod set: its annotations say where instead.
    if placement.topology_key is None:
        return
    annotations = metadata.setdefault("annotations", {})
    annotations[REQUIRED_TOPOLOGY if placement.required else PREFERRED_TOPOLOGY] = placement.topology_key
    if svc.number_of_nodes > 1:
        annotations[PODSET_GROUP] = service


def _add_pod_affinity(idep: InferaDeployment, placement: PlacementSpec, spec: dict[str, Any], key: str) -> None:
    # The first pod of a generation matches its own term, which the scheduler then lets it
    # satisfy on any node with the label: that pod chooses the domain. A multi-node pool's
    # groups choose theirs (workload_annotations), and single-node workers follow them.
    term = {"labelSelector": {"matchLabels": generation_workers(idep)}, "topologyKey": key}
    pod_affinity = spec.setdefault("affinity", {}).setdefault("podAffinity", {})
    if placement.required:
        pod_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)
    else:
        preferred = {"weight": PREFERRED_WEIGHT, "podAffinityTerm": term}
        pod_affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(preferred)


def _refuse_repelling(idep: InferaDeployment, service: str, spec: dict[str, Any], key: str) -> None:
    """SpecError for an extraPodSpec that keeps the generation's workers out of each other's
    domain, which a required placement puts them in: they would wait Pending forever."""
    workers = generation_workers(idep)
    anti = field_at(spec, "affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution") or []
    for index, term in enumerate(anti):
        # A term without a selector selects no pod.
        if term.get("topologyKey") == key and "labelSelector" in term and selects(term["labelSelector"], workers):
            raise SpecError(
                f"spec.services.{service}.extraPodSpec.affinity.podAntiAffinity."
                f"requiredDuringSchedulingIgnoredDuringExecution[{index}]: keeps the graph's workers out of each "
                f"other's {key} domain, which spec.placement requires them to share; remove the term, narrow "
                "its labelSelector, or set placement.mode Preferred"
            )


def _pinned_domains(extra: dict[str, Any] | None, key: str) -> set[str] | None:
    """The values of `key` an extraPodSpec confines its pods' nodes to, or None for any."""
    if not extra:
        return None
    pinned: set[str] | None = None
    selected = (extra.get("nodeSelector") or {}).get(key)
    if isinstance(selected, str):
        pinned = {selected}
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    terms = field_at(extra, "affinity", "nodeAffinity", required, "nodeSelectorTerms") or []
    # Terms are alternatives: they pin the domain only when every one of them does.
    allowed: set[str] = set()
    for term in terms:
        values = [
            set(expression.get("values") or [])
            for expression in term.get("matchExpressions") or []
            if expression.get("key") == key and expression.get("operator") == "In"
        ]
        if not values:
            return pinned
        allowed |= set.intersection(*values)
    if terms:
        pinned = allowed if pinned is None else pinned & allowed
    return pinned


def check_pinned_domains(idep: InferaDeployment) -> None:
    """SpecError when worker services' extraPodSpecs pin their nodes to domains they cannot
    share, which a required placement asks of them."""
    placement = idep.spec.placement
    key = placement.affinity_key if placement else None
    if placement is None or key is None or not placement.required:
        return
    shared: set[str] | None = None
    pinned_by: list[str] = []
    for service, svc in sorted(idep.spec.services.items()):
        pinned = _pinned_domains(svc.extra_pod_spec, key) if svc.is_worker else None
        if pinned is None:
            continue
        pinned_by.append(service)
        shared = pinned if shared is None else shared & pinned
        if not shared:
            services = " and ".join(f"spec.services.{name}.extraPodSpec" for name in pinned_by)
            allowed = "it allows" if len(pinned_by) == 1 else "they all allow"
            raise SpecError(
                f"{services}: no {key} domain is left that {allowed}, while spec.placement requires every worker "
                "of the graph in one: pin them to one domain, or set placement.mode Preferred"
            )
