"""The parent's conditions: one function per condition type, each the only place that type is
built.

A condition's lastTransitionTime is carried over from the previous status while its status
stays; the clock is read only when it changes (Metacontroller writes the status only when it
changed, and every write triggers another sync).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hooks.api.status import TIME_FORMAT, Clock, Condition, ConditionStatus, ModelCacheStatus, RolloutStatus
from hooks.observed import listed_briefly

# The teardown's condition: the wait for the workers' pods (hooks.teardown).
DRAINED = "Drained"


@dataclass(frozen=True)
class Stamp:
    """What every condition of one status carries: the parent's generation it judged, and the
    previous status and the clock its transition time comes from."""

    generation: int
    previous: dict[str, Any]
    now: Clock

    def condition(self, kind: str, status: ConditionStatus, reason: str, message: str) -> Condition:
        found = self.previous.get("conditions")
        previous = found if isinstance(found, list) else []
        prior = next((c for c in previous if isinstance(c, dict) and c.get("type") == kind), {})
        unchanged = prior.get("status") == status and isinstance(prior.get("lastTransitionTime"), str)
        return Condition(
            type=kind,
            status=status,
            reason=reason,
            message=message,
            observed_generation=self.generation,
            last_transition_time=prior["lastTransitionTime"] if unchanged else self.now().strftime(TIME_FORMAT),
        )

    def carried_over(self, kind: str) -> list[Condition]:
        return carried_over(self.previous, kind)


def carried_over(previous: dict[str, Any], kind: str) -> list[Condition]:
    """The condition of that type in the `previous` status, if it still fits the CRD (else it is
    dropped: the API server would have pruned or refused it anyway)."""
    found = previous.get("conditions")
    for condition in found if isinstance(found, list) else []:
        if isinstance(condition, dict) and condition.get("type") == kind:
            try:
                return [Condition.model_validate(condition)]
            except ValueError:
                return []
    return []


def ready(stamp: Stamp, unregistered: Sequence[str], verdict: tuple[bool, str, str] | None) -> Condition:
    """Ready: the graph serves (`verdict`: ready, reason, message). A graph that cannot be
    rendered as specified is not ready, whatever still runs; one whose spec is invalid (no
    verdict) is not judged meanwhile."""
    if verdict is None:
        message = "readiness is not evaluated while the spec is invalid; running children are kept as they are"
        return stamp.condition("Ready", "Unknown", "SpecInvalid", message)
    if unregistered:
        return stamp.condition("Ready", "False", "KindNotRegistered", "; ".join(unregistered))
    serving, reason, message = verdict
    return stamp.condition("Ready", "True" if serving else "False", reason, message)


def child_kinds_registered(stamp: Stamp, unregistered: Sequence[str]) -> Condition:
    """ChildKindsRegistered: the controller registers every kind the spec needs, or which
    children it withholds (`unregistered`)."""
    if unregistered:
        return stamp.condition("ChildKindsRegistered", "False", "KindNotRegistered", "; ".join(unregistered))
    return stamp.condition(
        "ChildKindsRegistered", "True", "AllRegistered", "every child kind the spec needs is registered"
    )


def children_created(stamp: Stamp, lost: Sequence[str], absent: Sequence[str], anything_observed: bool) -> Condition:
    """Every child the answer holds exists, or which do not (`absent`) and why they might not;
    `lost`: children of the serving generation that this spec cannot make again."""
    if lost:
        return stamp.condition("ChildrenCreated", "False", "ServingChildrenLost", absent_children(lost, absent))
    if not absent:
        return stamp.condition("ChildrenCreated", "True", "AllCreated", "every child the graph needs exists")
    if not anything_observed:
        return stamp.condition("ChildrenCreated", "False", "Creating", f"creating {len(absent)} children")
    return stamp.condition("ChildrenCreated", "False", "ChildrenMissing", absent_children((), absent))


def absent_children(lost: Sequence[str], names: Sequence[str]) -> str:
    """What is gone for good, then what is not created yet and why that may last."""
    it = "it stays" if len(names) == 1 else "they stay"
    not_created = (
        f"not created yet: {listed_briefly(names)} (if {it} missing, another object holds the name, which `kubectl "
        "get` shows, or Metacontroller's create fails: its log says why, e.g. a quota or an admission policy)"
    )
    return "; ".join([*lost, *([not_created] if names else [])])


def spec_valid(stamp: Stamp, problem: str | None, notices: Sequence[str] = ()) -> Condition:
    """Whether the spec renders (`problem`: why not), and the changes it asks for that could
    not be applied."""
    if problem is not None:
        return stamp.condition("SpecValid", "False", "InvalidSpec", problem)
    return stamp.condition(
        "SpecValid", "True", "Valid", "; ".join(notices) if notices else "spec is valid and rendered"
    )


MODEL_READY: dict[str, tuple[ConditionStatus, str]] = {
    "Ready": ("True", "Downloaded"),
    "Downloading": ("False", "Downloading"),
    "Failed": ("False", "DownloadFailed"),
}


def model_ready(stamp: Stamp, cache: ModelCacheStatus) -> Condition:
    """ModelReady: where the model cache's download is."""
    return stamp.condition("ModelReady", *MODEL_READY[cache.phase], cache.message)


# The Progressing condition of each rollout phase (a stalled one is not progressing).
PROGRESSING: dict[str, tuple[ConditionStatus, str]] = {
    "Stable": ("True", "RolloutComplete"),
    "Switching": ("True", "FrontDoorSwitched"),
    "Draining": ("True", "OldGenerationDraining"),
    "Progressing": ("True", "NewGenerationProgressing"),
    "Stalled": ("False", "ProgressDeadlineExceeded"),
}


def progressing(stamp: Stamp, rollout: RolloutStatus) -> Condition:
    """Progressing: the rollout moves on, or stalled past its deadline."""
    return stamp.condition("Progressing", *PROGRESSING[rollout.phase], rollout.message)


def drained(generation: int, status: ConditionStatus, reason: str, message: str, since: datetime) -> Condition:
    """Drained: the teardown's wait for the workers' pods, False since it began (the drain bound
    counts from its time), True since the plane was let go."""
    return Condition(
        type=DRAINED,
        status=status,
        reason=reason,
        message=message,
        observed_generation=generation,
        last_transition_time=since.strftime(TIME_FORMAT),
    )
