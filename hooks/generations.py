"""Generations of a graph under BlueGreen, read from what exists: the hook keeps no state.

A generation is a digest of what the graph's processes run: the pod templates of every pool,
router and Endpoint Picker (not their metadata, not their spread across nodes, not replica
counts, not the autoscaler). Its pods carry it as a label, its routers and picker select on it,
and its workloads, picker and InferencePool are named after it for as long as it lives. The
front door (each server's Service and, with GAIE, the HTTPRoute) selects one generation: the
serving one. A change that makes a new generation
renders it beside the serving one, which is kept exactly as applied; the front door moves once
every pool of the new generation is ready, and on the next sync the old generation, no longer
served, is no longer answered, so Metacontroller deletes it.

Which generation serves is never read from one object: the observed front door and the previous
status's servingGeneration (what the last answer's front door selected) are witnesses, and the
generations present and their readiness decide between them. A front door deleted or edited by
hand is restored to the serving generation, never advanced to one that is not ready. Each
generation's workloads record their siblings' pod templates (TEMPLATES_ANNOTATION), so a workload
of a kept generation deleted mid-rollout is recreated when the spec still renders it unchanged.

Outside BlueGreen the generation is "": children are named and selected as they always were.
"""

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hooks.api.fields import SpecError
from hooks.api.graph import InferaDeployment
from hooks.contract import as_last_applied, field_at
from hooks.kubernetes_names import DNS_LABEL, DNS_LABEL_MAX
from hooks.observed import (
    GROUP_SIZE_PATH,
    Observed,
    current_ready,
    live_replicas,
    observed_workload,
    pod_templates,
    service_of,
)
from hooks.vocabulary import (
    DIGEST_LENGTH,
    EPP_SUFFIX,
    GENERATION_LABEL,
    WORKLOAD_KINDS,
    child_name,
    generation_name,
    route_name,
)


def generation_of(child: dict[str, Any]) -> str:
    """The generation a child belongs to by its label ("" for one made outside BlueGreen)."""
    label = field_at(child, "metadata", "labels", GENERATION_LABEL)
    return label if isinstance(label, str) else ""


def belongs_to_a_generation(child: dict[str, Any]) -> bool:
    """A child each generation has its own of: a service's workload, the Endpoint Picker and its
    Service, the InferencePool."""
    kind = child.get("kind")
    if kind in WORKLOAD_KINDS or kind == "InferencePool":
        return True
    return kind == "Service" and service_of(child) == EPP_SUFFIX


# Pod fields that say only where a pod runs, not what it runs: left out of the digest.
# topologySpreadConstraints is the one the hook injects (a server that may run several replicas,
# several Endpoint Pickers) and so follows a count, which must never start a rollout. It is left
# out wherever it comes from (the hook, extraPodSpec, a patch): the digest is also taken of last
# applied children, which do not say who set a field, and pods that differ only in their spread
# run the same thing, so replacing them in place mixes no code. Fields that choose the nodes
# (nodeSelector, affinity, tolerations) stay in: they may choose other hardware, and leaving
# them out would change the generation of every running graph that sets them.
PLACEMENT_FIELDS = ("topologySpreadConstraints",)


def digest(workloads: Iterable[dict[str, Any]]) -> str:
    """The generation of workloads rendered (or last applied) at generation "": what their pods
    run, by workload kind and name. Replica counts, pod metadata and placement are left out, so
    scaling, relabelling and spreading never start a rollout; a graph without placement fields
    keeps the digest it had before they were left out. Of two sets of workloads at one other
    generation, equal digests say their pods run the same."""
    runs = [
        [child["kind"], field_at(child, "metadata", "name"), *_runs(child)]
        for child in workloads
        if child.get("kind") in WORKLOAD_KINDS
    ]
    runs.sort(key=lambda run: (run[0], str(run[1])))
    return _sha256(runs)[:DIGEST_LENGTH]


def _runs(workload: dict[str, Any]) -> list[Any]:
    """What a workload's pods run and how many form a group: its group size and its pod
    templates' specs without their placement fields."""
    size = field_at(workload, *GROUP_SIZE_PATH)
    specs = [template.get("spec") for template, _ in pod_templates(workload)]
    return [size, [_what_runs(spec) for spec in specs]]


def _what_runs(spec: Any) -> Any:
    if not isinstance(spec, dict):
        return spec
    return {key: value for key, value in spec.items() if key not in PLACEMENT_FIELDS}


