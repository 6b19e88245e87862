"""The Inference Gateway front door as its controllers report it: the Endpoint Picker's ready
replicas, and whether the Gateway accepts the InferencePool and the HTTPRoute."""

from typing import Any

from hooks.api.graph import InferaDeployment
from hooks.api.status import GaieStatus
from hooks.observed import Observed, as_int
from hooks.vocabulary import EPP_SUFFIX, generation_name, pool_name, route_name


def _accepted(obj: dict[str, Any] | None) -> bool:
    """A parent (Gateway) reports the object's current generation Accepted=True in
    status.parents[].conditions (an older generation's verdict does not count)."""
    parents = ((obj or {}).get("status") or {}).get("parents") or []
    generation = as_int(((obj or {}).get("metadata") or {}).get("generation"))
    return any(
        c.get("type") == "Accepted"
        and c.get("status") == "True"
        and as_int(c.get("observedGeneration", generation)) >= generation
        for parent in parents
        if isinstance(parent, dict)
        for c in parent.get("conditions") or []
        if isinstance(c, dict)
    )


def _reports_conditions(obj: dict[str, Any]) -> bool:
    return any(isinstance(p, dict) and p.get("conditions") for p in (obj.get("status") or {}).get("parents") or [])


def of(idep: InferaDeployment, by_key: Observed) -> GaieStatus:
    """The Inference Gateway objects as their controllers report them."""
    epp = by_key.get(("Deployment", generation_name(idep, EPP_SUFFIX))) or {}
    pool = by_key.get(("InferencePool", pool_name(idep)))
    route = by_key.get(("HTTPRoute", route_name(idep)))
    epp_replicas = as_int((epp.get("spec") or {}).get("replicas", 1))
    epp_ready = as_int((epp.get("status") or {}).get("readyReplicas"))
    # A pool is ready once it exists, or, when its gateway writes conditions, once Accepted.
    pool_ready = pool is not None and (_accepted(pool) or not _reports_conditions(pool))
    route_accepted = _accepted(route)
    return GaieStatus(
        epp_replicas=epp_replicas,
        epp_ready_replicas=epp_ready,
        inference_pool_name=pool_name(idep),
        http_route_name=route_name(idep),
        inference_pool_ready=pool_ready,
        http_route_accepted=route_accepted,
        ready=epp_ready >= 1 and pool_ready and route_accepted,
    )


def waiting(status: GaieStatus) -> str | None:
    """What the gateway's parts wait for, or None once they are ready."""
    if status.ready:
        return None
    parts = [f"EPP {status.epp_ready_replicas}/{status.epp_replicas} ready"]
    if not status.inference_pool_ready:
        parts.append(f"InferencePool {status.inference_pool_name} not accepted")
    if not status.http_route_accepted:
        parts.append(f"HTTPRoute {status.http_route_name} not accepted")
    return "gateway: " + ", ".join(parts)
