"""spec.patches: RFC 6902 JSON patches on rendered children, for what the API does not model."""

import jsonpatch
import jsonpointer

from hooks.api import InferaDeployment, SpecError
from hooks.renderers.common import DEPLOYMENT_LABEL, SERVICE_LABEL


def _identity(child: dict) -> tuple:
    """What Metacontroller and this hook recognise a child by: kind, name and identity labels."""
    metadata = child.get("metadata") or {}
    labels = metadata.get("labels") or {}
    return child.get("apiVersion"), child.get("kind"), metadata.get("name"), labels.get(DEPLOYMENT_LABEL), labels.get(SERVICE_LABEL)


def apply_patches(idep: InferaDeployment, children: list[dict]) -> list[dict]:
    """The children with every patch applied in order; SpecError names a patch that does not apply."""
    children = list(children)
    for index, patch in enumerate(idep.spec.patches or []):
        where = f"patches[{index}] ({patch.target.kind} {patch.target.name})"
        position = next(
            (i for i, child in enumerate(children)
             if child["kind"] == patch.target.kind and child["metadata"]["name"] == patch.target.name),
            None,
        )
        if position is None:
            rendered = ", ".join(f"{c['kind']} {c['metadata']['name']}" for c in children)
            raise SpecError(f"{where}: no such child is rendered; the children are: {rendered}")
        before = patched = children[position]
        for number, operation in enumerate(patch.patch):
            step = operation.model_dump(by_alias=True, exclude_unset=True)
            try:
                patched = jsonpatch.apply_patch(patched, [step])
            except jsonpointer.JsonPointerException:
                # Its message would quote the whole child; say which path instead.
                raise SpecError(f"{where}: operation {number} ({step['op']} {step['path']}): path not found") from None
            except jsonpatch.JsonPatchException as error:
                raise SpecError(f"{where}: operation {number} ({step['op']} {step['path']}): {error}") from None
        if _identity(patched) != _identity(before):
            raise SpecError(f"{where}: a patch must not change apiVersion, kind, metadata.name or the identity labels")
        children[position] = patched
    return children
