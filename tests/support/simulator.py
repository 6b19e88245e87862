"""A small Metacontroller for the tests: applies hook answers the way Metacontroller v4.17 does.

It creates desired children (adding uid, resourceVersion, ownerReference, the controller-uid
label and the last-applied annotation), stores them through a simulated API server that
defaults and canonicalises them (tests/support/apiserver.py), updates a child only when the
3-way merge of observed, last-applied and desired differs from what is stored and as its kind's
updateStrategy says, deletes children the answer leaves out, writes the parent status only when
it changed, and records every write so tests can count them. The rules of each apply are
tests/support/apply.py's; tests/cluster/test_differential.py holds them to the real program.
"""

import copy
import hashlib
import itertools
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from hooks.contract import CONTROLLER_UID_LABEL
from tests.support import apiserver
from tests.support.apply import as_stored, go_equal, record, stamped, update_for, update_method, updated
from tests.support.requests import KIND_RESOURCES, RESOURCE_KINDS, controller_for, parent, request_body
from tests.support.service import HookClient

# (create | update | delete | adopt | release, kind, name) of a child; (status | finalizer |
# finalized, kind, name) of the parent: its status written, Metacontroller's finalizer added
# or removed.
Write = tuple[str, str, str]


def _now(offset_seconds: int) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset_seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


