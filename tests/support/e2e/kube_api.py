"""A fake Kubernetes API server: the calls the Infera runtime makes, as the real server answers them.

The runtime's Kubernetes code is an httpx client of its own (infera/common/k8s_client.py), so
what it relies on is wire behaviour, and that is what this reproduces for the calls it makes:

- the in-cluster endpoint: HTTPS with a certificate for the node address and the `kubernetes`
  Service names, signed by a CA that `write_service_account` mounts next to the token, and a 401
  Status for a request without that token;
- list and watch of Pods by label selector (the router's discovery), a PodList whose items lack
  kind/apiVersion as a typed list's do, a stream of one WatchEvent per line, selector
  transitions turned into ADDED/DELETED as the watch cache does, and a bounded history behind
  it so a resourceVersion too old gets the ERROR event with a 410 Status that makes a client
  re-list;
- get and JSON merge patch (RFC 7386) of a Pod (a worker writes and clears its registration
  annotation) and of an InferaDeployment (the router's scaling API), with what the server does
  to a write: server-owned metadata kept, status untouched by a write to the main resource,
  empty maps dropped as ObjectMeta's omitempty drops them, a no-op write stored as nothing (no
  new resourceVersion, no event), generation bumped by a spec change;
- Status errors with the real reasons and codes (401, 400, 404, 405, 409, 415, 422).

Deliberately absent, so that a runtime change starting to depend on them fails loudly here
instead of passing against something invented: other patch types (415), set-based selectors
(400), field selectors, RBAC, managedFields, bookmarks, server-side watch timeouts.
"""

import contextlib
import copy
import datetime
import ipaddress
import json
import re
import secrets
import socket
import ssl
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# What the in-cluster `kubernetes` Service is reached as, so the certificate must name.
SERVICE_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
MERGE_PATCH = "application/merge-patch+json"
ANNOTATIONS_LIMIT = 256 * 1024  # apimachinery's TotalAnnotationSizeLimitB
_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_TERM = re.compile(r"(?P<neg>!)?\s*(?P<key>[^\s=!(),]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[^\s=!(),]*))?")


@dataclass(frozen=True)
class Resource:
    """A resource the fake serves; its shapes differ by whether the server knows it as a typed
    (built-in) kind or as a custom resource."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """How errors name it: `pods`, `inferadeployments.infera.amd.com`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def typed(self) -> bool:
        """A typed list encodes its items without kind/apiVersion; a custom resource's keeps them."""
        return not self.group


POD = Resource("", "v1", "pods", "Pod")
RESOURCES = {
    (r.group, r.version, r.plural): r
    for r in (POD, Resource("infera.amd.com", "v1alpha1", "inferadeployments", "InferaDeployment"))
}
_KINDS = {r.kind: r for r in RESOURCES.values()}
_PATH = re.compile(
    r"/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"/namespaces/(?P<namespace>[^/]+)/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?"
)


@dataclass(frozen=True)
class Call:
    """One request the fake answered, for assertions on what the runtime asked for."""

    method: str
    path: str
    query: dict[str, str]
    body: Any  # the decoded JSON of a PATCH (its text when it is not JSON), else None
    status: int
    at: float  # time.monotonic() when it was answered
    client: str  # the caller's address: in the sandbox, its pod's IP, which names its account


@dataclass(frozen=True)
class _Change:
    """One entry of the watch history: the stored object after the change and before it, both
    needed to tell a watcher whose selector the change crossed that it was ADDED or DELETED."""

    rv: int
    resource: Resource
    namespace: str
    type: str
    obj: dict[str, Any]
    prev: dict[str, Any] | None


