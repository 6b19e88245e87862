"""Status roll-up: the parent's status as a deterministic function of spec and observed children.

Metacontroller writes the status only when it changed, and every write triggers another sync,
so nothing here may depend on the clock or on dict order.
"""

from typing import Any

from hooks.api import InferaDeployment
from hooks.contract import child_key
from hooks.renderers.common import child_name

WORKLOAD_KINDS = ("Deployment",)


def _as_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def service_statuses(idep: InferaDeployment, observed: list[dict]) -> dict[str, dict]:
    by_key = {child_key(child): child for child in observed}
    statuses = {}
    for service, svc in sorted(idep.spec.services.items()):
        name = child_name(idep, service)
        workload = next((by_key[(kind, name)] for kind in WORKLOAD_KINDS if (kind, name) in by_key), None)
        if workload is None:
            statuses[service] = {"kind": WORKLOAD_KINDS[0], "replicas": svc.replicas, "readyReplicas": 0}
            continue
        statuses[service] = {
            "kind": workload["kind"],
            "replicas": _as_int((workload.get("spec") or {}).get("replicas", svc.replicas)),
            "readyReplicas": _as_int((workload.get("status") or {}).get("readyReplicas")),
        }
    return statuses


def roll_up(idep: InferaDeployment, observed: list[dict], notices: list[str] = ()) -> dict[str, Any]:
    services = service_statuses(idep, observed)
    # Readiness is judged against the spec: a replica that was never created is not ready.
    waiting = {
        service: status
        for service, status in services.items()
        if status["readyReplicas"] < idep.spec.services[service].replicas
    }
    total = len(services)
    if not observed:
        state, message = "initializing", f"creating {total} services"
    elif waiting:
        details = "; ".join(
            f"{service} {status['readyReplicas']}/{idep.spec.services[service].replicas} ready"
            for service, status in waiting.items()
        )
        state, message = "pending", f"{details}; waiting on {len(waiting)} of {total} services"
    else:
        state, message = "ready", f"all {total} services ready"
    return {
        "state": state,
        "message": "; ".join([message, *notices]),
        "readyServices": f"{total - len(waiting)}/{total}",
        "services": services,
    }


def failed(message: str) -> dict[str, Any]:
    return {"state": "failed", "message": message}
