"""spec.patches: RFC 6902 JSON patches on rendered children, for what the API does not model."""

import copy
from typing import Any

import jsonpatch
import jsonpointer

from hooks.api import SpecError
from hooks.limits import RenderedSize, json_size
from hooks.vocabulary import DEPLOYMENT_LABEL, SERVICE_LABEL


def _identity(child: dict) -> tuple:
    """What Metacontroller and this hook recognise a child by: kind, name and identity labels."""
    metadata = child.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    labels = metadata.get("labels")
    labels = labels if isinstance(labels, dict) else {}
    return (
        child.get("apiVersion"),
        child.get("kind"),
        metadata.get("name"),
        labels.get(DEPLOYMENT_LABEL),
        labels.get(SERVICE_LABEL),
    )


def _added_bytes(child: dict, step: dict[str, Any]) -> int:
    """What one operation can add to the child: its value, or for copy the value it copies."""
    if step["op"] in ("add", "replace"):
        return json_size(step.get("value"))
    if step["op"] == "copy":
        try:
            return json_size(jsonpointer.resolve_pointer(child, step.get("from", "")))
        except jsonpointer.JsonPointerException:
            return 0  # applying it reports the missing path
    return 0


def apply_patches(patches: list, children: list[dict], sizes: RenderedSize) -> list[dict]:
    """The children with every patch applied in order; SpecError names a patch that does not
    apply or that grows a child (or the answer) past what `sizes` allows.

    A patched child is copied once, then patched in place: one copy per operation would make
    many operations quadratic."""
    children = list(children)
    copied: set[int] = set()
    for index, patch in enumerate(patches):
        where = f"patches[{index}] ({patch.target.kind} {patch.target.name})"
        position = next(
            (
                i
                for i, child in enumerate(children)
                if child["kind"] == patch.target.kind and child["metadata"]["name"] == patch.target.name
            ),
            None,
        )
        if position is None:
            rendered = ", ".join(f"{c['kind']} {c['metadata']['name']}" for c in children)
            raise SpecError(f"{where}: no such child is rendered; the children are: {rendered}")
        if position not in copied:
            children[position] = copy.deepcopy(children[position])
            copied.add(position)
        patched = children[position]
        identity = _identity(patched)
        for number, operation in enumerate(patch.patch):
            step = operation.model_dump(by_alias=True, exclude_unset=True)
            at = f"{where}: operation {number} ({step['op']} {step['path']})"
            sizes.grow(position, patched, _added_bytes(patched, step), at)
            try:
                patched = jsonpatch.JsonPatch([step]).apply(patched, in_place=True)
            except jsonpointer.JsonPointerException:
                # Its message would quote the whole child; say which path instead.
                raise SpecError(f"{at}: path not found") from None
            except jsonpatch.JsonPatchException as error:
                raise SpecError(f"{at}: {error}") from None
        if not isinstance(patched, dict) or _identity(patched) != identity:
            raise SpecError(f"{where}: a patch must not change apiVersion, kind, metadata.name or the identity labels")
        children[position] = patched
    return children


def targeting(patches: list, child: dict) -> str:
    """The patches aimed at `child`, as a spec path: `patches[0], patches[3]`."""
    key = (child["kind"], child["metadata"]["name"])
    return ", ".join(
        f"patches[{index}]" for index, patch in enumerate(patches) if (patch.target.kind, patch.target.name) == key
    )
