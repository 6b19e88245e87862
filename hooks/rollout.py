"""The sync's rollout step: which generations of a graph to answer, and what of them to keep
or restore (hooks.generations reads generations from what exists).

Under BlueGreen the spec's generation is a digest of what its workloads run, so it is computed
from a render of the spec (spec_generation); an observed generation is compared with the spec by
the same render at that generation (workloads_at). Both are pure functions of the spec and the
registered kinds, which the sync calls through its memo; `plan` takes what they made.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hooks import generations
from hooks.api.graph import InferaDeployment
from hooks.contract import HookRequest, Registration, field_at
from hooks.encoding import EncodedChild
from hooks.generations import Recorded, Rollout, name_suffix, named, template_digest, with_record
from hooks.immutable import encoded, kept_as_applied
from hooks.observed import Observed, listed_briefly, live_replicas, service_of
from hooks.render import RenderInputs, render_children
from hooks.vocabulary import EPP_SUFFIX, WORKLOAD_KINDS, child_name, generation_name, pool_name


def _rendered_at(
    idep: InferaDeployment, registration: Registration, generation: str, live: dict[str, int] | None = None
) -> list[dict[str, Any]]:
    """The spec's children at `generation` as it would serve, its model downloaded (and its
    autoscalers at `live`)."""
    cache = None if idep.spec.model_cache is None else "Ready"
    inputs = RenderInputs(live or {}, model_phase=cache, serving=generation)
    return render_children(idep.at_generation(generation), registration, inputs)


def spec_generation(idep: InferaDeployment, registration: Registration) -> str:
    """The generation the spec renders under BlueGreen: the digest of what its workloads run."""
    return generations.digest(_rendered_at(idep, registration, ""))


def workloads_at(idep: InferaDeployment, registration: Registration, generation: str) -> dict[str, str]:
    """The template digest of each workload the spec renders at `generation`, by "Kind name"."""
    return generations.workload_digests(_rendered_at(idep, registration, generation))


def leaving_blue_green(idep: InferaDeployment, observed: Observed) -> bool:
    """Whether a graph outside BlueGreen still has a labelled generation: the switch is then
    checked against the spec's generation (generations.check_switch)."""
    return not idep.spec.blue_green and any(
        generations.generation_of(child) for child in observed.values() if generations.belongs_to_a_generation(child)
    )


def compared_generations(idep: InferaDeployment, observed: Observed, spec_digest: str) -> list[str]:
    """The observed generations planning compares with the spec rendered at them (workloads_at):
    under BlueGreen, those of workloads other than the spec's own (named_otherwise); leaving it,
    every labelled one (check_switch reads the one still served); else none."""
    if not idep.spec.blue_green and not spec_digest:
        return []
    if idep.spec.blue_green:
        labelled = {
            generations.generation_of(child) for child in observed.values() if child.get("kind") in WORKLOAD_KINDS
        }
        return sorted(labelled - {"", spec_digest})
    return sorted(generations.present(observed) - {""})


def plan(
    idep: InferaDeployment,
    observed: Observed,
    previous: dict[str, Any],
    spec_digest: str,
    compared: Mapping[str, dict[str, str]],
) -> Rollout | None:
    """Which generations to answer, or None for a graph that has only ever run outside BlueGreen.
    `spec_digest`: the spec's generation (spec_generation; "" outside BlueGreen and not leaving
    it); `compared`: workloads_at each of compared_generations."""
    desired = spec_digest if idep.spec.blue_green else ""
    recorded = field_at(previous, "rollout", "servingGeneration")
    recorded = recorded if isinstance(recorded, str) else None
    rollout = generations.plan(idep.at_generation(desired), observed, recorded)
    if not idep.spec.blue_green and rollout.served | rollout.present <= {""}:
        return None
    if idep.spec.blue_green and (named := generations.named_otherwise(rollout, observed, compared.__getitem__)):
        rollout = generations.plan(idep.at_generation(named), observed, recorded)
    generations.check_switch(rollout, observed, spec_digest, compared.__getitem__)
    return rollout