class APIError(Exception):
    """An API failure, answered as the Status object the real server sends."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict[str, Any]:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _not_found(resource: Resource, name: str) -> APIError:
    details = {"name": name, "kind": resource.plural} | ({"group": resource.group} if resource.group else {})
    return APIError(404, "NotFound", f'{resource.qualified} "{name}" not found', details)


def _invalid(resource: Resource, name: str, field: str, message: str) -> APIError:
    return APIError(
        422,
        "Invalid",
        f'{resource.kind} "{name}" is invalid: {field}: {message}',
        {"name": name, "kind": resource.kind, "causes": [{"field": field, "message": message}]},
    )


def _qualified_name_error(key: str) -> str | None:
    """Why `key` is not a valid label or annotation key (apimachinery's IsQualifiedName)."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return f"prefix part of {key!r} must be a DNS subdomain"
    if not name or len(name) > 63 or not re.fullmatch(_NAME, name):
        return f"name part of {key!r} must be 63 characters or less, alphanumerics, '-', '_' or '.'"
    return None


def _label_value_error(value: str) -> str | None:
    if value and (len(value) > 63 or not re.fullmatch(_NAME, value)):
        return f"{value!r}: a label value must be empty or 63 characters or less, alphanumerics, '-', '_' or '.'"
    return None


def parse_selector(text: str) -> Callable[[dict[str, str]], bool]:
    """A label selector as the API server parses it: comma-separated `k=v`, `k==v`, `k!=v`
    (which also matches objects without `k`), `k` and `!k`, all of which must hold. Set-based
    terms (`in`, `notin`) are a 400 here rather than silently matching nothing."""
    checks: list[Callable[[dict[str, str]], bool]] = []
    for term in text.split(",") if text.strip() else []:
        match = _TERM.fullmatch(term.strip())
        if not match or (match["neg"] and match["op"]):
            raise APIError(
                400,
                "BadRequest",
                f"unable to parse requirement: {term.strip()!r} "
                "(this fake serves equality-based and existence selectors only)",
            )
        key, op, value = match["key"], match["op"], match["value"] or ""
        error = _qualified_name_error(key) or (_label_value_error(value) if op else None)
        if error:
            raise APIError(400, "BadRequest", f"unable to parse requirement: {error}")
        if op is None:
            checks.append(
                (lambda labels, key=key: key not in labels) if match["neg"] else (lambda labels, key=key: key in labels)
            )
        elif op == "!=":
            checks.append(lambda labels, key=key, value=value: labels.get(key) != value)
        else:
            checks.append(lambda labels, key=key, value=value: labels.get(key) == value)
    return lambda labels: all(check(labels) for check in checks)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _now(offset_seconds: int = 0) -> str:
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=offset_seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _certificates(host: str) -> tuple[bytes, bytes, bytes]:
    """A CA and a serving certificate it signed, for `host` and the Service names: (CA, cert,
    key) in PEM. Fresh per server, so no test trusts another test's server by accident; with the
    key identifiers and critical constraints that strict verifiers (Python 3.13's default) want."""
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-kubernetes-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(name) for name in SERVICE_NAMES]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        if host not in SERVICE_NAMES:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return ca.public_bytes(pem), cert.public_bytes(pem), key_pem


