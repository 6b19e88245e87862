"""Status roll-up: the parent's status as a deterministic function of the request.

Metacontroller writes the status only when it changed, and every write triggers another sync.
So nothing here depends on dict order, and the clock is read only when a condition actually
changes status; otherwise its lastTransitionTime is carried over from the parent's status.
"""

from collections.abc import Callable, Collection, Sequence
from dataclasses import astuple, dataclass
from datetime import UTC, datetime
from typing import Any

from hooks import gateway_status
from hooks.api.graph import InferaDeployment
from hooks.api.status import (
    AutoscalingStatus,
    Condition,
    ConditionStatus,
    InferaDeploymentStatus,
    ModelCacheStatus,
    ServiceStatus,
    State,
)
from hooks.contract import field_at
from hooks.generations import RolloutRead, rollout_status
from hooks.observed import (
    Download,
    Observed,
    as_int,
    as_object,
    current_ready,
    listed_briefly,
    model_download,
    observed_autoscaler,
    observed_workload,
    quoted,
)
from hooks.scheduling import Unscheduled
from hooks.vocabulary import (
    NATS_SUFFIX,
    WORKLOAD_KINDS,
    child_name,
    download_job_name,
    workload_kind,
)

# Every hook takes the time from one of these: a test passes its own.
Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


def _conditions(previous: dict[str, Any]) -> list[Any]:
    """The previous status's conditions, whatever shape it was left in."""
    conditions = previous.get("conditions")
    return conditions if isinstance(conditions, list) else []


