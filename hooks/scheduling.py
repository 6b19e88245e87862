"""Why a graph's pods wait to be scheduled, in the scheduler's own words, and where its
workers run.

Read from the Pods the customize hook asks Metacontroller for, and kept apart from the status
roll-up, which only words what this finds: whether Metacontroller keeps watching Pods for us is a
question of its cost, and without that watch there is simply nothing to read here.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hooks.observed import quoted
from hooks.vocabulary import COMPONENT_LABEL, GENERATION_LABEL, SERVICE_LABEL

# PodScheduled=False reasons that mean the pod waits for room (or for a gate a queue controller
# such as Kueue lifts), rather than being on its way to a node.
WAITING_REASONS = ("Unschedulable", "SchedulingGated")


@dataclass(frozen=True)
class Unscheduled:
    """The pods of one service (of one generation) that no node takes."""

    service: str
    generation: str  # "" outside BlueGreen
    pods: int
    reason: str  # what the scheduler says of the first of them by name

    def message(self) -> str:
        pods = "1 pod" if self.pods == 1 else f"{self.pods} pods"
        return f"{self.service}: {pods} unschedulable: {self.reason}"


def _waiting_reason(pod: dict[str, Any]) -> str | None:
    conditions = (pod.get("status") or {}).get("conditions")
    for condition in conditions if isinstance(conditions, list) else []:
        if (
            isinstance(condition, dict)
            and condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") in WAITING_REASONS
        ):
            # One line, however the scheduler wrapped it, and short: it may list every node.
            return quoted(str(condition.get("message") or condition["reason"]))
    return None


def unscheduled(pods: Iterable[dict[str, Any]]) -> tuple[Unscheduled, ...]:
    """The graph's pods (related objects of any kind are passed over) that wait for a node, by
    service and generation. A pod being deleted waits for nothing."""
    found: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for pod in pods:
        # The request contract vouches for the metadata's shape: labels are strings.
        metadata = pod["metadata"]
        if pod["kind"] != "Pod" or metadata.get("deletionTimestamp") is not None:
            continue
        reason = _waiting_reason(pod)
        labels = metadata.get("labels") or {}
        if reason is None or SERVICE_LABEL not in labels:
            continue
        key = (labels[SERVICE_LABEL], labels.get(GENERATION_LABEL, ""))
        found.setdefault(key, []).append((metadata["name"], reason))
    return tuple(
        Unscheduled(service, generation, len(waiting), min(waiting)[1])
        for (service, generation), waiting in sorted(found.items())
    )


# (service, its worker pods' nodes), by service.
WorkerNodes = tuple[tuple[str, tuple[str, ...]], ...]


def worker_nodes(pods: Iterable[dict[str, Any]]) -> WorkerNodes:
    """The nodes each worker service's pods (of every generation) run on, by service."""
    found: dict[str, set[str]] = {}
    for pod in pods:
        metadata = pod["metadata"]
        labels = metadata.get("labels") or {}
        node = (pod.get("spec") or {}).get("nodeName") if pod["kind"] == "Pod" else None
        if isinstance(node, str) and labels.get(COMPONENT_LABEL) == "worker" and SERVICE_LABEL in labels:
            if metadata.get("deletionTimestamp") is None:
                found.setdefault(labels[SERVICE_LABEL], set()).add(node)
    return tuple((service, tuple(sorted(nodes))) for service, nodes in sorted(found.items()))
