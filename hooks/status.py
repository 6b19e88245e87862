"""Status roll-up: the parent's status as a deterministic function of what was observed.

Metacontroller writes the status only when it changed, and every write triggers another sync.
So nothing here depends on dict order, and the clock is read only when a condition changes
(hooks.conditions). The roll-up reads the graph through StatusInputs alone, as plain data, so
the sync can keep its result for the same inputs.
"""

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from hooks import conditions, gateway_status, scheduling, service_status
from hooks.api.graph import InferaDeployment
from hooks.api.status import (
    Clock,
    Condition,
    GaieStatus,
    InferaDeploymentStatus,
    ModelCacheStatus,
    PlacementStatus,
    RolloutStatus,
    ServiceStatus,
    State,
)
from hooks.conditions import Stamp
from hooks.contract import HookRequest
from hooks.encoding import EncodedChild, canonical_json
from hooks.generations import Rollout, belongs_to_a_generation, generation_of
from hooks.observed import Observed, as_object, current_ready, model_download, observed_workload, quoted
from hooks.rollout_status import rollout_status
from hooks.scheduling import Unscheduled, WorkerNodes
from hooks.vocabulary import WORKLOAD_KINDS


def as_wire(status: InferaDeploymentStatus) -> dict[str, Any]:
    """The status as the API server stores it: camelCase, unset fields left out."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def _as_read(child: dict[str, Any]) -> dict[str, Any]:
    """What the roll-up reads of an observed child: its kind and name, its generation, its
    replicas (whether set, too) and its status."""
    metadata = as_object(child.get("metadata"))
    read: dict[str, Any] = {
        "kind": child.get("kind"),
        "metadata": {"name": metadata.get("name"), "generation": metadata.get("generation")},
        "status": child.get("status"),
    }
    # How long a new generation has taken (a workload's age does not change otherwise).
    if child.get("kind") in WORKLOAD_KINDS and "creationTimestamp" in metadata:
        read["metadata"]["creationTimestamp"] = metadata["creationTimestamp"]
    spec = as_object(child.get("spec"))
    if "replicas" in spec:
        read["spec"] = {"replicas": spec["replicas"]}
    return read


@dataclass(frozen=True)
class StatusInputs:
    """Everything the roll-up reads besides the parsed parent, as plain data. It reads the
    observed children from here, as _as_read leaves them, so what it reads is what a memo keys."""

    # The observed children as read, ordered by (kind, name).
    children: tuple[dict[str, Any], ...]
    # The previous status's conditions (their transition times are carried over).
    previous: dict[str, Any]
    # Changes that could not be applied.
    notices: tuple[str, ...] = ()
    # Children withheld because the CompositeController does not register their kind (the
    # graph is then failed).
    unregistered: tuple[str, ...] = ()
    # The services whose workload the answer changes (answer.services_changing): none of their
    # replicas is ready yet.
    changing: tuple[str, ...] = ()
    # Under BlueGreen (or leaving it): which generations serve and exist.
    rollout: Rollout | None = None
    # Children the answer holds that are not observed ("Kind name"): those the graph serves
    # with, and those it does not serve with yet (the incoming generation's, a download Job).
    missing: tuple[str, ...] = ()
    coming: tuple[str, ...] = ()
    # Children of the serving generation that are gone and that this spec cannot make again.
    lost: tuple[str, ...] = ()
    # Pods no node takes (hooks.scheduling), where the request carries the graph's Pods.
    unscheduled: tuple[Unscheduled, ...] = ()
    # The nodes each worker service's pods run on, while spec.placement is set.
    worker_nodes: WorkerNodes | None = None

    @classmethod
    def of(
        cls,
        observed: Observed,
        previous: dict[str, Any],
        *,
        notices: Sequence[str] = (),
        unregistered: Sequence[str] = (),
        changing: Sequence[str] = (),
        rollout: Rollout | None = None,
        missing: Sequence[str] = (),
        coming: Sequence[str] = (),
        lost: Sequence[str] = (),
        unscheduled: Sequence[Unscheduled] = (),
        worker_nodes: WorkerNodes | None = None,
    ) -> "StatusInputs":
        """From the observed children by (kind, name), the previous status and the rest of what
        the roll-up reads."""
        return cls(
            children=tuple(_as_read(child) for _, child in sorted(observed.items())),
            previous={"conditions": previous["conditions"]} if "conditions" in previous else {},
            notices=tuple(notices),
            unregistered=tuple(unregistered),
            changing=tuple(changing),
            rollout=rollout,
            missing=tuple(missing),
            coming=tuple(coming),
            lost=tuple(lost),
            unscheduled=tuple(unscheduled),
            worker_nodes=worker_nodes,
        )

    def observed(self) -> Observed:
        return {(child["kind"], child["metadata"]["name"]): child for child in self.children}


def previous_status(request: HookRequest) -> dict[str, Any]:
    """The parent's status as last written, whatever shape it was left in ({} for none)."""
    previous = request.parent.get("status")
    return previous if isinstance(previous, dict) else {}


