"""The sync's answer: the children to answer, less what the controller cannot create and with
what cannot change as stored, or, for a spec that cannot be rendered, every observed child as
applied; and the answer as it is sent."""

from dataclasses import dataclass

from hooks import registration
from hooks.contract import HookRequest
from hooks.encoding import EncodedChild, sync_answer_json
from hooks.immutable import keep_immutable_fields, kept_as_applied


@dataclass(frozen=True)
class AnsweredChildren:
    """The children to answer, and what the status says of what could not be answered."""

    children: list[EncodedChild]
    notices: list[str]  # changes that could not be applied
    unregistered: list[str]  # children withheld: the controller does not register their kind


def answered(request: HookRequest, proposed: list[EncodedChild]) -> AnsweredChildren:
    """`proposed` (rendered, kept and restored children) as they can be answered: services that
    hold a child of an unregistered kind kept as observed, fields that cannot change as stored."""
    children, unregistered = registration.withhold_unregistered(request.registered, proposed, request.children)
    children, notices = keep_immutable_fields(children, request.by_key)
    return AnsweredChildren(children, notices, unregistered)


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
