"""spec.patches: RFC 6902 JSON patches on rendered children, for what the API does not model.

Metacontroller applies every child with its own broad permissions, so a patch must not create
what the InferaDeployment's author may not: a patched child stays in the parent's namespace,
under Metacontroller's ownership, and keeps the fields the hook or Metacontroller decides
(OWNED_FIELDS), such as the permissions a Role grants.
"""

import copy
from collections.abc import Callable, Iterable
from typing import Any

import jsonpatch
import jsonpointer

from hooks.api.fields import SpecError, nesting
from hooks.contract import CONTROLLER_UID_LABEL, LAST_APPLIED_ANNOTATION, field_at
from hooks.encoding import Path
from hooks.limits import MAX_NESTING, RenderedSize, json_size
from hooks.observed import POD_TEMPLATE_PATHS
from hooks.vocabulary import COMPONENT_LABEL, DEPLOYMENT_LABEL, GAIE_FRONTEND_LABEL, GENERATION_LABEL, SERVICE_LABEL

# A field a patch may not change, and who sets it (for the message).
Owned = tuple[Path, str]

# A patch may change a child's labels and annotations. The rest of its metadata is set by
# Metacontroller (the namespace: a child elsewhere would be created there with Metacontroller's
# permissions; the owner, which it claims children by) or by the API server (uid,
# resourceVersion, ...: Metacontroller's apply fails on every sync with another value).
PATCHABLE_METADATA = ("labels", "annotations")
METADATA_OWNERS = {
    "namespace": "Metacontroller (every child is in the InferaDeployment's namespace)",
    "ownerReferences": "Metacontroller (the InferaDeployment owns every child)",
    "finalizers": (
        "the controllers that act on them (one that no controller removes would hold the child, "
        "and the InferaDeployment's deletion, forever)"
    ),
}
RBAC_OWNER = "the hook (the graph's processes get the permissions they need, and no more)"
# The fields a child's rendered value decides, by kind ("*": every kind), and who decides them.
# Keyed on kind, never on name: which accounts and Roles are rendered is the renderers' business.
OWNED_FIELDS: dict[str, tuple[Owned, ...]] = {
    "*": (
        (("metadata", "labels", CONTROLLER_UID_LABEL), "Metacontroller (its generated selector)"),
        (("metadata", "annotations", LAST_APPLIED_ANNOTATION), "Metacontroller (its record of what it applied)"),
    ),
    "Role": ((("rules",), RBAC_OWNER),),
    "RoleBinding": ((("roleRef",), RBAC_OWNER), (("subjects",), RBAC_OWNER)),
    "PodDisruptionBudget": (
        (("spec", "selector"), "the hook (exactly the pool's pods: a pod under two budgets can never be evicted)"),
    ),
}


# The labels by which the graph's pods are told apart: the routers' and the Endpoint Picker's
# selectors, the InferencePool's, the network policies', the budgets' and the teardown's.
POD_IDENTITY_LABELS = (DEPLOYMENT_LABEL, SERVICE_LABEL, COMPONENT_LABEL, GENERATION_LABEL, GAIE_FRONTEND_LABEL)
POD_IDENTITY_OWNER = (
    "the hook (the routers, the InferencePool, the network policies and the teardown select pods by it)"
)


def owned_fields(child: dict[str, Any]) -> Iterable[Owned]:
    """What no patch may change in `child`, whatever the spec says: with the fields every child of
    its kind keeps, the identity labels of each pod template it has. A template a patch removes
    whole is left to the API server's schema (a group needs its worker template)."""
    templates = tuple(
        ((*path, "metadata", "labels", label), POD_IDENTITY_OWNER)
        for path in POD_TEMPLATE_PATHS.get(child["kind"], ())
        if isinstance(field_at(child, *path), dict)
        for label in POD_IDENTITY_LABELS
    )
    return OWNED_FIELDS["*"] + OWNED_FIELDS.get(child["kind"], ()) + templates


def _identity(child: dict) -> tuple:
    """What Metacontroller and this hook recognise a child by: kind, name and identity labels
    (its generation's too)."""
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
        labels.get(GENERATION_LABEL),
    )


