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

Outside BlueGreen the generation is "": children are named and selected as they always were.
"""

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hooks.api.fields import SpecError
from hooks.api.graph import InferaDeployment
from hooks.api.status import ConditionStatus, PoolProgress, RolloutPhase, RolloutStatus
from hooks.contract import as_last_applied, field_at
from hooks.observed import Observed, as_int, current_ready, live_replicas, observed_workload, pod_templates, service_of
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
    runs = []
    for child in workloads:
        if child.get("kind") not in WORKLOAD_KINDS:
            continue
        size = field_at(child, "spec", "leaderWorkerTemplate", "size")
        specs = [_what_runs(template.get("spec")) for template, _ in pod_templates(child)]
        runs.append([child["kind"], field_at(child, "metadata", "name"), size, specs])
    runs.sort(key=lambda run: (run[0], str(run[1])))
    encoded = json.dumps(runs, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:DIGEST_LENGTH]


def _what_runs(spec: Any) -> Any:
    """A pod template's spec without its placement fields."""
    if not isinstance(spec, dict):
        return spec
    return {key: value for key, value in spec.items() if key not in PLACEMENT_FIELDS}


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


@dataclass(frozen=True)
class Rollout:
    """Which generations this sync answers, from the spec and the observed children."""

    desired: str  # the spec's generation
    served: frozenset[str]  # the generations the observed front door selects
    serving: str  # the generation this answer's front door selects

    @property
    def kept(self) -> frozenset[str]:
        """Generations answered exactly as applied: those still served that the spec no longer
        renders. Any other generation (a change replaced mid-rollout, or one no longer served)
        is left out of the answer, and so deleted."""
        return self.served - {self.desired}

    @property
    def front(self) -> str:
        """The generation the front door was at before this answer: the rendered live replicas
        (an autoscaler's count) are read from its workloads."""
        return min(self.kept) if self.kept else self.desired


def plan(idep: InferaDeployment, observed: Observed) -> Rollout:
    """The rollout to the generation `idep` renders: the front door stays where it is until every
    pool of that generation is ready (autoscaled ones at the count their autoscaler keeps now)."""
    desired = idep.graph_generation
    served = frozenset(front_door(idep, observed))
    others = served - {desired}
    if not others:
        return Rollout(desired, served, desired)
    live = live_replicas(idep.at_generation(min(others)), observed)
    return Rollout(desired, served, desired if ready(idep, observed, live) else min(others))


def runs_the_spec(generation: str, observed: Observed, runs_at: Callable[[str], str]) -> bool:
    """Whether the observed workloads of `generation` run exactly what the spec renders at it,
    whatever its name. `runs_at(generation)`: the digest of the spec's workloads rendered at
    `generation`."""
    applied = [as_last_applied(child) for child in observed.values() if generation_of(child) == generation]
    return digest(applied) == runs_at(generation)


def named_otherwise(rollout: Rollout, observed: Observed, runs_at: Callable[[str], str]) -> str | None:
    """An observed generation that already runs what the spec renders, under a name other than
    the one this build's digest gives it (the served one first); None when there is none.
    Builds from c3dfbbd to a2fc70b put the routers' spread into the digest: such a generation
    goes on under its name, serving or rolling out, rather than being replaced by itself."""
    named = {generation_of(child) for child in observed.values() if child.get("kind") in WORKLOAD_KINDS}
    for generation in sorted(named - {"", rollout.desired}, key=lambda name: (name not in rollout.served, name)):
        if runs_the_spec(generation, observed, runs_at):
            return generation
    return None


def check_switch(rollout: Rollout, observed: Observed, runs_at: Callable[[str], str]) -> None:
    """A switch between RollingUpdate and BlueGreen hands over between a generation whose routers
    see every worker of the graph ("") and a labelled one: harmless only while both run the
    same thing, so it must come in a change of its own."""
    legacy = "" in rollout.kept or (rollout.desired == "" and rollout.kept)
    if not legacy:
        return
    wanted = runs_at("")
    if rollout.desired == "":
        # What it runs, not its name: one named by another build's digest may run this spec.
        running = min(rollout.kept)
        if running == wanted or runs_the_spec(running, observed, runs_at):
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


def created(idep: InferaDeployment, observed: Observed) -> str | None:
    """When the oldest workload of the generation `idep` renders was created (None: not yet)."""
    stamps = [
        stamp
        for service in idep.spec.services
        if isinstance(
            stamp := field_at(observed_workload(idep, service, observed), "metadata", "creationTimestamp"), str
        )
    ]
    return min(stamps, default=None)


@dataclass(frozen=True)
class RolloutRead:
    """What the status roll-up reads of a rollout, as plain data (part of the status memo's key)."""

    desired: str
    serving: str
    kept: tuple[str, ...]
    present: tuple[str, ...]  # every generation with a child observed

    @classmethod
    def of(cls, rollout: Rollout, children: Iterable[dict[str, Any]]) -> "RolloutRead":
        present = {generation_of(child) for child in children if belongs_to_a_generation(child)}
        return cls(rollout.desired, rollout.serving, tuple(sorted(rollout.kept)), tuple(sorted(present)))

    def key(self) -> list[Any]:
        return [self.desired, self.serving, list(self.kept), list(self.present)]


def _named(generations: Iterable[str]) -> str:
    return ", ".join(generation or '"" (RollingUpdate)' for generation in generations)


def rollout_status(
    idep: InferaDeployment, read: RolloutRead, observed: Observed, now: Callable[[], datetime]
) -> tuple[RolloutStatus, tuple[ConditionStatus, str]]:
    """The rollout's status and its Progressing condition (status, reason), for `idep` at the
    desired generation. The clock is read only while a new generation is not yet serving."""
    strategy = idep.spec.rollout.strategy
    desired, serving = read.desired, read.serving
    if serving == desired:
        draining = sorted(set(read.present) - {desired})
        if read.kept:
            phase: RolloutPhase = "Switching"
            reason, message = "FrontDoorSwitched", f"the front door moves to generation {_named([desired])}"
        elif draining:
            phase, reason = "Draining", "OldGenerationDraining"
            message = f"generation {_named([desired])} serves; removing generation {_named(draining)}"
        else:
            phase, reason, message = "Stable", "RolloutComplete", f"generation {_named([desired])} serves"
        done = RolloutStatus(strategy=strategy, phase=phase, serving_generation=serving, message=message)
        return done, ("True", reason)
    pools = {}
    for service in sorted(idep.spec.services):
        workload = observed_workload(idep, service, observed)
        pools[service] = PoolProgress(
            replicas=as_int(field_at(workload, "spec", "replicas")), ready_replicas=current_ready(workload)
        )
    progress = ", ".join(f"{service} {pool.ready_replicas}/{pool.replicas}" for service, pool in pools.items())
    message = f"generation {_named([serving])} serves; generation {desired} starts: {progress} ready"
    since = created(idep, observed)
    deadline = idep.spec.rollout.progress_deadline_seconds
    stalled = since is not None and (now() - datetime.fromisoformat(since)).total_seconds() > deadline
    if stalled:
        message = (
            f"generation {desired} is not ready {deadline}s after it was created (rollout.progressDeadlineSeconds); "
            f"generation {_named([serving])} keeps serving: {progress} ready"
        )
    rolling = RolloutStatus(
        strategy=strategy,
        phase="Stalled" if stalled else "Progressing",
        serving_generation=serving,
        incoming_generation=desired,
        pools=pools,
        message=message,
    )
    return rolling, ("False", "ProgressDeadlineExceeded") if stalled else ("True", "NewGenerationProgressing")
