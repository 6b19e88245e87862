"""The hooks as pure functions: a parsed Metacontroller request in, the answer out."""

import logging
from typing import Any

from pydantic import ValidationError

from hooks import status
from hooks.api import InferaDeployment, SpecError
from hooks.contract import HookRequest, as_last_applied
from hooks.immutable import keep_immutable_fields
from hooks.renderers import render_children

log = logging.getLogger(__name__)


def describe_validation_error(error: ValidationError) -> str:
    """One line naming each bad field by its API path, e.g. `spec.services.decode.replicas`."""
    problems = []
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"])
        # Our own rules already say what is wrong; pydantic would prefix "Value error, ".
        message = str(item["ctx"]["error"]) if item["type"] == "value_error" else item["msg"]
        problems.append(f"{path}: {message}" if path else message)
    return "; ".join(problems)


def parse_parent(parent: dict[str, Any]) -> InferaDeployment:
    """Validate the parent; raises SpecError naming the field on any problem."""
    try:
        return InferaDeployment.model_validate(
            {"metadata": parent.get("metadata"), "spec": parent.get("spec") or {}}
        )
    except ValidationError as error:
        raise SpecError(f"invalid spec: {describe_validation_error(error)}") from None


def _previous_status(request: HookRequest) -> dict[str, Any]:
    previous = request.parent.get("status")
    return previous if isinstance(previous, dict) else {}


def sync(request: HookRequest, now: status.Clock = status.utc_now) -> dict[str, Any]:
    try:
        idep = parse_parent(request.parent)
        children = render_children(idep)
        notices = keep_immutable_fields(children, request.children)
    except SpecError as error:
        return _keep_observed(request, str(error), now)
    except Exception as error:  # a renderer bug must not delete a running fleet either
        log.exception("rendering %s failed", request.parent["metadata"]["name"])
        return _keep_observed(request, f"internal error while rendering: {error}", now)
    return {
        "status": status.roll_up(idep, request.children, _previous_status(request), now, notices),
        "children": children,
    }


def _keep_observed(request: HookRequest, message: str, now: status.Clock) -> dict[str, Any]:
    """A bad spec fails loudly in status and keeps every observed child exactly as applied,
    creating nothing new."""
    generation = request.parent["metadata"].get("generation")
    return {
        "status": status.failed(
            message, generation if isinstance(generation, int) else 0, _previous_status(request), now
        ),
        "children": [as_last_applied(child) for child in request.children],
    }


# While children are still going away, call back even if no deletion event arrives.
FINALIZE_RESYNC_SECONDS = 5


def finalize(request: HookRequest) -> dict[str, Any]:
    """Teardown: release every child; the finalizer goes once none is observed any more."""
    remaining = len(request.children)
    if not remaining:
        return {"status": {"state": "terminating", "message": "all children deleted"}, "children": [], "finalized": True}
    return {
        "status": {"state": "terminating", "message": f"deleting {remaining} children"},
        "children": [],
        "finalized": False,
        "resyncAfterSeconds": FINALIZE_RESYNC_SECONDS,
    }
