"""Metacontroller's hook wire contract: what a request holds and what an answer may contain.

Requests are `{"controller", "parent", "children", "related", "finalizing"}`. Children are
grouped by `Kind.apiVersion`, then keyed by `name` (hook v1) or `namespace/name` (hook v2);
only the objects matter, never the keys. Answers may hold only `status`, `children`,
`resyncAfterSeconds` and `finalized`: v2 hooks are decoded strictly.
"""

import functools
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from hooks import vocabulary

LAST_APPLIED_ANNOTATION = "metacontroller.k8s.io/last-applied-configuration"
# The label generateSelector adds to every child: the parent's uid, which its selector matches.
CONTROLLER_UID_LABEL = "controller-uid"
# Metacontroller sends the parent plus every child; 16 MiB is far above any real graph.
DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024


class BadRequest(ValueError):
    """The body is not a Metacontroller hook request; answered with HTTP 400."""


# Child kinds the hook can emit, by the (apiVersion, resource) of a childResources entry.
CHILD_KINDS = {(child.api_version, child.resource): child.kind for child in vocabulary.CHILD_KINDS}

Kind = tuple[str, str]  # (kind, apiVersion)


@dataclass(frozen=True)
class HookRequest:
    parent: dict[str, Any]
    children: list[dict[str, Any]]
    # Objects the customize hook asked for, and the Kind.apiVersion keys Metacontroller sent for
    # them (present, possibly empty, for every kind the customize hook asks for).
    related: list[dict[str, Any]] = field(default_factory=list)
    related_kinds: frozenset[str] = frozenset()
    # Child kinds the CompositeController registers.
    registered: "Registration" = field(default_factory=lambda: Registration())

    @functools.cached_property
    def by_key(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The observed children by (kind, name)."""
        return {child_key(child): child for child in self.children}


@dataclass(frozen=True)
class Registration:
    """The child kinds (kind, apiVersion) the CompositeController registers; None when the
    request does not say (a hand-written body): every kind may then be emitted. What follows
    from it is hooks.registration's."""

    kinds: frozenset[Kind] | None = None

    def registers(self, kind: str, api_version: str) -> bool:
        return self.kinds is None or (kind, api_version) in self.kinds

    def allows(self, child: dict[str, Any]) -> bool:
        return self.registers(child["kind"], child["apiVersion"])


def _registered(body: dict[str, Any]) -> frozenset[Kind] | None:
    """Registered kinds from `controller.spec.childResources`, else from the children map,
    which Metacontroller fills with every registered type (`{}` when none exists)."""
    controller = body.get("controller")
    spec = controller.get("spec") if isinstance(controller, dict) else None
    resources = spec.get("childResources") if isinstance(spec, dict) else None
    if isinstance(resources, list):
        keys = [(entry.get("apiVersion"), entry.get("resource")) for entry in resources if isinstance(entry, dict)]
        # A key of anything but strings is in no table: only strings are looked up.
        strings = [key for key in keys if isinstance(key[0], str) and isinstance(key[1], str)]
        return frozenset((CHILD_KINDS[key], key[0]) for key in strings if key in CHILD_KINDS)
    children = body.get("children")
    if isinstance(children, dict) and children:
        return frozenset(tuple(key.split(".", 1)) for key in children if "." in key)
    return None


def _objects(group: Any, where: str) -> list[dict[str, Any]]:
    if group is None:
        return []
    if not isinstance(group, dict):
        raise BadRequest(f"'{where}' must be an object of Kind.apiVersion -> name -> object")
    objects = []
    for type_key, by_name in sorted(group.items()):
        if by_name is None:
            continue
        if not isinstance(by_name, dict):
            raise BadRequest(f"'{where}.{type_key}' must be an object keyed by child name")
        for key, child in sorted(by_name.items()):
            if not _is_kubernetes_object(child):
                raise BadRequest(
                    f"'{where}.{type_key}.{key}' must be a Kubernetes object: a kind, a name, labels and annotations "
                    "of strings, spec and status objects"
                )
            objects.append(child)
    return objects


def _is_kubernetes_object(obj: Any) -> bool:
    """The shape every object from the API server has, as far as the hooks read it."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    return (
        isinstance(metadata, dict)
        and isinstance(metadata.get("name"), str)
        and isinstance(obj.get("kind"), str)
        and is_string_map(metadata.get("labels"))
        and is_string_map(metadata.get("annotations"))
        and isinstance(obj.get("spec"), OPTIONAL_OBJECT)
        and isinstance(obj.get("status"), OPTIONAL_OBJECT)
    )


OPTIONAL_OBJECT = (dict, type(None))


def is_string_map(mapping: Any) -> bool:
    """Absent, or an object of strings: what labels and annotations may be."""
    if mapping is None:
        return True
    if not isinstance(mapping, dict):
        return False
    for value in mapping.values():  # a loop: all() over map() is slower on the hot path
        if not isinstance(value, str):
            return False
    return True


# JSON can escape a lone UTF-16 surrogate (\ud800): it decodes to a str that no UTF-8 encoder
# accepts, so an answer echoing it could never be written. Valid pairs decode to one character.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _lone_surrogate(node: Any, where: str) -> str | None:
    """Where a string holds a lone surrogate (a key or a value), or None. Keys in the path are
    escaped: the path goes into an answer, which must be valid UTF-8."""
    if isinstance(node, str):
        return where if any("\ud800" <= char <= "\udfff" for char in node) else None
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        name = str(key).encode("utf-8", "backslashreplace").decode()
        path = f"{where}.{name}" if where else name
        found = _lone_surrogate(key, path) if isinstance(key, str) else None
        if found is None:
            found = _lone_surrogate(value, path)
        if found is not None:
            return found
    return None


def decode(raw: bytes) -> Any:
    """The JSON document in a request body; ValueError (BadRequest for a lone surrogate) if
    there is none.

    orjson reads every RFC 8259 document, the whole of what Metacontroller sends; it refuses
    the rest (a lone surrogate, NaN, UTF-16, nesting past 1,024 levels), which the standard
    library then reads or refuses as it always has, except a number that is not finite (NaN,
    Infinity, 1e400), which no Kubernetes object holds: refused. They differ only on an integer
    beyond 64 bits, which orjson reads as a float: the API server has read it as one already (a
    Kubernetes object holds int64 or float64), so only a hand-written body can hold one."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    document = finite_json(raw)
    if SURROGATE_ESCAPE.search(raw) and (where := _lone_surrogate(document, "")) is not None:
        raise BadRequest(
            f"{where or 'the body'} holds a lone UTF-16 surrogate escape (\\ud800-\\udfff), which is not text"
        )
    return document


def parse_request(body: Any) -> HookRequest:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    parent = body.get("parent")
    if not isinstance(parent, dict):
        raise BadRequest("'parent' is missing or not an object")
    metadata = parent.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str) or not metadata["name"]:
        raise BadRequest("'parent.metadata.name' is missing")
    if not isinstance(body.get("finalizing", False), bool):
        raise BadRequest("'finalizing' must be a boolean")
    return HookRequest(
        parent=parent,
        children=_objects(body.get("children"), "children"),
        registered=Registration(_registered(body)),
        related=_objects(body.get("related"), "related"),
        related_kinds=frozenset(body["related"]) if isinstance(body.get("related"), dict) else frozenset(),
    )


