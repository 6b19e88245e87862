"""Fields the API server refuses to change on an existing object.

Sending a new value would fail the apply on every sync, so an existing child keeps the value it
was created with, and the hook says so in status.
"""

from typing import Any

from hooks.contract import as_last_applied, child_key

# kind -> (path to the field, the spec field a user would have changed)
IMMUTABLE_FIELDS: dict[str, list[tuple[tuple[str, ...], str]]] = {
    "StatefulSet": [(("spec", "volumeClaimTemplates"), "nats.storageSize/storageClassName")],
}


def _get(obj: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def keep_immutable_fields(desired: list[dict[str, Any]], observed: list[dict[str, Any]]) -> list[str]:
    """Reset immutable fields of `desired` to what was applied before; return one notice each."""
    applied = {child_key(child): child for child in observed}
    notices = []
    for child in desired:
        previous = applied.get(child_key(child))
        if previous is None:
            continue
        previous = as_last_applied(previous)
        for path, spec_field in IMMUTABLE_FIELDS.get(child["kind"], []):
            old = _get(previous, path)
            if old is not None and _get(child, path) != old:
                _get(child, path[:-1])[path[-1]] = old
                notices.append(
                    f"{spec_field} change not applied to {child['kind']} {child['metadata']['name']}: "
                    f"{'.'.join(path)} is immutable (delete the {child['kind']} to recreate it)"
                )
    return notices
