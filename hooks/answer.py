"""The sync's answer besides its status: the desired children with what the rollout keeps or
restores, less what the controller cannot create, with what cannot change as stored; or, for a
spec that cannot be rendered, every observed child as applied."""

from dataclasses import dataclass
from typing import Any

from hooks import registration, rollout
from hooks.contract import HookRequest
from hooks.encoding import EncodedChild, sync_answer_json
from hooks.generations import Rollout
from hooks.immutable import keep_immutable_fields, kept_as_applied
from hooks.rollout import Restoration


@dataclass(frozen=True)
class Children:
    """The children to answer, and what the status says of what could not be answered."""

    answer: list[EncodedChild]
    notices: list[str]  # changes that could not be applied
    unregistered: list[str]  # children of kinds the controller does not register
    lost: list[str]  # children of the serving generation this spec cannot make again


def children(
    request: HookRequest,
    desired: list[EncodedChild],
    plan: Rollout | None,
    restoration: Restoration | None = None,
    rendered_at_serving: list[dict[str, Any]] | None = None,
) -> Children:
    """The answer whose rendered children are `desired`; under a rollout whose serving generation
    lost children (`restoration`), with those the spec `rendered_at_serving` makes as recorded."""
    restored, lost = rollout.restored(restoration, rendered_at_serving or [], plan)
    answer = desired + rollout.kept_generations(request, plan) + restored
    answer, unregistered = registration.withhold_unregistered(request.registered, answer, request.children)
    answer, notices = keep_immutable_fields(answer, request.by_key)
    return Children(answer, notices, unregistered, lost)


def observed_as_applied(request: HookRequest) -> list[EncodedChild]:
    """Every observed child exactly as applied (an autoscaled workload at the autoscaler's
    count), creating nothing new: what a spec that cannot be rendered is answered."""
    return kept_as_applied(request.children, request.children)


@dataclass(frozen=True)
class SyncAnswer:
    state: str | None
    status_json: bytes  # the status as canonical JSON
    children: list[EncodedChild]

    def json(self) -> bytes:
        """The answer as canonical JSON, spliced from its parts' encodings."""
        return sync_answer_json(self.status_json, self.children)
