"""Fields the API server refuses to change on an existing object.

Sending a new value would fail the apply on every sync, so an existing child keeps the value it
holds on the cluster, verbatim, and the hook says in status what it could not change. Verbatim
matters: the API server fills in fields of a claim template (kind, volumeMode, status), and
Metacontroller replaces such lists wholesale, so anything less would be re-applied every sync.
"""

import json
from typing import Any

from hooks.contract import (
    as_kept,
    field_at,
    fields_at,
    recorded_configuration,
)
from hooks.encoding import EncodedChild, Path, canonical_json
from hooks.observed import GROUP_SIZE_PATH
from hooks.quantity import quantity_value

# kind -> (path to the field, the spec field a user would have changed)
IMMUTABLE_FIELDS: dict[str, list[tuple[Path, str]]] = {
    "StatefulSet": [(("spec", "volumeClaimTemplates"), "nats.storageSize/storageClassName")],
    "PersistentVolumeClaim": [
        (("spec", "storageClassName"), "modelCache.storageClassName"),
        (("spec", "accessModes"), "modelCache.accessMode"),
    ],
}
# Fields that may grow but never shrink (a claim's storage: volume expansion).
GROW_ONLY: dict[str, list[tuple[Path, str]]] = {
    "PersistentVolumeClaim": [(("spec", "resources", "requests", "storage"), "modelCache.size")],
}
# Fields whose change replaces the child instead: it is left out of one answer (Metacontroller
# deletes it) and created anew on the next sync. Many LeaderWorkerSet releases refuse to change
# a group's size in place, and a new size re-forms every group anyway.
REPLACED_ON_CHANGE: dict[str, list[tuple[Path, str]]] = {
    "LeaderWorkerSet": [(GROUP_SIZE_PATH, "numberOfNodes")],
    # Only a child another controller created has another selector: the upstream operator puts
    # its managed-by label in every selector.
    "Deployment": [(("spec", "selector"), "the selector")],
    "StatefulSet": [(("spec", "selector"), "the selector")],
    "Service": [(("spec", "selector"), "the selector")],
}
# Of those, the fields the API server lets change: replaced only when the stored map holds a key
# the hook never applied, which the 3-way merge would keep (the Service would then select no new
# pod). Otherwise they change in place: BlueGreen moves a server's Service to the next generation.
MERGED_IN_PLACE = {("Service", ("spec", "selector"))}


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


# Every path the steps above read, by kind: what an encoded child carries beside its body.
TABLES = (IMMUTABLE_FIELDS, GROW_ONLY, REPLACED_ON_CHANGE)
WATCHED_PATHS: dict[str, tuple[Path, ...]] = {
    kind: tuple(path for table in TABLES for path, _ in table.get(kind, [])) for kind in set().union(*TABLES)
}
REMOVED = object()  # a field to leave out of the answer


def encoded(child: dict[str, Any]) -> EncodedChild:
    """A child encoded with the fields keep_immutable_fields compares."""
    kind = child.get("kind")
    return EncodedChild.of(child, WATCHED_PATHS.get(kind, ()) if isinstance(kind, str) else ())


def kept_as_applied(children: list[dict[str, Any]], observed: list[dict[str, Any]]) -> list[EncodedChild]:
    """Observed `children` answered exactly as last applied (contract.as_kept; `observed`: every
    observed child), encoded."""
    return [encoded(child) for child in as_kept(children, observed)]


# What each observed child's last-applied record holds at its kind's IMMUTABLE_FIELDS, by (kind,
# name): None where the record does not parse. A child without a record is not in it.
RecordedFields = dict[tuple[str, str], dict[Path, Any] | None]


def _holds_foreign_keys(stored: Any, applied: Any, wanted: Any) -> bool:
    """Whether the map `stored` holds a key neither `wanted` nor `applied` by the hook."""
    if not isinstance(stored, dict):
        return True
    known = set(wanted if isinstance(wanted, dict) else ()) | set(applied if isinstance(applied, dict) else ())
    return not set(stored) <= known