def kept_generations(request: HookRequest, rollout: Rollout | None) -> list[EncodedChild]:
    """The children of generations still served that the spec no longer renders, as applied."""
    if rollout is None or not rollout.kept:
        return []
    kept = [
        child
        for child in request.children
        if generations.belongs_to_a_generation(child) and generations.generation_of(child) in rollout.kept
    ]
    return kept_as_applied(kept, request.children)


@dataclass(frozen=True)
class Restoration:
    """The workloads of a kept generation that are gone, by what its record says."""

    generation: str
    record: str  # the record's annotation, which a restored workload carries again
    missing: list[Recorded]
    # The picker's companions that are gone too (its Service, the InferencePool), and the
    # template digest the record holds for the picker they follow.
    companions: list[tuple[str, str]]
    picker: str | None
    # The replicas its autoscaled services have now (their workloads are rendered at them).
    live: dict[str, int]


def restored_children(
    restoration: Restoration, idep: InferaDeployment, registration: Registration, rollout: Rollout
) -> tuple[list[EncodedChild], list[str]]:
    """The children of `restoration` that the spec, rendered at its generation as it serves,
    renders exactly as that generation recorded them, to create anew; and why the others cannot
    be."""
    rendered = _rendered_at(idep, registration, restoration.generation, restoration.live)
    children, lost = _recreated(restoration, rendered, rollout)
    return [encoded(child) for child in children], [lost] if lost else []


def restoration_needed(rollout: Rollout | None, observed: Observed, idep: InferaDeployment) -> Restoration | None:
    """The recorded workloads (and picker companions) of the generation that serves, while it is
    not the spec's, that are not observed; None when none are gone, or it recorded nothing (a
    generation made before templates were recorded: its pools then say they are short)."""
    if rollout is None:
        return None
    generation = rollout.serving
    recorded = generations.recorded_templates(idep, observed, generation) if generation != rollout.desired else None
    if recorded is None:
        return None
    record, entries = recorded
    at = idep.at_generation(generation)
    missing = [(kind, name, d) for kind, name, d in entries if (kind, name + name_suffix(generation)) not in observed]
    picker = next(
        (d for kind, name, d in entries if (kind, name) == ("Deployment", child_name(idep, EPP_SUFFIX))), None
    )
    companions = []
    if picker is not None:
        wanted = [("Service", generation_name(at, EPP_SUFFIX)), ("InferencePool", pool_name(at))]
        companions = [key for key in wanted if key not in observed]
    if not missing and not companions:
        return None
    return Restoration(generation, record, missing, companions, picker, live_replicas(at, observed))


def _recreated(
    restoration: Restoration, rendered: list[dict[str, Any]], rollout: Rollout
) -> tuple[list[dict[str, Any]], str | None]:
    """What of `restoration` the spec, `rendered` at its generation, renders exactly as recorded:
    those children (each workload with the generation's record again), and what to do about the
    others, which cannot be recreated from this spec (None when there are none). The picker's
    companions follow the picker's template: they are named after the generation and made of
    what its command holds."""
    by_key = {(child["kind"], child["metadata"]["name"]): child for child in rendered}
    restored, lost = [], []
    suffix = name_suffix(restoration.generation)
    for kind, name, recorded in restoration.missing:
        child = by_key.get((kind, name + suffix))
        if child is not None and template_digest(child) == recorded:
            restored.append(with_record(child, restoration.record))
        else:
            lost.append(f"{kind} {name + suffix}")
    picker = next((c for c in rendered if c["kind"] == "Deployment" and service_of(c) == EPP_SUFFIX), None)
    same_picker = picker is not None and template_digest(picker) == restoration.picker
    for key in restoration.companions:
        if same_picker and key in by_key:
            restored.append(by_key[key])
        else:
            lost.append(" ".join(key))
    return restored, _lost(restoration, lost, rollout) if lost else None


def _lost(restoration: Restoration, names: list[str], rollout: Rollout) -> str:
    generation = named([restoration.generation])
    one = len(names) == 1
    them = "it" if one else "them"
    return (
        f"{listed_briefly(names)} of the serving generation {generation} {'is' if one else 'are'} gone, and this "
        f"spec renders {them} differently: revert the spec to generation {generation}'s to recreate {them}, or let "
        f"generation {named([rollout.desired])} become ready to replace {them}"
    )
