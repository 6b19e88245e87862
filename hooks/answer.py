"""The sync's answer: the children to answer, less what the controller cannot create and with
what cannot change as stored, or, for a spec that cannot be rendered, every observed child as
applied; which services it changes against what was applied before; and the answer as it is
sent."""

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hooks import registration
from hooks.api.graph import InferaDeployment
from hooks.contract import LAST_APPLIED_ANNOTATION, HookRequest, fields_at, parse_recorded
from hooks.encoding import EncodedChild, sync_answer_json
from hooks.immutable import IMMUTABLE_FIELDS, RecordedFields, keep_immutable_fields, kept_as_applied
from hooks.observed import Observed
from hooks.vocabulary import WORKLOAD_KINDS, generation_name


@dataclass(frozen=True)
class AnsweredChildren:
    """The children to answer, and what the status says of what could not be answered."""

    children: list[EncodedChild]
    notices: list[str]  # changes that could not be applied
    unregistered: list[str]  # children withheld: the controller does not register their kind


def answered(request: HookRequest, proposed: list[EncodedChild], recorded: RecordedFields) -> AnsweredChildren:
    """`proposed` (rendered, kept and restored children) as they can be answered: services that
    hold a child of an unregistered kind kept as observed, fields that cannot change as stored
    (`recorded`: what the observed children's records hold there, recorded_fields)."""
    children, unregistered = registration.withhold_unregistered(request.registered, proposed, request.children)
    children, notices = keep_immutable_fields(children, request.by_key, recorded)
    return AnsweredChildren(children, notices, unregistered)


def records_to_read(observed: Iterable[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(kind, name, last-applied record) of each observed child with fields that cannot change."""
    return [
        (child["kind"], child["metadata"]["name"], recorded)
        for child in observed
        if child["kind"] in IMMUTABLE_FIELDS and (recorded := _record(child))
    ]


def recorded_fields(records: list[tuple[str, str, str]]) -> RecordedFields:
    """What each of `records` (records_to_read) holds at its kind's immutable fields."""
    read: RecordedFields = {}
    for kind, name, recorded in records:
        applied = parse_recorded(recorded)
        paths = [path for path, _ in IMMUTABLE_FIELDS[kind]]
        read[(kind, name)] = None if applied is None else fields_at(applied, paths)
    return read


def workloads_answered(
    idep: InferaDeployment, answer: Sequence[EncodedChild], observed: Observed
) -> list[tuple[str, str | None, str]]:
    """(service, its observed workload's last-applied record, the workload answered) for each
    workload of the generation `idep` renders in `answer`: the record is None where no workload
    is observed, "" where the observed one holds none (adopted from elsewhere)."""
    workloads = []
    for child in answer:
        service = child.service
        if (
            child.kind not in WORKLOAD_KINDS
            or service not in idep.spec.services
            or child.name != generation_name(idep, service)
        ):
            continue
        running = observed.get((child.kind, child.name))
        workloads.append((service, None if running is None else _record(running), child.body.decode()))
    return workloads


def _record(child: dict[str, Any]) -> str:
    """An observed child's last-applied record ("" for none). Its annotations are strings: the
    request contract checked them."""
    return str((child["metadata"].get("annotations") or {}).get(LAST_APPLIED_ANNOTATION, ""))


def services_changing(workloads: list[tuple[str, str | None, str]]) -> list[str]:
    """The services whose workload (workloads_answered) the answer creates or changes other than
    in its replica count (a new template, a switch of kind): the pods the observed workload
    reports ready run what the spec asked before, and Metacontroller applies the change only
    after it writes this status, which is the first about the new generation."""
    return sorted(
        {
            service
            for service, recorded, body in workloads
            if recorded is None or (recorded and _changes_workload(recorded, body))
        }
    )


def _changes_workload(recorded: str, body: str) -> bool:
    """Whether applying `body` over a workload last applied as `recorded` changes more than its
    replicas."""
    applied = parse_recorded(recorded)
    return applied is not None and _as_compared(applied) != _as_compared(json.loads(body))


def _as_compared(workload: dict[str, Any]) -> Any:
    """What of a workload makes its pods: its spec without its replicas. Its own labels and
    annotations (and what Metacontroller stamps on it) roll nothing."""
    spec = workload.get("spec")
    return {key: value for key, value in spec.items() if key != "replicas"} if isinstance(spec, dict) else spec


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