def _changed_owned_field(rendered: dict, patched: dict, owned: Iterable[Owned]) -> str | None:
    """The first field of `rendered` that a patch may not change and `patched` changes, with who
    sets it; None if there is none. Both have the same identity, so metadata is an object."""
    before, after = rendered["metadata"], patched["metadata"]
    for key in sorted((before.keys() | after.keys()) - set(PATCHABLE_METADATA)):
        if before.get(key) != after.get(key):
            return f"metadata.{key} is set by {METADATA_OWNERS.get(key, 'the API server')}"
    for path, owner in owned:
        if field_at(patched, *path) != field_at(rendered, *path):
            return f"{'.'.join(path)} is set by {owner}"
    return None


def _placed(child: dict, step: dict[str, Any]) -> Any:
    """What one operation puts into the child or compares with it: its value, or for copy and
    move the value at `from`."""
    if step["op"] in ("copy", "move"):
        try:
            return jsonpointer.resolve_pointer(child, step.get("from", ""))
        except jsonpointer.JsonPointerException:
            return None  # applying it reports the missing path
    return step.get("value")


def target_name(child: dict) -> str:
    """The name a patch aims at a child by: a generation's child (under BlueGreen) by its name
    without the generation, so that one patch applies to every generation."""
    metadata = child["metadata"]
    generation = (metadata.get("labels") or {}).get(GENERATION_LABEL)
    return metadata["name"].removesuffix(f"-{generation}") if generation else metadata["name"]


def apply_patches(
    patches: list,
    children: list[dict],
    sizes: RenderedSize,
    owned: Callable[[dict], Iterable[Owned]] = owned_fields,
) -> list[dict]:
    """The children with every patch applied in order; SpecError names a patch that does not
    apply, that grows a child (or the answer) past what `sizes` allows, nests it too deep, or
    changes what `owned` says it may not.

    A patched child is copied once, then patched in place: one copy per operation would make
    many operations quadratic."""
    rendered = children
    children = list(children)
    copied: set[int] = set()
    for index, patch in enumerate(patches):
        where = f"patches[{index}] ({patch.target.kind} {patch.target.name})"
        position = next(
            (
                i
                for i, child in enumerate(children)
                if child["kind"] == patch.target.kind and target_name(child) == patch.target.name
            ),
            None,
        )
        if position is None:
            listed = ", ".join(f"{c['kind']} {target_name(c)}" for c in children)
            raise SpecError(f"{where}: no such child is rendered; the children are: {listed}")
        if position not in copied:
            children[position] = copy.deepcopy(children[position])
            copied.add(position)
        patched = children[position]
        identity = _identity(patched)
        for number, operation in enumerate(patch.patch):
            step = operation.model_dump(by_alias=True, exclude_unset=True)
            at = f"{where}: operation {number} ({step['op']} {step['path']})"
            placed = _placed(patched, step)
            sizes.grow(position, patched, json_size(placed) if step["op"] in ("add", "replace", "copy") else 0, at)
            # Each token of the path is a level above what it places.
            if step["path"].count("/") + nesting(placed) > MAX_NESTING:
                raise SpecError(
                    f"{at}: would nest the child more than {MAX_NESTING} levels deep (Kubernetes objects nest about 15)"
                )
            try:
                patched = jsonpatch.JsonPatch([step]).apply(patched, in_place=True)
            except jsonpointer.JsonPointerException:
                # Its message would quote the whole child; say which path instead.
                raise SpecError(f"{at}: path not found") from None
            except jsonpatch.JsonPatchException as error:
                raise SpecError(f"{at}: {error}") from None
        if not isinstance(patched, dict) or _identity(patched) != identity:
            raise SpecError(f"{where}: a patch must not change apiVersion, kind, metadata.name or the identity labels")
        # What the patched child still has is owned: its templates' labels, not a template it drops.
        changed = _changed_owned_field(rendered[position], patched, owned(patched))
        if changed is not None:
            raise SpecError(f"{where}: {changed}, not by a patch")
        children[position] = patched
    return children


def targeting(patches: list, child: dict) -> str:
    """The patches aimed at `child`, as a spec path: `patches[0], patches[3]`."""
    key = (child["kind"], target_name(child))
    return ", ".join(
        f"patches[{index}]" for index, patch in enumerate(patches) if (patch.target.kind, patch.target.name) == key
    )