def inputs_of(
    idep: InferaDeployment,
    request: HookRequest,
    answer: Sequence[EncodedChild],
    rollout: Rollout | None,
    live_replicas: dict[str, int],
    notices: Sequence[str] = (),
    unregistered: Sequence[str] = (),
    changing: Sequence[str] = (),
    lost: Sequence[str] = (),
) -> StatusInputs:
    """What the roll-up reads of a sync of `idep` (at the desired generation) that answers
    `answer`, rendered with its autoscalers at `live_replicas`; `notices`: what could not be
    applied as asked; `unregistered`: children withheld; `changing`: the services whose workload
    the answer changes (answer.services_changing); `lost`: the serving generation's children
    that this spec cannot make again."""
    keys = {(child.kind, child.name) for child in answer}
    missing, coming = _not_observed(request.by_key, answer, rollout)
    return StatusInputs.of(
        request.by_key,
        previous_status(request),
        notices=(*notices, *service_status.autoscaler_notices(idep, live_replicas, keys)),
        unregistered=tuple(unregistered),
        changing=tuple(changing),
        rollout=rollout,
        missing=tuple(missing),
        coming=tuple(coming),
        lost=tuple(lost),
        unscheduled=scheduling.unscheduled(request.related),
        worker_nodes=scheduling.worker_nodes(request.related) if idep.spec.placement else None,
    )


def _not_observed(
    observed: Observed, answer: Sequence[EncodedChild], rollout: Rollout | None
) -> tuple[list[str], list[str]]:
    """The children of the answer that are not observed ("Kind name"): those the graph serves
    with, and those it does not serve with yet: the incoming generation's of a rollout, and a
    model download (the model cache's phase says where it is)."""
    incoming = rollout.desired if rollout and rollout.serving != rollout.desired else None
    missing: list[str] = []
    coming: list[str] = []
    for child in answer:
        if (child.kind, child.name) in observed:
            continue
        later = child.kind == "Job"
        if incoming is not None and not later:
            body = json.loads(child.body)  # rare: a child just answered, or one whose create fails
            later = belongs_to_a_generation(body) and generation_of(body) == incoming
        (coming if later else missing).append(f"{child.kind} {child.name}")
    return missing, coming


@dataclass(frozen=True)
class Workloads:
    """Each service's workload as reported, and the services short of what the spec asks."""

    services: dict[str, ServiceStatus]
    waiting: dict[str, tuple[int, int]]  # service -> (ready, wanted)

    def message(self) -> str:
        details = [f"{service} {ready}/{wanted} ready" for service, (ready, wanted) in self.waiting.items()]
        return "; ".join([*details, f"waiting on {len(self.waiting)} of {len(self.services)} services"])