# The alphabet of the names Kubernetes generates (no vowels, no look-alikes).
SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def _safe_encoded(text: str, length: int) -> str:
    """A deterministic name suffix, as a Deployment's pod-template-hash or a pod's random suffix."""
    number = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8])
    return "".join(SAFE_ALPHABET[(number // len(SAFE_ALPHABET) ** i) % len(SAFE_ALPHABET)] for i in range(length))


def gateway_status(accepted: bool) -> dict[str, Any]:
    """status.parents as a Gateway controller writes it on an HTTPRoute or InferencePool."""
    condition = {
        "type": "Accepted",
        "status": "True" if accepted else "False",
        "reason": "Accepted" if accepted else "NotAllowedByListeners",
        "message": "",
        "lastTransitionTime": "2026-11-30T00:00:00Z",
        "observedGeneration": 1,
    }
    return {
        "parents": [
            {
                "parentRef": {"name": "inference-gateway"},
                "controllerName": "example.com/gateway",
                "conditions": [condition],
            }
        ]
    }


class Metacontroller:
    def __init__(self, client: HookClient, idep: Any, composite: dict[str, Any] | None = None) -> None:
        self.client = client
        self.parent = parent(idep)
        self.composite = composite or controller_for(self.parent)
        self.parent.setdefault("status", {})
        self.children: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[Write] = []
        self.last_answer: dict[str, Any] = {}
        # Pods of the workloads; they outlive a deleted workload until they finish draining.
        self.pods: dict[str, dict[str, Any]] = {}
        # Each pod's workload, and its group's leader pod (the garbage collector's view).
        self._pod_workloads: dict[str, tuple[tuple[str, str], str | None]] = {}
        self.finalized = False
        self.finalize_calls = 0
        self._versions = itertools.count(2000)
        self._uids = itertools.count(1)
        self.registered = {
            (RESOURCE_KINDS[c["resource"]], c["apiVersion"]) for c in self.composite["spec"]["childResources"]
        }
        # Children whose create the API server refuses (a quota, an admission policy): each
        # attempt is counted, and the child stays missing.
        self.refused: set[tuple[str, str]] = set()
        self.refusals: list[tuple[str, str]] = []

    @property
    def uid(self) -> str:
        return self.parent["metadata"]["uid"]

    @property
    def namespace(self) -> str:
        return self.parent["metadata"]["namespace"]

    @property
    def deleting(self) -> bool:
        return "deletionTimestamp" in self.parent["metadata"]

    def claimed(self, child: dict[str, Any]) -> bool:
        """With a generated selector, Metacontroller claims only children labelled with the
        parent's uid and owned by it, or by nobody while the parent is not being deleted (an
        orphan is adopted then, and ignored during deletion); it never shows the others to
        the hook."""
        owner = next((ref for ref in child["metadata"].get("ownerReferences") or [] if ref.get("controller")), None)
        matches = (child["metadata"].get("labels") or {}).get(CONTROLLER_UID_LABEL) == self.uid
        return matches and (owner.get("uid") == self.uid if owner else not self.deleting)

    def _claim(self) -> None:
        """Metacontroller's ClaimChildren before each call: a child it owns whose labels do not
        match is released (its owner reference removed), an orphan that matches is adopted."""
        for key, child in self.children.items():
            metadata = child["metadata"]
            owner = next((ref for ref in metadata.get("ownerReferences") or [] if ref.get("controller")), None)
            matches = (metadata.get("labels") or {}).get(CONTROLLER_UID_LABEL) == self.uid
            if owner and owner.get("uid") == self.uid and not matches:
                metadata["ownerReferences"] = [ref for ref in metadata["ownerReferences"] if ref is not owner]
                self.writes.append(("release", *key))
            elif owner is None and matches and not self.deleting:
                metadata["ownerReferences"] = [*(metadata.get("ownerReferences") or []), self._owner_reference()]
                self.writes.append(("adopt", *key))

    def _owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": self.parent["apiVersion"],
            "kind": self.parent["kind"],
            "name": self.parent["metadata"]["name"],
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def body(self, finalizing: bool = False) -> dict[str, Any]:
        related = list(self.pods.values()) if self._watches_pods() else None
        children = [child for child in self.children.values() if self.claimed(child)]
        return request_body(self.parent, children, finalizing=finalizing, composite=self.composite, related=related)

    def _watches_pods(self) -> bool:
        return "customize" in self.composite["spec"].get("hooks", {})

    def run_pods(self) -> None:
        """Start every pod the workloads ask for, labelled from their templates and owned as their
        controllers own them: a Deployment's by its ReplicaSet `<deployment>-<pod-template-hash>`,
        a StatefulSet's by it, a LeaderWorkerSet's leaders by its StatefulSet `<lws>` and group
        i's other pods by the group's StatefulSet `<lws>-<i>` (itself owned by the leader pod)."""
        for (kind, name), child in self.children.items():
            spec = child.get("spec") or {}
            if kind == "LeaderWorkerSet":
                template = spec["leaderWorkerTemplate"]
                for group in range(spec.get("replicas", 1)):
                    leader = f"{name}-{group}"
                    for rank in range(template["size"]):
                        rank_template = template["leaderTemplate" if rank == 0 else "workerTemplate"]
                        lws_labels = {
                            "leaderworkerset.sigs.k8s.io/name": name,
                            "leaderworkerset.sigs.k8s.io/group-index": str(group),
                            "leaderworkerset.sigs.k8s.io/worker-index": str(rank),
                        }
                        self._pod(
                            f"{leader}-{rank}" if rank else leader,
                            rank_template,
                            lws_labels,
                            ("StatefulSet", leader if rank else name),
                            (kind, name),
                            leader if rank else None,
                        )
            elif kind == "Deployment":
                pod_template_hash = _safe_encoded(json.dumps(spec["template"], sort_keys=True), 10)
                replica_set = f"{name}-{pod_template_hash}"
                for index in range(spec.get("replicas", 1)):
                    self._pod(
                        f"{replica_set}-{_safe_encoded(f'{replica_set}/{index}', 5)}",
                        spec["template"],
                        {"pod-template-hash": pod_template_hash},
                        ("ReplicaSet", replica_set),
                        (kind, name),
                    )
            elif kind == "StatefulSet":
                for index in range(spec.get("replicas", 1)):
                    self._pod(f"{name}-{index}", spec["template"], {}, (kind, name), (kind, name))

    def _pod(
        self,
        pod_name: str,
        template: dict[str, Any],
        controller_labels: dict[str, str],
        owner: tuple[str, str],
        workload: tuple[str, str],
        leader: str | None = None,
    ) -> None:
        """A pod of `workload`, owned by `owner`; a group's other pods are deleted only once its
        `leader` pod has gone (the garbage collector deletes their StatefulSet then)."""
        self.pods[pod_name] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": self.namespace,
                "labels": dict(template["metadata"]["labels"]) | controller_labels,
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": owner[0],
                        "name": owner[1],
                        "uid": f"{owner[1]}-uid",
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "terminationGracePeriodSeconds": (template.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            },
        }
        self._pod_workloads[pod_name] = (workload, leader)

    def pods_finish_draining(self) -> None:
        """Pods being deleted finish their preStop and drain, and exit; then a group's other pods,
        deleted once their leader has gone, drain and exit too."""
        for _ in range(2):
            self.pods = {name: pod for name, pod in self.pods.items() if "deletionTimestamp" not in pod["metadata"]}
            self._delete_orphaned_pods()

    def _delete_orphaned_pods(self) -> None:
        """The garbage collector: a pod whose workload is gone is deleted, once its group's leader
        pod (if it has one) has gone too. Its deletionTimestamp is when its grace period ends. A
        pod no workload made (created by hand) is left alone."""
        for name, pod in self.pods.items():
            if name not in self._pod_workloads or "deletionTimestamp" in pod["metadata"]:
                continue
            workload, leader = self._pod_workloads[name]
            if workload not in self.children and leader not in self.pods:
                pod["metadata"]["deletionTimestamp"] = _now(pod["spec"]["terminationGracePeriodSeconds"])

    def created_before(self, children: list[dict[str, Any]]) -> None:
        """The children an earlier build's answer had Metacontroller create, as it stored them:
        with the controller-uid label, the controller reference and the last-applied record of
        that answer."""
        for child in children:
            self.children[(child["kind"], child["metadata"]["name"])] = self._created(
                stamped(child, self.namespace, self.uid)
            )

    def customize(self) -> dict[str, Any]:
        return self.client.hook_raw("/customize", {"controller": self.composite, "parent": self.parent})

    def finalize(self) -> list[Write]:
        """One finalize call while the parent is being deleted; returns the writes it caused."""
        assert not self.finalized, "Metacontroller does not call a parent whose finalizer is gone"
        # The API server stamps the deletion request on the parent.
        self.parent["metadata"].setdefault("deletionTimestamp", _now(0))
        start = len(self.writes)
        self._claim()
        self.finalize_calls += 1
        answer = self.client.hook("/finalize", self.body(finalizing=True))
        self.last_answer = answer
        if answer.get("finalized"):
            # The finalizer goes at once; the children of this answer are not applied.
            self.finalized = True
            self.parent["metadata"]["finalizers"] = [
                name for name in self.parent["metadata"].get("finalizers", []) if name != self.finalizer
            ]
            self.writes.append(("finalized", self.parent["kind"], self.parent["metadata"]["name"]))
            return self.writes[start:]
        listed = {(c["kind"], c["metadata"]["name"]) for c in answer["children"]}
        assert listed <= set(self.children), f"a deleting parent was handed back {listed - set(self.children)}"
        self._apply(answer["children"])
        self._write_status(answer["status"])
        return self.writes[start:]

    @property
    def finalizer(self) -> str | None:
        """The finalizer Metacontroller keeps on the parent while its controller has a finalize hook."""
        if "finalize" not in self.composite["spec"].get("hooks", {}):
            return None
        return f"metacontroller.io/compositecontroller-{self.composite['metadata']['name']}"

    def sync(self) -> list[Write]:
        """One sync call; returns the writes it caused."""
        start = len(self.writes)
        metadata = self.parent["metadata"]
        if self.finalizer and not self.deleting and self.finalizer not in metadata.get("finalizers", []):
            # Before anything else, so that teardown runs whatever the sync goes on to create.
            metadata["finalizers"] = [*metadata.get("finalizers", []), self.finalizer]
            self.writes.append(("finalizer", self.parent["kind"], metadata["name"]))
        self._claim()
        answer = self.client.hook("/sync", self.body())
        self.last_answer = answer
        self._apply(answer["children"])
        self._write_status(answer["status"])
        return self.writes[start:]

    def converge(self, max_rounds: int = 6) -> int:
        """Sync until a round writes nothing; returns the number of rounds that wrote."""
        for rounds in range(max_rounds):
            if not self.sync():
                return rounds
        raise AssertionError(f"no convergence after {max_rounds} syncs: last writes {self.writes[-10:]}")

    def serve(self) -> "Metacontroller":
        """Converged with every pool ready and the gateway accepting: twice, since workers that
        wait for a model download are created once it completes."""
        for _ in range(2):
            self.converge()
            self.mark_ready()
            self.gateway_accepts()
            self.converge()
        assert self.parent["status"]["state"] == "ready"
        return self

    def edit(self, change: Callable[[dict[str, Any]], None]) -> None:
        """A user edit of the spec: bumps metadata.generation like the API server."""
        change(self.parent["spec"])
        self.parent["metadata"]["generation"] += 1

    def mark_ready(self, ready: Callable[[str, str], int | None] = lambda kind, name: None) -> None:
        """Workloads report every desired replica ready (or `ready(kind, name)` of them), and
        Jobs complete."""
        for (kind, name), child in self.children.items():
            if kind == "Job":
                child["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
            if kind in ("Deployment", "StatefulSet", "LeaderWorkerSet"):
                desired = child["spec"].get("replicas", 1)
                count = ready(kind, name)
                count = desired if count is None else count
                child["status"] = {
                    "replicas": desired,
                    "readyReplicas": count,
                    "updatedReplicas": desired,
                    "observedGeneration": child["metadata"]["generation"],
                }

    def delete(self, kind: str, name: str, refuse: bool = False) -> dict[str, Any]:
        """`kubectl delete` of a child; with `refuse`, its create is refused from now on."""
        if refuse:
            self.refused.add((kind, name))
        return self.children.pop((kind, name))

    def hold(self, kind: str, name: str, owner_uid: str = "another-owner") -> None:
        """Another owner holds a child's name: Metacontroller neither shows that object to the
        hook nor can create its own (AlreadyExists, which it swallows)."""
        child = self.children.pop((kind, name), None) or {
            "apiVersion": "v1",
            "kind": kind,
            "metadata": {"name": name, "namespace": self.namespace},
        }
        metadata = child["metadata"]
        metadata["labels"] = {**(metadata.get("labels") or {}), CONTROLLER_UID_LABEL: owner_uid}
        metadata["ownerReferences"] = [
            {"kind": "InferaDeployment", "name": "other", "uid": owner_uid, "controller": True}
        ]
        self.children[(kind, name)] = child

    def autoscale(self, kind: str, name: str, replicas: int) -> None:
        """The HorizontalPodAutoscaler controller resizes a workload through its /scale
        subresource: spec.replicas changes (a new generation), not by the hook."""
        child = self.children[(kind, name)]
        child["spec"]["replicas"] = replicas
        child["metadata"]["generation"] += 1
        child["metadata"]["resourceVersion"] = str(next(self._versions))

    def set_status(self, kind: str, name: str, status: dict[str, Any]) -> None:
        """Another controller (a Gateway, say) writes a child's status."""
        self.children[(kind, name)]["status"] = status

    def gateway_accepts(self, accepted: bool = True) -> None:
        """The Gateway reports every InferencePool and HTTPRoute Accepted (or not)."""
        for kind, name in self.children:
            if kind in ("InferencePool", "HTTPRoute"):
                self.set_status(kind, name, gateway_status(accepted))

    def _apply(self, desired_children: list[dict[str, Any]]) -> None:
        # Every child is stamped before any is written: a label that does not match the
        # parent's selector fails the whole sync (apply.SyncFailed), status included.
        applied = [stamped(desired, self.namespace, self.uid) for desired in desired_children]
        desired_keys = set()
        for desired in applied:
            key = (desired["kind"], desired["metadata"]["name"])
            assert key not in desired_keys, f"duplicate child {key}"
            assert (desired["kind"], desired["apiVersion"]) in self.registered, (
                f"{key} is not a registered child kind: Metacontroller would fail the whole sync"
            )
            desired_keys.add(key)
            existing = self.children.get(key)
            if existing is None and key in self.refused:
                self.refusals.append(key)  # Metacontroller logs the error; the status is still written
                continue
            if existing is None:
                self.children[key] = self._created(desired)
                self.writes.append(("create", *key))
                continue
            if not self.claimed(existing):
                continue  # the create fails with AlreadyExists, which Metacontroller swallows
            # Metacontroller sends an update whenever the merge differs from what is stored,
            # even if the API server would then normalise it back: that is churn too.
            merged = updated(existing, desired)
            if go_equal(merged, existing) or "deletionTimestamp" in existing["metadata"]:
                continue
            update = update_for(update_method(self.composite, (desired["apiVersion"], KIND_RESOURCES[key[0]])))
            if update == "recreate":  # deleted now, created again by the next sync
                self.children.pop(key)
                self.writes.append(("delete", *key))
            elif update == "update":
                apiserver.check_update(existing, merged)
                stored = apiserver.store(merged)
                stored["metadata"]["resourceVersion"] = str(next(self._versions))
                stored["metadata"]["generation"] = apiserver.generation_after_update(existing, stored)
                self.children[key] = stored
                self.writes.append(("update", *key))
        for key in sorted(key for key in set(self.children) - desired_keys if self.claimed(self.children[key])):
            self.children.pop(key)
            self.writes.append(("delete", *key))
        self._delete_orphaned_pods()

    def _created(self, desired: dict[str, Any]) -> dict[str, Any]:
        stored = apiserver.store(desired)
        record(stored, desired)
        metadata = stored["metadata"]
        metadata.update(uid=f"child-{next(self._uids)}", resourceVersion=str(next(self._versions)), generation=1)
        # Metacontroller adds its controller reference to any the answer gives.
        metadata["ownerReferences"] = [*(metadata.get("ownerReferences") or []), self._owner_reference()]
        return stored

    def _write_status(self, status: dict[str, Any]) -> None:
        # Metacontroller sets observedGeneration itself and skips a write that changes nothing,
        # by Go's equality of the stored status and the answer's.
        new = {**status, "observedGeneration": self.parent["metadata"]["generation"]}
        if not go_equal(new, self.parent["status"]):
            self.parent["status"] = as_stored(new)
            self.writes.append(("status", self.parent["kind"], self.parent["metadata"]["name"]))

    def child_writes(self, writes: list[Write]) -> list[Write]:
        """The writes to children: not the parent's status nor its finalizer."""
        return [write for write in writes if write[0] not in ("status", "finalizer", "finalized")]

    def refusal(self, change: Callable[[dict[str, Any]], None]) -> str:
        """The failed message a copy of this (converged) graph gets for the spec edit `change`;
        asserts the sync wrote no child and kept every one as it was."""
        mc = copy.deepcopy(self)
        before = {key: dict(child) for key, child in mc.children.items()}
        mc.edit(change)
        writes = mc.sync()
        assert mc.child_writes(writes) == [] and mc.children == before
        assert mc.parent["status"]["state"] == "failed"
        return mc.parent["status"]["message"]
