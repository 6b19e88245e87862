"""The rollout's part of the status: which generation serves, and how far the incoming one is."""

from collections.abc import Sequence
from datetime import datetime

from hooks.api.graph import InferaDeployment
from hooks.api.status import Clock, PoolProgress, RolloutPhase, RolloutStatus
from hooks.contract import field_at
from hooks.generations import Rollout, named
from hooks.observed import Observed, as_int, current_ready, observed_workload


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


def rollout_status(
    idep: InferaDeployment, rollout: Rollout, observed: Observed, now: Clock, unscheduled: Sequence[str] = ()
) -> RolloutStatus:
    """The rollout's status, for `idep` at the desired generation; `unscheduled` says which of
    its pods no node takes. The clock is read only while a new generation is not yet serving."""
    strategy = idep.spec.rollout.strategy
    desired, serving = rollout.desired, rollout.serving
    if serving == desired:
        draining = sorted(set(rollout.present) - {desired})
        if rollout.kept:
            phase: RolloutPhase = "Switching"
            message = f"the front door moves to generation {named([desired])}"
        elif draining:
            phase, message = "Draining", f"generation {named([desired])} serves; removing generation {named(draining)}"
        else:
            phase, message = "Stable", f"generation {named([desired])} serves"
        return RolloutStatus(strategy=strategy, phase=phase, serving_generation=serving, message=message)
    pools = {}
    for service in sorted(idep.spec.services):
        workload = observed_workload(idep, service, observed)
        pools[service] = PoolProgress(
            replicas=as_int(field_at(workload, "spec", "replicas")), ready_replicas=current_ready(workload)
        )
    progress = ", ".join(f"{service} {pool.ready_replicas}/{pool.replicas}" for service, pool in pools.items())
    message = f"generation {named([serving])} serves; generation {desired} starts: {progress} ready"
    since = created(idep, observed)
    deadline = idep.spec.rollout.progress_deadline_seconds
    stalled = since is not None and (now() - datetime.fromisoformat(since)).total_seconds() > deadline
    if stalled:
        message = (
            f"generation {desired} is not ready {deadline}s after it was created (rollout.progressDeadlineSeconds); "
            f"generation {named([serving])} keeps serving: {progress} ready"
        )
    if rollout.door_restored:
        message += f"; the front door, deleted or edited, is restored to generation {named([serving])}"
    message = "; ".join([message, *unscheduled])
    return RolloutStatus(
        strategy=strategy,
        phase="Stalled" if stalled else "Progressing",
        serving_generation=serving,
        incoming_generation=desired,
        pools=pools,
        message=message,
    )