def field_at(obj: Any, *keys: str) -> Any:
    """obj[k1][k2]..., or None where a level is missing or not an object (a child from the API
    server has its shape, but a request body or a patched child may hold anything)."""
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def fields_at(obj: Any, paths: Iterable[tuple[str, ...]]) -> dict[tuple[str, ...], Any]:
    """field_at for each of `paths`, by path."""
    return {path: field_at(obj, *path) for path in paths}


# Metacontroller's 3-way merge (pkg/dynamic/apply) takes a list whose items are all objects
# sharing one of these keys (the first, in this order) as a map by that key's value.
MERGE_KEYS = ("containerPort", "port", "mountPath", "name", "uid", "ip", "path")


def list_merge_key(*lists: list[Any]) -> str | None:
    """The key by which Metacontroller merges these versions of one list, or None (it replaces
    the list whole)."""
    common: set[str] | None = None
    for item in (item for items in lists for item in items):
        if not isinstance(item, dict):
            return None
        common = set(item) if common is None else common & set(item)
    return next((key for key in MERGE_KEYS if common and key in common), None)


def merge_key_text(value: Any) -> str:
    """A merge key's value as Go's fmt %v writes it: items whose texts are equal are one item."""
    if isinstance(value, str):
        return value
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return json.dumps(value, sort_keys=True)


def child_key(child: dict[str, Any]) -> tuple[str, str]:
    return child.get("kind", ""), child["metadata"].get("name", "")


def recorded_configuration(child: dict[str, Any]) -> dict[str, Any] | None:
    """The child as Metacontroller recorded it when it last applied it, or None."""
    recorded = (child["metadata"].get("annotations") or {}).get(LAST_APPLIED_ANNOTATION)
    return parse_recorded(recorded) if recorded else None


def parse_recorded(recorded: str) -> dict[str, Any] | None:
    try:
        applied = finite_json(recorded)
    except (ValueError, RecursionError):
        return None
    return applied if isinstance(applied, dict) else None


def finite_json(text: str | bytes) -> Any:
    """json.loads, refusing a number that is not finite (BadRequest): answered again, a NaN
    would be written as no JSON at all."""
    return json.loads(text, parse_float=_finite, parse_constant=_not_finite)


def _finite(text: str) -> float:
    value = float(text)
    return value if math.isfinite(value) else _not_finite(text)


def _not_finite(text: str) -> float:
    raise BadRequest(f"the number {text} is not finite: JSON holds no NaN or Infinity")


def as_last_applied(child: dict[str, Any]) -> dict[str, Any]:
    """What the hook last asked for: answering it again changes nothing on the cluster.

    Metacontroller records every applied child in the last-applied annotation. Without one
    (a child adopted from elsewhere) keep the object minus what the API server owns.
    """
    metadata = child["metadata"]
    applied = recorded_configuration(child)
    if applied is not None:
        return applied
    kept_metadata = {k: metadata[k] for k in ("name", "namespace", "labels", "annotations") if k in metadata}
    return {k: v for k, v in child.items() if k not in ("status", "metadata")} | {"metadata": kept_metadata}


def as_kept(kept: list[dict[str, Any]], observed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Observed children answered so that nothing on the cluster changes: each as last applied,
    except the replicas of a workload that an observed HorizontalPodAutoscaler scales. Those are
    the autoscaler's: answering the recorded count would undo its every decision."""
    scaled = {
        (ref.get("kind"), ref.get("name"))
        for hpa in observed
        if hpa.get("kind") == "HorizontalPodAutoscaler"
        and isinstance(ref := field_at(hpa, "spec", "scaleTargetRef"), dict)
    }
    answer = []
    for child in kept:
        applied = as_last_applied(child)
        live = field_at(child, "spec", "replicas")
        if child_key(child) in scaled and type(live) is int and isinstance(applied.get("spec"), dict):
            applied = {**applied, "spec": {**applied["spec"], "replicas": live}}
        answer.append(applied)
    return answer
