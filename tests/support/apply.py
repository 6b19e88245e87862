"""How Metacontroller v4.17 applies a sync answer to one child, written from its source
(pkg/controller/composite/controller.go, pkg/controller/common/manage_children.go,
pkg/dynamic/apply): the simulator's only source of these rules.

- It stamps the generated selector's label only where the hook left it out, and fails the whole
  sync when a child's label would not match the parent's selector.
- It records what it applied, as Go's encoding/json writes it, in the last-applied annotation,
  and merges observed, last-applied and desired in the style of `kubectl apply` (3-way).
- It compares with Go's reflect.DeepEqual over decoded JSON: an integer and a float (1 and 1.0)
  differ, as do a bool and a number; Python's `==` says both pairs are equal.
- It updates a child only as the childResources entry's updateStrategy says.
"""

import json
import math
from typing import Any, Literal

from hooks.contract import CONTROLLER_UID_LABEL, LAST_APPLIED_ANNOTATION, list_merge_key, merge_key_text
from hooks.limits import GO_ESCAPE_EXTRA

# metadata fields the server owns: the merge never changes them (revertObjectMetaSystemFields).
SYSTEM_METADATA = (
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
)

Update = Literal["none", "update", "recreate"]


class SyncFailed(Exception):
    """Metacontroller refuses the whole answer: no child is written, nor the status."""


def stamped(desired: dict[str, Any], namespace: str, parent_uid: str) -> dict[str, Any]:
    """A desired child as Metacontroller applies it: in the parent's namespace, with the
    generated selector's label unless the hook set it (then it must match the parent's uid)."""
    child = json.loads(json.dumps(desired))
    metadata = child["metadata"]
    if not metadata.get("namespace"):
        metadata["namespace"] = namespace
    labels = metadata.get("labels")
    if labels is None or CONTROLLER_UID_LABEL not in labels:
        metadata["labels"] = {**(labels or {}), CONTROLLER_UID_LABEL: parent_uid}
    elif labels[CONTROLLER_UID_LABEL] != parent_uid:
        raise SyncFailed(
            f"labels on desired child {child['kind']} {namespace}/{metadata['name']} don't match parent selector"
        )
    return child


def go_json(value: Any) -> str:
    """`value` as Go's json.Marshal writes it: keys sorted, no spaces, UTF-8 kept, the HTML
    characters and line separators escaped, and a whole float written as an integer. (Go writes
    small fractions such as 0.00005 without an exponent, which Python writes 5e-05: no child the
    hooks render holds one.)"""
    text = json.dumps(_go_numbers(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for char in GO_ESCAPE_EXTRA:
        text = text.replace(char, f"\\u{ord(char):04x}")
    return text


def _go_numbers(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _go_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_go_numbers(item) for item in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    return value


def as_stored(value: Any) -> Any:
    """`value` as it reads back from the API server (or an annotation) once Go has written it:
    a whole float comes back an integer."""
    return json.loads(go_json(value))


def recorded(child: dict[str, Any]) -> dict[str, Any] | None:
    """The last-applied record on a stored child; None on a child Metacontroller never applied.
    Unlike the hooks' reader (hooks.contract.recorded_configuration), which ignores a record it
    cannot parse, Metacontroller fails on one: so does this."""
    text = (child["metadata"].get("annotations") or {}).get(LAST_APPLIED_ANNOTATION)
    return json.loads(text) if text else None


def record(child: dict[str, Any], applied: dict[str, Any]) -> None:
    child["metadata"].setdefault("annotations", {})[LAST_APPLIED_ANNOTATION] = go_json(applied)


def go_equal(left: Any, right: Any) -> bool:
    """reflect.DeepEqual over JSON decoded by Go: int64, float64, bool and string are each
    their own type."""
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(go_equal(left[key], right[key]) for key in left)
    if isinstance(left, list):
        return len(left) == len(right) and all(go_equal(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, float) and math.isnan(left):
        return False  # NaN is equal to nothing, as in Go
    return bool(left == right)


def updated(observed: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """The update Metacontroller computes (ApplyUpdate): the 3-way merge, with the server's
    metadata fields and the status kept as observed, and `desired` recorded as last applied."""
    new = merge(json.loads(json.dumps(observed)), recorded(observed) or {}, desired)
    for name in SYSTEM_METADATA:
        new["metadata"].pop(name, None)
        if name in observed["metadata"]:
            new["metadata"][name] = observed["metadata"][name]
    new.pop("status", None)
    if "status" in observed:
        new["status"] = observed["status"]
    record(new, desired)
    return new


def update_method(composite: dict[str, Any], kind_resource: tuple[str, str]) -> str:
    """The updateStrategy method a CompositeController declares for (apiVersion, resource):
    OnDelete when it declares none."""
    api_version, resource = kind_resource
    for child in composite["spec"]["childResources"]:
        if (child["apiVersion"], child["resource"]) == (api_version, resource):
            return str((child.get("updateStrategy") or {}).get("method") or "OnDelete")
    raise KeyError(kind_resource)


def update_for(method: str) -> Update:
    """What a method does to a child whose merge differs from what is stored: nothing until
    someone else deletes it, delete it now (created again by the next sync), or update it. The
    rolling methods go through ControllerRevisions, which are not modelled."""
    updates: dict[str, Update] = {"OnDelete": "none", "Recreate": "recreate", "InPlace": "update"}
    if method not in updates:
        raise NotImplementedError(f"updateStrategy method {method!r} is not modelled")
    return updates[method]


def merge(observed: Any, last_applied: Any, desired: Any) -> Any:
    """The client-side 3-way merge (pkg/dynamic/apply): fields dropped since last-applied are
    removed, desired fields are set, objects merge key by key, lists of objects sharing a
    conventional key merge item by item, other lists and scalars are replaced by the desired
    value."""
    # Go takes a last-applied or desired value of another type than the observed one as null.
    if isinstance(observed, dict):
        return _merge_object(
            dict(observed),
            last_applied if isinstance(last_applied, dict) else {},
            desired if isinstance(desired, dict) else {},
        )
    if isinstance(observed, list):
        last = last_applied if isinstance(last_applied, list) else []
        wanted = desired if isinstance(desired, list) else []
        key = list_merge_key(observed, last, wanted)
        if key:
            return _merge_list_map(key, observed, last, wanted)
        return desired if isinstance(desired, list) else None
    return desired


def _merge_object(observed: dict, last_applied: dict, desired: dict) -> dict:
    for key in last_applied:
        if key not in desired:
            observed.pop(key, None)
    for key, value in desired.items():
        observed[key] = merge(observed.get(key), last_applied.get(key), value)
    return observed


def _merge_list_map(key: str, observed: list, last_applied: list, desired: list) -> list:
    by_key = lambda items: {merge_key_text(item[key]): item for item in items}  # noqa: E731
    merged = _merge_object(by_key(observed), by_key(last_applied), by_key(desired))
    # Observed order first, each observed item (two with one key both come out as the last of
    # them, as in Go), then the desired items not yet there.
    observed_keys = [merge_key_text(item[key]) for item in observed]
    result = [merged[text] for text in observed_keys if text in merged]
    added = set(observed_keys)
    for text in (merge_key_text(item[key]) for item in desired):
        if text not in added:
            result.append(merged[text])
            added.add(text)
    return result