class KubeAPI:
    """The fake API server, serving HTTPS on `host:port` (port 0: a free one) from construction
    until `stop()`. `history` bounds the changes a watch can resume from, as the watch cache's
    window does; make it small to reach the 410 path."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, token: str | None = None, history: int = 1000
    ) -> None:
        self.host = host
        self.token = token or secrets.token_urlsafe(32)
        ca_pem, cert_pem, key_pem = _certificates(host)
        self.ca_pem = ca_pem.decode()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory() as scratch:  # ssl loads a chain from files only
            (Path(scratch) / "tls.crt").write_bytes(cert_pem)
            (Path(scratch) / "tls.key").write_bytes(key_pem)
            context.load_cert_chain(Path(scratch) / "tls.crt", Path(scratch) / "tls.key")
        self._cond = threading.Condition()
        self._objects: dict[tuple[Resource, str, str], dict[str, Any]] = {}
        self._rv = 1
        self._history: deque[_Change] = deque(maxlen=history)
        self._compacted = 0  # newest resourceVersion no longer in the history
        self._calls: list[Call] = []
        self._epoch = 0  # bumped to end every open watch stream
        self._paused = False
        self._stopped = False
        self._server = _Server(self, (host, port), context)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"kube-api-{self.port}", daemon=True
        )
        self._thread.start()

    # -- what a client is given ------------------------------------------------------------------

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}"

    def env(self) -> dict[str, str]:
        """The service variables kubelet gives every container, pointing here."""
        return {
            "KUBERNETES_SERVICE_HOST": self.host,
            "KUBERNETES_SERVICE_PORT": str(self.port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(self.port),
        }

    def write_service_account(self, directory: Path | str, namespace: str = "default") -> Path:
        """`token`, `ca.crt` and `namespace`, as kubelet mounts them at
        /var/run/secrets/kubernetes.io/serviceaccount."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "token").write_text(self.token)
        (directory / "ca.crt").write_text(self.ca_pem)
        (directory / "namespace").write_text(namespace)
        return directory

    # -- the cluster's side: what controllers and kubelet would write ----------------------------

    def add_object(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create `obj` (a Pod or an InferaDeployment, status included, as if its controllers had
        already written it); returns the stored copy with the server-set metadata."""
        resource = _KINDS.get(obj.get("kind"))
        if resource is None or resource.api_version != obj.get("apiVersion"):
            raise ValueError(f"the fake does not serve {obj.get('apiVersion')}/{obj.get('kind')}")
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        namespace, name = meta.setdefault("namespace", "default"), meta["name"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        self._validate(resource, name, obj)
        with self._cond:
            if (resource, namespace, name) in self._objects:
                raise APIError(409, "AlreadyExists", f'{resource.qualified} "{name}" already exists')
            return self._commit(resource, namespace, name, "ADDED", obj)

    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Create a Pod (the caller gives it labels, annotations, status.podIP and its phase)."""
        return self.add_object({"apiVersion": "v1", "kind": "Pod", **pod})

    def object(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        """A copy of the stored object of `kind` (Pod, InferaDeployment)."""
        with self._cond:
            return copy.deepcopy(self._get(_KINDS[kind], namespace, name))

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.object("Pod", namespace, name)

    def mark_deleting(self, namespace: str, name: str, grace_period_seconds: int | None = None) -> dict[str, Any]:
        """A graceful DELETE: the Pod stays, stamped with the time it will be gone (now plus the
        grace period, by default its spec's terminationGracePeriodSeconds), a MODIFIED event. A
        Pod already being deleted is left as it is."""
        with self._cond:
            pod = copy.deepcopy(self._get(POD, namespace, name))
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                return pod
            grace = grace_period_seconds
            if grace is None:
                grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            meta.update(
                deletionTimestamp=_now(grace),
                deletionGracePeriodSeconds=grace,
                generation=meta.get("generation", 0) + 1,
            )
            return self._commit(POD, namespace, name, "MODIFIED", pod)

    def remove_pod(self, namespace: str, name: str) -> None:
        """The Pod is gone (kubelet's final delete, or a forced one): a DELETED event carrying
        its last state at the deletion's resourceVersion."""
        with self._cond:
            self._get(POD, namespace, name)
            self._commit(POD, namespace, name, "DELETED", None)

    @property
    def events(self) -> list[Call]:
        """Every request answered so far (watches included), in order."""
        with self._cond:
            return list(self._calls)

    @contextlib.contextmanager
    def pause_watches(self) -> Iterator[None]:
        """End every watch stream (as the server's request timeout does) and hold new watches
        until the block exits, while everything else keeps working. Changes made inside are what
        a reconnecting client missed: within `history` it is sent them, beyond it gets a 410."""
        with self._cond:
            self._paused = True
            self._epoch += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._paused = False
                self._cond.notify_all()

    def stop(self) -> None:
        """End the watch streams, close every connection and stop serving."""
        with self._cond:
            if self._stopped:
                return
            self._stopped = True
            self._cond.notify_all()
        self._server.shutdown()
        self._server.close_connections()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> "KubeAPI":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- storage ---------------------------------------------------------------------------------

    def _get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any]:
        obj = self._objects.get((resource, namespace, name))
        if obj is None:
            raise _not_found(resource, name)
        return obj

    def _commit(
        self, resource: Resource, namespace: str, name: str, type_: str, obj: dict[str, Any] | None
    ) -> dict[str, Any]:
        """Store a change at the next resourceVersion and tell the watchers. Caller holds the lock."""
        key = (resource, namespace, name)
        prev = self._objects.get(key)
        self._rv += 1
        if obj is None:
            obj = copy.deepcopy(prev)
            del self._objects[key]
        else:
            self._objects[key] = obj
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if len(self._history) == self._history.maxlen:
            self._compacted = self._history[0].rv
        self._history.append(_Change(self._rv, resource, namespace, type_, copy.deepcopy(obj), copy.deepcopy(prev)))
        self._cond.notify_all()
        return copy.deepcopy(obj)

    def _validate(self, resource: Resource, name: str, obj: dict[str, Any]) -> None:
        """What ObjectMeta decoding and validation reject, and its omitempty maps dropped."""
        meta = obj["metadata"]
        for field in ("labels", "annotations"):
            values = meta.get(field)
            if values is None:
                continue
            if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
                raise APIError(
                    400,
                    "BadRequest",
                    f"json: cannot unmarshal into Go struct field "
                    f"ObjectMeta.metadata.{field} of type map[string]string",
                )
            if not values:
                del meta[field]
            for key, value in values.items():
                error = _qualified_name_error(key) or (_label_value_error(value) if field == "labels" else None)
                if error:
                    raise _invalid(resource, name, f"metadata.{field}", f"Invalid value: {error}")
        if (
            sum(len(k.encode()) + len(v.encode()) for k, v in (meta.get("annotations") or {}).items())
            > ANNOTATIONS_LIMIT
        ):
            raise _invalid(
                resource, name, "metadata.annotations", f"Too long: must have at most {ANNOTATIONS_LIMIT} bytes"
            )

    def _patch(self, resource: Resource, namespace: str, name: str, content_type: str, body: bytes) -> dict[str, Any]:
        """A PATCH of the main resource, as the server applies a JSON merge patch."""
        if content_type != MERGE_PATCH:
            raise APIError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - "
                f"accepted media types include: {MERGE_PATCH} (the only patch type this fake serves)",
            )
        try:
            patch = json.loads(body)
        except ValueError as error:
            raise APIError(400, "BadRequest", f"error decoding patch: {error}") from None
        if not isinstance(patch, dict):
            raise APIError(400, "BadRequest", "a merge patch of an object must be a JSON object")
        with self._cond:
            current = self._get(resource, namespace, name)
            meta = current["metadata"]
            if not isinstance(patch.get("metadata", {}), dict):
                raise APIError(400, "BadRequest", "metadata must be an object")
            precondition = (patch.get("metadata") or {}).get("resourceVersion")
            if precondition is not None and precondition != meta["resourceVersion"]:
                raise APIError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {resource.qualified} "{name}": '
                    "the object has been modified; please apply your changes to the latest version and try again",
                    {"name": name, "kind": resource.plural},
                )
            new = merge_patch(copy.deepcopy(current), patch)
            new_meta = new.setdefault("metadata", {})
            if new_meta.get("name") != name or new_meta.get("namespace") != namespace:
                raise APIError(
                    400,
                    "BadRequest",
                    f"the name of the object ({new_meta.get('name')}) does not match the name on the URL ({name})",
                )
            for owned in ("uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds"):
                new_meta.pop(owned, None)
                if owned in meta:
                    new_meta[owned] = meta[owned]
            new.pop("status", None)  # only the status subresource writes status
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            new["kind"], new["apiVersion"] = resource.kind, resource.api_version
            self._validate(resource, name, new)
            new_meta["resourceVersion"] = meta["resourceVersion"]
            if new == current:
                return copy.deepcopy(current)
            spec_keys = set(new) | set(current)
            if any(new.get(k) != current.get(k) for k in spec_keys - {"metadata", "status"}):
                new_meta["generation"] = meta.get("generation", 0) + 1
            return self._commit(resource, namespace, name, "MODIFIED", new)

    def _list(self, resource: Resource, namespace: str, selector: Callable[[dict[str, str]], bool]) -> dict[str, Any]:
        with self._cond:
            objs = sorted(
                (
                    obj
                    for (r, ns, _), obj in self._objects.items()
                    if r == resource and ns == namespace and selector(_labels(obj))
                ),
                key=lambda obj: obj["metadata"]["name"],
            )
            items = [copy.deepcopy(obj) for obj in objs]
            rv = str(self._rv)
        if resource.typed:
            for item in items:
                item.pop("kind", None)
                item.pop("apiVersion", None)
        return {
            "kind": f"{resource.kind}List",
            "apiVersion": resource.api_version,
            "metadata": {"resourceVersion": rv},
            "items": items,
        }

    # -- watch -----------------------------------------------------------------------------------

    def _watch(
        self,
        resource: Resource,
        namespace: str,
        selector: Callable[[dict[str, str]], bool],
        resource_version: str | None,
        send: Callable[[dict[str, Any] | None], None],
    ) -> None:
        """Stream the watch through `send` (None: the stream's first write, its headers).

        No resourceVersion (or "0") starts with the current objects as ADDED, as the server
        does; any other starts after it, from the history, with an ERROR event carrying a 410
        Expired Status once the history no longer reaches back that far."""
        try:
            cursor = int(resource_version) if resource_version not in (None, "", "0") else None
        except ValueError:
            raise APIError(400, "BadRequest", f'invalid resource version "{resource_version}"') from None
        with self._cond:
            self._cond.wait_for(lambda: not self._paused or self._stopped)
            if self._stopped:
                raise APIError(503, "ServiceUnavailable", "the server is shutting down")
            epoch = self._epoch
            initial: list[dict[str, Any]] = []
            if cursor is None:
                cursor = self._rv
                initial = [
                    {"type": "ADDED", "object": copy.deepcopy(obj)}
                    for (r, ns, _), obj in sorted(self._objects.items(), key=lambda item: item[0][2])
                    if r == resource and ns == namespace and selector(_labels(obj))
                ]
        send(None)
        for event in initial:
            send(event)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopped or self._epoch != epoch or self._rv > cursor)
                if self._stopped or self._epoch != epoch:
                    return
                if cursor < self._compacted:
                    expired = APIError(410, "Expired", f"too old resource version: {cursor} ({self._compacted})")
                    send({"type": "ERROR", "object": expired.status()})
                    return
                changes = [c for c in self._history if c.rv > cursor]
                cursor = self._rv
            for change in changes:
                if change.resource == resource and change.namespace == namespace:
                    event = _as_seen(change, selector)
                    if event is not None:
                        send(event)

    # -- HTTP ------------------------------------------------------------------------------------

    def _record(self, client: str, method: str, path: str, query: dict[str, str], body: Any, status: int) -> None:
        with self._cond:
            self._calls.append(Call(method, path, query, body, status, time.monotonic(), client))

    def _authenticate(self, authorization: str | None) -> None:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), self.token):
            raise APIError(401, "Unauthorized", "Unauthorized")

    def _route(self, path: str) -> tuple[Resource, str, str | None]:
        match = _PATH.fullmatch(path)
        resource = match and RESOURCES.get(
            ("", "v1", match["plural"]) if match["core"] else (match["group"], match["version"], match["plural"])
        )
        if resource is None:
            raise APIError(404, "NotFound", "the server could not find the requested resource", {})
        return resource, unquote(match["namespace"]), unquote(match["name"]) if match["name"] else None


