"""Metacontroller's CompositeController loop against a real API server, in Metacontroller's place.

Metacontroller v4.17 cannot be had from the Go module proxy (it answers 403 Forbidden for
github.com/metacontroller/metacontroller at every version, tag commits included), so this
driver plays its part with the simulator's apply semantics (tests/support/simulator.py): it
reads the CompositeController as `kubectl apply -k` installed it (hook URLs, child kinds,
update strategies), adds the finalizer, claims children by the generated selector, asks the
customize hook for related Pods, calls the sync or finalize hook over HTTP, creates children
with a controller reference and the last-applied annotation, deletes the ones the answer
leaves out (background propagation, UID precondition) before it creates or updates the others,
updates one only when the 3-way merge differs from what the API server stores (compared with
Go's types: 1 and 1.0 differ), tries every write though one fails, writes the status
subresource only when it changed (whatever the writes did), and removes the finalizer once
finalized.

What only the real program could show stays unproven here: its informer cache and work queue,
its rate limits, ETag reuse and its own error handling.
"""

import copy
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import jsonpatch

from tests.support import apiserver
from tests.support.requests import RESOURCE_KINDS, request_body

LAST_APPLIED = "metacontroller.k8s.io/last-applied-configuration"
COMPOSITE_CONTROLLERS = "/apis/metacontroller.k8s.io/v1alpha1/compositecontrollers"
RESOURCES = {kind: resource for resource, kind in RESOURCE_KINDS.items()} | {"InferaDeployment": "inferadeployments"}


class Retry(RuntimeError):
    """The API server asks to be called again later (429, as while a new CRD's storage
    initialises): Metacontroller requeues the parent, so does this driver."""