def _workloads(idep: InferaDeployment, observed: Observed, changing: Collection[str]) -> Workloads:
    """The services of `idep` (at the generation that serves) and how many of each are ready.
    Readiness is judged against the count the spec asks for (a replica that was never created
    is not ready); an autoscaled service against minReplicas, so a scale-up in progress (minutes
    of model loading) does not turn a serving graph pending."""
    services = service_status.service_statuses(idep, observed)
    waiting = {}
    for service, svc in sorted(idep.spec.services.items()):
        ready = 0 if service in changing else current_ready(observed_workload(idep, service, observed))
        wanted = svc.autoscaling.min_replicas if svc.autoscaling else svc.replicas
        if ready < wanted:
            waiting[service] = (ready, wanted)
    return Workloads(services, waiting)


def _unscheduled(inputs: StatusInputs, generations: Collection[str]) -> list[str]:
    return [pods.message() for pods in inputs.unscheduled if pods.generation in generations]


@dataclass(frozen=True)
class Parts:
    """What the roll-up found of each part of the graph."""

    workloads: Workloads
    cache: ModelCacheStatus | None
    gateway: GaieStatus | None
    rollout: RolloutStatus | None
    # What holds readiness, each with its Ready reason, in the order the message says them.
    blockers: list[tuple[str, str]]


def _parts(idep: InferaDeployment, inputs: StatusInputs, observed: Observed, now: Clock) -> Parts:
    # 1. The rollout: under BlueGreen, readiness is that of the generation behind the front door.
    rolled, changing = None, inputs.changing
    if inputs.rollout:
        incoming = _unscheduled(inputs, {idep.graph_generation})
        rolled = rollout_status(idep, inputs.rollout, observed, now, incoming)
        if inputs.rollout.serving != idep.graph_generation:
            # The answer changes the incoming generation, not the one that serves.
            idep, changing = idep.at_generation(inputs.rollout.serving), ()
    # 2. The workloads: each service's counts, and which fall short.
    workloads = _workloads(idep, observed, changing)
    # 3. The plumbing: the children the answer holds, the broker, the model download.
    cache = service_status.model_cache_status(idep, model_download(idep, observed))
    # 4. The gateway's parts, with GAIE.
    gateway = gateway_status.of(idep, observed) if idep.spec.gaie.enabled else None
    blockers = []
    if inputs.lost or inputs.missing:
        blockers.append(("ChildrenMissing", conditions.absent_children(inputs.lost, inputs.missing)))
    if workloads.waiting:
        blockers.append(("ServicesNotReady", workloads.message()))
    if broker := service_status.broker_waiting(idep, observed):
        blockers.append(("BrokerNotReady", broker))
    if gateway and (gateway_waiting := gateway_status.waiting(gateway)):
        blockers.append(("GatewayNotReady", gateway_waiting))
    return Parts(workloads, cache, gateway, rolled, blockers)