def _as_seen(change: _Change, selector: Callable[[dict[str, str]], bool]) -> dict[str, Any] | None:
    """The event a watcher with this selector gets for a change, as the watch cache decides it:
    an object entering the selection is ADDED, one leaving it is DELETED (its previous state at
    the change's resourceVersion), one outside it before and after is not sent."""
    now = change.type != "DELETED" and selector(_labels(change.obj))
    before = change.prev is not None and selector(_labels(change.prev))
    if now:
        return {"type": "MODIFIED" if before else "ADDED", "object": change.obj}
    if before:
        gone = copy.deepcopy(change.prev)
        gone["metadata"]["resourceVersion"] = str(change.rv)
        return {"type": "DELETED", "object": gone}
    return None


class _Server(ThreadingHTTPServer):
    """One thread per connection (watches are long-lived); TLS handshakes happen in those
    threads, so a slow client never holds up accepting the next one."""

    daemon_threads = True

    def __init__(self, api: KubeAPI, address: tuple[str, int], context: ssl.SSLContext) -> None:
        self.api = api
        self.context = context
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        # Headers and body are separate writes: without this, Nagle's algorithm holds the body
        # for the client's delayed ACK, 40 ms on every call.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Unblock every connection thread: one waiting for the next keep-alive request or
        writing a watch. The plain socket's shutdown, so the TLS object stays in its thread."""
        with self.connections_lock:
            connections = list(self.connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(connection, socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away or rejected the certificate is the client's failure to
        report; the server has nothing to add."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        self.request.settimeout(10)
        self.request.do_handshake()
        self.request.settimeout(None)
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        """Requests are recorded in KubeAPI.events instead."""

    def do_GET(self) -> None:
        self._serve("GET")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        api = self.server.api
        url = urlsplit(self.path)
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body: Any = None
        if method == "PATCH":
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode(errors="replace")
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        try:
            api._authenticate(self.headers.get("Authorization"))
            resource, namespace, name = api._route(url.path)
            if method == "GET" and name is None and query.get("watch") in ("true", "1"):
                selector = parse_selector(query.get("labelSelector", ""))
                send = self._watch_writer(api, url.path, query)
                api._watch(resource, namespace, selector, query.get("resourceVersion"), send)
                self._end_stream()
                return
            if method == "GET":
                answer = (
                    api._list(resource, namespace, parse_selector(query.get("labelSelector", "")))
                    if name is None
                    else api.object(resource.kind, namespace, name)
                )
            elif method == "PATCH" and name is not None:
                answer = api._patch(resource, namespace, name, content_type, raw)
            else:
                raise APIError(
                    405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
                )
            status = 200
        except APIError as error:
            status, answer = error.code, error.status()
        except OSError:  # the client went away mid-watch
            self.close_connection = True
            return
        api._record(self.client_address[0], method, url.path, query, body, status)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _watch_writer(self, api: KubeAPI, path: str, query: dict[str, str]) -> Callable[[dict[str, Any] | None], None]:
        """Headers on the first call, then one event per chunk and line, sent at once."""

        def send(event: dict[str, Any] | None) -> None:
            if event is None:
                api._record(self.client_address[0], "GET", path, query, None, 200)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Cache-Control", "no-cache, private")
                self.end_headers()
                return
            line = json.dumps(event, separators=(",", ":")).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))

        return send

    def _end_stream(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.write(b"0\r\n\r\n")