def _verbatim(stored: Any, wanted: Any) -> bool:
    return stored == wanted and canonical_json(stored) == canonical_json(wanted)


def keep_immutable_fields(
    desired: list[EncodedChild], observed: dict[tuple[str, str], dict[str, Any]], recorded: RecordedFields
) -> tuple[list[EncodedChild], list[str]]:
    """Set immutable fields of `desired` to their observed values (`observed` by kind and name;
    `recorded`: what their records hold there) and leave out children that must be replaced;
    return the children to answer and one notice per field concerned. Only a child that changes
    is decoded and encoded again."""
    answer, notices = [], []
    for child in desired:
        current = observed.get((child.kind, child.name)) if child.kind in WATCHED_PATHS else None
        stored = fields_at(current, child.fields) if current is not None else {}
        # Most children hold what they were rendered with, and none of their fields is set
        # from what is stored: nothing to check further.
        if current is None or (child.kind not in IMMUTABLE_FIELDS and stored == child.fields):
            answer.append(child)
            continue
        label = f"{child.kind} {child.name}"
        replaced = [
            (path, spec_field)
            for path, spec_field in REPLACED_ON_CHANGE.get(child.kind, [])
            if stored[path] != child.fields[path]
            and (
                (child.kind, path) not in MERGED_IN_PLACE
                or _holds_foreign_keys(
                    stored[path], field_at(recorded_configuration(current), *path), child.fields[path]
                )
            )
        ]
        if replaced:
            for path, spec_field in replaced:
                notices.append(
                    f"{label} is being replaced: {spec_field} changed from {stored[path]} to "
                    f"{child.fields[path]} ({'.'.join(path)} cannot change in place)"
                )
            continue
        changes: dict[Path, Any] = {}
        for path, spec_field in GROW_ONLY.get(child.kind, []):
            stored_value, wanted = stored[path], child.fields[path]
            if isinstance(stored_value, str) and isinstance(wanted, str) and _smaller(wanted, stored_value):
                notices.append(
                    f"{spec_field} not applied to {label}: {wanted} is less than its {stored_value}, which cannot shrink"
                )
                changes[path] = stored_value
        for path, spec_field in IMMUTABLE_FIELDS.get(child.kind, []):
            stored_value, wanted = stored[path], child.fields[path]
            # Left unset, what the API server filled in (a default storage class) stays: the
            # 3-way merge keeps a field never applied.
            if stored_value is None or wanted is None:
                continue
            if stored_value != wanted and not _covers(stored_value, wanted):
                notices.append(
                    f"{spec_field} change not applied to {label}: "
                    f"{'.'.join(path)} is immutable (delete the {child.kind} to recreate it)"
                )
            # Never applied (the API server filled it in): left out, the merge keeps it. Without
            # a record, what is stored is what the hook is taken to have applied.
            record = recorded.get((child.kind, child.name))
            applied = record[path] if record is not None else stored_value
            changes[path] = stored_value if applied is not None else REMOVED
        # Verbatim: 1, 1.0 and True are equal in Python, not on the wire.
        if any(value is REMOVED or not _verbatim(value, child.fields[path]) for path, value in changes.items()):
            edits = [[path] if value is REMOVED else [path, value] for path, value in changes.items()]
            child = _edited(child.body, canonical_json(edits))
        answer.append(child)
    return answer, notices


def _edited(body: bytes, edits: bytes) -> EncodedChild:
    """A child's body with fields set, `[path, value]`, or removed, `[path]`."""
    child = json.loads(body)
    for path, *value in json.loads(edits):  # the standard library's: exact for any number
        parent = field_at(child, *path[:-1])
        if value:
            parent[path[-1]] = value[0]
        else:
            parent.pop(path[-1])
    return encoded(child)