def _condition(
    kind: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int,
    previous: dict[str, Any],
    now: Clock,
) -> Condition:
    prior = next((c for c in _conditions(previous) if isinstance(c, dict) and c.get("type") == kind), {})
    unchanged = prior.get("status") == status and isinstance(prior.get("lastTransitionTime"), str)
    return Condition(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        observed_generation=generation,
        last_transition_time=prior["lastTransitionTime"] if unchanged else now().strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def _carried_over(kind: str, previous: dict[str, Any]) -> list[Condition]:
    """The previous status's condition of that type, if it still fits the CRD (else it is dropped:
    the API server would have pruned or refused it anyway)."""
    for condition in _conditions(previous):
        if isinstance(condition, dict) and condition.get("type") == kind:
            try:
                return [Condition.model_validate(condition)]
            except ValueError:
                return []
    return []


def as_wire(status: InferaDeploymentStatus) -> dict[str, Any]:
    """The status as the API server stores it: camelCase, unset fields left out."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def autoscaler_notices(
    idep: InferaDeployment, live: dict[str, int], answered: Collection[tuple[str, str]]
) -> list[str]:
    """A replica count written in the spec (by a user, or by the router's scaling API) that the
    autoscaler of a service overrides: said, so nobody waits for it. Only for an autoscaler in
    the answer (`answered`, by kind and name): one withheld for its unregistered kind owns nothing."""
    notices = []
    for service, svc in sorted(idep.spec.services.items()):
        if service not in live or "replicas" not in svc.model_fields_set:
            continue
        count = svc.desired_replicas(live[service])
        if ("HorizontalPodAutoscaler", child_name(idep, service)) in answered and count != svc.replicas:
            notices.append(
                f"{service}: replicas {svc.replicas} in the spec is not applied while autoscaling owns the count "
                f"({count} now)"
            )
    return notices


AUTOSCALER_CONDITIONS = ("AbleToScale", "ScalingActive")


def _autoscaling_status(idep: InferaDeployment, service: str, by_key: Observed) -> AutoscalingStatus | None:
    scaling = idep.spec.services[service].autoscaling
    if scaling is None:
        return None
    reported = observed_autoscaler(idep, service, by_key).get("status") or {}
    return AutoscalingStatus(
        min_replicas=scaling.min_replicas,
        max_replicas=scaling.max_replicas,
        current_replicas=as_int(reported.get("currentReplicas")),
        desired_replicas=as_int(reported.get("desiredReplicas")),
    )


def _autoscaler_trouble(idep: InferaDeployment, by_key: Observed) -> list[str]:
    """What keeps an autoscaler from scaling: its absence beside a running pool (the API server
    refused it, or it is still to be created), or what it says in its conditions."""
    trouble = []
    for service, svc in sorted(idep.spec.services.items()):
        if svc.autoscaling is None:
            continue
        autoscaler = observed_autoscaler(idep, service, by_key)
        if not autoscaler and observed_workload(idep, service, by_key) is not None:
            trouble.append(
                f"{service} autoscaler: HorizontalPodAutoscaler {child_name(idep, service)} does not exist yet (if it "
                "stays missing, the API server refused it: Metacontroller's log says why)"
            )
        conditions = field_at(autoscaler, "status", "conditions")
        for condition in conditions if isinstance(conditions, list) else []:
            if not isinstance(condition, dict) or condition.get("status") != "False":
                continue
            if condition.get("type") in AUTOSCALER_CONDITIONS:
                detail = quoted(f"{condition.get('reason')}: {condition.get('message')}")
                trouble.append(f"{service} autoscaler: {condition['type']} is False ({detail})")
    return trouble


def service_statuses(idep: InferaDeployment, by_key: Observed) -> dict[str, ServiceStatus]:
    """Each service's workload kind and counts as the workload reports them: the replicas it has
    now, not the ones asked for (the router's scaling API reads them as the current count)."""
    statuses = {}
    for service, svc in sorted(idep.spec.services.items()):
        workload = observed_workload(idep, service, by_key)
        reported = (workload or {}).get("status") or {}
        statuses[service] = ServiceStatus(
            kind=workload["kind"] if workload else workload_kind(svc),
            replicas=as_int(reported.get("replicas")),
            ready_replicas=as_int(reported.get("readyReplicas")),
            autoscaling=_autoscaling_status(idep, service, by_key),
        )
    return statuses


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
    """Everything the roll-up reads besides the parsed parent, and so the status memo's key.
    The roll-up reads the observed children from here, as _as_read leaves them, so what it
    reads cannot outgrow the key."""

    # The observed children by (kind, name), as read.
    observed: Observed
    # The previous status's conditions (their transition times are carried over).
    previous: dict[str, Any]
    # Changes that could not be applied.
    notices: tuple[str, ...]
    # Children withheld because the CompositeController does not register their kind (the
    # graph is then failed).
    unregistered: tuple[str, ...]
    # The services whose workload the answer changes (services_changing): none of their
    # replicas is ready yet.
    changing: tuple[str, ...]
    # Under BlueGreen (or leaving it): which generations serve and exist.
    rollout: RolloutRead | None = None
    # Children the answer holds that are not observed ("Kind name"): those the graph serves
    # with, and those it does not serve with yet (reconcile._not_observed).
    missing: tuple[str, ...] = ()
    coming: tuple[str, ...] = ()
    # Children of the serving generation that are gone and that this spec cannot make again.
    lost: tuple[str, ...] = ()
    # Pods no node takes (hooks.scheduling), where the request carries the graph's Pods.
    unscheduled: tuple[Unscheduled, ...] = ()

    @classmethod
    def of(
        cls,
        by_key: Observed,
        previous: dict[str, Any],
        notices: Sequence[str] = (),
        unregistered: Sequence[str] = (),
        changing: Collection[str] = (),
        rollout: RolloutRead | None = None,
        missing: Sequence[str] = (),
        coming: Sequence[str] = (),
        lost: Sequence[str] = (),
        unscheduled: Sequence[Unscheduled] = (),
    ) -> "StatusInputs":
        observed = {key: _as_read(child) for key, child in sorted(by_key.items())}
        conditions = {"conditions": previous["conditions"]} if "conditions" in previous else {}
        return cls(
            observed,
            conditions,
            tuple(notices),
            tuple(unregistered),
            tuple(sorted(changing)),
            rollout,
            tuple(missing),
            tuple(coming),
            tuple(lost),
            tuple(unscheduled),
        )

    def key(self) -> list[Any]:
        return [
            self.previous.get("conditions"),
            list(self.notices),
            list(self.unregistered),
            list(self.changing),
            self.rollout.key() if self.rollout else None,
            list(self.missing),
            list(self.coming),
            list(self.lost),
            [list(astuple(pods)) for pods in self.unscheduled],
            [[kind, name, child] for (kind, name), child in self.observed.items()],
        ]


def _children_created(inputs: StatusInputs) -> tuple[ConditionStatus, str, str]:
    """The ChildrenCreated condition: every child the answer holds exists, or which do not and
    why they might not."""
    absent = [*inputs.missing, *inputs.coming]
    if inputs.lost:
        return "False", "ServingChildrenLost", _absent(inputs.lost, absent)
    if not absent:
        return "True", "AllCreated", "every child the graph needs exists"
    if not inputs.observed:
        return "False", "Creating", f"creating {len(absent)} children"
    return "False", "ChildrenMissing", _absent((), absent)


def _absent(lost: Sequence[str], names: Sequence[str]) -> str:
    """What is gone for good, then what is not created yet and why that may last."""
    it = "it stays" if len(names) == 1 else "they stay"
    not_created = (
        f"not created yet: {listed_briefly(names)} (if {it} missing, another object holds the name, which `kubectl "
        "get` shows, or Metacontroller's create fails: its log says why, e.g. a quota or an admission policy)"
    )
    return "; ".join([*lost, *([not_created] if names else [])])


def _broker_waiting(idep: InferaDeployment, by_key: Observed) -> str | None:
    """The NATS broker, when the graph deploys it and its StatefulSet exists: every process
    publishes KV events to it (and, by default, requests cross it)."""
    broker = by_key.get(("StatefulSet", child_name(idep, NATS_SUFFIX)))
    if not idep.spec.nats.deploy or broker is None or current_ready(broker) >= 1:
        return None
    return f"NATS broker {current_ready(broker)}/1 ready"


def _unscheduled(inputs: StatusInputs, generations: Collection[str]) -> list[str]:
    return [pods.message() for pods in inputs.unscheduled if pods.generation in generations]


def roll_up(idep: InferaDeployment, inputs: StatusInputs, now: Clock) -> InferaDeploymentStatus:
    """The status of the graph (`idep` at the spec's generation) from what was observed
    (`inputs`): its readiness is that of the generation behind the front door, with every child
    it needs created, the broker it publishes to ready and, with GAIE, the gateway's parts."""
    by_key, previous, notices = inputs.observed, inputs.previous, inputs.notices
    unregistered, changing = inputs.unregistered, inputs.changing
    generation = idep.metadata.generation
    incoming = _unscheduled(inputs, {idep.graph_generation})
    rolled = rollout_status(idep, inputs.rollout, by_key, now, incoming) if inputs.rollout else None
    if inputs.rollout and inputs.rollout.serving != idep.graph_generation:
        # The answer changes the incoming generation, not the one that serves.
        idep, changing = idep.at_generation(inputs.rollout.serving), ()
    services = service_statuses(idep, by_key)
    current = {
        service: 0 if service in changing else current_ready(observed_workload(idep, service, by_key))
        for service in services
    }
    # Readiness is judged against the count the spec asks for (a replica that was never created
    # is not ready); an autoscaled service against minReplicas, so a scale-up in progress (minutes
    # of model loading) does not turn a serving graph pending.
    wanted = {
        service: svc.autoscaling.min_replicas if svc.autoscaling else svc.replicas
        for service, svc in idep.spec.services.items()
    }
    waiting = {service: ready for service, ready in current.items() if ready < wanted[service]}
    total = len(services)
    gateway = gateway_status.of(idep, by_key) if idep.spec.gaie.enabled else None
    cache = _model_cache_status(idep, model_download(idep, by_key))
    # While the weights move, the workers that wait for them are why.
    downloading = [cache.message] if cache and cache.phase == "Downloading" else []
    # What holds readiness, each with its Ready reason, in the order the message says them.
    blockers: list[tuple[str, str]] = []
    if inputs.lost or inputs.missing:
        blockers.append(("ChildrenMissing", _absent(inputs.lost, inputs.missing)))
    if waiting:
        details = [f"{service} {ready}/{wanted[service]} ready" for service, ready in waiting.items()]
        blockers.append(("ServicesNotReady", "; ".join([*details, f"waiting on {len(waiting)} of {total} services"])))
    if broker := _broker_waiting(idep, by_key):
        blockers.append(("BrokerNotReady", broker))
    if gateway and (gateway_waiting := gateway_status.waiting(gateway)):
        blockers.append(("GatewayNotReady", gateway_waiting))
    state: State
    if not by_key:
        state, reason = "initializing", "Initializing"
        message = "; ".join([*downloading, f"creating {total} services"])
    elif blockers:
        reason = blockers[0][0]
        # The serving generation's pods, and the plumbing's, which no generation labels.
        unscheduled = _unscheduled(inputs, {idep.graph_generation, ""})
        state, message = "pending", "; ".join([*downloading, *(text for _, text in blockers), *unscheduled])
    else:
        state, reason, message = "ready", "AllServicesReady", f"all {total} services ready"
    # A graph that cannot be rendered as specified is not ready, whatever still runs.
    ready_condition: tuple[ConditionStatus, str, str] = (
        ("False", "KindNotRegistered", "; ".join(unregistered))
        if unregistered
        else ("True" if state == "ready" else "False", reason, message)
    )
    spec_message = "; ".join(notices) if notices else "spec is valid and rendered"
    kinds_condition: tuple[ConditionStatus, str, str] = (
        ("False", "KindNotRegistered", "; ".join(unregistered))
        if unregistered
        else ("True", "AllRegistered", "every child kind the spec needs is registered")
    )
    # A failed download fails the graph (what runs is kept); its message leads.
    download_failed = [cache.message] if cache and cache.phase == "Failed" else []
    conditions = [
        _condition("Ready", *ready_condition, generation, previous, now),
        _condition("ChildKindsRegistered", *kinds_condition, generation, previous, now),
        _condition("ChildrenCreated", *_children_created(inputs), generation, previous, now),
        _condition("SpecValid", "True", "Valid", spec_message, generation, previous, now),
    ]
    if cache:
        model_ready = MODEL_READY[cache.phase]
        conditions.append(_condition("ModelReady", *model_ready, cache.message, generation, previous, now))
    rollout, rolling = None, []
    if rolled:
        rollout, (progressing, reason) = rolled
        conditions.append(_condition("Progressing", progressing, reason, rollout.message, generation, previous, now))
        rolling = [rollout.message] if rollout.phase != "Stable" else []
    return InferaDeploymentStatus(
        state="failed" if unregistered or download_failed else state,
        message="; ".join(
            [*unregistered, *download_failed, message, *rolling, *_autoscaler_trouble(idep, by_key), *notices]
        ),
        ready_services=f"{total - len(waiting)}/{total}",
        services=services,
        conditions=conditions,
        gaie=gateway,
        model_cache=cache,
        rollout=rollout,
    )


MODEL_READY: dict[str, tuple[ConditionStatus, str]] = {
    "Ready": ("True", "Downloaded"),
    "Downloading": ("False", "Downloading"),
    "Failed": ("False", "DownloadFailed"),
}


def _model_cache_status(idep: InferaDeployment, download: Download | None) -> ModelCacheStatus | None:
    cache = idep.spec.model_cache
    if cache is None or download is None:
        return None
    job = download_job_name(idep, cache.digest)
    message = {
        "Ready": f"{cache.source} is in the model cache",
        "Downloading": f"downloading {cache.source}",
        "Failed": (
            f"downloading {cache.source} failed ({download.reason}); running workers are kept; fix the spec, "
            f"or delete Job {job} to try again"
        ),
    }[download.phase]
    return ModelCacheStatus(phase=download.phase, source=cache.source, job=job, message=message)


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


def failed(message: str, generation: int, previous: dict[str, Any], now: Clock) -> InferaDeploymentStatus:
    """A spec that cannot be rendered: say what is wrong; readiness is not judged meanwhile, and
    ChildKindsRegistered and ModelReady stay as last evaluated (so their transition times survive
    the fix)."""
    message = _bounded(message)
    return InferaDeploymentStatus(
        state="failed",
        message=message,
        conditions=[
            _condition(
                "Ready",
                "Unknown",
                "SpecInvalid",
                "readiness is not evaluated while the spec is invalid; running children are kept as they are",
                generation,
                previous,
                now,
            ),
            *_carried_over("ChildKindsRegistered", previous),
            *_carried_over("ChildrenCreated", previous),
            *_carried_over("ModelReady", previous),
            *_carried_over("Progressing", previous),
            _condition("SpecValid", "False", "InvalidSpec", message, generation, previous, now),
        ],
    )
