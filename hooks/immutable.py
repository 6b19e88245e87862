"""Fields the API server refuses to change on an existing object.

Sending a new value would fail the apply on every sync, so an existing child keeps the value it
holds on the cluster, verbatim, and the hook says in status what it could not change. Verbatim
matters: the API server fills in fields of a claim template (kind, volumeMode, status), and
Metacontroller replaces such lists wholesale, so anything less would be re-applied every sync.
"""

from typing import Any

from hooks.contract import as_last_applied, child_key
from hooks.quantity import quantity_value

# kind -> (path to the field, the spec field a user would have changed)
IMMUTABLE_FIELDS: dict[str, list[tuple[tuple[str, ...], str]]] = {
    "StatefulSet": [(("spec", "volumeClaimTemplates"), "nats.storageSize/storageClassName")],
    "PersistentVolumeClaim": [
        (("spec", "storageClassName"), "modelCache.storageClassName"),
        (("spec", "accessModes"), "modelCache.accessMode"),
    ],
}
# Fields that may grow but never shrink (a claim's storage: volume expansion).
GROW_ONLY: dict[str, list[tuple[tuple[str, ...], str]]] = {
    "PersistentVolumeClaim": [(("spec", "resources", "requests", "storage"), "modelCache.size")],
}
# Fields whose change replaces the child instead: it is left out of one answer (Metacontroller
# deletes it) and created anew on the next sync. Many LeaderWorkerSet releases refuse to change
# a group's size in place, and a new size re-forms every group anyway.
REPLACED_ON_CHANGE: dict[str, list[tuple[tuple[str, ...], str]]] = {
    "LeaderWorkerSet": [(("spec", "leaderWorkerTemplate", "size"), "numberOfNodes")],
    # Only a child another controller created has another selector: the upstream operator puts
    # its managed-by label in every selector. A Service's could change in place, but the 3-way
    # merge keeps a key it never applied, and the Service would then select no new pod.
    "Deployment": [(("spec", "selector"), "the selector")],
    "StatefulSet": [(("spec", "selector"), "the selector")],
    "Service": [(("spec", "selector"), "the selector")],
}


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _smaller(wanted: str, stored: str) -> bool:
    try:
        return quantity_value(wanted) < quantity_value(stored)
    except ValueError:
        return False


def _covers(stored: Any, wanted: Any) -> bool:
    """Whether `stored` holds everything `wanted` asks for (server-filled extras allowed)."""
    if isinstance(wanted, dict):
        return isinstance(stored, dict) and all(k in stored and _covers(stored[k], v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return isinstance(stored, list) and len(stored) == len(wanted) and all(map(_covers, stored, wanted))
    return stored == wanted


def keep_immutable_fields(
    desired: list[dict[str, Any]], observed: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Set immutable fields of `desired` to their observed values and leave out children that
    must be replaced; return the children to answer and one notice per field concerned."""
    existing = {child_key(child): child for child in observed}
    answer, notices = [], []
    for child in desired:
        current = existing.get(child_key(child))
        label = f"{child['kind']} {child['metadata']['name']}"
        replaced = [
            (path, spec_field)
            for path, spec_field in REPLACED_ON_CHANGE.get(child["kind"], [])
            if current
            if _get(current, path) != _get(child, path)
        ]
        if replaced:
            for path, spec_field in replaced:
                notices.append(
                    f"{label} is being replaced: {spec_field} changed from {_get(current, path)} to "
                    f"{_get(child, path)} ({'.'.join(path)} cannot change in place)"
                )
            continue
        for path, spec_field in GROW_ONLY.get(child["kind"], []) if current else []:
            stored, wanted = _get(current, path), _get(child, path)
            if isinstance(stored, str) and isinstance(wanted, str) and _smaller(wanted, stored):
                notices.append(
                    f"{spec_field} not applied to {label}: {wanted} is less than its {stored}, which cannot shrink"
                )
                _get(child, path[:-1])[path[-1]] = stored
        for path, spec_field in IMMUTABLE_FIELDS.get(child["kind"], []) if current else []:
            stored = _get(current, path)
            # Left unset, what the API server filled in (a default storage class) stays: the
            # 3-way merge keeps a field never applied.
            if stored is None or _get(child, path) is None:
                continue
            if not _covers(stored, _get(child, path)):
                notices.append(
                    f"{spec_field} change not applied to {label}: "
                    f"{'.'.join(path)} is immutable (delete the {child['kind']} to recreate it)"
                )
            if current is None or _get(as_last_applied(current), path) is None:
                # Never applied (the API server filled it in): left out, the merge keeps it.
                _get(child, path[:-1]).pop(path[-1])
            else:
                _get(child, path[:-1])[path[-1]] = stored
        answer.append(child)
    return answer, notices