def roll_up(idep: InferaDeployment, inputs: StatusInputs, now: Clock) -> InferaDeploymentStatus:
    """The status of the graph (`idep` at the spec's generation) from what was observed
    (`inputs`): its readiness is that of the generation behind the front door, with every child
    it needs created, the broker it publishes to ready and, with GAIE, the gateway's parts."""
    observed = inputs.observed()
    parts = _parts(idep, inputs, observed, now)
    serving = idep.at_generation(inputs.rollout.serving) if inputs.rollout else idep
    total = len(parts.workloads.services)
    # While the weights move, the workers that wait for them are why.
    downloading = [parts.cache.message] if parts.cache and parts.cache.phase == "Downloading" else []
    state: State
    if not observed:
        state, reason = "initializing", "Initializing"
        message = "; ".join([*downloading, f"creating {total} services"])
    elif parts.blockers:
        reason = parts.blockers[0][0]
        # The serving generation's pods, and the plumbing's, which no generation labels.
        unscheduled = _unscheduled(inputs, {serving.graph_generation, ""})
        state, message = "pending", "; ".join([*downloading, *(text for _, text in parts.blockers), *unscheduled])
    else:
        state, reason, message = "ready", "AllServicesReady", f"all {total} services ready"
    stamp = Stamp(idep.metadata.generation, inputs.previous, now)
    absent = [*inputs.missing, *inputs.coming]
    status_conditions = [
        conditions.ready(stamp, inputs.unregistered, (state == "ready", reason, message)),
        conditions.child_kinds_registered(stamp, inputs.unregistered),
        conditions.children_created(stamp, inputs.lost, absent, bool(observed)),
        conditions.spec_valid(stamp, None, inputs.notices),
        *([conditions.model_ready(stamp, parts.cache)] if parts.cache else []),
        *([conditions.progressing(stamp, parts.rollout)] if parts.rollout else []),
    ]
    # A failed download fails the graph (what runs is kept); its message leads.
    download_failed = [parts.cache.message] if parts.cache and parts.cache.phase == "Failed" else []
    rolling = [parts.rollout.message] if parts.rollout and parts.rollout.phase != "Stable" else []
    trouble = service_status.autoscaler_trouble(serving, observed)
    return InferaDeploymentStatus(
        state="failed" if inputs.unregistered or download_failed else state,
        message="; ".join([*inputs.unregistered, *download_failed, message, *rolling, *trouble, *inputs.notices]),
        ready_services=f"{total - len(parts.workloads.waiting)}/{total}",
        services=parts.workloads.services,
        conditions=status_conditions,
        gaie=parts.gateway,
        model_cache=parts.cache,
        rollout=parts.rollout,
        placement=_placement(inputs.worker_nodes),
    )


def _placement(worker_nodes: WorkerNodes | None) -> PlacementStatus | None:
    if worker_nodes is None:
        return None
    # A printer column: a pool of hundreds of nodes is cut short there, as quoted words are.
    summary = quoted("; ".join(f"{service}: {','.join(nodes)}" for service, nodes in worker_nodes))
    return PlacementStatus(nodes={service: list(nodes) for service, nodes in worker_nodes}, summary=summary)


def encoded_status(idep: InferaDeployment, inputs: StatusInputs, now: Clock) -> tuple[State | None, bytes]:
    """The rolled-up status's state, and the status as canonical JSON."""
    status = roll_up(idep, inputs, now)
    return status.state, canonical_json(as_wire(status))


def terminating(message: str, drained: Condition | None = None) -> InferaDeploymentStatus:
    """During teardown only the state and what the finalizer waits on are reported, and once the
    workers' pods are waited for, the Drained condition."""
    return InferaDeploymentStatus(state="terminating", message=message, conditions=[drained] if drained else None)


# A failure message quotes what is wrong, and a hostile spec can make that anything: the status
# (written to etcd on every change) stays small.
MAX_MESSAGE = 2048


def _bounded(message: str) -> str:
    if len(message) <= MAX_MESSAGE:
        return message
    cut = MAX_MESSAGE - 40
    return f"{message[:cut]} … ({len(message) - cut} more characters)"


def encoded_failure(request: HookRequest, message: str, now: Clock) -> tuple[State | None, bytes]:
    """The status of a spec that cannot be rendered (failed), and as canonical JSON."""
    generation = request.parent["metadata"].get("generation")
    status = failed(message, generation if isinstance(generation, int) else 0, previous_status(request), now)
    return status.state, canonical_json(as_wire(status))


def failed(message: str, generation: int, previous: dict[str, Any], now: Clock) -> InferaDeploymentStatus:
    """A spec that cannot be rendered: say what is wrong; readiness is not judged meanwhile, and
    ChildKindsRegistered and ModelReady stay as last evaluated (so their transition times survive
    the fix)."""
    message = _bounded(message)
    stamp = Stamp(generation, previous, now)
    return InferaDeploymentStatus(
        state="failed",
        message=message,
        conditions=[
            conditions.ready(stamp, (), None),
            *stamp.carried_over("ChildKindsRegistered"),
            *stamp.carried_over("ChildrenCreated"),
            *stamp.carried_over("ModelReady"),
            *stamp.carried_over("Progressing"),
            conditions.spec_valid(stamp, message),
        ],
    )