def same(a: Any, b: Any) -> bool:
    """Go's reflect.DeepEqual on decoded JSON: an integer and a float never match, nor a bool
    and a number, which Python's == would let pass."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def collection(api_version: str, resource: str, namespace: str) -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{resource}"


class CompositeDriver:
    """Syncs every parent of one CompositeController, through `api` (an httpx client whose
    identity plays Metacontroller's ServiceAccount)."""

    def __init__(self, api: httpx.Client, controller_name: str) -> None:
        self.api = api
        self.hooks = httpx.Client(timeout=30)  # the API server's token stays with the API server
        self.controller_name = controller_name
        self.errors: list[str] = []
        self.writes: list[tuple[str, str, str]] = []  # (verb, kind, name), as the audit log has them
        self.changes: list[tuple[str, str, list[dict[str, Any]]]] = []  # (kind, name, JSON patch) of each update
        self.passes = 0  # completed passes over every parent
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def finalizer(self) -> str:
        return f"metacontroller.io/compositecontroller-{self.controller_name}"

    def composite(self) -> dict[str, Any]:
        return self._checked(self.api.get(f"{COMPOSITE_CONTROLLERS}/{self.controller_name}"))

    def _checked(self, reply: httpx.Response) -> Any:
        if reply.status_code == 429:
            raise Retry(reply.text)
        if reply.is_error:
            raise RuntimeError(f"{reply.request.method} {reply.request.url.path}: {reply.status_code} {reply.text}")
        return reply.json()

    def _parents(self, composite: dict[str, Any]) -> list[dict[str, Any]]:
        parent = composite["spec"]["parentResource"]
        kind = self._checked(self.api.get(f"/apis/{parent['apiVersion']}/{parent['resource']}"))
        return [
            {**item, "apiVersion": parent["apiVersion"], "kind": kind["kind"].removesuffix("List")}
            for item in kind["items"]
        ]

    def sync_all(self) -> None:
        """One pass over every parent, as a resync does; errors are kept, not raised."""
        composite = self.composite()
        for parent in self._parents(composite):
            try:
                self.sync(composite, parent)
            except Retry:
                continue
            except (RuntimeError, httpx.HTTPError) as error:
                self.errors.append(f"{parent['metadata']['name']}: {error}")
        self.passes += 1

    def sync(self, composite: dict[str, Any], parent: dict[str, Any]) -> None:
        metadata = parent["metadata"]
        hooks = composite["spec"]["hooks"]
        deleting = "deletionTimestamp" in metadata
        finalizers = metadata.get("finalizers") or []
        if "finalize" in hooks and not deleting and self.finalizer not in finalizers:
            parent = self._write("update", parent, {**metadata, "finalizers": [*finalizers, self.finalizer]})
        if deleting and self.finalizer not in finalizers:
            return
        children = list(self._claimed(composite, parent))
        related = self._related(composite, parent) if "customize" in hooks else None
        hook = "finalize" if deleting else "sync"
        body = request_body(parent, children, composite=composite, related=related, finalizing=deleting)
        answer = self._checked(self.hooks.post(hooks[hook]["webhook"]["url"], json=body))
        if deleting and answer.get("finalized"):
            remaining = [name for name in finalizers if name != self.finalizer]
            self._write("update", parent, {**parent["metadata"], "finalizers": remaining})
            return
        # As Metacontroller: a child it cannot write (a quota, an admission policy) fails the sync
        # after the others were tried, and the status is written regardless.
        replies = self._apply(composite, parent, children, answer["children"])
        self._write_status(parent, answer["status"])
        if any(reply.status_code == 429 for reply in replies):
            raise Retry("a child's write was refused for now")
        if replies:
            raise RuntimeError(
                "; ".join(f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text}" for r in replies)
            )

    def _claimed(self, composite: dict[str, Any], parent: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Children labelled with the parent's uid that it owns, or that nobody owns (adopted)."""
        uid = parent["metadata"]["uid"]
        for child_resource in composite["spec"]["childResources"]:
            path = collection(child_resource["apiVersion"], child_resource["resource"], parent["metadata"]["namespace"])
            listed = self._checked(self.api.get(path, params={"labelSelector": f"controller-uid={uid}"}))
            kind = RESOURCE_KINDS[child_resource["resource"]]
            for item in listed["items"]:
                child = {**item, "apiVersion": child_resource["apiVersion"], "kind": kind}
                owner = next(
                    (ref for ref in child["metadata"].get("ownerReferences") or [] if ref.get("controller")), None
                )
                if owner is None and "deletionTimestamp" not in parent["metadata"]:
                    refs = [*(child["metadata"].get("ownerReferences") or []), self._owner_reference(parent)]
                    child = self._write("update", child, {**child["metadata"], "ownerReferences": refs})
                    yield child
                elif owner is not None and owner["uid"] == uid:
                    yield child

    def _related(self, composite: dict[str, Any], parent: dict[str, Any]) -> list[dict[str, Any]]:
        url = composite["spec"]["hooks"]["customize"]["webhook"]["url"]
        answer = self._checked(self.hooks.post(url, json={"controller": composite, "parent": parent}))
        related = []
        for wanted in answer["relatedResources"]:
            labels = ",".join(f"{key}={value}" for key, value in wanted["labelSelector"]["matchLabels"].items())
            path = collection(wanted["apiVersion"], wanted["resource"], wanted["namespace"])
            listed = self._checked(self.api.get(path, params={"labelSelector": labels}))
            kind = listed["kind"].removesuffix("List")
            related += [{**item, "apiVersion": wanted["apiVersion"], "kind": kind} for item in listed["items"]]
        return related

    @staticmethod
    def _owner_reference(parent: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": parent["apiVersion"],
            "kind": parent["kind"],
            "name": parent["metadata"]["name"],
            "uid": parent["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def _path(self, obj: dict[str, Any]) -> str:
        path = collection(obj["apiVersion"], RESOURCES[obj["kind"]], obj["metadata"]["namespace"])
        return f"{path}/{obj['metadata']['name']}"

    def _write(self, verb: str, obj: dict[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
        updated = {**obj, "metadata": metadata}
        self.writes.append((verb, obj["kind"], metadata["name"]))
        return {
            **self._checked(self.api.put(self._path(obj), json=updated)),
            "kind": obj["kind"],
            "apiVersion": obj["apiVersion"],
        }

    def _apply(
        self,
        composite: dict[str, Any],
        parent: dict[str, Any],
        observed: list[dict[str, Any]],
        desired_children: list[dict[str, Any]],
    ) -> list[httpx.Response]:
        """Deletes the observed children the answer leaves out, then creates or updates the
        others, as Metacontroller's ManageChildren does: every write is tried; the replies of
        those that failed are returned."""
        strategies = {
            RESOURCE_KINDS[c["resource"]]: (c.get("updateStrategy") or {}).get("method", "OnDelete")
            for c in composite["spec"]["childResources"]
        }
        by_key = {(child["kind"], child["metadata"]["name"]): child for child in observed}
        namespace, uid = parent["metadata"]["namespace"], parent["metadata"]["uid"]
        stamped_children = []
        for desired in desired_children:
            stamped = copy.deepcopy(desired)
            stamped["metadata"].setdefault("namespace", namespace)
            stamped["metadata"].setdefault("labels", {}).setdefault("controller-uid", uid)
            stamped_children.append(stamped)
        desired_keys = {(stamped["kind"], stamped["metadata"]["name"]) for stamped in stamped_children}
        failures: list[httpx.Response] = []
        for key in sorted(set(by_key) - desired_keys):
            child = by_key[key]
            self.writes.append(("delete", *key))
            options = {"propagationPolicy": "Background", "preconditions": {"uid": child["metadata"]["uid"]}}
            reply = self.api.request("DELETE", self._path(child), json=options)
            if reply.is_error and reply.status_code != 404:
                failures.append(reply)
        for stamped in stamped_children:
            key = (stamped["kind"], stamped["metadata"]["name"])
            existing = by_key.get(key)
            if existing is None:
                reply = self._create(parent, stamped)
            elif "deletionTimestamp" in existing["metadata"] or strategies[stamped["kind"]] != "InPlace":
                continue
            else:
                reply = self._update(existing, stamped)
            # Gone, changed since listed (the next sync sees it) or someone else's (which
            # Metacontroller lets be): not a failure.
            if reply is not None and reply.is_error and reply.status_code not in (404, 409):
                failures.append(reply)
        return failures

    def _update(self, existing: dict[str, Any], stamped: dict[str, Any]) -> httpx.Response | None:
        """The 3-way merge of what is stored, last applied and desired, written if it differs."""
        key = (stamped["kind"], stamped["metadata"]["name"])
        last_applied = json.loads((existing["metadata"].get("annotations") or {}).get(LAST_APPLIED, "{}"))
        merged = apiserver.merge(copy.deepcopy(existing), last_applied, stamped)
        merged["metadata"].setdefault("annotations", {})[LAST_APPLIED] = json.dumps(stamped, sort_keys=True)
        if same(merged, existing):
            return None
        self.writes.append(("update", *key))
        self.changes.append((*key, jsonpatch.make_patch(existing, merged).patch))
        return self.api.put(self._path(merged), json=merged)

    def _create(self, parent: dict[str, Any], stamped: dict[str, Any]) -> httpx.Response:
        created = copy.deepcopy(stamped)
        metadata = created["metadata"]
        metadata.setdefault("annotations", {})[LAST_APPLIED] = json.dumps(stamped, sort_keys=True)
        metadata["ownerReferences"] = [*(metadata.get("ownerReferences") or []), self._owner_reference(parent)]
        self.writes.append(("create", created["kind"], metadata["name"]))
        path = self._path(created).rsplit("/", 1)[0]
        return self.api.post(path, json=created)

    def _write_status(self, parent: dict[str, Any], status: dict[str, Any]) -> None:
        new = {**status, "observedGeneration": parent["metadata"]["generation"]}
        if same(new, parent.get("status") or {}):
            return
        self.writes.append(("update", parent["kind"], parent["metadata"]["name"]))
        reply = self.api.put(f"{self._path(parent)}/status", json={**parent, "status": new})
        if reply.status_code not in (404, 409):
            self._checked(reply)

    def start(self, interval: float = 1.0) -> None:
        """Sync every parent every `interval` seconds in a thread, a resync far more eager than
        Metacontroller's: churn shows sooner."""

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.sync_all()
                except Retry:  # reading the controller or the parents: the next pass reads again
                    continue
                except (RuntimeError, httpx.HTTPError) as error:
                    self.errors.append(str(error))

        self._thread = threading.Thread(target=loop, name="composite-driver", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