def _sha256(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# On every workload of a BlueGreen generation: that generation's workloads, each as its kind, its
# name without the generation and a digest of its pod templates. A workload deleted while its
# generation is kept is then recreated from the spec exactly when the spec still renders it the
# same; its siblings' last-applied records alone say nothing of it.
TEMPLATES_ANNOTATION = "infera.amd.com/generation-templates"
Recorded = tuple[str, str, str]  # (kind, name without the generation, template digest)
# Hex characters of a template's digest: 64 bits, where no forged or accidental collision with
# a spec's own render is to be expected.
TEMPLATE_DIGEST_LENGTH = 16


def template_digest(workload: dict[str, Any]) -> str:
    """What one workload's pods run (_runs), as a digest."""
    return _sha256(_runs(workload))[:TEMPLATE_DIGEST_LENGTH]


def workload_digests(children: Iterable[dict[str, Any]]) -> dict[str, str]:
    """Each workload's template digest, by "Kind name"."""
    return {
        f"{child['kind']} {field_at(child, 'metadata', 'name')}": template_digest(child)
        for child in children
        if child.get("kind") in WORKLOAD_KINDS
    }


def name_suffix(generation: str) -> str:
    """What a generation adds to its children's names (nothing for the unlabelled one)."""
    return f"-{generation}" if generation else ""


def _plain_name(child: dict[str, Any]) -> str:
    return str(field_at(child, "metadata", "name")).removesuffix(name_suffix(generation_of(child)))


def with_templates_recorded(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`children` of a BlueGreen generation, each of its workloads annotated with the record of
    them all (TEMPLATES_ANNOTATION)."""
    workloads = [c for c in children if c["kind"] in WORKLOAD_KINDS and generation_of(c)]
    if not workloads:
        return children
    record = json.dumps(
        sorted([c["kind"], _plain_name(c), template_digest(c)] for c in workloads), separators=(",", ":")
    )
    recording = {id(child) for child in workloads}
    return [with_record(child, record) if id(child) in recording else child for child in children]


def with_record(child: dict[str, Any], record: str) -> dict[str, Any]:
    metadata = child["metadata"]
    annotations = {**(metadata.get("annotations") or {}), TEMPLATES_ANNOTATION: record}
    return {**child, "metadata": {**metadata, "annotations": annotations}}


def recorded_templates(
    idep: InferaDeployment, observed: Observed, generation: str
) -> tuple[str, list[Recorded]] | None:
    """The record of `generation`'s workloads (as annotated, and parsed) on the first of its
    observed workloads that holds one the graph could have written (workloads named after it,
    each with a digest); None when none does (all of them gone, or made by a build that did not
    record them). What anyone else could write there is not believed, nor quoted at length."""
    for (kind, _), child in sorted(observed.items()):
        if kind not in WORKLOAD_KINDS or generation_of(child) != generation:
            continue
        text = field_at(child, "metadata", "annotations", TEMPLATES_ANNOTATION)
        try:
            record = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            continue
        if isinstance(record, list) and record and all(_recordable(entry, idep) for entry in record):
            return text, [(kind, name, digest) for kind, name, digest in record]
    return None


def _recordable(entry: Any, idep: InferaDeployment) -> bool:
    return (
        isinstance(entry, list)
        and len(entry) == 3
        and entry[0] in WORKLOAD_KINDS
        and isinstance(entry[1], str)
        and entry[1].startswith(child_name(idep, ""))
        and len(entry[1]) <= DNS_LABEL_MAX
        and DNS_LABEL.fullmatch(entry[1]) is not None
        and isinstance(entry[2], str)
        and re.fullmatch(f"[0-9a-f]{{{TEMPLATE_DIGEST_LENGTH}}}", entry[2]) is not None
    )


def front_door(idep: InferaDeployment, observed: Observed) -> set[str]:
    """The generations the observed front door selects: each server Service's, and the one
    whose InferencePool the HTTPRoute routes to."""
    selected = set()
    for service, svc in idep.spec.services.items():
        selector = field_at(observed.get(("Service", child_name(idep, service))), "spec", "selector")
        if not svc.is_worker and isinstance(selector, dict):
            label = selector.get(GENERATION_LABEL)
            selected.add(label if isinstance(label, str) else "")
    rules = field_at(observed.get(("HTTPRoute", route_name(idep))), "spec", "rules")
    backends = rules[0].get("backendRefs") if isinstance(rules, list) and rules and isinstance(rules[0], dict) else None
    for backend in backends if isinstance(backends, list) else []:
        name = backend.get("name") if isinstance(backend, dict) else None
        pool = child_name(idep, "pool")
        if isinstance(name, str) and (name == pool or name.startswith(f"{pool}-")):
            selected.add(name.removeprefix(pool).removeprefix("-"))
    return selected


def ready(idep: InferaDeployment, observed: Observed, live: dict[str, int]) -> bool:
    """Whether every pool and router of the generation `idep` renders runs its desired ready
    replicas (at least the count the serving generation has now, for an autoscaled one), and
    its Endpoint Picker one."""
    for service, svc in idep.spec.services.items():
        if current_ready(observed_workload(idep, service, observed)) < svc.desired_replicas(live.get(service)):
            return False
    if idep.spec.gaie.enabled:
        picker = observed.get(("Deployment", generation_name(idep, EPP_SUFFIX)))
        return current_ready(picker) >= 1
    return True


def present(observed: Observed) -> frozenset[str]:
    """The generations that have a child observed."""
    return frozenset(generation_of(child) for child in observed.values() if belongs_to_a_generation(child))


@dataclass(frozen=True)
class Rollout:
    """Which generations this sync answers, from the spec and the observed children."""

    desired: str  # the spec's generation
    served: frozenset[str]  # the generations the observed front door selects
    serving: str  # the generation this answer's front door selects
    # Generations answered besides the desired one, exactly as applied: the serving one and those
    # the observed front door still selects. Any other (a change replaced mid-rollout, or one no
    # longer served) is left out of the answer, and so deleted.
    kept: frozenset[str]
    # The generation that served before this answer: the rendered live replicas (an
    # autoscaler's count) are read from its workloads, and readiness is judged by them.
    front: str
    present: frozenset[str]  # every generation with a child observed

    @property
    def door_restored(self) -> bool:
        """Whether the observed front door does not select the generation that serves, which is
        not the incoming one: it was deleted or edited, and this answer puts it back."""
        return self.serving != self.desired and self.served != {self.serving}


def plan(idep: InferaDeployment, observed: Observed, recorded: str | None = None) -> Rollout:
    """The rollout to the generation `idep` renders. The front door moves to it once every pool
    of it is ready (autoscaled ones at the count their autoscaler keeps now); until then it
    stays at the generation that serves. Two witnesses say which that is: `recorded` (the
    previous status's servingGeneration) and the observed front door. Where both name the same
    generation it serves, ready or not; where they disagree, or one is gone, a ready generation
    wins, the witnessed ones first: a deleted or edited front door never takes traffic to a
    generation that is not ready, and never costs the one that serves its workloads."""
    desired = idep.graph_generation
    served = frozenset(front_door(idep, observed))
    generations = present(observed)
    behind_door = served & generations
    witnessed = list(dict.fromkeys(g for g in (recorded, *sorted(served)) if g in generations))
    # Without a witness, an older generation exists only because it served.
    older = sorted(generations - {desired})
    front = (witnessed or older or [desired])[0]
    live = live_replicas(idep.at_generation(front), observed)

    def is_ready(generation: str) -> bool:
        return generation in generations and ready(idep.at_generation(generation), observed, live)

    if is_ready(desired):
        serving = desired
    elif recorded in generations and behind_door == {recorded}:
        serving = recorded
    else:
        candidates = list(dict.fromkeys([*witnessed, *older]))
        serving = next((g for g in candidates if is_ready(g)), candidates[0] if candidates else desired)
    kept = (behind_door | {serving}) - {desired}
    return Rollout(desired, served, serving, kept, front, generations)


def runs_the_spec(generation: str, observed: Observed, workloads_at: Callable[[str], dict[str, str]]) -> bool:
    """Whether every observed workload of `generation` runs exactly what the spec renders at it,
    whatever its name. `workloads_at(generation)`: the template digest of each workload the spec
    renders at `generation`, by "Kind name". A workload of it that is gone does not count:
    restoring it is the serving generation's business (restoration)."""
    applied = workload_digests(
        as_last_applied(child) for child in observed.values() if generation_of(child) == generation
    )
    rendered = workloads_at(generation)
    return bool(applied) and all(rendered.get(key) == value for key, value in applied.items())


def named_otherwise(rollout: Rollout, observed: Observed, workloads_at: Callable[[str], dict[str, str]]) -> str | None:
    """An observed generation that already runs what the spec renders, under a name other than
    the one this build's digest gives it (the served one first); None when there is none. A
    build whose digest reads the templates otherwise (the CHANGELOG says which did) then renames
    nothing: such a generation goes on under its name, serving or rolling out, rather than being
    replaced by itself."""
    labelled = {generation_of(child) for child in observed.values() if child.get("kind") in WORKLOAD_KINDS}
    for generation in sorted(labelled - {"", rollout.desired}, key=lambda name: (name not in rollout.served, name)):
        if runs_the_spec(generation, observed, workloads_at):
            return generation
    return None


def check_switch(
    rollout: Rollout, observed: Observed, wanted: str, workloads_at: Callable[[str], dict[str, str]]
) -> None:
    """A switch between RollingUpdate and BlueGreen hands over between a generation whose routers
    see every worker of the graph ("") and a labelled one: harmless only while both run the
    same thing, so it must come in a change of its own. `wanted`: the spec's generation."""
    legacy = "" in rollout.kept or (rollout.desired == "" and rollout.kept)
    if not legacy:
        return
    if rollout.desired == "":
        # What it runs, not its name: one named by another build's digest may run this spec.
        running = min(rollout.kept)
        if running == wanted or runs_the_spec(running, observed, workloads_at):
            return
    else:
        running = digest(
            as_last_applied(child)
            for child in observed.values()
            if belongs_to_a_generation(child) and generation_of(child) == ""
        )
        if running == wanted:
            return
    raise SpecError(
        f"spec.rollout.strategy: the running pods (generation {running}) run something other than this spec "
        f"(generation {wanted}), and the routers of a RollingUpdate graph see every worker of the graph: "
        "change the strategy in a change of its own, then change what runs"
    )


def named(generations: Iterable[str]) -> str:
    return ", ".join(generation or '"" (RollingUpdate)' for generation in generations)
